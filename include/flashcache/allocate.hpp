#pragma once
// Stage 2, allocate: per-layer budgets from high-frequency energy ratios.
//
// Layer l gets b_l = clamp(lambda * w_l, lo_l, hi_l) with the water level
// lambda chosen so that sum b_l == total (water-filling: what a clamped layer
// cannot take flows to the others), then largest-remainder rounding makes the
// integer budgets add up to `total` exactly. w_l = R_l; if no layer has any
// high-frequency energy the split falls back to w_l = N_l (uniform ratio).
// Layers with w_l = 0 sit at their floor unless the others are full, in which
// case the rest is shared among them in proportion to N_l.
//
// allocate_budgets() is plain arithmetic on caller arrays, callable from host
// and device code (one thread), so a GPU pipeline needs no host round trip.
// check_allocation() holds the preconditions, with messages.
#include <cmath>
#include <cstdint>
#include <vector>

#include "config.hpp"
#include "error.hpp"

namespace flashcache {

namespace detail {

// b_l for weight w at level lambda; in the fallback phase only zero-weight layers move.
struct FillProblem {
  int layers;
  const double* weight;
  const std::int64_t* lo;
  const std::int64_t* hi;
  bool zero_weight_phase;

  FLASHCACHE_INLINE double share(int l, double lambda) const {
    const bool moves = zero_weight_phase ? !(weight[l] > 0) : weight[l] > 0;
    const double lo_l = static_cast<double>(lo[l]), hi_l = static_cast<double>(hi[l]);
    if (!moves) return zero_weight_phase && weight[l] > 0 ? hi_l : lo_l;
    const double w = zero_weight_phase ? hi_l : weight[l];
    const double b = lambda * w;
    return b < lo_l ? lo_l : (b > hi_l ? hi_l : b);
  }
  FLASHCACHE_INLINE double total(double lambda) const {
    double s = 0;
    for (int l = 0; l < layers; ++l) s += share(l, lambda);
    return s;
  }
  // The level at which every moving layer is full.
  FLASHCACHE_INLINE double full_level() const {
    double top = 0;
    for (int l = 0; l < layers; ++l) {
      const bool moves = zero_weight_phase ? !(weight[l] > 0) : weight[l] > 0;
      const double w = zero_weight_phase ? static_cast<double>(hi[l]) : weight[l];
      if (moves && w > 0) top = fmax(top, static_cast<double>(hi[l]) / w);
    }
    return top;
  }
  // Bisection on the monotone total(lambda); 200 halvings reach double precision.
  FLASHCACHE_INLINE double level_for(double target) const {
    double a = 0, b = full_level();
    if (total(b) <= target) return b;
    for (int it = 0; it < 200 && a < b; ++it) {
      const double mid = 0.5 * (a + b);
      if (mid <= a || mid >= b) break;
      (total(mid) < target ? a : b) = mid;
    }
    return b;
  }
};

}  // namespace detail

// Preconditions of allocate_budgets(), each failure named.
inline Status check_allocation(int layers, const double* ratio, const std::int64_t* tokens, const std::int64_t* floor,
                               std::int64_t total) {
  if (layers < 0) return make_error(Errc::invalid_shape, "layer count ", layers, " is negative");
  std::int64_t sum_tokens = 0, sum_floor = 0;
  for (int l = 0; l < layers; ++l) {
    if (!std::isfinite(ratio[l]) || ratio[l] < 0)
      return make_error(Errc::invalid_option, "energy ratio of layer ", l, " is ", ratio[l],
                        " (must be finite and >= 0)");
    if (tokens[l] < 0) return make_error(Errc::invalid_shape, "layer ", l, " has ", tokens[l], " tokens");
    if (floor[l] < 0 || floor[l] > tokens[l])
      return make_error(Errc::invalid_budget, "layer ", l, ": ", floor[l], " always-kept tokens but ", tokens[l],
                        " tokens");
    sum_tokens += tokens[l];
    sum_floor += floor[l];
  }
  if (total > sum_tokens)
    return make_error(Errc::invalid_budget, "total budget ", total, " > ", sum_tokens, " tokens over ", layers,
                      " layers");
  if (total < sum_floor)
    return make_error(Errc::invalid_budget, "total budget ", total, " < ", sum_floor, " always-kept tokens over ",
                      layers, " layers");
  return Status::success();
}

// Fills out[l] with integer budgets, floor[l] <= out[l] <= tokens[l] and
// sum out == total. Requires check_allocation() to pass.
// Ties in the rounding go to the lower layer index.
FLASHCACHE_INLINE void allocate_budgets(int layers, const double* ratio, const std::int64_t* tokens,
                                        const std::int64_t* floor, std::int64_t total, std::int64_t* out) {
  if (layers <= 0) return;
  double weight_sum = 0;
  for (int l = 0; l < layers; ++l) weight_sum += ratio[l];
  // With no high-frequency energy anywhere every layer is "zero-weight", and
  // the fallback phase weights them all by tokens: a uniform ratio.
  detail::FillProblem p{layers, ratio, floor, tokens, !(weight_sum > 0)};
  const double target = static_cast<double>(total);
  double lambda = p.level_for(target);
  if (!p.zero_weight_phase && p.total(lambda) < target - 0.5) {
    // Every weighted layer is full: the rest goes to the zero-weight ones.
    p.zero_weight_phase = true;
    lambda = p.level_for(target);
  }

  // Integer parts, then hand out (or take back) the remainder by fractional part.
  std::int64_t assigned = 0;
  for (int l = 0; l < layers; ++l) {
    const double b = p.share(l, lambda);
    auto bi = static_cast<std::int64_t>(b);  // b >= 0, so truncation is floor
    if (bi < floor[l]) bi = floor[l];
    if (bi > tokens[l]) bi = tokens[l];
    out[l] = bi;
    assigned += bi;
  }
  while (assigned != total) {
    const bool give = assigned < total;
    int best = -1;
    double best_frac = 0;
    for (int l = 0; l < layers; ++l) {
      if (give ? out[l] >= tokens[l] : out[l] <= floor[l]) continue;
      const double frac = p.share(l, lambda) - static_cast<double>(out[l]);
      if (best < 0 || (give ? frac > best_frac : frac < best_frac)) {
        best = l;
        best_frac = frac;
      }
    }
    if (best < 0) break;  // unreachable when check_allocation() passed
    out[best] += give ? 1 : -1;
    assigned += give ? 1 : -1;
  }
}

// Host convenience: checks, then allocates.
inline Status allocate_budgets(const std::vector<double>& ratio, const std::vector<std::int64_t>& tokens,
                               const std::vector<std::int64_t>& floor, std::int64_t total,
                               std::vector<std::int64_t>* out) {
  if (ratio.size() != tokens.size() || floor.size() != tokens.size())
    return make_error(Errc::invalid_shape, "allocate: ", ratio.size(), " ratios, ", tokens.size(), " token counts, ",
                      floor.size(), " floors");
  const int layers = static_cast<int>(tokens.size());
  FLASHCACHE_RETURN_IF_ERROR(check_allocation(layers, ratio.data(), tokens.data(), floor.data(), total));
  out->assign(tokens.size(), 0);
  allocate_budgets(layers, ratio.data(), tokens.data(), floor.data(), total, out->data());
  return Status::success();
}

}  // namespace flashcache
