#pragma once
// flashcache: frequency-domain, outlier-aware KV cache compression (FlashCache,
// arXiv 2511.16786), CPU front door.
//
//   score     DCT along tokens, low-pass, inverse, residual -> outlier scores
//   allocate  per-layer budgets from high-frequency energy (whole model)
//   select    per head: protected tokens + top scores, ascending
//   gather    dense compact K', V'
//
//   auto out = flashcache::compress(flashcache::hnd(k, H, N, d), flashcache::hnd(v, H, N, d),
//                                    flashcache::Budget::ratio(0.2));
//
// Every entry point validates its input and throws flashcache::Error with a
// message naming the problem. The GPU API is in flashcache/cuda/.
#include <cmath>
#include <cstdint>
#include <numeric>
#include <type_traits>
#include <vector>

#include "allocate.hpp"
#include "error.hpp"
#include "gather.hpp"
#include "options.hpp"
#include "score.hpp"
#include "select.hpp"
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

  KVView<const T> k_view() const { return hnd(k.data(), heads, budget, head_dim); }
  KVView<const T> v_view() const { return hnd(v.data(), heads, budget, head_dim); }
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

template <class T>
Status select_and_gather(KVView<const T> k, KVView<const T> v, std::int64_t budget, const Options& opt,
                         LayerScores scores, CompressedLayer<T>* out) {
  out->heads = k.heads;
  out->tokens = k.tokens;
  out->budget = budget;
  out->head_dim = k.head_dim;
  FLASHCACHE_RETURN_IF_ERROR(select_tokens(scores, budget, opt, &out->kept));
  const auto size = static_cast<std::size_t>(k.heads * budget * k.head_dim);
  out->k.resize(size);
  out->v.resize(size);
  FLASHCACHE_RETURN_IF_ERROR(gather(k, out->kept.data(), hnd(out->k.data(), k.heads, budget, k.head_dim)));
  FLASHCACHE_RETURN_IF_ERROR(gather(v, out->kept.data(), hnd(out->v.data(), k.heads, budget, k.head_dim)));
  out->scores = std::move(scores);
  return Status::success();
}

}  // namespace detail

// Compresses one layer: every head keeps `budget` tokens (a count, or a ratio
// of the layer's tokens), chosen by outlier score. Throws flashcache::Error.
template <class T, class Real = float>
CompressedLayer<std::remove_const_t<T>> compress(KVView<T> k, KVView<T> v, Budget budget, const Options& opt = {}) {
  using E = std::remove_const_t<T>;
  const KVView<const E> kc(k), vc(v);
  Scorer<Real> scorer;
  LayerScores scores;
  throw_if_error(scorer.score(kc, vc, opt, &scores));
  std::int64_t keep = 0;
  throw_if_error(budget.resolve(k.tokens, &keep));
  CompressedLayer<E> out;
  throw_if_error(detail::select_and_gather<E>(kc, vc, keep, opt, std::move(scores), &out));
  return out;
}

namespace detail {

// Allocate, select and gather for a whole model whose layers are scored already.
template <class T>
CompressedModel<T> compress_scored_model(const std::vector<KVView<const T>>& k, const std::vector<KVView<const T>>& v,
                                         std::vector<LayerScores> scores, Budget budget, const Options& opt) {
  const auto layers = static_cast<int>(k.size());
  CompressedModel<T> model;
  std::vector<std::int64_t> tokens(k.size()), floor(k.size());
  model.energy_ratio.resize(k.size());
  for (int l = 0; l < layers; ++l) {
    tokens[l] = k[l].tokens;
    model.energy_ratio[l] = scores[l].energy_ratio();
    model.nonfinite += scores[l].nonfinite;
    const auto min_share =
        static_cast<std::int64_t>(std::ceil(opt.min_layer_ratio * static_cast<double>(tokens[l]) - 1e-9));
    floor[l] = std::max(protected_count(scores[l], protected_tokens(tokens[l], opt)), min_share);
  }

  model.budgets.resize(k.size());
  std::int64_t total = 0;
  for (int l = 0; l < layers; ++l) {
    Status s = budget.resolve(tokens[l], &model.budgets[l]);
    if (!s.ok()) throw Error(make_error(s.code(), "layer ", l, ": ", s.message()));
    total += model.budgets[l];
  }
  if (budget.is_ratio())  // the model-wide total is round(ratio * all tokens), not a sum of per-layer roundings
    throw_if_error(budget.resolve(std::accumulate(tokens.begin(), tokens.end(), std::int64_t{0}), &total));
  if (opt.allocation == Allocation::dynamic)
    throw_if_error(allocate_budgets(model.energy_ratio, tokens, floor, total, &model.budgets));

  model.layers.resize(k.size());
  for (int l = 0; l < layers; ++l) {
    Status s = select_and_gather<T>(k[l], v[l], model.budgets[l], opt, std::move(scores[l]), &model.layers[l]);
    if (!s.ok()) throw Error(make_error(s.code(), "layer ", l, ": ", s.message()));
  }
  return model;
}

// Views of const elements, checked for a layer count that matches.
template <class T>
std::vector<KVView<const std::remove_const_t<T>>> const_views(const std::vector<KVView<T>>& x) {
  return {x.begin(), x.end()};
}

inline void check_model_inputs(std::size_t k_layers, std::size_t v_layers, const Options& opt) {
  if (k_layers != v_layers)
    throw Error(make_error(Errc::invalid_shape, k_layers, " K layers but ", v_layers, " V layers"));
  throw_if_error(check_options(opt));
}

template <class T>
void check_mask_layers(const std::vector<KVView<T>>& k, const Options& opt) {
  for (std::size_t l = 0; l < k.size(); ++l)
    if (opt.protect != nullptr && k[l].tokens != k[0].tokens)
      throw Error(make_error(Errc::invalid_option, "a protect mask needs every layer to have the same tokens; layer ",
                             l, " has ", k[l].tokens, ", layer 0 has ", k[0].tokens));
}

}  // namespace detail

// Compresses a whole model, one view per layer. The budget is per layer (a
// count or a ratio of each layer's tokens); with Allocation::dynamic the same
// total is re-split across layers in proportion to their energy ratios R_l.
template <class T, class Real = float>
CompressedModel<std::remove_const_t<T>> compress_model(const std::vector<KVView<T>>& k, const std::vector<KVView<T>>& v,
                                                       Budget budget, const Options& opt = {}) {
  using E = std::remove_const_t<T>;
  detail::check_model_inputs(k.size(), v.size(), opt);
  detail::check_mask_layers(k, opt);
  const auto kc = detail::const_views(k), vc = detail::const_views(v);
  std::vector<LayerScores> scores(k.size());
  Scorer<Real> scorer;
  for (std::size_t l = 0; l < k.size(); ++l) {
    Status s = scorer.score(kc[l], vc[l], opt, &scores[l]);
    if (!s.ok()) throw Error(make_error(s.code(), "layer ", l, ": ", s.message()));
  }
  return detail::compress_scored_model<E>(kc, vc, std::move(scores), budget, opt);
}

}  // namespace flashcache
