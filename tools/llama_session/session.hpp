#pragma once
// A small llama.cpp session for the measuring programs (bench/llama_cpp), the adapter's tests
// (tests/llama) and tools/hops, public API only:
// load a model, make a context, tokenize, prefill one sequence, decode one token
// at a time, and watch n_kv (the cells a decode step attends to).
//
// n_kv is not in llama.h. With LLAMA_KV_CACHE_DEBUG=1 in the environment
// before the context is made, llama.cpp's cache logs, at every decode step's
// slot search, "find_slot: stream[s], n = U, used = ..., head = ..., size = ..."
// where U is the highest used cell + 1 before the new tokens go in; a step
// then attends to n_kv = min(size, max(256, U' padded to 256)) cells, U' the
// same after they go in. The log callback below reads U from that line.
#include <llama.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace llama_session {

struct LogState {
  bool quiet = true;
  long used_max_p1 = -1;  // U of the last find_slot line
  long size = -1;         // cells in the cache
};

inline LogState& log_state() {
  static LogState s;
  return s;
}

inline void log_callback(ggml_log_level level, const char* text, void*) {
  LogState& s = log_state();
  if (const char* p = std::strstr(text, "find_slot: stream[")) {
    long stream = 0, n = 0, used = 0, head = 0, size = 0;
    if (std::sscanf(p, "find_slot: stream[%ld], n = %ld, used = %ld, head = %ld, size = %ld", &stream, &n, &used, &head,
                    &size) == 5) {
      s.used_max_p1 = n;
      s.size = size;
    }
    return;
  }
  // Errors always, warnings unless quiet, the rest never (llama.cpp is chatty).
  if (level == GGML_LOG_LEVEL_ERROR || (!s.quiet && level == GGML_LOG_LEVEL_WARN)) std::fputs(text, stderr);
}

// Call once, before any context is made. watch_n_kv turns llama.cpp's cache
// debug log on (a line per decode step, which n_kv is read from); programs that
// do not report n_kv leave it off.
inline void init(bool quiet, bool watch_n_kv = false) {
  if (watch_n_kv) setenv("LLAMA_KV_CACHE_DEBUG", "1", 0);
  log_state().quiet = quiet;
  llama_log_set(log_callback, nullptr);
  llama_backend_init();
}

// n_kv of a decode step that found U used cells before its `tokens` new ones went in
// (the new ones go to the first free cells, here right after the used ones).
inline long n_kv_of(long used_max_p1, long tokens, long size) {
  const long u = used_max_p1 + tokens;
  const long padded = std::max(256L, (u + 255) / 256 * 256);
  return std::min(size, padded);
}

// CPU-only model parameters. Extra buffer types (weight repacking, AMX) stay off
// by default: the pip package builds ggml with GGML_NATIVE, which on this
// project's CI machines (AMX in cpuinfo, not usable in the VM) compiles AMX tile
// kernels that die with SIGILL at the first matrix product.
inline llama_model_params model_params(bool extra_bufts = false) {
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  mp.use_extra_bufts = extra_bufts;
  return mp;
}

inline double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline std::vector<llama_token> tokenize(const llama_vocab* vocab, const std::string& text, bool add_special) {
  int n = -llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), nullptr, 0, add_special, true);
  std::vector<llama_token> out(static_cast<std::size_t>(std::max(n, 0)));
  if (n > 0)
    n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), out.data(), n, add_special, true);
  out.resize(static_cast<std::size_t>(std::max(n, 0)));
  return out;
}

inline std::string piece(const llama_vocab* vocab, llama_token t) {
  char buf[256];
  const int n = llama_token_to_piece(vocab, t, buf, sizeof buf, 0, true);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

// The prompt as a one-turn chat with the model's template (or the text itself without one).
inline std::string chat_prompt(const llama_model* model, const std::string& user) {
  const char* tmpl = llama_model_chat_template(model, nullptr);
  if (tmpl == nullptr) return user;
  llama_chat_message msg{"user", user.c_str()};
  std::vector<char> buf(user.size() * 2 + 1024);
  int n = llama_chat_apply_template(tmpl, &msg, 1, true, buf.data(), static_cast<int32_t>(buf.size()));
  if (n > static_cast<int>(buf.size())) {
    buf.resize(static_cast<std::size_t>(n));
    n = llama_chat_apply_template(tmpl, &msg, 1, true, buf.data(), static_cast<int32_t>(buf.size()));
  }
  return n > 0 ? std::string(buf.data(), static_cast<std::size_t>(n)) : user;
}

// Decodes tokens[0..n) of sequence `seq` at positions first_pos.., in chunks of
// n_batch; logits for every token when all_logits, else for the last one only.
// Returns llama_decode's first nonzero result, or 0.
inline int decode(llama_context* ctx, const llama_token* tokens, int n, llama_pos first_pos, llama_seq_id seq,
                  bool all_logits, std::vector<float>* logits = nullptr) {
  const int n_batch = static_cast<int>(llama_n_batch(ctx));
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(llama_get_model(ctx)));
  llama_batch batch = llama_batch_init(n_batch, 0, 1);
  if (logits != nullptr) logits->clear();
  int rc = 0;
  for (int i0 = 0; i0 < n && rc == 0; i0 += n_batch) {
    const int m = std::min(n_batch, n - i0);
    batch.n_tokens = m;
    for (int i = 0; i < m; ++i) {
      batch.token[i] = tokens[i0 + i];
      batch.pos[i] = first_pos + i0 + i;
      batch.n_seq_id[i] = 1;
      batch.seq_id[i][0] = seq;
      batch.logits[i] = all_logits || (i0 + i == n - 1);
    }
    rc = llama_decode(ctx, batch);
    if (rc == 0 && logits != nullptr)
      for (int i = 0; i < m; ++i)
        if (batch.logits[i]) {
          const float* l = llama_get_logits_ith(ctx, i);
          logits->insert(logits->end(), l, l + n_vocab);
        }
  }
  llama_batch_free(batch);
  return rc;
}

inline llama_token argmax(const float* logits, int n_vocab) {
  return static_cast<llama_token>(std::max_element(logits, logits + n_vocab) - logits);
}

}  // namespace llama_session
