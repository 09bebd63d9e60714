#pragma once
// flashcache_llama's output: one JSON object (--json), or a summary on stderr
// and the generated text on stdout.
#include <flashcache/llama.hpp>

#include <cstdint>
#include <cstdio>
#include <string>

#include "text_io.hpp"

namespace run_report {

struct RunReport {
  int prompt_tokens = 0;
  bool compressed = false;
  flashcache::llama::CompactionStats stats;  // of the first compression (bytes: the full cache's if none)
  long n_kv_after = -1, used_after = -1;     // at the first decode step
  unsigned n_ctx = 0;
  double prefill_ms = 0, compress_ms = 0;  // compress_ms: every compression
  int recompressions = 0;
  double decode_tokens_per_s = 0;
  double keep_ratio = -1;
  int threads = 0;
  std::string cache_type;
  std::size_t tokens = 0;  // generated
  double nll = 0;
  int nll_tokens = 0;  // 0: no continuation
  std::string text;
};

inline void print_json(const RunReport& r) {
  const flashcache::llama::CompactionStats& st = r.stats;
  const long long before = r.compressed ? st.cells_before : r.prompt_tokens;
  const long long after = r.compressed ? st.cells_after : r.prompt_tokens;
  std::printf(
      "{\"prompt_tokens\": %d, \"cells_before\": %lld, \"cells_after\": %lld, \"n_kv_after\": %ld, "
      "\"used_cells_before_first_decode\": %ld, \"n_ctx\": %u, \"prefill_ms\": %.3f, \"compress_ms\": %.3f, "
      "\"recompressions\": %d, \"decode_tokens_per_s\": %.3f, \"kv_bytes_before\": %llu, "
      "\"kv_bytes_after\": %llu, \"keep_ratio\": %g, \"threads\": %d, \"cache_type\": %s, \"v_trans\": %s, "
      "\"query\": \"%s\", \"tokens\": %zu",
      r.prompt_tokens, before, after, r.n_kv_after, r.used_after, r.n_ctx, r.prefill_ms, r.compress_ms,
      r.recompressions, r.decode_tokens_per_s, static_cast<unsigned long long>(st.kv_bytes_before),
      static_cast<unsigned long long>(st.kv_bytes_after), r.keep_ratio, r.threads,
      text_io::json_string(r.cache_type).c_str(), st.v_trans ? "true" : "false", st.query_tails ? "tail" : "none",
      r.tokens);
  if (r.nll_tokens > 0) std::printf(", \"nll\": %.6f, \"nll_tokens\": %d", r.nll, r.nll_tokens);
  std::printf(", \"text\": %s}\n", text_io::json_string(r.text).c_str());
}

inline void print_summary(const RunReport& r) {
  const flashcache::llama::CompactionStats& st = r.stats;
  if (r.compressed)
    std::fprintf(
        stderr, "prompt %d tokens, prefill %.1f ms; compressed %lld -> %lld cells (%.1f ms, K %s, V %s%s), n_kv %ld\n",
        r.prompt_tokens, r.prefill_ms, static_cast<long long>(st.cells_before), static_cast<long long>(st.cells_after),
        r.compress_ms, st.k_type.c_str(), st.v_type.c_str(), st.v_trans ? " transposed" : "", r.n_kv_after);
  else
    std::fprintf(stderr, "prompt %d tokens, prefill %.1f ms; not compressed, n_kv %ld\n", r.prompt_tokens, r.prefill_ms,
                 r.n_kv_after);
  if (r.nll_tokens > 0) std::fprintf(stderr, "continuation NLL %.4f over %d tokens\n", r.nll, r.nll_tokens);
  std::fprintf(stderr, "%zu tokens at %.1f tokens/s\n", r.tokens, r.decode_tokens_per_s);
}

}  // namespace run_report
