#pragma once
// Budget planning for a whole model: how many tokens each layer keeps per head.
//
// Planning needs three numbers per layer, not the scores themselves: its
// token count, its energies summed over heads, and its largest always-kept
// set over heads. An engine that splits heads over tensor-parallel ranks
// scores its own heads, summarises them, all-reduces the summaries (energies
// by sum, protected counts by max: combine() below) and plans with the
// reduced values on every rank, which then agree on the budgets.
//
//   total  round(ratio * sum N_l), or count * layers (rules::model_total)
//   floor  max(protected count, ceil(min_layer_ratio * N_l)) (rules::layer_floor)
//   split  Allocation::dynamic: water-filling on R_l (allocate.hpp);
//          Allocation::uniform: every layer keeps its own ratio or count
#include <algorithm>
#include <cstdint>
#include <vector>

#include "allocate.hpp"
#include "mask.hpp"
#include "options.hpp"
#include "rules.hpp"
#include "score.hpp"
#include "select.hpp"

namespace flashcache {

// What planning needs of one layer (of one sequence).
struct LayerSummary {
  std::int64_t tokens = 0;
  HeadEnergy energy;                 // summed over the layer's heads
  std::int64_t protected_count = 0;  // largest always-kept set over the layer's heads

  // R_l = E_high(K)/E(K) + E_high(V)/E(V) of the summed energies.
  double energy_ratio() const {
    return rules::energy_ratio(energy.k_total, energy.k_high, energy.v_total, energy.v_high);
  }
};

// The summary of a scored layer: energy[h] for each head, its scores, the
// caller's protected set. Allocates nothing.
inline LayerSummary summarize(ScoreView scores, const HeadEnergy* energy, const SelectOptions& opt, ProtectMask mask) {
  LayerSummary s;
  s.tokens = scores.tokens;
  for (std::int64_t h = 0; h < scores.heads; ++h) {
    s.energy.k_total += energy[h].k_total;
    s.energy.k_high += energy[h].k_high;
    s.energy.v_total += energy[h].v_total;
    s.energy.v_high += energy[h].v_high;
  }
  s.protected_count = protected_count(scores, opt, mask);
  return s;
}

// The reduction tensor-parallel ranks apply to the summaries of one layer:
// energies add up, the always-kept set is the largest of any head.
inline LayerSummary combine(const LayerSummary& a, const LayerSummary& b) {
  LayerSummary s;
  s.tokens = a.tokens;
  s.energy.k_total = a.energy.k_total + b.energy.k_total;
  s.energy.k_high = a.energy.k_high + b.energy.k_high;
  s.energy.v_total = a.energy.v_total + b.energy.v_total;
  s.energy.v_high = a.energy.v_high + b.energy.v_high;
  s.protected_count = std::max(a.protected_count, b.protected_count);
  return s;
}

// Plans budgets[l] for `layers` layers into caller memory. Owns its scratch
// (energy ratios, token counts, floors): no allocation once it has planned
// this many layers.
class BudgetPlanner {
 public:
  Status plan(const LayerSummary* summary, int layers, Budget budget, const AllocateOptions& opt,
              std::int64_t* budgets) {
    FLASHCACHE_RETURN_IF_ERROR(check_options(opt));
    if (layers < 0) return make_error(Errc::invalid_shape, "layer count ", layers, " is negative");
    if (layers > 0 && (summary == nullptr || budgets == nullptr))
      return make_error(Errc::invalid_shape, "plan: null summary or budget array");
    const auto count = static_cast<std::size_t>(layers);
    ratio_.resize(count);
    tokens_.resize(count);
    floor_.resize(count);
    std::int64_t tokens_sum = 0;
    for (std::size_t l = 0; l < count; ++l) {
      const LayerSummary& s = summary[l];
      tokens_[l] = s.tokens;
      ratio_[l] = s.energy_ratio();
      floor_[l] = rules::layer_floor(s.protected_count, opt.min_layer_ratio, s.tokens);
      const Status resolved = budget.resolve(s.tokens, &budgets[l]);
      if (!resolved.ok()) return make_error(resolved.code(), "layer ", l, ": ", resolved.message());
      tokens_sum += s.tokens;
    }
    if (opt.mode != Allocation::dynamic) return Status::success();
    // The model-wide total is round(ratio * all tokens), not a sum of per-layer roundings.
    const std::int64_t total =
        rules::model_total(budget.is_ratio(), budget.ratio_value(), budget.token_count(), tokens_sum, layers);
    FLASHCACHE_RETURN_IF_ERROR(check_allocation(layers, ratio_.data(), tokens_.data(), floor_.data(), total));
    allocate_budgets(layers, ratio_.data(), tokens_.data(), floor_.data(), total, budgets);
    return Status::success();
  }

  // R_l of the layers last planned.
  const std::vector<double>& energy_ratio() const { return ratio_; }

 private:
  std::vector<double> ratio_;
  std::vector<std::int64_t> tokens_, floor_;
};

}  // namespace flashcache
