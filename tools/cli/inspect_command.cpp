// `flashcache inspect`: how much of each layer's energy sits below the
// low-pass cutoff, and the energy ratios R_l that drive budget allocation.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "commands.hpp"
#include "flashcache/score.hpp"
#include "input.hpp"

namespace flashcache::cli {

namespace {

template <class T>
std::vector<LayerScores> score_all(const KVCache& cache, const Options& opt) {
  const auto k = cache.views<T>(cache.k), v = cache.views<T>(cache.v);
  std::vector<LayerScores> out(k.size());
  Scorer<float> scorer;
  for (std::size_t l = 0; l < k.size(); ++l) {
    const Status s = scorer.score(k[l], v[l], opt.score, &out[l]);
    if (!s.ok()) throw Error(make_error(s.code(), "layer ", l, ": ", s.message()));
  }
  return out;
}

void print_row(const std::string& label, const HeadEnergy& e, double share) {
  const double r = high_share(e.k_high, e.k_total) + high_share(e.v_high, e.v_total);
  std::printf("%5s %15.6f %15.6f %11.6f %11.3f\n", label.c_str(), 1.0 - high_share(e.k_high, e.k_total),
              1.0 - high_share(e.v_high, e.v_total), r, share);
}

}  // namespace

int run_inspect(const InspectArgs& a) {
  check_transform_args(a.transform);
  const KVCache cache = load_cache(a.k, a.v);
  const Options opt = to_options(a.transform);
  const std::vector<LayerScores> layers =
      cache.dtype == DType::f16 ? score_all<half_t>(cache, opt) : score_all<float>(cache, opt);

  std::printf("%s, %s: %lld layers x %lld heads x %lld tokens x %lld dims, %s\n", a.k.c_str(), a.v.c_str(),
              static_cast<long long>(cache.layers), static_cast<long long>(cache.heads),
              static_cast<long long>(cache.tokens), static_cast<long long>(cache.head_dim), to_string(cache.dtype));
  if (opt.score.transform == Transform::global)
    std::printf("global transform, gamma %g: the base is the lowest %lld of %lld frequencies\n\n", opt.score.gamma,
                static_cast<long long>(lowpass_cutoff(cache.tokens, opt.score.gamma)), static_cast<long long>(cache.tokens));
  else {
    const std::int64_t len = std::min(opt.score.block_size, cache.tokens);
    std::printf(
        "blocked transform (%lld-token blocks), gamma %g: the base is the lowest %lld of %lld frequencies "
        "per block\n\n",
        static_cast<long long>(opt.score.block_size), opt.score.gamma, static_cast<long long>(lowpass_cutoff(len, opt.score.gamma)),
        static_cast<long long>(len));
  }

  double r_sum = 0;
  for (const auto& l : layers) r_sum += l.energy_ratio();
  std::printf("%5s %15s %15s %11s %11s\n", "layer", "K below cutoff", "V below cutoff", "R_l", "share of R");
  HeadEnergy all;
  std::int64_t nonfinite = 0;
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const HeadEnergy e = layers[l].layer_energy();
    print_row(std::to_string(l), e, r_sum > 0 ? layers[l].energy_ratio() / r_sum : 0.0);
    all.k_total += e.k_total;
    all.k_high += e.k_high;
    all.v_total += e.v_total;
    all.v_high += e.v_high;
    nonfinite += layers[l].nonfinite;
  }
  print_row("total", all, r_sum > 0 ? 1.0 : 0.0);

  std::printf(
      "\nbelow cutoff: share of the energy in the base frequencies, 1 - E_high/E\n"
      "R_l = E_high(K)/E(K) + E_high(V)/E(V); share of R: R_l / sum R, how a dynamic budget is split "
      "(before clamping)\n"
      "total: the same over the energies of all layers\n");
  if (nonfinite > 0)
    std::printf("note: %lld (layer, head, token) rows hold NaN or infinity; they add no energy and are always kept\n",
                static_cast<long long>(nonfinite));
  return 0;
}

}  // namespace flashcache::cli
