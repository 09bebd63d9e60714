#pragma once
// grid_eval's measurement of one entry: per layer, every variant scored once
// (policies::score_with_policy; random: once per seed) and selected at every
// keep ratio (select_tokens with the CLS tokens protected, uniform budget), the
// attention error of each kept set by attention_error.hpp's LayerAttention
// (--verify: layer 0 also by attention_error() itself).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "attention_error.hpp"
#include "eval_util.hpp"
#include "flashcache/flashcache.hpp"
#include "flashcache/policies/baselines.hpp"
#include "grid_entries.hpp"
#include "grid_variants.hpp"

namespace flashcache::quality::grid {

namespace fc = flashcache;
namespace fp = flashcache::policies;

// Per variant, entry and keep ratio: the per-layer errors (random: the mean over
// seeds) and, for random, the spread of the layer means over seeds.
struct Result {
  std::vector<double> layer;
  double seed_std = -1;
  std::int64_t budget = 0;
  double error() const { return mean_of(layer); }
};
using Results = std::map<std::string, std::map<std::string, std::map<double, Result>>>;  // key, entry, keep

inline void evaluate_entry(const Entry& e, const std::vector<Variant>& variants, const std::vector<double>& ratios,
                           int seeds, bool verify, Results* results) {
  const Cache& c = e.cache;
  std::vector<std::uint8_t> protect(static_cast<std::size_t>(c.tokens), 0);
  for (std::int64_t t : e.cls) protect[static_cast<std::size_t>(t)] = 1;
  const fc::ProtectMask mask(protect);
  fp::PolicyOptions po;  // observation window 32, pool 7
  fc::SelectWorkspace ws;
  std::vector<std::int32_t> kept;
  // per variant key, ratio: [layer][seed] errors
  std::map<std::string, std::map<double, std::vector<std::vector<double>>>> raw;
  const auto kviews = c.k_views(), vviews = c.v_views(), qviews = c.q_views();
  const std::int64_t n = c.tokens, d = c.head_dim;
  const AttentionSetup setup{c.q_heads, c.heads, n, d, n, 0, n, false, c.scale};
  for (std::int64_t l = 0; l < c.layers; ++l) {
    LayerAttention att(c.q_layer(l), c.k_layer(l), c.v_layer(l), setup);
    const auto& kv = kviews[static_cast<std::size_t>(l)];
    const auto& vv = vviews[static_cast<std::size_t>(l)];
    const auto& qv = qviews[static_cast<std::size_t>(l)];
    std::map<std::string, std::vector<fc::LayerScores>> scored;  // score key -> per seed
    for (const Variant& v : variants) {
      const fc::Options opt = variant_options(v);
      const fc::ImageSpans spans = variant_spans(v, e);
      const int runs = v.policy == fp::Policy::random ? seeds : 1;
      auto& scores = scored[v.score_key()];
      if (scores.empty())
        for (int s = 0; s < runs; ++s) {
          po.seed = static_cast<std::uint64_t>(s);
          fc::LayerScores ls;
          fc::throw_if_error(fp::score_with_policy<float>(v.policy, qv, kv, vv, opt.score, po, &ls, spans));
          scores.push_back(std::move(ls));
        }
      for (double ratio : ratios) {
        const std::int64_t budget = std::llround(ratio * static_cast<double>(n));
        auto& slot = raw[v.key()][ratio];
        slot.emplace_back();
        for (const fc::LayerScores& ls : scores) {
          kept.assign(static_cast<std::size_t>(c.heads * budget), 0);
          fc::throw_if_error(fc::select_tokens(ls.view(), budget, opt.select, mask, spans, &ws,
                                             fc::KeptView{kept.data(), budget}));
          const double err = att.relative_error(kept, budget);
          if (verify && l == 0) {
            const ErrorSums ref =
                attention_error(c.q_layer(l), c.k_layer(l), c.v_layer(l), setup, kept.data(), budget);
            if (std::abs(ref.relative() - err) > 1e-9 * std::max(1.0, ref.relative()))
              fail("--verify: " + e.name + " " + v.key() + " keep " + share_text(ratio) + ": GEMM error " +
                   std::to_string(err) + " vs attention_error.hpp " + std::to_string(ref.relative()));
          }
          slot.back().push_back(err);
        }
        (*results)[v.key()][e.name][ratio].budget = budget;
      }
    }
  }
  for (auto& [key, by_ratio] : raw)
    for (auto& [ratio, per_layer] : by_ratio) {
      Result& r = (*results)[key][e.name][ratio];
      const std::size_t runs = per_layer.front().size();
      r.layer.clear();
      for (const auto& seedwise : per_layer) r.layer.push_back(mean_of(seedwise));
      if (runs > 1) {
        std::vector<double> per_seed(runs, 0.0);
        for (const auto& seedwise : per_layer)
          for (std::size_t s = 0; s < runs; ++s) per_seed[s] += seedwise[s] / static_cast<double>(per_layer.size());
        const double m = mean_of(per_seed);
        double var = 0;
        for (double x : per_seed) var += (x - m) * (x - m);
        r.seed_std = std::sqrt(var / static_cast<double>(runs - 1));
      }
    }
}

}  // namespace flashcache::quality::grid
