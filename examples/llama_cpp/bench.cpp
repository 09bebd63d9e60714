// flashcache_llama_bench: decode speed of llama.cpp over the full and the
// compacted KV cache of one sequence. Each prompt length is prefilled once and
// its state saved; every (threads, keep) configuration restores that state,
// compresses it (flashcache/llama.hpp) unless keep is 1, and decodes
// greedily. Prints one JSON object (examples/llama_cpp/bench.sh writes it to
// bench/results/llama_cpp.json).
//
//   flashcache_llama_bench --prompt-file FILE [--lengths 2048,8192] [--keeps 1,0.2,0.1]
//                          [--threads 1,2] [--decode 32] [--prefill-threads N] [--model FILE.gguf]
#include <flashcache/llama.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/find_model.hpp"
#include "session.hpp"

namespace fc = flashcache;
namespace ls = llama_session;

namespace {

template <class T>
std::vector<T> parse_list(const std::string& s) {
  std::vector<T> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(static_cast<T>(std::atof(item.c_str())));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path, prompt_file;
  std::vector<int> lengths = {2048, 4096, 8192}, threads = {1, 2};
  std::vector<double> keeps = {1.0, 0.2, 0.1};
  int n_decode = 32, prefill_threads = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--model")
      model_path = v;
    else if (k == "--prompt-file")
      prompt_file = v;
    else if (k == "--lengths")
      lengths = parse_list<int>(v);
    else if (k == "--keeps")
      keeps = parse_list<double>(v);
    else if (k == "--threads")
      threads = parse_list<int>(v);
    else if (k == "--decode")
      n_decode = std::atoi(v.c_str());
    else if (k == "--prefill-threads")
      prefill_threads = std::atoi(v.c_str());
    else {
      std::fprintf(stderr, "flashcache_llama_bench: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (model_path.empty()) model_path = engine::find_default_model();
  if (model_path.empty()) {
    std::fprintf(stderr, "flashcache_llama_bench: no model; %s\n", engine::model_install_hint().c_str());
    return 2;
  }
  std::ifstream f(prompt_file, std::ios::binary);
  if (!f) {
    std::fprintf(stderr, "flashcache_llama_bench: cannot read --prompt-file '%s'\n", prompt_file.c_str());
    return 2;
  }
  std::ostringstream text;
  text << f.rdbuf();

  ls::init(true, /*watch_n_kv=*/true);  // n_kv after compaction is reported
  llama_model* model = llama_model_load_from_file(model_path.c_str(), ls::model_params());
  if (model == nullptr) return 1;
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const int n_vocab = llama_vocab_n_tokens(vocab);
  const std::vector<llama_token> base = ls::tokenize(vocab, text.str(), true);
  if (base.empty()) return 2;
  int max_threads = 1;
  for (int t : threads) max_threads = std::max(max_threads, t);
  if (prefill_threads <= 0) prefill_threads = max_threads;

  std::printf("{\"llama_version\": \"%s\", \"llama_commit\": \"%s\", \"decode_tokens\": %d, \"runs\": [",
              llama_version(), fc::llama::kPinnedLlamaCommit, n_decode);
  bool first = true;
  fc::llama::SequenceCompressor compressor;
  for (int length : lengths) {
    std::vector<llama_token> prompt(static_cast<std::size_t>(length));
    for (int i = 0; i < length; ++i) prompt[static_cast<std::size_t>(i)] = base[static_cast<std::size_t>(i) % base.size()];
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = static_cast<uint32_t>((length + n_decode + 8 + 255) / 256 * 256);
    cp.n_batch = 2048;
    cp.n_ubatch = 512;
    cp.n_seq_max = 1;
    cp.n_threads = cp.n_threads_batch = prefill_threads;
    llama_context* ctx = llama_init_from_model(model, cp);
    if (ctx == nullptr) return 1;
    std::vector<float> logits;
    double t = ls::now_ms();
    if (ls::decode(ctx, prompt.data(), length, 0, 0, false, &logits) != 0) return 1;
    const double prefill_ms = ls::now_ms() - t;
    const llama_token first_token = ls::argmax(logits.data(), n_vocab);
    std::vector<std::uint8_t> saved(llama_state_seq_get_size(ctx, 0));
    llama_state_seq_get_data(ctx, saved.data(), saved.size(), 0);
    fc::llama::SeqState parsed;
    if (auto s = fc::llama::parse_seq_state(saved.data(), saved.size(), &parsed); !s) {
      std::fprintf(stderr, "flashcache_llama_bench: %s\n", s.message().c_str());
      return 1;
    }
    llama_memory_t mem = llama_get_memory(ctx);
    for (int th : threads) {
      llama_set_n_threads(ctx, th, th);
      for (double keep : keeps) {
        llama_memory_seq_rm(mem, 0, -1, -1);
        if (llama_state_seq_set_data(ctx, saved.data(), saved.size(), 0) != saved.size()) return 1;
        fc::llama::CompactionStats st;
        st.cells_before = st.cells_after = length;
        st.kv_bytes_before = st.kv_bytes_after = parsed.kv_bytes();
        if (keep < 1.0) {
          if (auto s = compressor.compress(ctx, 0, fc::Budget::ratio(keep), {}, {}, &st); !s) {
            std::fprintf(stderr, "flashcache_llama_bench: %s\n", s.message().c_str());
            return 1;
          }
        }
        llama_token next = first_token;
        long used = -1;
        t = ls::now_ms();
        for (int i = 0; i < n_decode; ++i) {
          ls::log_state().used_max_p1 = -1;
          if (ls::decode(ctx, &next, 1, llama_memory_seq_pos_max(mem, 0) + 1, 0, false, &logits) != 0) return 1;
          if (i == 0) used = ls::log_state().used_max_p1;
          next = ls::argmax(logits.data(), n_vocab);
        }
        const double decode_ms = ls::now_ms() - t;
        std::printf("%s\n {\"prompt_tokens\": %d, \"threads\": %d, \"keep_ratio\": %g, \"cells_before\": %lld, "
                    "\"cells_after\": %lld, \"used_cells_before_first_decode\": %ld, \"n_kv_after\": %ld, "
                    "\"prefill_ms\": %.1f, \"prefill_threads\": %d, \"compress_ms\": %.1f, \"score_ms\": %.1f, "
                    "\"decode_tokens_per_s\": %.3f, \"kv_bytes_before\": %llu, \"kv_bytes_after\": %llu}",
                    first ? "" : ",", length, th, keep, static_cast<long long>(st.cells_before),
                    static_cast<long long>(st.cells_after), used, used < 0 ? -1 : ls::n_kv_of(used, 1, ls::log_state().size),
                    prefill_ms, prefill_threads, st.compress_ms, st.score_ms, 1000.0 * n_decode / decode_ms,
                    static_cast<unsigned long long>(st.kv_bytes_before),
                    static_cast<unsigned long long>(st.kv_bytes_after));
        std::fflush(stdout);
        first = false;
      }
    }
    llama_free(ctx);
  }
  std::printf("\n]}\n");
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
