// Bases chosen by energy (ScoreOptions::base = peak, mixed) against a direct
// reference: the naive double DCT of every column, frequency energies summed
// over the head dim, a full sort for the choice, the inverse of the rest.
#include <gtest/gtest.h>
#include <flashcache/flashcache.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "reference.hpp"

namespace fc = flashcache;
using fc::testing::naive_dct2;
using fc::testing::naive_dct3;

namespace {

// The base frequencies of one transform, from the definition: the lowest
// `low`, then the rest by energy (most first, ties to the lower frequency).
std::vector<bool> reference_choice(fc::Base kind, const std::vector<double>& energy, std::int64_t m) {
  const auto len = static_cast<std::int64_t>(energy.size());
  const std::int64_t low = kind == fc::Base::lowpass ? m : kind == fc::Base::mixed ? (m + 1) / 2 : 0;
  std::vector<bool> chosen(energy.size(), false);
  std::vector<std::int64_t> rest;
  for (std::int64_t k = 0; k < len; ++k) {
    if (k < low)
      chosen[k] = true;
    else
      rest.push_back(k);
  }
  std::stable_sort(rest.begin(), rest.end(), [&](std::int64_t a, std::int64_t b) { return energy[a] > energy[b]; });
  for (std::int64_t i = 0; i < m - low && i < static_cast<std::int64_t>(rest.size()); ++i) chosen[rest[i]] = true;
  return chosen;
}

struct Reference {
  std::vector<double> score;
  double k_high = 0, v_high = 0;
};

// One head, K and V as [tokens][d] row-major doubles; block 0 = global.
Reference reference_score(const std::vector<double>& k, const std::vector<double>& v, std::int64_t n, std::int64_t d,
                          double gamma, std::int64_t block, fc::Base kind) {
  Reference out;
  out.score.assign(static_cast<std::size_t>(n), 0.0);
  const std::int64_t step = block > 0 ? block : n;
  for (std::int64_t b0 = 0; b0 < n; b0 += step) {
    const std::int64_t len = std::min(step, n - b0), m = fc::lowpass_cutoff(len, gamma);
    for (int which = 0; which < 2; ++which) {
      const std::vector<double>& src = which == 0 ? k : v;
      std::vector<std::vector<double>> coeff;
      std::vector<double> energy(static_cast<std::size_t>(len), 0.0);
      for (std::int64_t c = 0; c < d; ++c) {
        std::vector<double> col(static_cast<std::size_t>(len));
        for (std::int64_t t = 0; t < len; ++t) col[t] = src[(b0 + t) * d + c];
        coeff.push_back(naive_dct2(col));
        for (std::int64_t f = 0; f < len; ++f) energy[f] += coeff.back()[f] * coeff.back()[f];
      }
      const std::vector<bool> chosen = reference_choice(kind, energy, m);
      for (std::int64_t c = 0; c < d; ++c) {
        std::vector<double> rest = coeff[c];
        for (std::int64_t f = 0; f < len; ++f)
          if (chosen[f]) rest[f] = 0;
        const std::vector<double> r = naive_dct3(rest);
        for (std::int64_t t = 0; t < len; ++t) {
          out.score[b0 + t] += r[t] * r[t] / static_cast<double>(d);
          (which == 0 ? out.k_high : out.v_high) += r[t] * r[t];
        }
      }
    }
  }
  return out;
}

std::vector<float> random_rows(std::int64_t count, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  std::vector<float> x(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i)  // a periodic pattern plus noise, so the spectrum has peaks
    x[i] = static_cast<float>(std::sin(0.9 * static_cast<double>(i / 7)) + 0.5 * normal(rng));
  return x;
}

using Case = std::tuple<fc::Base, fc::Transform, std::int64_t /*tokens*/, std::int64_t /*dim*/, std::int64_t /*block*/,
                        double /*gamma*/>;
class BaseVsReference : public ::testing::TestWithParam<Case> {};

TEST_P(BaseVsReference, DoubleAndFloatMatchTheDefinition) {
  const auto [kind, transform, n, dim, block, gamma] = GetParam();
  const std::int64_t heads = 2;
  const std::vector<float> k = random_rows(heads * n * dim, static_cast<std::uint64_t>(n * 7 + dim));
  const std::vector<float> v = random_rows(heads * n * dim, static_cast<std::uint64_t>(n * 11 + dim));
  fc::Options opt;
  opt.score.mean_weight = 0.0;  // the residual alone, as the reference defines it
  opt.score.base = kind;
  opt.score.transform = transform;
  opt.score.block_size = block;
  opt.score.gamma = gamma;
  const auto kv = fc::hnd(k.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(dim));
  const auto vv = fc::hnd(v.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(dim));
  const fc::LayerScores sd = fc::score_layer<double>(kv, vv, opt.score);
  const fc::LayerScores sf = fc::score_layer<float>(kv, vv, opt.score);
  for (std::int64_t h = 0; h < heads; ++h) {
    const std::vector<double> kh(k.begin() + h * n * dim, k.begin() + (h + 1) * n * dim);
    const std::vector<double> vh(v.begin() + h * n * dim, v.begin() + (h + 1) * n * dim);
    const Reference ref =
        reference_score(kh, vh, n, dim, gamma, transform == fc::Transform::blocked ? block : 0, kind);
    const double top = *std::max_element(ref.score.begin(), ref.score.end()) + 1e-30;
    for (std::int64_t t = 0; t < n; ++t) {
      EXPECT_NEAR(sd(h, t), ref.score[t], 1e-6 * top) << "head " << h << " token " << t;
      EXPECT_NEAR(sf(h, t), ref.score[t], 2e-4 * top) << "head " << h << " token " << t;
    }
    EXPECT_NEAR(sd.energy[h].k_high, ref.k_high, 1e-7 * (ref.k_high + 1e-30));
    EXPECT_NEAR(sd.energy[h].v_high, ref.v_high, 1e-7 * (ref.v_high + 1e-30));
  }
}

INSTANTIATE_TEST_SUITE_P(
    AwkwardSizes, BaseVsReference,
    ::testing::Values(Case{fc::Base::peak, fc::Transform::global, 1, 3, 64, 0.2},
                      Case{fc::Base::peak, fc::Transform::global, 37, 5, 64, 0.2},
                      Case{fc::Base::peak, fc::Transform::global, 101, 7, 64, 0.1},
                      Case{fc::Base::mixed, fc::Transform::global, 101, 5, 64, 0.3},
                      Case{fc::Base::peak, fc::Transform::blocked, 101, 5, 16, 0.2},
                      Case{fc::Base::peak, fc::Transform::blocked, 37, 9, 64, 0.3},
                      Case{fc::Base::mixed, fc::Transform::blocked, 130, 3, 17, 0.2},
                      Case{fc::Base::peak, fc::Transform::blocked, 29, 4, 1, 0.2},
                      Case{fc::Base::lowpass, fc::Transform::blocked, 101, 5, 16, 0.2}));

TEST(Base, ChoiceTakesTheStrongestAndTiesToTheLowerFrequency) {
  std::vector<std::int32_t> order;
  std::vector<std::uint8_t> chosen(6);
  const std::vector<double> energy = {1, 5, 2, 5, 9, 2};
  fc::choose_base_frequencies(fc::Base::peak, energy.data(), 6, 3, &order, chosen.data());
  EXPECT_EQ(chosen, (std::vector<std::uint8_t>{0, 1, 0, 1, 1, 0}));
  fc::choose_base_frequencies(fc::Base::mixed, energy.data(), 6, 3, &order, chosen.data());
  EXPECT_EQ(chosen, (std::vector<std::uint8_t>{1, 1, 0, 0, 1, 0}));  // 0, 1 lowest; then 4
  fc::choose_base_frequencies(fc::Base::lowpass, energy.data(), 6, 3, &order, chosen.data());
  EXPECT_EQ(chosen, (std::vector<std::uint8_t>{1, 1, 1, 0, 0, 0}));
  const std::vector<double> flat(6, 1.0);  // all tied: the lowest, as the paper's filter
  fc::choose_base_frequencies(fc::Base::peak, flat.data(), 6, 2, &order, chosen.data());
  EXPECT_EQ(chosen, (std::vector<std::uint8_t>{1, 1, 0, 0, 0, 0}));
}

// The property the peak base is for: a token that breaks a repeated pattern.
// The pattern is rough (it repeats every 3 tokens), so a low-pass base leaves
// every token's residual large; the peak base absorbs the pattern's harmonics
// and the odd token stands out.
TEST(Base, PeakFindsTheTokenThatBreaksARepeatedPattern) {
  const std::int64_t n = 240, d = 8, needle = 131;
  std::vector<float> k(static_cast<std::size_t>(n * d)), v(k.size());
  for (std::int64_t t = 0; t < n; ++t)
    for (std::int64_t c = 0; c < d; ++c) {
      const double phase = 2.0 * M_PI * static_cast<double>(t % 3) / 3.0 + static_cast<double>(c);
      k[t * d + c] = static_cast<float>(std::sin(phase) + (t == needle ? 0.8 * std::cos(3.0 * c) : 0.0));
      v[t * d + c] = static_cast<float>(std::cos(phase));
    }
  const auto kv = fc::hnd(k.data(), fc::Heads(1), fc::Tokens(n), fc::HeadDim(d));
  const auto vv = fc::hnd(v.data(), fc::Heads(1), fc::Tokens(n), fc::HeadDim(d));
  for (fc::Transform transform : {fc::Transform::global, fc::Transform::blocked}) {
    fc::Options opt;
    opt.score.transform = transform;
    opt.score.block_size = 60;  // whole periods per block: a cut pattern leaks into every frequency at the block's edges
    opt.score.gamma = 0.2;      // room for that leakage: a DCT does not make a period-3 pattern exactly sparse
    opt.score.base = fc::Base::peak;
    const fc::LayerScores peak = fc::score_layer(kv, vv, opt.score);
    const auto top = std::max_element(peak.score.begin(), peak.score.end()) - peak.score.begin();
    EXPECT_EQ(top, needle) << fc::to_string(transform);
    opt.score.base = fc::Base::lowpass;
    const fc::LayerScores low = fc::score_layer(kv, vv, opt.score);
    // Under the low-pass base the pattern itself is residual: the needle is
    // not the clear top (other tokens come within a factor 2 of it).
    std::vector<float> sorted = low.score;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_LT(sorted[sorted.size() - 1], 2.0f * sorted[sorted.size() - 2]) << fc::to_string(transform);
  }
}

TEST(Base, PaperPresetKeepsTheLowPassBase) { EXPECT_EQ(fc::Options::paper().score.base, fc::Base::lowpass); }

TEST(Base, NonFiniteTokensStayAlwaysKept) {
  const std::int64_t n = 50, d = 4;
  std::vector<float> k = random_rows(n * d, 3), v = random_rows(n * d, 4);
  k[17 * d + 2] = std::numeric_limits<float>::quiet_NaN();
  const auto kv = fc::hnd(k.data(), fc::Heads(1), fc::Tokens(n), fc::HeadDim(d));
  const auto vv = fc::hnd(v.data(), fc::Heads(1), fc::Tokens(n), fc::HeadDim(d));
  for (fc::Transform transform : {fc::Transform::global, fc::Transform::blocked}) {
    fc::Options opt;
    opt.score.transform = transform;
    opt.score.block_size = 16;
    opt.score.base = fc::Base::peak;
    const fc::LayerScores s = fc::score_layer(kv, vv, opt.score);
    EXPECT_TRUE(std::isinf(s(0, 17)));
    for (std::int64_t t = 0; t < n; ++t) {
      if (t != 17) {
        EXPECT_TRUE(std::isfinite(s(0, t))) << t;
      }
    }
  }
}

}  // namespace
