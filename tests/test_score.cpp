// Scores and energies against the direct reference (naive DCT, double).
#include <gtest/gtest.h>
#include <flashcache/flashcache.hpp>
#include <flashcache/score.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "reference.hpp"

namespace fc = flashcache;
using fc::testing::naive_score;
using fc::testing::random_normal;

namespace {

// A random layer in HND layout plus per-head row-major copies for the reference.
struct Layer {
  std::int64_t heads, tokens, dim;
  std::vector<float> k, v;  // HND
  std::vector<double> head_rows(const std::vector<float>& src, std::int64_t h) const {
    return {src.begin() + h * tokens * dim, src.begin() + (h + 1) * tokens * dim};
  }
};

Layer random_layer(std::int64_t heads, std::int64_t tokens, std::int64_t dim, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Layer l{heads, tokens, dim, {}, {}};
  // A smooth trend plus noise, like neighbouring visual tokens.
  const auto noise_k = random_normal(static_cast<std::size_t>(heads * tokens * dim), rng, 0.3);
  const auto noise_v = random_normal(static_cast<std::size_t>(heads * tokens * dim), rng, 0.3);
  for (std::int64_t i = 0; i < heads * tokens * dim; ++i) {
    const double t = static_cast<double>((i / dim) % std::max<std::int64_t>(tokens, 1)) / 17.0;
    l.k.push_back(static_cast<float>(std::sin(t + static_cast<double>(i % dim)) + noise_k[i]));
    l.v.push_back(static_cast<float>(std::cos(0.5 * t) * static_cast<double>(i % 3) + noise_v[i]));
  }
  return l;
}

// The residual alone, without the default's distance from the mean: what the naive references compute.
fc::Options residual_only() {
  fc::Options o;
  o.score.mean_weight = 0.0;
  return o;
}

using Case = std::tuple<std::int64_t /*tokens*/, fc::Transform, std::int64_t /*block*/>;
class ScoreVsReference : public ::testing::TestWithParam<Case> {};

TEST_P(ScoreVsReference, DoubleAndFloatMatchNaive) {
  const auto [n, transform, block] = GetParam();
  const std::int64_t heads = 3, dim = 5;
  const Layer l = random_layer(heads, n, dim, static_cast<std::uint64_t>(n * 31 + block));
  fc::Options opt = residual_only();
  opt.score.base = fc::Base::lowpass;  // the reference's base (test_base covers the others)
  opt.score.transform = transform;
  opt.score.block_size = block;
  const auto kv = fc::hnd(l.k.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(dim));
  const auto vv = fc::hnd(l.v.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(dim));
  const fc::LayerScores sd = fc::score_layer<double>(kv, vv, opt.score);
  const fc::LayerScores sf = fc::score_layer<float>(kv, vv, opt.score);
  ASSERT_EQ(sd.score.size(), static_cast<std::size_t>(heads * n));
  for (std::int64_t h = 0; h < heads; ++h) {
    const auto ref = naive_score(l.head_rows(l.k, h), l.head_rows(l.v, h), n, dim, opt.score.gamma,
                                 transform == fc::Transform::blocked ? block : 0);
    double max_ref = 1e-30;
    for (double s : ref.score) max_ref = std::max(max_ref, s);
    for (std::int64_t t = 0; t < n; ++t) {
      EXPECT_NEAR(sd(h, t), ref.score[t], 1e-6 * max_ref) << "head " << h << " token " << t;
      EXPECT_NEAR(sf(h, t), ref.score[t], 1e-4 * max_ref) << "head " << h << " token " << t;
    }
    const auto& e = sd.energy[h];
    EXPECT_NEAR(e.k_total, ref.k_total, 1e-9 * ref.k_total);
    EXPECT_NEAR(e.v_total, ref.v_total, 1e-9 * ref.v_total);
    EXPECT_NEAR(e.k_high, ref.k_high, 1e-7 * ref.k_total);
    EXPECT_NEAR(e.v_high, ref.v_high, 1e-7 * ref.v_total);
  }
}

INSTANTIATE_TEST_SUITE_P(AwkwardSizes, ScoreVsReference,
                         ::testing::Values(Case{1, fc::Transform::global, 64}, Case{2, fc::Transform::global, 64},
                                           Case{7, fc::Transform::global, 64}, Case{100, fc::Transform::global, 64},
                                           Case{257, fc::Transform::global, 64}, Case{7, fc::Transform::blocked, 64},
                                           Case{257, fc::Transform::blocked, 64}, Case{257, fc::Transform::blocked, 5},
                                           Case{130, fc::Transform::blocked, 1},
                                           Case{1000, fc::Transform::blocked, 128}));

TEST(Score, EnergyRatioIsHighShareOfKPlusV) {
  const Layer l = random_layer(2, 97, 4, 5);
  const auto s = fc::score_layer<double>(fc::hnd(l.k.data(), fc::Heads(2), fc::Tokens(97), fc::HeadDim(4)),
                                         fc::hnd(l.v.data(), fc::Heads(2), fc::Tokens(97), fc::HeadDim(4)));
  const auto e = s.layer_energy();
  EXPECT_DOUBLE_EQ(s.energy_ratio(), e.k_high / e.k_total + e.v_high / e.v_total);
  EXPECT_GT(s.energy_ratio(), 0.0);
  EXPECT_LT(s.energy_ratio(), 2.0);
}

TEST(Score, LayoutDoesNotChangeTheResult) {
  const std::int64_t heads = 2, n = 41, dim = 6;
  const Layer l = random_layer(heads, n, dim, 77);
  // The same data in NHD order.
  std::vector<float> k_nhd(l.k.size()), v_nhd(l.v.size());
  for (std::int64_t h = 0; h < heads; ++h)
    for (std::int64_t t = 0; t < n; ++t)
      for (std::int64_t c = 0; c < dim; ++c) {
        k_nhd[(t * heads + h) * dim + c] = l.k[(h * n + t) * dim + c];
        v_nhd[(t * heads + h) * dim + c] = l.v[(h * n + t) * dim + c];
      }
  const auto a = fc::score_layer(fc::hnd(l.k.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(dim)),
                                 fc::hnd(l.v.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(dim)));
  const auto b = fc::score_layer(fc::nhd(k_nhd.data(), fc::Tokens(n), fc::Heads(heads), fc::HeadDim(dim)),
                                 fc::nhd(v_nhd.data(), fc::Tokens(n), fc::Heads(heads), fc::HeadDim(dim)));
  EXPECT_EQ(a.score, b.score);
}

// After the caller's own check_options, the trusting form (detail::score_trusted) scores the same,
// and still refuses a bad input the options do not cover (K and V of other shapes).
TEST(Score, TrustedFormScoresTheSame) {
  const std::int64_t heads = 2, n = 67, dim = 6;
  const Layer l = random_layer(heads, n, dim, 78);
  const auto k = fc::hnd(l.k.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(dim));
  const auto v = fc::hnd(l.v.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(dim));
  fc::Scorer<float> scorer;
  for (const fc::Options& opt : {fc::Options{}, fc::Options::paper()}) {
    std::vector<float> a(static_cast<std::size_t>(heads * n)), b(a.size());
    std::vector<fc::HeadEnergy> ea(static_cast<std::size_t>(heads)), eb(ea.size());
    ASSERT_TRUE(scorer.score(k, v, opt.score, fc::ScoreBuffers{a.data(), ea.data()}).ok());
    ASSERT_TRUE(fc::check_options(opt).ok());
    ASSERT_TRUE(fc::detail::score_trusted(&scorer, k, v, opt.score, fc::ScoreBuffers{b.data(), eb.data()}, {}).ok());
    EXPECT_EQ(a, b);
    EXPECT_EQ(ea[1].k_high, eb[1].k_high);
  }
  const auto short_v = fc::hnd(l.v.data(), fc::Heads(heads), fc::Tokens(n - 1), fc::HeadDim(dim));
  std::vector<float> s(static_cast<std::size_t>(heads * n));
  std::vector<fc::HeadEnergy> e(static_cast<std::size_t>(heads));
  EXPECT_FALSE(
      fc::detail::score_trusted(&scorer, k, short_v, fc::ScoreOptions{}, fc::ScoreBuffers{s.data(), e.data()}, {}).ok());
}

TEST(Score, HalfInputsScoreTheirRoundedValues) {
  const std::int64_t heads = 2, n = 33, dim = 8;
  const Layer l = random_layer(heads, n, dim, 8);
  std::vector<fc::half_t> kh, vh;
  std::vector<float> kr, vr;  // the rounded values, as float
  for (float x : l.k) kh.emplace_back(x), kr.push_back(static_cast<float>(kh.back()));
  for (float x : l.v) vh.emplace_back(x), vr.push_back(static_cast<float>(vh.back()));
  const auto a = fc::score_layer<double>(fc::hnd(kh.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(dim)),
                                         fc::hnd(vh.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(dim)));
  const auto b = fc::score_layer<double>(fc::hnd(kr.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(dim)),
                                         fc::hnd(vr.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(dim)));
  EXPECT_EQ(a.score, b.score);
}

TEST(Score, PlantedOutlierScoresHighest) {
  // A smooth sequence with one token replaced by noise: that token stands out.
  const std::int64_t n = 200, dim = 16;
  std::vector<float> k(n * dim), v(n * dim);
  for (std::int64_t t = 0; t < n; ++t)
    for (std::int64_t c = 0; c < dim; ++c) {
      k[t * dim + c] = static_cast<float>(std::sin(0.02 * t + c));
      v[t * dim + c] = static_cast<float>(std::cos(0.03 * t * (c % 4 + 1)));
    }
  for (std::int64_t c = 0; c < dim; ++c) k[123 * dim + c] += (c % 2 ? 2.0f : -2.0f);
  const auto s = fc::score_layer(fc::hnd(k.data(), fc::Heads(1), fc::Tokens(n), fc::HeadDim(dim)),
                                 fc::hnd(v.data(), fc::Heads(1), fc::Tokens(n), fc::HeadDim(dim)));
  const auto best = std::max_element(s.score.begin(), s.score.end()) - s.score.begin();
  EXPECT_EQ(best, 123);
}

TEST(Score, NonFiniteTokensScoreInfinityWithoutSpreading) {
  const std::int64_t heads = 2, n = 50, dim = 4;
  Layer l = random_layer(heads, n, dim, 9);
  const Layer clean = l;
  l.k[(1 * n + 10) * dim + 2] = std::numeric_limits<float>::quiet_NaN();  // head 1, token 10
  l.v[(0 * n + 0) * dim + 0] = std::numeric_limits<float>::infinity();    // head 0, token 0
  for (auto tr : {fc::Transform::global, fc::Transform::blocked}) {
    fc::Options opt = residual_only();  // the distance's mean would move with the patched token
    opt.score.transform = tr;
    opt.score.block_size = 16;
    const auto s = fc::score_layer(fc::hnd(l.k.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(dim)),
                                   fc::hnd(l.v.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(dim)), opt.score);
    EXPECT_EQ(s.nonfinite, 2);
    EXPECT_TRUE(std::isinf(s(1, 10)));
    EXPECT_TRUE(std::isinf(s(0, 0)));
    std::int64_t infinite = 0;
    for (float x : s.score) {
      EXPECT_FALSE(std::isnan(x));
      infinite += std::isinf(x);
    }
    EXPECT_EQ(infinite, 2);
    EXPECT_TRUE(std::isfinite(s.energy_ratio()));
    // Head 1's other scores equal those of the clean input with token 10 replaced by token 9.
    Layer patched = clean;
    for (std::int64_t c = 0; c < dim; ++c) {
      patched.k[(1 * n + 10) * dim + c] = clean.k[(1 * n + 9) * dim + c];
      patched.v[(1 * n + 10) * dim + c] = clean.v[(1 * n + 9) * dim + c];
    }
    const auto p = fc::score_layer(fc::hnd(patched.k.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(dim)),
                                   fc::hnd(patched.v.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(dim)), opt.score);
    for (std::int64_t t = 0; t < n; ++t)
      if (t != 10) {
        EXPECT_FLOAT_EQ(s(1, t), p(1, t)) << t;
      }
  }
}

TEST(Score, AllNonFiniteHeadStillScores) {
  std::vector<float> k(3 * 2, std::numeric_limits<float>::quiet_NaN()), v(3 * 2, 1.0f);
  const auto s = fc::score_layer(fc::hnd(k.data(), fc::Heads(1), fc::Tokens(3), fc::HeadDim(2)),
                                 fc::hnd(v.data(), fc::Heads(1), fc::Tokens(3), fc::HeadDim(2)));
  EXPECT_EQ(s.nonfinite, 3);
  EXPECT_EQ(s.energy_ratio(), 0.0);
}

TEST(Score, EmptyLayerIsFine) {
  std::vector<float> none;
  const auto s = fc::score_layer(fc::hnd(none.data(), fc::Heads(4), fc::Tokens(0), fc::HeadDim(8)),
                                 fc::hnd(none.data(), fc::Heads(4), fc::Tokens(0), fc::HeadDim(8)));
  EXPECT_TRUE(s.score.empty());
  EXPECT_EQ(s.energy_ratio(), 0.0);
}

TEST(Score, BadInputThrowsNamedError) {
  std::vector<float> k(24), v(24);
  fc::Options opt;
  opt.score.gamma = 2;
  try {
    fc::score_layer(fc::hnd(k.data(), fc::Heads(2), fc::Tokens(3), fc::HeadDim(4)),
                    fc::hnd(v.data(), fc::Heads(2), fc::Tokens(3), fc::HeadDim(4)), opt.score);
    FAIL() << "expected flashcache::Error";
  } catch (const fc::Error& e) {
    EXPECT_EQ(e.code(), fc::Errc::invalid_option);
    EXPECT_NE(std::string(e.what()).find("gamma 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(fc::score_layer(fc::hnd(k.data(), fc::Heads(2), fc::Tokens(3), fc::HeadDim(4)),
                               fc::hnd(v.data(), fc::Heads(3), fc::Tokens(2), fc::HeadDim(4))),
               fc::Error);
}

}  // namespace

namespace {

// normalize_terms: each term divided by its mean over the head's tokens.
TEST(Score, NormalizedTermsAreDividedByTheirHeadMeans) {
  const std::int64_t heads = 2, n = 57, dim = 6;
  const Layer l = random_layer(heads, n, dim, 99);
  fc::Options opt = residual_only();
  opt.score.base = fc::Base::lowpass;  // the reference's base
  opt.score.normalize_terms = true;
  const auto kv = fc::hnd(l.k.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(dim)),
             vv = fc::hnd(l.v.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(dim));
  const fc::LayerScores s = fc::score_layer<double>(kv, vv, opt.score);
  for (std::int64_t h = 0; h < heads; ++h) {
    // The reference's score is the sum of both terms: rebuild each from K alone and V alone.
    const auto zeros = std::vector<double>(static_cast<std::size_t>(n * dim), 0.0);
    const auto ref_k = naive_score(l.head_rows(l.k, h), zeros, n, dim, opt.score.gamma, 0);
    const auto ref_v = naive_score(zeros, l.head_rows(l.v, h), n, dim, opt.score.gamma, 0);
    double mean_k = 0, mean_v = 0;
    for (std::int64_t t = 0; t < n; ++t) mean_k += ref_k.score[t] / n, mean_v += ref_v.score[t] / n;
    for (std::int64_t t = 0; t < n; ++t)
      EXPECT_NEAR(s(h, t), ref_k.score[t] / mean_k + ref_v.score[t] / mean_v, 1e-5) << h << " " << t;
  }
}

// mean_weight: each token's distance from its head's mean K and V (a naive double
// reference, the mean over the finite tokens; a non-finite token reads the nearest
// finite one before it and keeps +inf), mixed with the residual by sum or max.
TEST(Score, MeanWeightMixesEachTokensDistanceFromTheHeadMean) {
  const std::int64_t heads = 2, n = 61, dim = 6;
  Layer l = random_layer(heads, n, dim, 41);
  l.v[static_cast<std::size_t>((1 * n + 30) * dim + 2)] = std::numeric_limits<float>::quiet_NaN();  // head 1, token 30
  const auto kv = fc::hnd(l.k.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(dim)),
             vv = fc::hnd(l.v.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(dim));
  fc::Options opt = residual_only();
  opt.score.mean_distance = fc::MeanDistance::kv_squared;  // the distance this reference computes
  const fc::LayerScores residual = fc::score_layer<double>(kv, vv, opt.score);
  for (const fc::TailMix mix : {fc::TailMix::sum, fc::TailMix::max}) {
    const double w = 0.3;
    opt.score.mean_weight = w;
    opt.score.mean_mix = mix;
    const fc::LayerScores s = fc::score_layer<double>(kv, vv, opt.score);
    for (std::int64_t h = 0; h < heads; ++h) {
      auto bad = [&](std::int64_t t) { return h == 1 && t == 30; };
      std::vector<double> mean(static_cast<std::size_t>(2 * dim), 0.0), dist(static_cast<std::size_t>(n));
      for (std::int64_t t = 0; t < n; ++t)
        for (std::int64_t c = 0; c < dim && !bad(t); ++c) {
          mean[static_cast<std::size_t>(c)] += l.k[static_cast<std::size_t>((h * n + t) * dim + c)] / (n - (h == 1));
          mean[static_cast<std::size_t>(dim + c)] += l.v[static_cast<std::size_t>((h * n + t) * dim + c)] / (n - (h == 1));
        }
      double sum_r = 0, sum_d = 0;
      for (std::int64_t t = 0; t < n; ++t) {
        const std::int64_t src = bad(t) ? t - 1 : t;
        double d2 = 0;
        for (std::int64_t c = 0; c < dim; ++c) {
          const double dk = l.k[static_cast<std::size_t>((h * n + src) * dim + c)] - mean[static_cast<std::size_t>(c)];
          const double dv = l.v[static_cast<std::size_t>((h * n + src) * dim + c)] - mean[static_cast<std::size_t>(dim + c)];
          d2 += dk * dk + dv * dv;
        }
        dist[static_cast<std::size_t>(t)] = d2 / dim;
        if (!bad(t)) sum_r += residual(h, t), sum_d += dist[static_cast<std::size_t>(t)];
      }
      const double finite = static_cast<double>(n - (h == 1));
      for (std::int64_t t = 0; t < n; ++t) {
        if (bad(t)) {
          EXPECT_TRUE(std::isinf(s(h, t)));
          continue;
        }
        const double a = (1 - w) * residual(h, t) / (sum_r / finite), b = w * dist[static_cast<std::size_t>(t)] / (sum_d / finite);
        EXPECT_NEAR(s(h, t), mix == fc::TailMix::sum ? a + b : std::max(a, b), 1e-5 * (1 + a + b)) << h << " " << t;
      }
    }
  }
}

// MeanDistance::key_cosine: 1 - cos(key, mean of the finite tokens' unit keys), 0 below
// 8 float epsilons, from a naive double reference on awkward sizes, summed in double and
// in float; a zero key has cosine 0 (an unguarded 0 / 0 would fail the comparison), a
// single token's distance is 0 (its key is the anchor), and a non-finite token keeps +inf.
TEST(Score, KeyCosineMixesEachKeysDistanceFromTheMeanDirection) {
  for (const std::int64_t n : {1, 2, 7, 61, 130}) {
    const std::int64_t heads = 2, dim = 5;
    Layer l = random_layer(heads, n, dim, static_cast<std::uint64_t>(53 + n));
    auto key = [&](std::int64_t h, std::int64_t t, std::int64_t c) -> float& {
      return l.k[static_cast<std::size_t>((h * n + t) * dim + c)];
    };
    const bool has_bad = n > 2;
    const std::int64_t zero = n / 2, nan_at = n - 1;  // head 0: a zero key; head 1: a NaN key
    if (n > 1)
      for (std::int64_t c = 0; c < dim; ++c) key(0, zero, c) = 0.0f;
    if (has_bad) key(1, nan_at, 3) = std::numeric_limits<float>::quiet_NaN();
    const auto kv = fc::hnd(l.k.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(dim)),
               vv = fc::hnd(l.v.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(dim));
    fc::Options opt = residual_only();
    const fc::LayerScores residual = fc::score_layer<double>(kv, vv, opt.score);
    const double w = 0.6;
    opt.score.mean_weight = w;
    opt.score.mean_distance = fc::MeanDistance::key_cosine;
    const fc::LayerScores in_double = fc::score_layer<double>(kv, vv, opt.score);
    const fc::LayerScores in_float = fc::score_layer<float>(kv, vv, opt.score);
    for (std::int64_t h = 0; h < heads; ++h) {
      auto bad = [&](std::int64_t t) { return has_bad && h == 1 && t == nan_at; };
      std::vector<bool> finite_rows(static_cast<std::size_t>(n));
      for (std::int64_t t = 0; t < n; ++t) finite_rows[static_cast<std::size_t>(t)] = !bad(t);
      const std::vector<double> dist = fc::testing::naive_key_cosine(&key(h, 0, 0), n, dim, finite_rows);
      const std::int64_t finite = n - (has_bad && h == 1);
      double sum_r = 0, sum_d = 0;
      for (std::int64_t t = 0; t < n; ++t)
        if (!bad(t)) sum_r += residual(h, t), sum_d += dist[static_cast<std::size_t>(t)];
      if (n == 1) {
        EXPECT_EQ(sum_d, 0.0);  // the case the snap to 0 is for
      }
      for (std::int64_t t = 0; t < n; ++t) {
        if (bad(t)) {
          EXPECT_TRUE(std::isinf(in_double(h, t)) && std::isinf(in_float(h, t)));
          continue;
        }
        const double a = sum_r > 0 ? (1 - w) * residual(h, t) / (sum_r / finite) : 0.0;
        const double b = sum_d > 0 ? w * dist[static_cast<std::size_t>(t)] / (sum_d / finite) : 0.0;
        EXPECT_NEAR(in_double(h, t), a + b, 1e-5 * (1 + a + b)) << "n " << n << " head " << h << " token " << t;
        EXPECT_NEAR(in_float(h, t), a + b, 1e-4 * (1 + a + b)) << "n " << n << " head " << h << " token " << t;
      }
    }
  }
}

// key_cosine reads keys only: with the distance alone (weight 1), other values leave
// every score as it was, bit for bit; the default distance reads them.
TEST(Score, KeyCosineReadsNoValues) {
  const std::int64_t heads = 2, n = 45, dim = 6;
  const Layer l = random_layer(heads, n, dim, 61), other = random_layer(heads, n, dim, 62);
  const auto kv = fc::hnd(l.k.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(dim)),
             vv = fc::hnd(l.v.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(dim)),
             other_v = fc::hnd(other.v.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(dim));
  fc::Options opt;
  opt.score.mean_weight = 1.0;
  opt.score.mean_distance = fc::MeanDistance::key_cosine;
  EXPECT_EQ(fc::score_layer<double>(kv, vv, opt.score).score, fc::score_layer<double>(kv, other_v, opt.score).score);
  opt.score.mean_distance = fc::MeanDistance::kv_squared;
  EXPECT_NE(fc::score_layer<double>(kv, vv, opt.score).score, fc::score_layer<double>(kv, other_v, opt.score).score);
}

// A weight that follows the budget scores as the fixed weight it resolves to, bit
// for bit, at the keep ratio given in ScoreInputs (1 when none is): compress,
// compress_model and the policies' compress_model pass theirs, as a count or a ratio.
TEST(Score, MeanWeightFollowsTheKeepRatioGiven) {
  const std::int64_t heads = 2, n = 80, dim = 6;
  Layer l = random_layer(heads, n, dim, 43);
  const auto kv = fc::hnd(l.k.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(dim)),
             vv = fc::hnd(l.v.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(dim));
  fc::Options fade;
  fade.score.mean_weight = 0.75;
  fade.score.mean_full_keep = 0.5;
  fade.score.mean_zero_keep = 0.25;
  auto fixed = [&](double w) {
    fc::Options o = fade;
    o.score.mean_weight = w;
    o.score.mean_full_keep = o.score.mean_zero_keep = 0.0;
    return o;
  };
  fc::Scorer<float> scorer;
  auto scores = [&](const fc::Options& o, double keep) {
    fc::LayerScores s;
    EXPECT_TRUE(
        scorer
            .score(fc::KVView<const float>(kv), fc::KVView<const float>(vv), o.score, &s, fc::ScoreInputs{{}, {}, keep})
            .ok());
    return s.score;
  };
  EXPECT_EQ(scores(fc::Options{}, 0.375), scores(fade, 0.375));  // the library's default fade
  EXPECT_EQ(scores(fade, 0.375), scores(fixed(0.375), 0.375));
  EXPECT_EQ(scores(fade, 0.2), scores(fixed(0.0), 0.2));
  EXPECT_EQ(scores(fade, 0.6), scores(fixed(0.75), 0.6));
  EXPECT_EQ(fc::score_layer(kv, vv, fade.score).score, scores(fixed(0.75), 1.0));  // no budget: keep 1
  EXPECT_NE(scores(fixed(0.375), 1.0), scores(fixed(0.0), 1.0));                   // the weights above differ at all

  // The entry points pass the keep ratio of their budget: 30 of 80 tokens is 0.375.
  const auto kept = [](const auto& layer) { return layer.kept; };
  EXPECT_EQ(kept(fc::compress(kv, vv, fc::Budget::tokens(30), fade)),
            kept(fc::compress(kv, vv, fc::Budget::tokens(30), fixed(0.375))));
  EXPECT_EQ(kept(fc::compress(kv, vv, fc::Budget::ratio(0.375), fade)),
            kept(fc::compress(kv, vv, fc::Budget::ratio(0.375), fixed(0.375))));
  EXPECT_NE(kept(fc::compress(kv, vv, fc::Budget::ratio(0.375), fixed(0.375))),
            kept(fc::compress(kv, vv, fc::Budget::ratio(0.375), fixed(0.0))));
  const std::vector<fc::KVView<float>> ks{kv, kv}, vs{vv, vv};
  const auto model = [&](const fc::Options& o) {
    std::vector<std::vector<std::int32_t>> out;
    for (const auto& layer : fc::compress_model(ks, vs, fc::Budget::ratio(0.375), o).layers) out.push_back(layer.kept);
    return out;
  };
  EXPECT_EQ(model(fade), model(fixed(0.375)));

  fc::LayerScores s;
  const fc::Status bad = scorer.score(fc::KVView<const float>(kv), fc::KVView<const float>(vv), fade.score, &s,
                                      fc::ScoreInputs{{}, {}, 1.5});
  EXPECT_EQ(bad.code(), fc::Errc::invalid_budget);
  EXPECT_NE(bad.message().find("keep ratio 1.5 is outside [0, 1]"), std::string::npos) << bad.message();
}

// Keys rotated by RoPE and scored with derotate score as the unrotated keys do.
TEST(Score, DerotatedKeysScoreAsBeforeRope) {
  const std::int64_t heads = 2, n = 83, dim = 8, first = 11;
  const Layer l = random_layer(heads, n, dim, 5);
  for (fc::RopeLayout layout : {fc::RopeLayout::half, fc::RopeLayout::interleaved}) {
    std::vector<float> rotated = l.k;
    const double theta = 10000.0;
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t t = 0; t < n; ++t) {
        float* row = rotated.data() + (h * n + t) * dim;
        for (std::int64_t i = 0; i < dim / 2; ++i) {
          const std::int64_t a = layout == fc::RopeLayout::half ? i : 2 * i;
          const std::int64_t b = layout == fc::RopeLayout::half ? i + dim / 2 : 2 * i + 1;
          const double angle = static_cast<double>(first + t) * std::pow(theta, -2.0 * i / dim);
          const double x = row[a], y = row[b];
          row[a] = static_cast<float>(x * std::cos(angle) - y * std::sin(angle));
          row[b] = static_cast<float>(y * std::cos(angle) + x * std::sin(angle));
        }
      }
    fc::Options opt;
    opt.score.rope.derotate = true;
    opt.score.rope.theta = theta;
    opt.score.rope.layout = layout;
    opt.score.rope.first_position = first;
    const float* rot = rotated.data();
    const auto vv = fc::hnd(l.v.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(dim));
    const auto plain = fc::score_layer<double>(fc::hnd(l.k.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(dim)),
                                               vv, fc::Options{}.score);
    const auto derotated =
        fc::score_layer<double>(fc::hnd(rot, fc::Heads(heads), fc::Tokens(n), fc::HeadDim(dim)), vv, opt.score);
    const auto as_cached =
        fc::score_layer<double>(fc::hnd(rot, fc::Heads(heads), fc::Tokens(n), fc::HeadDim(dim)), vv, fc::Options{}.score);
    double changed = 0;
    for (std::int64_t i = 0; i < heads * n; ++i) {
      EXPECT_NEAR(derotated.score[i], plain.score[i], 1e-5 * (1 + std::fabs(plain.score[i])));
      changed = std::max(changed, static_cast<double>(std::fabs(as_cached.score[i] - plain.score[i])));
    }
    EXPECT_GT(changed, 1e-3) << "the rotation should change the scores of the keys as cached";
  }
  fc::Options odd;
  odd.score.rope.derotate = true;
  std::vector<float> x(3 * 5, 1.0f);
  EXPECT_THROW(fc::score_layer(fc::hnd(x.data(), fc::Heads(1), fc::Tokens(3), fc::HeadDim(5)),
                               fc::hnd(x.data(), fc::Heads(1), fc::Tokens(3), fc::HeadDim(5)), odd.score),
               fc::Error);
}

// bridge (score/bridge.hpp) against its rule written pairwise: a token rises to
// the best min(in[a], in[b]) over rankable a in [t - gap, t) and b in (t, t + gap].
std::vector<float> pairwise_bridge(const std::vector<float>& in, std::int64_t gap) {
  const auto n = static_cast<std::int64_t>(in.size());
  const auto rankable = [&](std::int64_t i) { return std::isfinite(in[static_cast<std::size_t>(i)]); };
  std::vector<float> out = in;
  for (std::int64_t t = 0; t < n; ++t) {
    if (!rankable(t)) continue;
    double best = in[static_cast<std::size_t>(t)];
    for (std::int64_t a = std::max<std::int64_t>(0, t - gap); a < t; ++a)
      for (std::int64_t b = t + 1; b < std::min(n, t + gap + 1); ++b)
        if (rankable(a) && rankable(b))
          best = std::max(best, std::min<double>(in[static_cast<std::size_t>(a)], in[static_cast<std::size_t>(b)]));
    out[static_cast<std::size_t>(t)] = static_cast<float>(best);
  }
  return out;
}

TEST(Bridge, MatchesThePairwiseRuleOnAwkwardSizes) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (const std::int64_t n : {1, 2, 3, 7, 37, 130})
    for (const std::int64_t gap : {1, 2, 5, 64}) {
      std::vector<float> in(static_cast<std::size_t>(n));
      for (float& x : in) x = u(rng);
      if (n > 3) in[2] = std::numeric_limits<float>::infinity();  // always kept: stays, lends nothing
      if (n > 5) in[static_cast<std::size_t>(n - 2)] = std::nanf("");
      std::vector<float> out(in.size());
      fc::detail::bridge_scores(in.data(), out.data(), n, gap);
      const std::vector<float> want = pairwise_bridge(in, gap);
      for (std::int64_t t = 0; t < n; ++t) {
        const auto i = static_cast<std::size_t>(t);
        if (std::isnan(want[i]))
          EXPECT_TRUE(std::isnan(out[i])) << n << " " << gap << " " << t;
        else
          EXPECT_EQ(out[i], want[i]) << n << " " << gap << " " << t;
      }
    }
}

// A hole in a run fills; an isolated high token and a hole wider than the
// bridge reaches stay as they were.
TEST(Bridge, FillsHolesInRunsAndLeavesIsolatedTokens) {
  const std::vector<float> in = {0.1f, 5, 1, 6, 0.1f, 0.1f, 9, 0.1f, 0.1f, 4, 0.2f, 0.3f, 4};
  std::vector<float> out(in.size());
  fc::detail::bridge_scores(in.data(), out.data(), static_cast<std::int64_t>(in.size()), 1);
  // 1 rises to 5 (between 5 and 6); 0.2 to 0.3 (between 4 and 0.3); 9 and the
  // 0.1s beside it stay (nothing higher on their far side within 1).
  const std::vector<float> want = {0.1f, 5, 5, 6, 0.1f, 0.1f, 9, 0.1f, 0.1f, 4, 0.3f, 0.3f, 4};
  EXPECT_EQ(out, want);
  fc::detail::bridge_scores(in.data(), out.data(), static_cast<std::int64_t>(in.size()), 2);
  EXPECT_FLOAT_EQ(out[10], 4.0f);  // within 2 of both 4s
  EXPECT_FLOAT_EQ(out[11], 4.0f);
  EXPECT_FLOAT_EQ(out[4], 6.0f);  // a hole two wide between 6 and 9
  EXPECT_FLOAT_EQ(out[0], 0.1f);  // the first token has no left side
}

// The Scorer bridges each head's mixed scores, and nothing else changes.
TEST(Score, BridgeRaisesTheMixedScoresOfEachHead) {
  const std::int64_t heads = 3, n = 57, dim = 5;
  Layer l = random_layer(heads, n, dim, 91);
  const auto kv = fc::hnd(l.k.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(dim)),
             vv = fc::hnd(l.v.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(dim));
  fc::ScoreOptions plain;
  plain.mean_weight = 0.5;
  fc::ScoreOptions bridged = plain;
  bridged.bridge = 3;
  const fc::LayerScores a = fc::score_layer(kv, vv, plain), b = fc::score_layer(kv, vv, bridged);
  EXPECT_EQ(a.energy.size(), b.energy.size());
  for (std::int64_t h = 0; h < heads; ++h) {
    std::vector<float> want(static_cast<std::size_t>(n));
    fc::detail::bridge_scores(a.score.data() + h * n, want.data(), n, 3);
    EXPECT_EQ(std::vector<float>(b.score.begin() + h * n, b.score.begin() + (h + 1) * n), want) << h;
  }
  EXPECT_NE(a.score, b.score);  // the random layer has holes to fill
}

TEST(Score, BridgeIsCheckedByName) {
  fc::Options o;
  o.score.bridge = -1;
  EXPECT_NE(fc::check_options(o).message().find("bridge -1 is outside [0, 64]"), std::string::npos)
      << fc::check_options(o).message();
  o.score.bridge = fc::kMaxBridge + 1;
  EXPECT_NE(fc::check_options(o).message().find("bridge 65"), std::string::npos);
  o.score.bridge = fc::kMaxBridge;
  EXPECT_TRUE(fc::check_options(o).ok());
}

}  // namespace
