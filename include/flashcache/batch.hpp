#pragma once
// The no-throw CPU entry for a ragged batch of sequences, described as the
// GPU API describes it (cuda/cache.cuh): every layer's view packs the
// sequences along its token axis, sequence b owning rows [indptr[b],
// indptr[b + 1]). Each sequence is compressed on its own: scored, its budgets
// planned over the layers (plan.hpp), selected and gathered into caller
// buffers. Nothing throws; nothing is allocated once the workspace has seen a
// batch this large (Transform::global).
//
//   flashcache::BatchWorkspace<> ws;                  // reuse across calls
//   flashcache::Status s = flashcache::compress_batch(k, v, layers, batch, budget, opt, masks, spans, &ws, out);
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "gather.hpp"
#include "mask.hpp"
#include "options.hpp"
#include "plan.hpp"
#include "score.hpp"
#include "select.hpp"
#include "view.hpp"

namespace flashcache {

// Sequences packed along the token axis; a null indptr is one sequence of
// each layer's full length (layers may then differ in length).
struct Batch {
  int sequences = 1;
  const std::int32_t* indptr = nullptr;  // [sequences + 1], host memory
};

// Where compress_batch() writes; arrays indexed [layer][sequence] have
// `sequences` entries per layer. Layer l's capacity is k[l].tokens.
template <class T>
struct BatchOutputs {
  // Required. Kept indices (within each sequence), ascending: head h of
  // sequence b in layer l at kept[l][h * capacity + kept_indptr[l * (sequences + 1) + b] + i].
  std::int32_t* const* kept = nullptr;  // [layers] arrays of heads * capacity
  std::int32_t* kept_indptr = nullptr;  // [layers][sequences + 1]
  // Optional.
  std::int64_t* budgets = nullptr;    // [layers][sequences]: tokens kept per head
  double* energy_ratio = nullptr;     // [layers][sequences]: R_l
  std::int64_t* nonfinite = nullptr;  // [layers][sequences]: (head, token) rows with NaN/inf
  // Optional dense compact cache: kept row i of sequence b goes to row
  // kept_indptr[l * (sequences + 1) + b] + i of k_out[l] / v_out[l].
  const KVView<T>* k_out = nullptr;  // [layers]
  const KVView<T>* v_out = nullptr;  // [layers]
};

// Caller-owned state of compress_batch(): the scorer's transforms and every
// buffer, kept between calls.
template <class Real = float>
struct BatchWorkspace {
  Scorer<Real> scorer;
  BudgetPlanner planner;
  SelectWorkspace select;
  std::vector<float> scores;
  std::vector<HeadEnergy> energy;
  std::vector<LayerSummary> summary;
  std::vector<std::int64_t> budgets;
};

namespace detail {

// "layer 2: ..." or, in a batch of several, "sequence 1, layer 2: ...".
inline Status at_layer(const Status& s, int sequences, int b, int l) {
  if (s.ok()) return s;
  if (sequences > 1) return make_error(s.code(), "sequence ", b, ", layer ", l, ": ", s.message());
  return make_error(s.code(), "layer ", l, ": ", s.message());
}

template <class T, class U>
Status check_batch(const KVView<const T>* k, const KVView<const T>* v, int layers, Batch batch,
                   const ProtectMask* masks, const BatchOutputs<U>& out) {
  if (layers < 0) return make_error(Errc::invalid_shape, "layer count ", layers, " is negative");
  if (layers == 0) return Status::success();
  if (k == nullptr || v == nullptr) return make_error(Errc::invalid_shape, "null K or V layer array");
  if (out.kept == nullptr || out.kept_indptr == nullptr)
    return make_error(Errc::invalid_shape, "outputs: kept and kept_indptr are required");
  if (batch.sequences < 1) return make_error(Errc::invalid_shape, "batch of ", batch.sequences, " sequences");
  if (batch.indptr == nullptr && batch.sequences != 1)
    return make_error(Errc::invalid_shape, "a batch of ", batch.sequences, " sequences needs an indptr");
  if (batch.indptr != nullptr) {
    if (batch.indptr[0] < 0) return make_error(Errc::invalid_shape, "indptr[0] is ", batch.indptr[0]);
    for (int b = 0; b < batch.sequences; ++b)
      if (batch.indptr[b + 1] < batch.indptr[b])
        return make_error(Errc::invalid_shape, "indptr decreases at sequence ", b, " (", batch.indptr[b], " > ",
                          batch.indptr[b + 1], ")");
  }
  for (int l = 0; l < layers; ++l) {
    FLASHCACHE_RETURN_IF_ERROR(at_layer(check_pair(k[l], v[l]), 1, 0, l));
    const std::int64_t capacity = k[l].tokens;
    if (batch.indptr != nullptr && batch.indptr[batch.sequences] > capacity)
      return make_error(Errc::invalid_shape, "layer ", l, ": indptr ends at ", batch.indptr[batch.sequences],
                        " but the view holds ", capacity, " tokens");
    if (masks != nullptr) FLASHCACHE_RETURN_IF_ERROR(at_layer(check_mask(masks[l], capacity), 1, 0, l));
    if (k[l].heads * capacity > 0 && out.kept[l] == nullptr)
      return make_error(Errc::invalid_shape, "layer ", l, ": null kept buffer");
    // An array, not a braced list: nvcc's front end rejects a range-for over one here.
    const KVView<U>* const outputs[2] = {out.k_out, out.v_out};
    for (const KVView<U>* dst : outputs)
      if (dst != nullptr && (dst[l].heads != k[l].heads || dst[l].head_dim != k[l].head_dim))
        return make_error(Errc::invalid_shape, "layer ", l, ": output is ", dst[l].heads, " heads x ", dst[l].head_dim,
                          " dims but the cache is ", k[l].heads, " x ", k[l].head_dim);
  }
  return Status::success();
}

}  // namespace detail

// Compresses every sequence of the batch into the caller's outputs; see the
// top of this file. `masks` holds one mask per layer over the packed tokens,
// or is null; `spans` are image spans at the same positions in every sequence
// (as the GPU takes them), or none.
template <class T, class U, class Real>
Status compress_batch(const KVView<const T>* k, const KVView<const T>* v, int layers, Batch batch, Budget budget,
                      const Options& opt, const ProtectMask* masks, ImageSpans spans, BatchWorkspace<Real>* ws,
                      const BatchOutputs<U>& out) {
  static_assert(std::is_same_v<T, U>, "outputs hold the cache's element type");
  FLASHCACHE_RETURN_IF_ERROR(check_options(opt));
  if (ws == nullptr) return make_error(Errc::invalid_shape, "compress_batch: null workspace");
  FLASHCACHE_RETURN_IF_ERROR(detail::check_batch(k, v, layers, batch, masks, out));
  if (layers == 0) return Status::success();
  const int sequences = batch.sequences;
  const auto count = static_cast<std::size_t>(layers);
  ws->summary.resize(count);
  ws->budgets.resize(count);
  for (int l = 0; l < layers; ++l) out.kept_indptr[l * (sequences + 1)] = 0;

  for (int b = 0; b < sequences; ++b) {
    // Scores of every layer first: planning needs all their energies.
    std::int64_t score_size = 0, energy_size = 0;
    for (int l = 0; l < layers; ++l) {
      const std::int64_t len = batch.indptr ? batch.indptr[b + 1] - batch.indptr[b] : k[l].tokens;
      score_size += k[l].heads * len;
      energy_size += k[l].heads;
    }
    ws->scores.resize(static_cast<std::size_t>(score_size));
    ws->energy.resize(static_cast<std::size_t>(energy_size));
    std::int64_t score_at = 0, energy_at = 0;
    for (int l = 0; l < layers; ++l) {
      const std::int64_t first = batch.indptr ? batch.indptr[b] : 0;
      const std::int64_t len = batch.indptr ? batch.indptr[b + 1] - first : k[l].tokens;
      const ProtectMask mask = masks ? masks[l].slice(first, len) : ProtectMask{};
      float* scores = ws->scores.data() + score_at;
      HeadEnergy* energy = ws->energy.data() + energy_at;
      std::int64_t nonfinite = 0;
      FLASHCACHE_RETURN_IF_ERROR(detail::at_layer(
          ws->scorer.score(token_range(k[l], first, len), token_range(v[l], first, len), opt.score,
                           ScoreBuffers{scores, energy, &nonfinite}, ScoreInputs{spans, {}, budget.keep_ratio(len)}),
          sequences, b, l));
      ws->summary[static_cast<std::size_t>(l)] = summarize({scores, k[l].heads, len}, energy, opt.select, mask);
      if (out.nonfinite) out.nonfinite[l * sequences + b] = nonfinite;
      score_at += k[l].heads * len;
      energy_at += k[l].heads;
    }
    Status planned = ws->planner.plan(ws->summary.data(), layers, budget, opt.allocate, ws->budgets.data());
    if (!planned.ok())
      return sequences > 1 ? make_error(planned.code(), "sequence ", b, ": ", planned.message()) : planned;

    score_at = 0;
    for (int l = 0; l < layers; ++l) {
      const std::int64_t first = batch.indptr ? batch.indptr[b] : 0;
      const std::int64_t len = batch.indptr ? batch.indptr[b + 1] - first : k[l].tokens;
      const std::int64_t keep = ws->budgets[static_cast<std::size_t>(l)];
      const std::int64_t capacity = k[l].tokens;
      const std::int32_t row = out.kept_indptr[l * (sequences + 1) + b];
      const ProtectMask mask = masks ? masks[l].slice(first, len) : ProtectMask{};
      std::int32_t* kept = out.kept[l] + row;
      FLASHCACHE_RETURN_IF_ERROR(
          detail::at_layer(select_tokens(ScoreView{ws->scores.data() + score_at, k[l].heads, len}, keep, opt.select,
                                         mask, spans, &ws->select, KeptView{kept, capacity}),
                           sequences, b, l));
      out.kept_indptr[l * (sequences + 1) + b + 1] = row + static_cast<std::int32_t>(keep);
      const KVView<const T>* const sources[2] = {k, v};
      const KVView<U>* const outputs[2] = {out.k_out, out.v_out};
      for (int i = 0; i < 2; ++i) {
        const KVView<const T>* src = sources[i];
        const KVView<U>* dst = outputs[i];
        if (dst == nullptr) continue;
        if (row + keep > dst[l].tokens)
          return make_error(Errc::invalid_shape, "layer ", l, ": output holds ", dst[l].tokens, " rows, ", row + keep,
                            " needed");
        FLASHCACHE_RETURN_IF_ERROR(detail::at_layer(
            gather(token_range(src[l], first, len), kept, capacity, token_range(dst[l], row, keep)), sequences, b, l));
      }
      if (out.budgets) out.budgets[l * sequences + b] = keep;
      if (out.energy_ratio)
        out.energy_ratio[l * sequences + b] = ws->planner.energy_ratio()[static_cast<std::size_t>(l)];
      score_at += k[l].heads * len;
    }
  }
  return Status::success();
}

}  // namespace flashcache
