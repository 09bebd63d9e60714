#pragma once
// The paper's founding observation, measured: how much of the K and V energy
// sits below the low-pass cutoff (the lowest max(1, ceil(gamma * N)) DCT
// frequencies along the token axis), with the library's own scorer.
//
// Besides the raw share, three controls tell how much of it is structure along
// the tokens rather than a constant offset: "centered" removes each (head,
// column) mean over the tokens first (the DC term holds the mean); "shuffled"
// permutes the tokens at random (same permutation for every head), which keeps
// the mean but destroys any order; "centered_shuffled" does both, and for
// tokens without order it comes to about gamma.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "flashcache/score.hpp"

namespace flashcache::quality {

enum class EnergyVariant { raw, centered, shuffled, centered_shuffled };

inline const char* to_string(EnergyVariant v) {
  switch (v) {
    case EnergyVariant::raw:
      return "raw";
    case EnergyVariant::centered:
      return "centered";
    case EnergyVariant::shuffled:
      return "shuffled";
    case EnergyVariant::centered_shuffled:
      return "centered_shuffled";
  }
  return "?";
}

// x: [heads][tokens][head_dim] (tokens contiguous rows); returns the variant's copy.
inline std::vector<float> energy_variant(const float* x, std::int64_t heads, std::int64_t tokens, std::int64_t d,
                                         EnergyVariant variant, std::uint64_t seed = 0) {
  std::vector<float> out(x, x + heads * tokens * d);
  const bool center = variant == EnergyVariant::centered || variant == EnergyVariant::centered_shuffled;
  const bool shuffle = variant == EnergyVariant::shuffled || variant == EnergyVariant::centered_shuffled;
  if (center)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t c = 0; c < d; ++c) {
        double mean = 0;
        for (std::int64_t t = 0; t < tokens; ++t) mean += out[static_cast<std::size_t>((h * tokens + t) * d + c)];
        mean /= static_cast<double>(tokens);
        for (std::int64_t t = 0; t < tokens; ++t)
          out[static_cast<std::size_t>((h * tokens + t) * d + c)] -= static_cast<float>(mean);
      }
  if (shuffle) {
    std::vector<std::int64_t> perm(static_cast<std::size_t>(tokens));
    std::iota(perm.begin(), perm.end(), 0);
    std::mt19937_64 rng(seed);
    std::shuffle(perm.begin(), perm.end(), rng);
    const std::vector<float> in = out;
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t t = 0; t < tokens; ++t)
        std::copy_n(in.begin() + (h * tokens + perm[static_cast<std::size_t>(t)]) * d, d,
                    out.begin() + (h * tokens + t) * d);
  }
  return out;
}

// Energy of one layer (K and V, [heads][tokens][head_dim]) per head, global DCT, low-pass at `gamma`.
inline std::vector<HeadEnergy> layer_energy(const float* k, const float* v, std::int64_t heads, std::int64_t tokens,
                                            std::int64_t d, double gamma) {
  Options opt;
  opt.score.gamma = gamma;
  opt.score.base = Base::lowpass;  // the paper's observation is about the lowest frequencies
  opt.score.transform = Transform::global;
  Scorer<double> scorer;
  LayerScores scores;
  throw_if_error(scorer.score(hnd(k, Heads(heads), Tokens(tokens), HeadDim(d)),
                              hnd(v, Heads(heads), Tokens(tokens), HeadDim(d)), opt.score, &scores));
  return scores.energy;
}

// 1 - E_high / E: the share below the cutoff.
inline double low_share(double high, double total) { return total > 0 ? 1.0 - high / total : 0.0; }

}  // namespace flashcache::quality
