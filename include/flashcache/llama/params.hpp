#pragma once
// What one compaction of a llama.cpp sequence takes (CompressParams) and what it
// reports (CompactionStats); flashcache/llama/compress.hpp does the compaction.
// CompactionSettings is the part a running context keeps between compactions
// (ContextParams::compress): the budget and the query capture are per call.
#include <llama.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "flashcache/archive.hpp"
#include "flashcache/error.hpp"
#include "flashcache/llama/queries.hpp"
#include "flashcache/options.hpp"
#include "flashcache/shared_keep.hpp"

namespace flashcache {
namespace llama {

// What one compaction did, and how long each step took.
struct CompactionStats {
  std::int64_t cells_before = 0, cells_after = 0;         // cells of the sequence
  std::uint64_t kv_bytes_before = 0, kv_bytes_after = 0;  // K and V of those cells, all layers
  std::size_t state_bytes_before = 0, state_bytes_after = 0;
  llama_pos pos_min_before = -1, pos_min_after = -1, pos_max = -1;
  std::int64_t layers = 0, kv_heads = 0, head_dim = 0;
  bool v_trans = false;
  std::string k_type, v_type;
  int threads = 1;  // scoring threads
  // get_data + parse + checks; score; select; the kept cells' blob + rm + set_data + verify.
  double read_ms = 0, score_ms = 0, select_ms = 0, write_ms = 0;
  double compress_ms = 0;            // all of it
  bool query_tails = false;          // scored with the prompt's query tails (ScoreOptions::query = tail)
  std::int64_t archived = 0;         // evicted cells appended to CompressParams::archive
  std::int64_t archive_dropped = 0;  // cells the archive's byte cap dropped in this call
};

// How every compaction scores and selects.
struct CompactionSettings {
  Options options;  // the score (Options::with_query_tail() with a QueryCapture)
  // One keep-set for the whole sequence (llama.cpp's cells hold every layer and
  // head, so KeepSet::per_sequence is the only keep set): how heads combine, and
  // whole pages of `page` cells.
  HeadCombine combine = HeadCombine::mean_normalized;
  std::int64_t page = 1;
  int n_threads = 0;  // scoring threads; 0: llama_n_threads(ctx)
};

// One compaction's inputs, as llama.cpp's C API passes them.
struct CompressParams : CompactionSettings {
  Budget budget = Budget::ratio(0.2);     // cells to keep, of the sequence's
  const QueryCapture* queries = nullptr;  // the prompt's queries when options.score.query = tail
  // Where the evicted cells go (flashcache/archive.hpp): their positions and rows as
  // stored, appended once the sequence is replaced (a failed call appends nothing). An
  // empty archive takes the state's shape and archive_options; a non-empty one of
  // another shape is refused. Null: evicted cells are dropped.
  Archive* archive = nullptr;
  ArchiveOptions archive_options;
  // Positions kept whatever their score (ascending; cells recalled for the current
  // turn, ContextManager): protect_count of them at protect.
  const llama_pos* protect = nullptr;
  std::int64_t protect_count = 0;
};
inline CompressParams compress_default_params() { return CompressParams{}; }

// Scoring threads: n_threads, or 0 for the context's llama_n_threads.
inline int scoring_threads(llama_context* ctx, int n_threads) {
  return n_threads > 0 ? n_threads : std::max(1, llama_n_threads(ctx));
}

inline SharedKeepOptions shared_keep(const CompactionSettings& p) {
  SharedKeepOptions s;
  s.keep_set = KeepSet::per_sequence;
  s.combine = p.combine;
  s.page = p.page;
  return s;
}

// The checks of a call's parameters, before anything is read.
inline Status check_compress_params(const CompressParams& p) {
  FLASHCACHE_RETURN_IF_ERROR(check_options(p.options));
  FLASHCACHE_RETURN_IF_ERROR(check_shared_options(shared_keep(p)));
  if (p.options.score.rope.derotate)
    return make_error(Errc::unsupported,
                      "llama: ScoreOptions::rope (de-rotation) is refused: after a compaction the "
                      "cells' positions have gaps, theta and the layout are the model's, and a "
                      "q8_0 cache is Hadamard-rotated");
  if (p.n_threads < 0) return make_error(Errc::invalid_option, "llama: n_threads ", p.n_threads, " is negative");
  if (p.protect_count < 0 || (p.protect_count > 0 && p.protect == nullptr))
    return make_error(Errc::invalid_option, "llama: ", p.protect_count, " protected positions at a null pointer");
  if (p.options.score.query != QueryInput::none && p.queries == nullptr)
    return make_error(Errc::invalid_option, "llama: ScoreOptions::query is ", to_string(p.options.score.query),
                      " but no QueryCapture was given (flashcache/llama/queries.hpp)");
  if (p.options.score.query == QueryInput::none && p.queries != nullptr)
    return make_error(Errc::invalid_option, "llama: a QueryCapture was given but ScoreOptions::query is none");
  return Status::success();
}

}  // namespace llama
}  // namespace flashcache
