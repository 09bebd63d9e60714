#pragma once
// Rules the CPU and the GPU paths must agree on, one definition each,
// callable from host and device code (as lowpass_cutoff() in options.hpp and
// allocate_budgets() in allocate.hpp already are). A change here changes both
// back ends at once; tests on either side hold them to it.
#include <cmath>
#include <cstdint>

#include "flashcache/config.hpp"

namespace flashcache::rules {

// The words, in names, messages and docs alike:
//   protected    the caller's set: sink, window and mask (is_protected)
//   always kept  protected, plus tokens whose score cannot be ranked (always_kept_score)

// A token is always kept when its score is +inf (a NaN or infinity in its K
// or V row) or NaN (finite values whose residual overflowed): such a score
// cannot be ranked, so the token is never dropped. !(s <= max) is true for
// exactly +inf and NaN (scores are sums of squares, never -inf).
FLASHCACHE_INLINE bool always_kept_score(float s) { return !(s <= 3.402823466e+38f); }
FLASHCACHE_INLINE bool always_kept_score(double s) { return !(s <= 1.7976931348623157e+308); }

// The caller's protected set: the first `sink` tokens, the last `window`
// tokens of a sequence of n, and tokens the caller's mask marks.
FLASHCACHE_INLINE bool is_protected(std::int64_t t, std::int64_t n, std::int64_t sink, std::int64_t window,
                                    bool masked) {
  return t < sink || t >= n - window || masked;
}

// Tokens a layer keeps per head for a per-layer budget: round(ratio * n),
// halves away from zero, or the count as given (the caller checks count <= n).
FLASHCACHE_INLINE std::int64_t layer_budget(bool is_ratio, double ratio, std::int64_t count, std::int64_t n) {
  return is_ratio ? static_cast<std::int64_t>(llround(ratio * static_cast<double>(n))) : count;
}

// The share of n tokens a budget keeps (Budget::keep_ratio; on the GPU, per
// sequence): the ratio, or count / n (1 when n is 0), clamped to [0, 1].
FLASHCACHE_INLINE double keep_share(bool is_ratio, double ratio, std::int64_t count, std::int64_t n) {
  double r = ratio;
  if (!is_ratio) r = n > 0 ? static_cast<double>(count) / static_cast<double>(n) : 1.0;
  return r < 0.0 ? 0.0 : (r > 1.0 ? 1.0 : r);
}

// A weight that follows the keep ratio (ScoreOptions::mean_full_keep): in full
// at keep >= full_keep, 0 at keep <= zero_keep, linearly between.
FLASHCACHE_INLINE double faded_weight(double weight, double full_keep, double zero_keep, double keep) {
  if (keep >= full_keep) return weight;
  if (keep <= zero_keep) return 0.0;
  return weight * (keep - zero_keep) / (full_keep - zero_keep);
}

// The model-wide total that dynamic allocation splits over `layers` layers of
// `tokens_sum` tokens in all: round(ratio * sum N_l), or count per layer.
FLASHCACHE_INLINE std::int64_t model_total(bool is_ratio, double ratio, std::int64_t count, std::int64_t tokens_sum,
                                           std::int64_t layers) {
  return is_ratio ? static_cast<std::int64_t>(llround(ratio * static_cast<double>(tokens_sum))) : count * layers;
}

// The least budget a layer of n tokens may receive: its protected count (the
// largest over its heads), and at least ceil(min_layer_ratio * n). The 1e-9
// slack keeps products such as 0.1 * 30 = 3.0000000000000004 at 3.
FLASHCACHE_INLINE std::int64_t layer_floor(std::int64_t protected_count, double min_layer_ratio, std::int64_t n) {
  const auto share = static_cast<std::int64_t>(ceil(min_layer_ratio * static_cast<double>(n) - 1e-9));
  return protected_count > share ? protected_count : share;
}

// A layer's high-frequency energy ratio R_l = E_high(K)/E(K) + E_high(V)/E(V),
// from sums over its heads (and, with tensor parallelism, over every rank's
// heads); a part without energy adds 0.
FLASHCACHE_INLINE double energy_ratio(double k_total, double k_high, double v_total, double v_high) {
  return (k_total > 0 ? k_high / k_total : 0.0) + (v_total > 0 ? v_high / v_total : 0.0);
}

// The recent window of a layer whose heads keep `budget` tokens: the fixed
// `window`, or round(window_share * budget) (halves away from zero), whichever
// is larger. Its tokens are kept after the protected set, newest first, while
// the budget lasts.
FLASHCACHE_INLINE std::int64_t recent_window(std::int64_t window, double window_share, std::int64_t budget) {
  const auto share = static_cast<std::int64_t>(llround(window_share * static_cast<double>(budget)));
  return window > share ? window : share;
}

// The recent window is the prompt's newest text: tokens inside image spans are
// not part of it (an image keeps its own sub-grid and outliers; its newest
// tokens are its bottom rows, not the recent context). The window holds the
// newest `recent` tokens outside the spans: those at or after the token this
// returns that lie in no span. Without spans it is n - recent (or 0).
// `spans` has span_count(), span_first(g) and span_end(g); spans do not overlap and lie in [0, n).
template <class Spans>
FLASHCACHE_INLINE std::int64_t recent_window_start(std::int64_t n, std::int64_t recent, const Spans& spans) {
  std::int64_t pos = n, left = recent;
  while (left > 0 && pos > 0) {
    std::int64_t text_from = 0;  // the run of text tokens that ends at pos starts here
    bool in_span = false;
    for (int g = 0; g < spans.span_count(); ++g) {
      const std::int64_t end = spans.span_end(g);
      if (end == pos) {
        pos = spans.span_first(g);  // token pos - 1 is in span g: skip the whole span
        in_span = true;
        break;
      }
      if (end < pos && end > text_from) text_from = end;
    }
    if (in_span) continue;
    const std::int64_t take = pos - text_from < left ? pos - text_from : left;
    pos -= take;
    left -= take;
  }
  return pos;
}

// The base sample of a head keeping `budget` tokens, without image spans:
// round(base_share * budget) (halves away from zero).
FLASHCACHE_INLINE std::int64_t base_sample_tokens(double base_share, std::int64_t budget) {
  return static_cast<std::int64_t>(llround(base_share * static_cast<double>(budget)));
}

// With spans, the base sample's share of a part of the free tokens:
// round(ratio * budget * part / free), in this order of operations on both paths.
FLASHCACHE_INLINE std::int64_t base_share_of(double ratio, std::int64_t budget, std::int64_t part, std::int64_t free) {
  return static_cast<std::int64_t>(
      llround(ratio * static_cast<double>(budget) * static_cast<double>(part) / static_cast<double>(free)));
}

// `count` picks spread evenly over `free` tokens (count <= free): pick j is the
// free token at rank floor((2j + 1) free / (2 count)); the ranks grow strictly.
FLASHCACHE_INLINE std::int64_t evenly_spaced_rank(std::int64_t j, std::int64_t count, std::int64_t free) {
  return (2 * j + 1) * free / (2 * count);
}
// Whether rank r is one of them: r's pick is floor(r count / free) or the next.
FLASHCACHE_INLINE bool evenly_spaced_pick(std::int64_t r, std::int64_t count, std::int64_t free) {
  const std::int64_t j = r * count / free;
  for (std::int64_t q = j; q <= j + 1 && q < count; ++q)
    if (evenly_spaced_rank(q, count, free) == r) return true;
  return false;
}

// Block sizes of Transform::blocked: at least one token everywhere; the GPU
// kernel holds a block's column in registers, so it takes at most 128.
inline constexpr std::int64_t kMinBlockSize = 1;
inline constexpr std::int64_t kMaxGpuBlockSize = 128;
FLASHCACHE_INLINE bool block_size_ok(std::int64_t block_size, bool gpu) {
  return block_size >= kMinBlockSize && (!gpu || block_size <= kMaxGpuBlockSize);
}

// The top-score order of a selection: the higher score first, a tie to the lower
// token index. A strict weak order on distinct indices, so nth_element picks the
// same set on every platform (the GPU's radix select keeps the same ties).
FLASHCACHE_INLINE bool ranks_above(float score_a, std::int32_t a, float score_b, std::int32_t b) {
  return score_a > score_b || (score_a == score_b && a < b);
}

// MeanDistance::key_cosine: a key's distance 1 - cos from its head's mean unit
// key. Below 8 float epsilons it is 0: a key along the anchor rounds to a cosine
// a hair either side of 1, and a head of parallel keys (or of one token) would
// otherwise rank its tokens by rounding noise scaled up to the term's weight.
FLASHCACHE_INLINE double key_cosine_distance(double cosine) {
  const double d = 1.0 - cosine;
  return d < 8.0 * 1.1920928955078125e-7 ? 0.0 : d;
}

// Query tails (QueryInput::tail): a head's residual scores and its keys' tails,
// each over its mean on the rankable tokens (not always kept), mixed by sum or
// by max; a term whose mean is 0 counts 0. The scales from the two sums over
// the `rankable` tokens, then one rankable token's mixed score.
struct TailMixScales {
  double residual = 0.0;
  double tail = 0.0;
};
FLASHCACHE_INLINE TailMixScales tail_mix_scales(double weight, double score_sum, double tail_sum, double rankable) {
  TailMixScales s;
  s.residual = score_sum > 0 ? (1.0 - weight) * rankable / score_sum : 0.0;
  s.tail = tail_sum > 0 ? weight * rankable / tail_sum : 0.0;
  return s;
}
FLASHCACHE_INLINE float mixed_tail_score(TailMixScales s, bool by_max, float score, float tail) {
  const double r = s.residual * static_cast<double>(score), q = s.tail * static_cast<double>(tail);
  return static_cast<float>(by_max ? (r < q ? q : r) : r + q);
}

}  // namespace flashcache::rules
