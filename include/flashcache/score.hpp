#pragma once
// Stage 1, score: per-token outlier score and per-head energies (CPU).
//
// For every KV head: Base = the chosen frequencies of K along tokens (the
// strongest by default, the lowest in the paper; ScoreOptions::base, score/base.hpp), score[n] = MSE(K[n], Kb[n]) +
// MSE(V[n], Vb[n]), and the energies E(K), E_high(K) = ||K - Kb||^2 (Parseval), likewise for V, from which the layer's
// ratio R_l follows.
//
// With ScoreOptions::query = QueryInput::tail the caller passes each key's tail
// (query_tail.hpp), and the score mixes the residual with it (ScoreOptions::tail_weight).
//
// Tokens of an image span (ScoreInputs::spans) are scored the same way over their
// 2D patch grid instead: Base = the 2D low-pass of the grid (or of each tile).
//
// Non-finite values: a token whose K or V row holds a NaN or infinity is
// certainly not smooth, so it scores +infinity and is always kept. So that it
// cannot spread through the transform, its rows are replaced for the transform
// by the nearest finite token before it (after it, for leading ones), and it
// adds nothing to the energies.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "grid.hpp"
#include "options.hpp"
#include "query_tail.hpp"
#include "rules.hpp"
#include "score/blocked.hpp"
#include "score/bridge.hpp"
#include "score/global.hpp"
#include "score/grid.hpp"
#include "score/rows.hpp"
#include "types.hpp"
#include "view.hpp"

namespace flashcache {

// Energies of one KV head, summed over its finite tokens.
struct HeadEnergy {
  double k_total = 0, k_high = 0;  // E(K), E_high(K)
  double v_total = 0, v_high = 0;  // E(V), E_high(V)
};

// High-frequency share high / total, 0 for an all-zero input.
inline double high_share(double high, double total) { return total > 0 ? high / total : 0.0; }

// A layer's scores in caller memory: score[h * tokens + t].
struct ScoreView {
  const float* data = nullptr;
  std::int64_t heads = 0;
  std::int64_t tokens = 0;

  float operator()(std::int64_t h, std::int64_t n) const { return data[h * tokens + n]; }
  const float* head(std::int64_t h) const { return data + h * tokens; }
};

struct LayerScores {
  std::int64_t heads = 0;
  std::int64_t tokens = 0;
  std::vector<float> score;        // [heads][tokens]; +inf marks a non-finite token
  std::vector<HeadEnergy> energy;  // [heads]
  std::int64_t nonfinite = 0;      // (head, token) rows with a NaN or infinity in K or V

  float operator()(std::int64_t h, std::int64_t n) const { return score[static_cast<std::size_t>(h * tokens + n)]; }
  const float* head(std::int64_t h) const { return score.data() + h * tokens; }
  ScoreView view() const { return {score.data(), heads, tokens}; }

  HeadEnergy layer_energy() const {
    HeadEnergy sum;
    for (const auto& e : energy) {
      sum.k_total += e.k_total;
      sum.k_high += e.k_high;
      sum.v_total += e.v_total;
      sum.v_high += e.v_high;
    }
    return sum;
  }
  // R_l = E_high(K)/E(K) + E_high(V)/E(V), summed over the layer's heads.
  double energy_ratio() const {
    const HeadEnergy e = layer_energy();
    return rules::energy_ratio(e.k_total, e.k_high, e.v_total, e.v_high);
  }
};

// One head's residual scores mixed with a second term per token (its keys'
// tails with QueryInput::tail, its distance from the head's mean with
// mean_weight): r = (1 - w) score[t] / mean, t = w term[t] / mean, means over
// the finite tokens, and score[t] = r + t (TailMix::sum) or max(r, t)
// (TailMix::max); a non-finite token's +inf stays, and a term whose mean is 0
// is 0. The Scorer calls it; a caller that keeps the residual scores can mix
// them with several weights without scoring again.
inline void mix_term(double weight, TailMix mix, const float* term, float* score, std::int64_t n) {
  double sum_r = 0, sum_t = 0;
  std::int64_t rankable = 0;
  for (std::int64_t t = 0; t < n; ++t)
    if (!rules::always_kept_score(score[t])) {
      sum_r += static_cast<double>(score[t]);
      sum_t += static_cast<double>(term[t]);
      ++rankable;
    }
  const rules::TailMixScales s = rules::tail_mix_scales(weight, sum_r, sum_t, static_cast<double>(rankable));
  for (std::int64_t t = 0; t < n; ++t)
    if (!rules::always_kept_score(score[t]))
      score[t] = rules::mixed_tail_score(s, mix == TailMix::max, score[t], term[t]);
}

// One head's mixed scores bridged over the holes of a run, in place
// (ScoreOptions::bridge, score/bridge.hpp); *scratch holds the scores before it
// (it allocates only when it grows). The Scorer calls it after every term is
// mixed; a caller that mixes terms itself (mix_term) calls it after them.
inline void bridge_head(std::int64_t bridge, float* score, std::int64_t n, std::vector<float>* scratch) {
  scratch->assign(score, score + n);
  detail::bridge_scores(scratch->data(), score, n, bridge);
}

// What a layer's score reads besides K and V; all optional.
struct ScoreInputs {
  ImageSpans spans;             // the request's image spans (grid.hpp): scored over their 2D grid
  TailView<const float> tails;  // each key's tail [heads][tokens] (query_tail.hpp), for QueryInput::tail
  // The share of the tokens the caller will keep, in [0, 1]: what
  // ScoreOptions::mean_weight follows (mean_weight_at). Compressing entry
  // points set it from their budget; 1 scores as if nothing were dropped.
  double keep = 1.0;
};

// Caller memory for one layer's scores.
struct ScoreBuffers {
  float* score = nullptr;             // [heads][tokens]
  HeadEnergy* energy = nullptr;       // [heads]
  std::int64_t* nonfinite = nullptr;  // optional: the count of non-finite (head, token) rows
};

template <class Real>
class Scorer;

namespace detail {
// Scorer::score for a caller that has run check_options(opt) itself (the
// llama.cpp adapter scores every layer under one check): every other input is checked.
template <class Real, class T>
Status score_trusted(Scorer<Real>* scorer, KVView<const T> k, KVView<const T> v, const ScoreOptions& opt,
                     ScoreBuffers out, const ScoreInputs& in);
}  // namespace detail

// Scores layers one after another and keeps its transforms, bases and
// buffers between calls, so scoring a whole model allocates once per shape.
// Real is the arithmetic type (float in production, double for references).
// Each head: its non-finite rows mapped and its keys de-rotated (score/rows.hpp),
// the 1D residual (score/global.hpp or score/blocked.hpp), the image
// spans' 2D residual over it (score/grid.hpp), then the scores and energies.
template <class Real = float>
class Scorer {
 public:
  // Head-dim columns the global transform takes together (score/global.hpp).
  static constexpr int kLanes = detail::GlobalResidual<Real>::kLanes;

  // Scores one layer into caller buffers: score[h * tokens + t] and energy[h]
  // for every head, and the count of non-finite (head, token) rows. Nothing is
  // allocated once the scorer has seen this sequence length and block size (a
  // test counts, Eigen's allocations included).
  template <class T>
  Status score(KVView<const T> k, KVView<const T> v, const ScoreOptions& opt, ScoreBuffers out,
               const ScoreInputs& in = {}) {
    FLASHCACHE_RETURN_IF_ERROR(check_options(opt));
    return run(k, v, opt, out, in);
  }

  // Scores one layer into an owning LayerScores (resized to the layer).
  template <class T>
  Status score(KVView<const T> k, KVView<const T> v, const ScoreOptions& opt, LayerScores* out,
               const ScoreInputs& in = {}) {
    FLASHCACHE_RETURN_IF_ERROR(check_pair(k, v));
    if (out == nullptr) return make_error(Errc::invalid_shape, "score: null output");
    out->heads = k.heads;
    out->tokens = k.tokens;
    out->score.resize(static_cast<std::size_t>(k.heads * k.tokens));
    out->energy.resize(static_cast<std::size_t>(k.heads));
    return score(k, v, opt, ScoreBuffers{out->score.data(), out->energy.data(), &out->nonfinite}, in);
  }

 private:
  template <class Real2, class T>
  friend Status detail::score_trusted(Scorer<Real2>* scorer, KVView<const T> k, KVView<const T> v,
                                      const ScoreOptions& opt, ScoreBuffers out, const ScoreInputs& in);

  // The score itself, opt already checked.
  template <class T>
  Status run(KVView<const T> k, KVView<const T> v, const ScoreOptions& opt, ScoreBuffers out, const ScoreInputs& in) {
    FLASHCACHE_RETURN_IF_ERROR(check_pair(k, v));
    FLASHCACHE_RETURN_IF_ERROR(check_query_input(opt, in.tails, k.heads, k.tokens));
    if (!(in.keep >= 0.0 && in.keep <= 1.0))
      return make_error(Errc::invalid_budget, "score: keep ratio ", in.keep, " is outside [0, 1]");
    const double mean_weight = mean_weight_at(opt, in.keep);
    const std::int64_t heads = k.heads, n = k.tokens;
    if (opt.mean_weight > 0) {  // sized whatever the weight at this keep ratio: another keep allocates nothing
      mean_row_.resize(static_cast<std::size_t>(2 * k.head_dim));
      distance_.resize(static_cast<std::size_t>(n));
      if (opt.mean_distance == MeanDistance::key_cosine) key_norm_.resize(static_cast<std::size_t>(n));
    }
    float* score = out.score;
    HeadEnergy* energy = out.energy;
    if (out.nonfinite != nullptr) *out.nonfinite = 0;
    if (heads * n > 0 && score == nullptr) return make_error(Errc::invalid_shape, "score: null score buffer");
    if (heads > 0 && energy == nullptr) return make_error(Errc::invalid_shape, "score: null energy buffer");
    std::fill(score, score + heads * n, 0.0f);
    std::fill(energy, energy + heads, HeadEnergy{});
    if (k.empty()) return Status::success();
    FLASHCACHE_RETURN_IF_ERROR(check_grid_spans(in.spans));
    FLASHCACHE_RETURN_IF_ERROR(check_grids_fit(in.spans, n));
    if (opt.rope.derotate && k.head_dim % 2 != 0)
      return make_error(Errc::invalid_option, "rope derotate needs an even head_dim, got ", k.head_dim);

    sums_.residual_k.resize(static_cast<std::size_t>(n));
    sums_.residual_v.resize(static_cast<std::size_t>(n));
    std::int64_t bad = 0;
    for (std::int64_t h = 0; h < heads; ++h) {
      bad += detail::map_nonfinite_rows(k, v, h, &source_);
      std::fill(sums_.residual_k.begin(), sums_.residual_k.end(), Real(0));
      std::fill(sums_.residual_v.begin(), sums_.residual_v.end(), Real(0));
      HeadEnergy& e = energy[h];
      if (opt.rope.derotate) {
        // The transform reads one de-rotated head from float buffers instead.
        detail::derotate_head(k, v, h, opt.rope, &derotated_);
        const KVView<const float> kh = hnd(derotated_.k.data(), Heads(1), Tokens(n), HeadDim(k.head_dim));
        const KVView<const float> vh = hnd(derotated_.v.data(), Heads(1), Tokens(n), HeadDim(k.head_dim));
        residuals(kh, vh, 0, opt, mean_weight > 0, in.spans, &e);
      } else {
        residuals(k, v, h, opt, mean_weight > 0, in.spans, &e);
      }
      write_scores(opt.normalize_terms, k.head_dim, score + h * n);
      if (mean_weight > 0) mix_term(mean_weight, opt.mean_mix, distance_.data(), score + h * n, n);
      if (opt.query == QueryInput::tail)
        mix_term(opt.tail_weight, opt.tail_mix, in.tails.data + h * in.tails.tokens, score + h * n, n);
      if (opt.bridge > 0) bridge_head(opt.bridge, score + h * n, n, &unbridged_);
    }
    if (out.nonfinite != nullptr) *out.nonfinite = bad;
    return Status::success();
  }

  // Per-token residual and total energies of head h (1D, then the 2D spans
  // over their own tokens), and the head's energies from them (Parseval); with
  // `distance`, each token's distance from the head's mean too (distance_).
  template <class T>
  void residuals(KVView<const T> k, KVView<const T> v, std::int64_t h, const ScoreOptions& opt, bool distance,
                 ImageSpans spans, HeadEnergy* e) {
    sums_.total_k.assign(static_cast<std::size_t>(k.tokens), Real(0));
    sums_.total_v.assign(static_cast<std::size_t>(k.tokens), Real(0));
    if (opt.transform == Transform::global)
      global_.compute(k, v, h, source_, opt.gamma, opt.base, &sums_);
    else
      blocked_.compute(k, v, h, source_, opt.gamma, opt.block_size, opt.base, &sums_);
    for (const GridSpan& g : spans) {
      const SpanTiling tiling = span_tiling(g, opt);
      for (std::int64_t q = 0; q < tiling.count(); ++q)
        grid_.compute(k, v, h, source_, g, tiling.at(q), opt.grid_zone, opt.gamma, &sums_);
    }
    if (distance && opt.mean_distance == MeanDistance::key_cosine)
      detail::key_cosine_from_mean(k, h, source_, &mean_row_, &key_norm_, &distance_);
    else if (distance)
      detail::distance_from_mean(k, v, h, source_, &mean_row_, &distance_);
    // Energies of the finite tokens: E from the input, E_high from the residual.
    for (std::int64_t t = 0; t < k.tokens; ++t)
      if (source_[static_cast<std::size_t>(t)] == t)
        add_energy(e, sums_.total_k[static_cast<std::size_t>(t)], sums_.residual_k[static_cast<std::size_t>(t)],
                   sums_.total_v[static_cast<std::size_t>(t)], sums_.residual_v[static_cast<std::size_t>(t)]);
  }

  // score[t] = MSE_K + MSE_V of token t, +inf for a non-finite token. With
  // `normalize`, each term is divided by its mean over the head's finite tokens.
  void write_scores(bool normalize, std::int64_t head_dim, float* score) const {
    const auto n = static_cast<std::int64_t>(source_.size());
    const std::vector<Real>& rk = sums_.residual_k;
    const std::vector<Real>& rv = sums_.residual_v;
    Real scale_k = Real(1) / static_cast<Real>(head_dim), scale_v = scale_k;
    if (normalize) {
      double sum_k = 0, sum_v = 0;
      std::int64_t finite = 0;
      for (std::int64_t t = 0; t < n; ++t)
        if (source_[static_cast<std::size_t>(t)] == t) {
          sum_k += static_cast<double>(rk[static_cast<std::size_t>(t)]);
          sum_v += static_cast<double>(rv[static_cast<std::size_t>(t)]);
          ++finite;
        }
      // An all-smooth term (mean 0) stays 0 rather than becoming 0/0.
      scale_k = sum_k > 0 ? static_cast<Real>(static_cast<double>(finite) / sum_k) : Real(0);
      scale_v = sum_v > 0 ? static_cast<Real>(static_cast<double>(finite) / sum_v) : Real(0);
    }
    for (std::int64_t t = 0; t < n; ++t)
      score[t] = source_[static_cast<std::size_t>(t)] != t
                     ? std::numeric_limits<float>::infinity()
                     : static_cast<float>(rk[static_cast<std::size_t>(t)] * scale_k +
                                          rv[static_cast<std::size_t>(t)] * scale_v);
  }

  // Tails go with QueryInput::tail and nothing else, one per key and head.
  static Status check_query_input(const ScoreOptions& opt, TailView<const float> tails, std::int64_t heads,
                                  std::int64_t tokens) {
    if (opt.query == QueryInput::none) {
      if (tails.data != nullptr)
        return make_error(Errc::invalid_option,
                          "score: tails were given but ScoreOptions::query is none (set it to tail)");
      return Status::success();
    }
    if (heads * tokens == 0) return Status::success();  // nothing to read
    if (tails.data == nullptr)
      return make_error(Errc::invalid_option,
                        "score: ScoreOptions::query is tail but no tails were given (query_tail.hpp)");
    FLASHCACHE_RETURN_IF_ERROR(check_tails(tails, heads, tokens, "score"));
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t t = 0; t < tokens; ++t)
        if (!(tails(h, t) >= 0.0f && tails(h, t) <= 1.0f))
          return make_error(Errc::invalid_option, "score: tail of head ", h, ", token ", t, " is ", tails(h, t),
                            " (a probability in [0, 1])");
    return Status::success();
  }

  static void add_energy(HeadEnergy* e, Real k_total, Real k_high, Real v_total, Real v_high) {
    e->k_total += static_cast<double>(k_total);
    e->k_high += static_cast<double>(k_high);
    e->v_total += static_cast<double>(v_total);
    e->v_high += static_cast<double>(v_high);
  }

  std::vector<std::int64_t> source_;  // the row each token reads (map_nonfinite_rows)
  detail::DerotatedHead derotated_;
  std::vector<Real> mean_row_;    // mean_weight: the head's mean K and V row
  std::vector<float> distance_;  // mean_weight: each token's distance from it
  std::vector<Real> key_norm_;   // mean_distance key_cosine: each finite row's key norm
  std::vector<float> unbridged_;  // bridge: one head's scores before it
  detail::TokenResiduals<Real> sums_;
  detail::GlobalResidual<Real> global_;
  detail::BlockedResidual<Real> blocked_;
  detail::GridResidual<Real> grid_;
};

namespace detail {
template <class Real, class T>
Status score_trusted(Scorer<Real>* scorer, KVView<const T> k, KVView<const T> v, const ScoreOptions& opt,
                     ScoreBuffers out, const ScoreInputs& in) {
  return scorer->run(k, v, opt, out, in);
}
}  // namespace detail

#if FLASHCACHE_EXCEPTIONS
// One-shot scoring of one layer; throws flashcache::Error on bad input.
template <class Real = float, class T>
LayerScores score_layer(KVView<T> k, KVView<T> v, const ScoreOptions& opt = {}, const ScoreInputs& in = {}) {
  LayerScores out;
  Scorer<Real> scorer;
  throw_if_error(scorer.score(KVView<const T>(k), KVView<const T>(v), opt, &out, in));
  return out;
}
#endif

}  // namespace flashcache
