#pragma once
// flashcache: frequency-domain, outlier-aware KV cache compression (FlashCache,
// arXiv 2511.16786), CPU front door.
//
//   score     DCT along tokens, low-pass, inverse, residual -> outlier scores
//   allocate  per-layer budgets from high-frequency energy (whole model)
//   select    per head: protected tokens + top scores, ascending
//   gather    dense compact K', V'
//
//   namespace fc = flashcache;
//   auto out = fc::compress(fc::hnd(k, fc::Heads(H), fc::Tokens(N), fc::HeadDim(d)),
//                           fc::hnd(v, fc::Heads(H), fc::Tokens(N), fc::HeadDim(d)), fc::Budget::ratio(0.2));
//
// Every entry point validates its input and throws flashcache::Error with a
// message naming the problem; this throwing front door exists only when
// exceptions are on (config.hpp). Under it, and always available, is the
// no-throw core: Scorer::score into caller buffers (score.hpp), summarize and
// BudgetPlanner::plan (plan.hpp), select_tokens with a SelectWorkspace
// (select.hpp), gather into caller views (gather.hpp), and compress_batch for
// a ragged batch (batch.hpp); each returns a Status. The GPU API is in
// flashcache/cuda/.
#include <cmath>
#include <cstdint>
#include <numeric>
#include <type_traits>
#include <vector>

#include "allocate.hpp"
#include "batch.hpp"
#include "error.hpp"
#include "gather.hpp"
#include "mask.hpp"
#include "options.hpp"
#include "plan.hpp"
#include "query_window.hpp"
#include "score.hpp"
#include "select.hpp"
#include "shared_keep.hpp"
#include "types.hpp"
#include "version.hpp"
#include "view.hpp"

namespace flashcache {

// One compressed layer: the kept token indices and a dense [heads][budget][head_dim] K', V'.
template <class T>
struct CompressedLayer {
  std::int64_t heads = 0;
  std::int64_t tokens = 0;  // before compression
  std::int64_t budget = 0;  // kept per head
  std::int64_t head_dim = 0;
  std::vector<std::int32_t> kept;  // [heads][budget], ascending per head
  std::vector<T> k, v;             // [heads][budget][head_dim]
  LayerScores scores;

  KVView<const T> k_view() const { return hnd(k.data(), Heads(heads), Tokens(budget), HeadDim(head_dim)); }
  KVView<const T> v_view() const { return hnd(v.data(), Heads(heads), Tokens(budget), HeadDim(head_dim)); }
  const std::int32_t* kept_head(std::int64_t h) const { return kept.data() + h * budget; }
};

template <class T>
struct CompressedModel {
  std::vector<CompressedLayer<T>> layers;
  std::vector<double> energy_ratio;   // R_l per layer
  std::vector<std::int64_t> budgets;  // B_l per layer (tokens kept per head)
  std::int64_t nonfinite = 0;         // (layer, head, token) rows with NaN/inf

  std::int64_t tokens_before() const {
    std::int64_t s = 0;
    for (const auto& l : layers) s += l.tokens;
    return s;
  }
  std::int64_t tokens_after() const {
    std::int64_t s = 0;
    for (auto b : budgets) s += b;
    return s;
  }
};

namespace detail {

// Gather K', V' of a layer whose out->kept ([heads][budget]) is filled.
template <class T>
Status gather_layer(KVView<const T> k, KVView<const T> v, std::int64_t budget, LayerScores scores,
                    CompressedLayer<T>* out) {
  out->heads = k.heads;
  out->tokens = k.tokens;
  out->budget = budget;
  out->head_dim = k.head_dim;
  const auto size = static_cast<std::size_t>(k.heads * budget * k.head_dim);
  out->k.resize(size);
  out->v.resize(size);
  FLASHCACHE_RETURN_IF_ERROR(
      gather(k, out->kept.data(), hnd(out->k.data(), Heads(k.heads), Tokens(budget), HeadDim(k.head_dim))));
  FLASHCACHE_RETURN_IF_ERROR(
      gather(v, out->kept.data(), hnd(out->v.data(), Heads(k.heads), Tokens(budget), HeadDim(k.head_dim))));
  out->scores = std::move(scores);
  return Status::success();
}

// Select and gather one scored layer into an owning CompressedLayer.
template <class T>
Status select_and_gather(KVView<const T> k, KVView<const T> v, std::int64_t budget, const SelectOptions& opt,
                         ProtectMask mask, ImageSpans spans, SelectWorkspace* ws, LayerScores scores,
                         CompressedLayer<T>* out) {
  if (budget >= 0 && budget <= k.tokens) out->kept.resize(static_cast<std::size_t>(k.heads * budget));
  FLASHCACHE_RETURN_IF_ERROR(
      select_tokens(scores.view(), budget, opt, mask, spans, ws, KeptView{out->kept.data(), budget}));
  return gather_layer<T>(k, v, budget, std::move(scores), out);
}

// Layer l's mask: masks[l] when given, else none; it must cover the layer.
inline Status layer_mask(const std::vector<ProtectMask>& masks, std::size_t l, std::int64_t tokens, ProtectMask* out) {
  *out = masks.empty() ? ProtectMask{} : masks[l];
  return check_mask(*out, tokens);
}

// Views of const elements.
template <class T>
std::vector<KVView<const std::remove_const_t<T>>> const_views(const std::vector<KVView<T>>& x) {
  return {x.begin(), x.end()};
}

template <class T>
Status check_model_inputs(const std::vector<KVView<T>>& k, std::size_t v_layers, const Options& opt) {
  if (k.size() != v_layers) return make_error(Errc::invalid_shape, k.size(), " K layers but ", v_layers, " V layers");
  return check_options(opt);
}

// The layer counts of a scored model must agree (masks: one per layer, or none).
inline Status check_model_layers(std::size_t k, std::size_t v, std::size_t scored, std::size_t masks) {
  if (k != v || k != scored || (masks != 0 && masks != k))
    return make_error(Errc::invalid_shape, k, " K layers, ", v, " V layers, ", scored, " scored layers, ", masks,
                      " masks");
  return Status::success();
}

// The first step of both model paths: each layer's mask (masks: one per layer,
// or none), its summary for the planner and R_l, and the non-finite count.
template <class T>
Status summarize_model(const std::vector<KVView<const T>>& k, const std::vector<LayerScores>& scores,
                       const Options& opt, const std::vector<ProtectMask>& masks, std::vector<ProtectMask>* mask,
                       std::vector<LayerSummary>* summary, CompressedModel<T>* model) {
  mask->assign(k.size(), ProtectMask{});
  summary->assign(k.size(), LayerSummary{});
  model->energy_ratio.resize(k.size());
  model->nonfinite = 0;
  for (std::size_t l = 0; l < k.size(); ++l) {
    FLASHCACHE_RETURN_IF_ERROR(at_layer(layer_mask(masks, l, k[l].tokens, &(*mask)[l]), 1, 0, static_cast<int>(l)));
    (*summary)[l] = summarize(scores[l].view(), scores[l].energy.data(), opt.select, (*mask)[l]);
    model->energy_ratio[l] = (*summary)[l].energy_ratio();
    model->nonfinite += scores[l].nonfinite;
  }
  return Status::success();
}

}  // namespace detail

namespace detail {

// out->kept = `set` (budget tokens) repeated for each of the layer's heads, then K', V'.
template <class T>
Status gather_shared(KVView<const T> k, KVView<const T> v, const std::vector<std::int32_t>& set, LayerScores scores,
                     CompressedLayer<T>* out) {
  const auto budget = static_cast<std::int64_t>(set.size());
  out->kept.resize(static_cast<std::size_t>(k.heads * budget));
  for (std::int64_t h = 0; h < k.heads; ++h)
    std::copy(set.begin(), set.end(), out->kept.begin() + static_cast<std::ptrdiff_t>(h * budget));
  return gather_layer<T>(k, v, budget, std::move(scores), out);
}

// compress_scored_model's per_head keep-set: planned budgets, each head its own set.
template <class T>
Status compress_per_head(const std::vector<KVView<const T>>& k, const std::vector<KVView<const T>>& v,
                         std::vector<LayerScores> scores, Budget budget, const Options& opt,
                         const std::vector<ProtectMask>& mask, ImageSpans spans,
                         const std::vector<LayerSummary>& summary, CompressedModel<T>* model) {
  model->budgets.resize(k.size());
  BudgetPlanner planner;
  FLASHCACHE_RETURN_IF_ERROR(
      planner.plan(summary.data(), static_cast<int>(k.size()), budget, opt.allocate, model->budgets.data()));
  model->layers.resize(k.size());
  SelectWorkspace ws;
  for (std::size_t l = 0; l < k.size(); ++l)
    FLASHCACHE_RETURN_IF_ERROR(at_layer(select_and_gather<T>(k[l], v[l], model->budgets[l], opt.select, mask[l], spans,
                                                             &ws, std::move(scores[l]), &model->layers[l]),
                                        1, 0, static_cast<int>(l)));
  return Status::success();
}

// compress_scored_model's per_layer and per_sequence keep-sets (see there).
template <class T>
Status compress_shared(const std::vector<KVView<const T>>& k, const std::vector<KVView<const T>>& v,
                       std::vector<LayerScores> scores, Budget budget, const Options& opt,
                       const SharedKeepOptions& shared, const std::vector<ProtectMask>& mask, ImageSpans spans,
                       std::vector<LayerSummary> summary, CompressedModel<T>* model) {
  const int layers = static_cast<int>(k.size());
  // A layer's floor is its shared always-kept count: the union over its heads, in whole pages.
  std::vector<ScoreView> views(k.size());
  for (std::size_t l = 0; l < k.size(); ++l) {
    views[l] = scores[l].view();
    summary[l].protected_count = shared_protected_count(&views[l], 1, opt.select, mask[l], shared.page);
  }
  model->budgets.resize(k.size());
  model->layers.resize(k.size());
  SharedKeepWorkspace ws;
  std::vector<std::int32_t> set;
  if (shared.keep_set == KeepSet::per_layer) {
    BudgetPlanner planner;
    FLASHCACHE_RETURN_IF_ERROR(planner.plan(summary.data(), layers, budget, opt.allocate, model->budgets.data()));
    for (std::size_t l = 0; l < k.size(); ++l) {
      const int at = static_cast<int>(l);
      set.resize(static_cast<std::size_t>(model->budgets[l]));
      FLASHCACHE_RETURN_IF_ERROR(at_layer(select_shared_tokens_trusted(&views[l], 1, model->budgets[l], opt.select,
                                                                       mask[l], spans, shared, &ws, set.data()),
                                          1, 0, at));
      FLASHCACHE_RETURN_IF_ERROR(
          at_layer(gather_shared<T>(k[l], v[l], set, std::move(scores[l]), &model->layers[l]), 1, 0, at));
    }
    return Status::success();
  }
  if (k.empty()) return Status::success();
  const std::int64_t n = k[0].tokens;
  for (std::size_t l = 1; l < k.size(); ++l)
    if (k[l].tokens != n)
      return make_error(Errc::invalid_shape, "keep set per_sequence needs one token count: layer ", l, " has ",
                        k[l].tokens, " tokens, layer 0 has ", n);
  std::vector<std::uint8_t> united;
  for (const ProtectMask& m : mask)
    if (!m.empty()) {
      united.resize(static_cast<std::size_t>(n), 0);
      for (std::int64_t t = 0; t < n; ++t) united[static_cast<std::size_t>(t)] |= static_cast<std::uint8_t>(m[t]);
    }
  std::int64_t keep = 0;
  FLASHCACHE_RETURN_IF_ERROR(budget.resolve(n, &keep));
  set.resize(static_cast<std::size_t>(keep));
  FLASHCACHE_RETURN_IF_ERROR(select_shared_tokens_trusted(
      views.data(), static_cast<std::int64_t>(views.size()), keep, opt.select,
      united.empty() ? ProtectMask{} : ProtectMask{united}, spans, shared, &ws, set.data()));
  for (std::size_t l = 0; l < k.size(); ++l) {
    model->budgets[l] = keep;
    FLASHCACHE_RETURN_IF_ERROR(at_layer(gather_shared<T>(k[l], v[l], set, std::move(scores[l]), &model->layers[l]), 1,
                                        0, static_cast<int>(l)));
  }
  return Status::success();
}

}  // namespace detail

// Plan, select and gather for a whole model whose layers are scored already,
// by Scorer or by any policy that writes LayerScores, into an owning result,
// without throwing (compress_model's second half). `masks`: one per layer, or
// none; `spans`: the request's image spans. The keep-set:
//   per_head      every head its own tokens, the budgets planned over the
//                 layers (opt.allocate);
//   per_layer     one set per layer shared by its heads (shared_keep.hpp), the
//                 budgets planned as per_head plans them, each layer's floor
//                 being its shared always-kept count (the union over its
//                 heads, in whole pages). With page > 1 every planned budget
//                 must be whole pages, or the layer's error names the nearest;
//   per_sequence  one set for all layers and heads of budget.resolve(N) tokens
//                 (N the layers' common token count); the allocation does not
//                 apply, and the masks are united.
// layers[l].kept repeats a shared set for each head.
template <class T>
Status compress_scored_model(const std::vector<KVView<const T>>& k, const std::vector<KVView<const T>>& v,
                             std::vector<LayerScores> scores, Budget budget, const Options& opt,
                             const SharedKeepOptions& shared, const std::vector<ProtectMask>& masks, ImageSpans spans,
                             CompressedModel<T>* model) {
  // The scores are given: only the selection and the allocation are read.
  FLASHCACHE_RETURN_IF_ERROR(check_options(opt.select));
  FLASHCACHE_RETURN_IF_ERROR(check_options(opt.allocate));
  FLASHCACHE_RETURN_IF_ERROR(check_shared_options(shared));
  FLASHCACHE_RETURN_IF_ERROR(detail::check_model_layers(k.size(), v.size(), scores.size(), masks.size()));
  if (model == nullptr) return make_error(Errc::invalid_shape, "compress_scored_model: null model");
  for (std::size_t l = 0; l < k.size(); ++l)
    if (scores[l].heads != k[l].heads || scores[l].tokens != k[l].tokens)
      return detail::at_layer(make_error(Errc::invalid_shape, "scores are ", scores[l].heads, " heads x ",
                                         scores[l].tokens, " tokens but K is ", k[l].heads, " x ", k[l].tokens),
                              1, 0, static_cast<int>(l));
  std::vector<ProtectMask> mask;
  std::vector<LayerSummary> summary;
  FLASHCACHE_RETURN_IF_ERROR(detail::summarize_model(k, scores, opt, masks, &mask, &summary, model));
  if (shared.keep_set == KeepSet::per_head)
    return detail::compress_per_head<T>(k, v, std::move(scores), budget, opt, mask, spans, summary, model);
  return detail::compress_shared<T>(k, v, std::move(scores), budget, opt, shared, mask, spans, std::move(summary),
                                    model);
}

#if FLASHCACHE_EXCEPTIONS

// Compresses one layer: every head keeps `budget` tokens (a count, or a ratio
// of the layer's tokens), chosen by outlier score; `mask` marks tokens always
// kept and `spans` the layer's image spans. Reads opt.score and opt.select
// (opt.allocate splits a model's budget: compress_model). `tails`: each key's tail
// [heads][tokens] (query_tail.hpp), read when opt.score.query is QueryInput::tail.
// Throws flashcache::Error.
template <class Real = float, class T>
CompressedLayer<std::remove_const_t<T>> compress(KVView<T> k, KVView<T> v, Budget budget, const Options& opt = {},
                                                 ProtectMask mask = {}, ImageSpans spans = {},
                                                 TailView<const float> tails = {}) {
  using E = std::remove_const_t<T>;
  const KVView<const E> kc(k), vc(v);
  std::int64_t keep = 0;
  throw_if_error(budget.resolve(k.tokens, &keep));
  Scorer<Real> scorer;
  LayerScores scores;
  throw_if_error(scorer.score(kc, vc, opt.score, &scores, ScoreInputs{spans, tails, budget.keep_ratio(k.tokens)}));
  throw_if_error(check_mask(mask, k.tokens));
  CompressedLayer<E> out;
  SelectWorkspace ws;
  throw_if_error(detail::select_and_gather<E>(kc, vc, keep, opt.select, mask, spans, &ws, std::move(scores), &out));
  return out;
}

// Compresses a whole model, one view per layer. The budget is per layer (a
// count or a ratio of each layer's tokens); with Allocation::dynamic the same
// total is re-split across layers in proportion to their energy ratios R_l.
// `masks` is empty or holds one protect mask per layer; `spans` are the
// request's image spans (the same in every layer).
template <class Real = float, class T>
CompressedModel<std::remove_const_t<T>> compress_model(const std::vector<KVView<T>>& k, const std::vector<KVView<T>>& v,
                                                       Budget budget, const Options& opt = {},
                                                       const std::vector<ProtectMask>& masks = {},
                                                       ImageSpans spans = {}) {
  using E = std::remove_const_t<T>;
  throw_if_error(detail::check_model_inputs(k, v.size(), opt));
  const auto kc = detail::const_views(k), vc = detail::const_views(v);
  std::vector<LayerScores> scores(k.size());
  Scorer<Real> scorer;
  for (std::size_t l = 0; l < k.size(); ++l)
    throw_if_error(detail::at_layer(
        scorer.score(kc[l], vc[l], opt.score, &scores[l], ScoreInputs{spans, {}, budget.keep_ratio(kc[l].tokens)}), 1,
        0, static_cast<int>(l)));
  CompressedModel<E> model;
  throw_if_error(compress_scored_model<E>(kc, vc, std::move(scores), budget, opt, kKeepPerHead, masks, spans, &model));
  return model;
}

#endif  // FLASHCACHE_EXCEPTIONS

}  // namespace flashcache
