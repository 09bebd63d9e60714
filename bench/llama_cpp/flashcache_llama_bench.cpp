// flashcache_llama_bench: decode speed of llama.cpp over the full and the
// compacted KV cache of one sequence, and the compression's steps against
// llama.cpp's prefill. Each prompt length is prefilled at each thread count
// (or once, with --prefill-threads N) and its state saved; every (threads,
// keep) configuration restores that state, compresses it (flashcache/llama.hpp)
// unless keep is 1, and decodes greedily (--decode 0: no decode). Prints one
// JSON object (bench/llama_cpp/bench.sh and bench/run_llama_cost.sh write
// it under bench/results/); progress goes to stderr.
//
//   flashcache_llama_bench --prompt-file FILE [--lengths 2048,8192] [--keeps 1,0.2,0.1]
//                          [--threads 1,2] [--decode 32] [--prefill-threads N] [--repeat N]
//                          [--model FILE.gguf]
//
// --repeat N compresses each restored state N times with one compressor: the
// first call grows its buffers (as a one-shot call does), the later ones are warm.
#include <flashcache/llama.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "find_model/find_model.hpp"
#include "measure.hpp"
#include "llama_session/session.hpp"

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
  int n_decode = 32, prefill_threads = 0, repeat = 1;
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
    else if (k == "--repeat")
      repeat = std::atoi(v.c_str());
    else {
      std::fprintf(stderr, "flashcache_llama_bench: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (repeat < 1 || n_decode < 0) {
    std::fprintf(stderr, "flashcache_llama_bench: --repeat must be at least 1 and --decode at least 0\n");
    return 2;
  }
  if (model_path.empty()) model_path = fc::model_finder::find_default_model();
  if (model_path.empty()) {
    std::fprintf(stderr, "flashcache_llama_bench: no model; %s\n", fc::model_finder::model_install_hint().c_str());
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

  std::printf("{\"llama_version\": \"%s\", \"llama_commit\": \"%s\", \"decode_tokens\": %d, \"runs\": [",
              llama_version(), fc::llama::kPinnedLlamaCommit, n_decode);
  bool first = true;
  for (int length : lengths) {
    std::vector<llama_token> prompt(static_cast<std::size_t>(length));
    for (int i = 0; i < length; ++i)
      prompt[static_cast<std::size_t>(i)] = base[static_cast<std::size_t>(i) % base.size()];
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = static_cast<uint32_t>((length + n_decode + 8 + 255) / 256 * 256);
    cp.n_batch = 2048;
    cp.n_ubatch = 512;
    cp.n_seq_max = 1;
    cp.n_threads = cp.n_threads_batch = prefill_threads > 0 ? prefill_threads : max_threads;
    llama_context* ctx = llama_init_from_model(model, cp);
    if (ctx == nullptr) return 1;
    llama_memory_t mem = llama_get_memory(ctx);
    std::vector<float> logits;
    std::vector<std::uint8_t> saved;
    fc::llama::SeqState parsed;
    llama_token first_token = 0;
    double prefill_ms = 0;
    int prefilled_with = 0;
    // Prefills the prompt with `th` threads and saves its state.
    auto prefill = [&](int th) -> bool {
      llama_set_n_threads(ctx, th, th);
      llama_memory_seq_rm(mem, 0, -1, -1);
      std::fprintf(stderr, "flashcache_llama_bench: prefill of %d tokens with %d threads\n", length, th);
      const double t0 = ls::now_ms();
      if (ls::decode(ctx, prompt.data(), length, 0, 0, false, &logits) != 0) return false;
      prefill_ms = ls::now_ms() - t0;
      prefilled_with = th;
      first_token = ls::argmax(logits.data(), n_vocab);
      saved.resize(llama_state_seq_get_size(ctx, 0));
      llama_state_seq_get_data(ctx, saved.data(), saved.size(), 0);
      if (auto s = fc::llama::parse_seq_state(saved.data(), saved.size(), &parsed,
                                              fc::llama::detail::state_sections(llama_get_model(ctx)));
          !s) {
        std::fprintf(stderr, "flashcache_llama_bench: %s\n", s.message().c_str());
        return false;
      }
      return true;
    };
    if (prefill_threads > 0 && !prefill(prefill_threads)) return 1;
    for (int th : threads) {
      if (prefill_threads <= 0 && !prefill(th)) return 1;
      llama_set_n_threads(ctx, th, th);
      for (double keep : keeps) {
        fc::llama::SequenceCompressor compressor;  // new: its first call grows its buffers
        for (int rep = 0; rep < repeat; ++rep) {
          llama_memory_seq_rm(mem, 0, -1, -1);
          if (llama_state_seq_set_data(ctx, saved.data(), saved.size(), 0) != saved.size()) return 1;
          fc::llama::CompactionStats st;
          st.cells_before = st.cells_after = length;
          st.kv_bytes_before = st.kv_bytes_after = parsed.kv_bytes();
          if (keep < 1.0) {
            fc::llama::CompressParams p = fc::llama::compress_default_params();
            p.budget = fc::Budget::ratio(keep);
            if (auto s = compressor.compress(ctx, 0, p, &st); !s) {
              std::fprintf(stderr, "flashcache_llama_bench: %s\n", s.message().c_str());
              return 1;
            }
          }
          llama_token next = first_token;
          measure::Step first_step;
          const double t = ls::now_ms();
          for (int i = 0; i < n_decode; ++i) {
            const measure::Step step =
                measure::decode_watching(ctx, next, llama_memory_seq_pos_max(mem, 0) + 1, &logits);
            if (step.rc != 0) return 1;
            if (i == 0) first_step = step;
            next = ls::argmax(logits.data(), n_vocab);
          }
          const double decode_ms = ls::now_ms() - t;
          std::printf(
              "%s\n {\"prompt_tokens\": %d, \"threads\": %d, \"keep_ratio\": %g, \"cells_before\": %lld, "
              "\"cells_after\": %lld, \"used_cells_before_first_decode\": %ld, \"n_kv_after\": %ld, "
              "\"prefill_ms\": %.1f, \"prefill_threads\": %d, \"compress_ms\": %.1f, \"read_ms\": %.1f, "
              "\"score_ms\": %.1f, \"select_ms\": %.1f, \"write_ms\": %.1f, \"compress_threads\": %d, "
              "\"repeat\": %d, \"decode_tokens_per_s\": %.3f, \"kv_bytes_before\": %llu, "
              "\"kv_bytes_after\": %llu}",
              first ? "" : ",", length, th, keep, static_cast<long long>(st.cells_before),
              static_cast<long long>(st.cells_after), first_step.used_before, first_step.n_kv, prefill_ms,
              prefilled_with, st.compress_ms, st.read_ms, st.score_ms, st.select_ms, st.write_ms,
              keep < 1.0 ? st.threads : 0, rep, n_decode > 0 ? 1000.0 * n_decode / decode_ms : 0.0,
              static_cast<unsigned long long>(st.kv_bytes_before), static_cast<unsigned long long>(st.kv_bytes_after));
          std::fflush(stdout);
          first = false;
        }
      }
    }
    llama_free(ctx);
  }
  std::printf("\n]}\n");
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
