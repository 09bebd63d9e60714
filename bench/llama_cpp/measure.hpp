#pragma once
// What the llama.cpp measuring programs measure beside the adapter, in one place:
// the n_kv a decode step attends to, a continuation's teacher-forced NLL, and
// the K and V bytes of a sequence's state. flashcache_llama and flashcache_llama_bench
// share them, so each program's main reads as the adapter's use.
#include <flashcache/llama.hpp>

#include <cstdint>
#include <vector>

#include "llama_session/session.hpp"
#include "token_nll.hpp"

namespace measure {

// One decode step of `token` at `pos` of sequence 0 with the cells it attended
// to, read from llama.cpp's log (llama_session::init(..., watch_n_kv = true)):
// used_before is the highest used cell + 1 before the token went in, n_kv the
// cells the step attended to; both -1 when the log said nothing.
struct Step {
  int rc = 0;  // llama_decode's result
  long used_before = -1, n_kv = -1;
};

inline Step decode_watching(llama_context* ctx, llama_token token, llama_pos pos, std::vector<float>* logits) {
  llama_session::LogState& log = llama_session::log_state();
  log.used_max_p1 = -1;
  Step s;
  s.rc = llama_session::decode(ctx, &token, 1, pos, 0, false, logits);
  if (s.rc == 0 && log.used_max_p1 >= 0) {
    s.used_before = log.used_max_p1;
    s.n_kv = llama_session::n_kv_of(log.used_max_p1, 1, log.size);
  }
  return s;
}

// The mean NLL of cont[1..) teacher-forced after sequence 0's last position (token i
// from the logits after tokens 0..i-1), then removed again, leaving the cells as
// they were. Returns llama_decode's result (nonzero: nothing measured).
inline int continuation_nll(llama_context* ctx, const std::vector<llama_token>& cont, double* nll, int* tokens) {
  *nll = 0;
  *tokens = 0;
  if (cont.size() < 2) return 0;
  llama_memory_t mem = llama_get_memory(ctx);
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(llama_get_model(ctx)));
  const llama_pos p0 = llama_memory_seq_pos_max(mem, 0) + 1;
  std::vector<float> logits;
  const int rc = llama_session::decode(ctx, cont.data(), static_cast<int>(cont.size()) - 1, p0, 0, true, &logits);
  if (rc == 0) {
    for (std::size_t i = 1; i < cont.size(); ++i)
      *nll += token_nll::of(logits.data() + (i - 1) * static_cast<std::size_t>(n_vocab), n_vocab, cont[i]);
    *tokens = static_cast<int>(cont.size()) - 1;
    *nll /= *tokens;
  }
  llama_memory_seq_rm(mem, 0, p0, -1);
  return rc;
}

// K and V bytes of sequence 0's state and whether V is stored transposed; false
// when the state cannot be read or parsed.
inline bool state_bytes(llama_context* ctx, std::uint64_t* kv_bytes, bool* v_trans) {
  std::vector<std::uint8_t> blob(llama_state_seq_get_size(ctx, 0));
  flashcache::llama::SeqState s;
  if (blob.empty() || llama_state_seq_get_data(ctx, blob.data(), blob.size(), 0) != blob.size() ||
      !flashcache::llama::parse_seq_state(blob.data(), blob.size(), &s,
                                          flashcache::llama::detail::state_sections(llama_get_model(ctx)))
           .ok())
    return false;
  *kv_bytes = s.kv_bytes();
  *v_trans = s.v_trans;
  return true;
}

}  // namespace measure
