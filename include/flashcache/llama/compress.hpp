#pragma once
// FlashCache inside llama.cpp through its public API: evict AND compact one
// sequence, then keep decoding.
//
// llama.cpp's KV cells are shared by all layers and KV heads, and a decode
// step attends to n_kv cells: the highest used cell, padded to 256. Removing
// positions (llama_memory_seq_rm) leaves holes that still cost time. This
// adapter instead reads the sequence's state (llama_state_seq_get_data),
// scores every layer, keeps one token set for the whole sequence
// (select_shared_tokens), writes a state blob of the kept cells only, with
// their positions unchanged (so RoPE of later tokens stays right), removes
// the sequence and restores that blob (llama_state_seq_set_data).
//
//   #include <flashcache/llama.hpp>   // needs llama.h; link flashcache::llama_cpp
//   flashcache::llama::CompressParams p = flashcache::llama::compress_default_params();
//   p.budget = flashcache::Budget::ratio(0.2);
//   flashcache::llama::CompactionStats st;
//   flashcache::Status s = flashcache::llama::compress_sequence(ctx, 0, p, &st);
//
// n_kv by layout. One unified cache (kv_unified = true, or one sequence): n_kv
// is the highest used cell of any sequence, padded to 256; a lone sequence's
// kept cells start at cell 0, so n_kv falls to the kept count, but with other
// sequences in the cache the freed cells are holes that their new tokens
// fill. Separate streams (kv_unified = false): each sequence has its own
// cells and a decode attends to the highest used cell of its streams, so
// compacting one sequence shrinks its own n_kv and changes no other.
//
// The call's inputs and report: llama/params.hpp; its checks: llama/checks.hpp.
// Refused before anything is touched, by name: a llama.cpp other than the
// pinned one (the state format is not versioned), recurrent or hybrid memory,
// M-RoPE / vision RoPE, sliding-window models other than gemma2 and gemma3, MLA
// and indexer (DSA, MSA) caches, K or V caches of types other than f32, f16,
// bf16 and q8_0, ScoreOptions::rope (the cells' positions have gaps after a
// compaction, and a q8_0 cache is Hadamard-rotated), an empty sequence, a
// sequence that may share cells with another one (a unified cache holding any
// other sequence id, up to 255, over overlapping positions), and any state the
// parser (llama/state.hpp) or the model's shape does not match. After the
// removal, any failure restores the original blob: nothing is lost.
//
// The rule for direct callers: compress right after a llama_decode. A K-shift
// (llama_memory_seq_add / seq_div) or a cross-stream llama_memory_seq_cp is
// applied only at the next decode, and the state read does not apply it: a
// compression in that window would keep stale keys. ContextManager
// (llama/context.hpp) follows the rule by construction.
//
// Query tails (Options::with_query_tail()): a QueryCapture (llama/queries.hpp)
// takes the prompt's last queries during its prefill through cb_eval, and the
// compression scores with them against the state's keys. It needs the sequence
// as prefilled (positions 0..N-1) and a K cache of f32, f16 or bf16. A capture
// that follows a running sequence (QueryCapture::follow, as ContextManager
// does) needs the cells at consecutive positions lo..hi and its last query at hi.
//
// Threads: the layers are scored in parallel on CompressParams::n_threads
// (0: the context's llama_n_threads), by a pool the compressor keeps; the kept
// cells do not depend on the count.
//
// Sliding-window models (gemma2, gemma3): the state holds the global layers'
// cache, then the sliding layers'; the global layers are scored (query tails
// with those layers' captured queries) and compacted, the sliding section is
// written back byte for byte, and the cells of the window (positions above
// pos_max - n_swa) are always kept: a budget that cannot hold them is refused.
//
// The newest cell is always kept (SelectOptions::window is raised to at least 1):
// llama.cpp requires a new token's position to follow the sequence's last.
// K and V bytes are copied as they are (f32, f16, bf16, q8_0), never
// requantized; scoring reads them as float. A q8_0 K cache is stored
// Hadamard-rotated along the head dim; the score (residual energies along the
// token axis) does not change under a rotation of the head dim.
#include <llama.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "flashcache/error.hpp"
#include "flashcache/llama/checks.hpp"
#include "flashcache/llama/params.hpp"
#include "flashcache/llama/queries.hpp"
#include "flashcache/llama/sequence.hpp"
#include "flashcache/mask.hpp"
#include "flashcache/options.hpp"
#include "flashcache/parallel.hpp"
#include "flashcache/score.hpp"
#include "flashcache/shared_keep.hpp"
#include "flashcache/view.hpp"

namespace flashcache {
namespace llama {

// Compresses sequences one after another, keeping its buffers and its scoring
// threads between calls.
class SequenceCompressor {
 public:
  // Reads sequence `seq`'s state and compacts it to p.budget cells.
  Status compress(llama_context* ctx, llama_seq_id seq, const CompressParams& p, CompactionStats* stats) {
    const auto t0 = std::chrono::steady_clock::now();
    FLASHCACHE_RETURN_IF_ERROR(check_supported(ctx, seq));
    FLASHCACHE_RETURN_IF_ERROR(check_compress_params(p));
    FLASHCACHE_RETURN_IF_ERROR(state_.read(ctx, seq));
    return compress_read(ctx, p, stats, t0);
  }

  // The same from a state the caller holds: `data` must be the sequence's
  // current state as llama_state_seq_get_data wrote it (it is also what a
  // failure restores). A blob the parser or the model refuses leaves the
  // sequence untouched.
  Status compress_state(llama_context* ctx, llama_seq_id seq, const std::uint8_t* data, std::size_t size,
                        const CompressParams& p, CompactionStats* stats) {
    const auto t0 = std::chrono::steady_clock::now();
    FLASHCACHE_RETURN_IF_ERROR(check_supported(ctx, seq));
    FLASHCACHE_RETURN_IF_ERROR(check_compress_params(p));
    FLASHCACHE_RETURN_IF_ERROR(state_.adopt(ctx, seq, data, size));
    return compress_read(ctx, p, stats, t0);
  }

  // The positions of the cells the last successful compress() kept, ascending.
  const std::vector<llama_pos>& kept_positions() const { return kept_pos_; }

 private:
  using clock = std::chrono::steady_clock;
  static double ms(clock::time_point a, clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  }

  // One scoring thread's scratch: grows to the largest layer, then reused.
  struct LayerScratch {
    Scorer<float> scorer;
    TailAccumulator tail;
    std::vector<float> k, v, tails;
    std::vector<HeadEnergy> energy;
    Status status;
  };

  // Steps, on the state read: check the queries, map the layers, score every layer, select one
  // keep-set and write its state, replace the sequence (restored on failure), archive the evicted.
  Status compress_read(llama_context* ctx, const CompressParams& p, CompactionStats* stats, clock::time_point t0) {
    CompactionStats st;
    FLASHCACHE_RETURN_IF_ERROR(describe(ctx, p, &st));
    FLASHCACHE_RETURN_IF_ERROR(state_.map_layers());
    const SeqState& s = state_.state();
    const std::vector<std::int32_t>& order = state_.order();
    const auto t1 = clock::now();
    st.read_ms = ms(t0, t1);

    const std::uint32_t n = s.cell_count;
    std::int64_t keep = 0;
    FLASHCACHE_RETURN_IF_ERROR(p.budget.resolve(n, &keep));
    if (keep < std::min<std::int64_t>(n, 1))
      return make_error(Errc::invalid_budget, "llama: keep budget ", keep, " drops the newest cell");
    SelectOptions select = p.options.select;
    select.window = std::max<std::int64_t>(select.window, 1);  // the newest cell: decoding continues after it
    kept_.resize(static_cast<std::size_t>(keep));
    // A sliding-window model's window stays: the sliding layers' section is kept as it is, and
    // the global layers keep the same recent positions.
    const std::int64_t in_window = state_.window_cells();
    if (keep < in_window)
      return make_error(Errc::invalid_budget, "llama: keep budget ", keep, " cannot hold the sliding window's ",
                        in_window, " cells (positions above ", st.pos_max - state_.n_swa(), ", n_swa ", state_.n_swa(),
                        ")");
    protect_mask_.assign(p.protect_count > 0 || in_window > 0 ? n : 0, 0);
    for (std::size_t i = 0; i < protect_mask_.size(); ++i) {
      const std::int32_t pos = s.pos[static_cast<std::size_t>(order[i])];
      protect_mask_[i] = std::binary_search(p.protect, p.protect + p.protect_count, pos) || state_.in_window(pos);
    }
    st.threads = scoring_threads(ctx, p.n_threads);
    auto t2 = clock::now();
    if (keep == static_cast<std::int64_t>(n)) {
      for (std::int64_t i = 0; i < keep; ++i) kept_[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
    } else {
      FLASHCACHE_RETURN_IF_ERROR(score_layers(st, p.options.score, p.queries, p.budget.keep_ratio(n)));
      t2 = clock::now();
      // check_compress_params checked the options and the shared ones.
      FLASHCACHE_RETURN_IF_ERROR(flashcache::detail::select_shared_tokens_trusted(
          views_.data(), st.layers, keep, select, protect_mask_.empty() ? ProtectMask{} : ProtectMask(protect_mask_),
          ImageSpans{}, shared_keep(p), &ws_, kept_.data()));
    }
    st.score_ms = ms(t1, t2);
    const auto t3 = clock::now();
    st.select_ms = ms(t2, t3);
    cells_.resize(kept_.size());
    for (std::size_t i = 0; i < kept_.size(); ++i) cells_[i] = order[static_cast<std::size_t>(kept_[i])];
    evicted_.clear();  // the cells not kept, by position: the archive's, once the sequence is replaced
    if (p.archive != nullptr) {
      FLASHCACHE_RETURN_IF_ERROR(state_.prepare_archive(p.archive, p.archive_options));
      keep_mask_.assign(n, 0);
      for (const std::int32_t i : kept_) keep_mask_[static_cast<std::size_t>(i)] = 1;
      for (std::uint32_t i = 0; i < n; ++i)
        if (!keep_mask_[i]) evicted_.push_back(order[i]);
    }
    FLASHCACHE_RETURN_IF_ERROR(state_.write_cells(cells_.data(), static_cast<std::uint32_t>(keep)));
    FLASHCACHE_RETURN_IF_ERROR(replace(ctx, st.pos_max, keep));
    if (p.archive != nullptr) {
      const std::int64_t dropped = p.archive->dropped_tokens();
      const auto archived = static_cast<std::int64_t>(evicted_.size());
      FLASHCACHE_RETURN_IF_ERROR(state_.archive_cells(evicted_.data(), archived, p.archive));  // cannot fail: prepared
      st.archived = archived;
      st.archive_dropped = p.archive->dropped_tokens() - dropped;
    }
    st.query_tails = p.queries != nullptr && keep < static_cast<std::int64_t>(n);  // scored with them
    st.cells_after = keep;
    st.kv_bytes_after = n == 0 ? 0 : st.kv_bytes_before / n * static_cast<std::uint64_t>(keep);
    st.state_bytes_after = state_.written().size();
    kept_pos_.resize(cells_.size());
    for (std::size_t i = 0; i < cells_.size(); ++i) kept_pos_[i] = state_.position(cells_[i]);
    st.pos_min_after = kept_pos_.front();
    const auto t4 = clock::now();
    st.write_ms = ms(t3, t4);
    st.compress_ms = ms(t0, t4);
    if (stats != nullptr) *stats = st;
    return Status::success();
  }

  // The read state's numbers into the report, and the queries checked against it.
  Status describe(llama_context* ctx, const CompressParams& p, CompactionStats* st) const {
    const SeqState& s = state_.state();
    st->pos_min_before = state_.pos_min();
    st->pos_max = state_.pos_max();
    st->cells_before = s.cell_count;
    st->kv_bytes_before = s.kv_bytes();
    st->state_bytes_before = state_.blob_size();
    st->layers = static_cast<std::int64_t>(s.layers.size());
    st->kv_heads = state_.kv_heads();
    st->head_dim = state_.head_dim();
    st->v_trans = s.v_trans;
    st->k_type = type_name(s.layers[0].k_type);
    st->v_type = type_name(s.layers[0].v_type);
    if (p.queries != nullptr) {
      const llama_model* model = llama_get_model(ctx);
      FLASHCACHE_RETURN_IF_ERROR(
          detail::check_queries(*p.queries, s, llama_model_n_layer(model), st->kv_heads, st->head_dim));
      FLASHCACHE_RETURN_IF_ERROR(detail::check_logit_scale(model));
    }
    return Status::success();
  }

  // Scores every layer over the cells in position order into scores_ / views_,
  // layer l on worker l % threads, for a budget that keeps `keep` of the cells
  // (ScoreInputs::keep); the first failing layer's error is returned.
  Status score_layers(const CompactionStats& st, const ScoreOptions& o, const QueryCapture* queries, double keep) {
    const SeqState& s = state_.state();
    const std::vector<std::int32_t>& order = state_.order();
    const std::uint32_t n = s.cell_count;
    const std::int64_t layers = st.layers, heads = st.kv_heads;
    const int threads = static_cast<int>(std::min<std::int64_t>(st.threads, layers));
    pool_.resize(threads);
    if (scratch_.size() < static_cast<std::size_t>(threads)) scratch_.resize(static_cast<std::size_t>(threads));
    scores_.resize(static_cast<std::size_t>(layers * heads) * n);
    views_.resize(static_cast<std::size_t>(layers));
    layer_status_.assign(static_cast<std::size_t>(layers), Status::success());
    auto score_layer = [&](std::int64_t l, int w) {
      LayerScratch& x = scratch_[static_cast<std::size_t>(w)];
      const LayerState& L = s.layers[static_cast<std::size_t>(l)];
      const std::int64_t dim = static_cast<std::int64_t>(L.k_embd) / heads;
      x.k.resize(static_cast<std::size_t>(n) * L.k_embd);
      x.v.resize(static_cast<std::size_t>(n) * L.v_embd);
      x.energy.resize(static_cast<std::size_t>(heads));
      layer_to_float(state_.blob(), s, static_cast<std::size_t>(l), Part::k, order.data(), n, x.k.data());
      layer_to_float(state_.blob(), s, static_cast<std::size_t>(l), Part::v, order.data(), n, x.v.data());
      const KVView<const float> k = nhd(static_cast<const float*>(x.k.data()), Tokens(n), Heads(heads), HeadDim(dim));
      const KVView<const float> v = nhd(static_cast<const float*>(x.v.data()), Tokens(n), Heads(heads), HeadDim(dim));
      float* score = scores_.data() + static_cast<std::size_t>(l * heads) * n;
      TailView<const float> tails;
      Status& status = layer_status_[static_cast<std::size_t>(l)];
      if (queries != nullptr) {  // the captured queries against this layer's keys, in position order
        x.tails.assign(static_cast<std::size_t>(heads) * n, 0.0f);
        const TailView<float> out{x.tails.data(), heads, static_cast<std::int64_t>(n)};
        const QueryWindow& w = queries->window(state_.model_layers()[static_cast<std::size_t>(l)]);
        const std::int64_t lo = state_.position(order[0]);  // key index = position - lo
        for (int i = 0; i < w.pieces() && status.ok(); ++i) {
          const QueryPiece piece = w.piece(i);
          status = x.tail.add(piece.q, piece.first - lo, k, nullptr, out);
        }
        if (!status.ok()) return;
        tails = out;
      }
      status = flashcache::detail::score_trusted(&x.scorer, k, v, o, ScoreBuffers{score, x.energy.data(), nullptr},
                                                 ScoreInputs{ImageSpans{}, tails, keep});
      views_[static_cast<std::size_t>(l)] = ScoreView{score, heads, n};
    };
    pool_.run(layers, score_layer);
    for (const Status& status : layer_status_)
      if (!status.ok()) return status;
    return Status::success();
  }

  // Replaces the sequence by its kept cells and checks what llama.cpp now holds: the positions
  // (a sliding-window model's memory reports its sliding section's lowest) and the state's size.
  Status replace(llama_context* ctx, llama_pos pos_max, std::int64_t keep) {
    const SeqState& s = state_.state();
    const llama_pos want_min = s.sliding.size > 0 ? s.sliding.pos_min : state_.position(cells_.front());
    const llama_seq_id seq = state_.id();
    return state_.replace("llama", [&]() -> Status {
      llama_memory_t mem = llama_get_memory(ctx);
      const std::size_t expect = state_.written().size();
      if (llama_memory_seq_pos_max(mem, seq) != pos_max || llama_memory_seq_pos_min(mem, seq) != want_min)
        return make_error(Errc::unsupported, "llama: after compaction positions are [",
                          llama_memory_seq_pos_min(mem, seq), ", ", llama_memory_seq_pos_max(mem, seq), "], expected [",
                          want_min, ", ", pos_max, "]");
      if (llama_state_seq_get_size(ctx, seq) != expect)
        return make_error(Errc::unsupported, "llama: after compaction the sequence's state is ",
                          llama_state_seq_get_size(ctx, seq), " bytes, expected ", expect, " (", keep, " cells)");
      return Status::success();
    });
  }

  SequenceState state_;
  WorkerPool pool_;
  std::vector<LayerScratch> scratch_;
  std::vector<Status> layer_status_;
  SharedKeepWorkspace ws_;
  std::vector<float> scores_;
  std::vector<ScoreView> views_;
  std::vector<std::int32_t> kept_, cells_, evicted_;
  std::vector<std::uint8_t> protect_mask_, keep_mask_;  // [cells by position]: CompressParams::protect; kept
  std::vector<llama_pos> kept_pos_;
};

// The one-shot form of SequenceCompressor::compress.
inline Status compress_sequence(llama_context* ctx, llama_seq_id seq, const CompressParams& p, CompactionStats* stats) {
  SequenceCompressor c;
  return c.compress(ctx, seq, p, stats);
}

}  // namespace llama
}  // namespace flashcache
