// Baseline policies against direct references on small inputs.
#include <gtest/gtest.h>
#include <flashcache/policies/baselines.hpp>

#include <cmath>
#include <limits>
#include <random>

namespace fc = flashcache;
namespace fp = flashcache::policies;

namespace {

std::vector<float> random_vec(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> x(n);
  for (auto& e : x) e = nd(rng);
  return x;
}

// Direct causal attention of query row i (head-major [H][N][d] arrays).
std::vector<double> direct_attention(const std::vector<float>& q, const std::vector<float>& k, std::int64_t n,
                                     std::int64_t d, std::int64_t qh, std::int64_t kh, std::int64_t i) {
  std::vector<double> logits;
  for (std::int64_t j = 0; j <= i; ++j) {
    double dot = 0;
    for (std::int64_t c = 0; c < d; ++c) dot += double(q[(qh * n + i) * d + c]) * k[(kh * n + j) * d + c];
    logits.push_back(dot / std::sqrt(double(d)));
  }
  double mx = *std::max_element(logits.begin(), logits.end()), sum = 0;
  for (auto& x : logits) sum += (x = std::exp(x - mx));
  for (auto& x : logits) x /= sum;
  return logits;
}

TEST(Policies, ParseAndNeedsQueries) {
  fp::Policy p;
  ASSERT_TRUE(fp::parse_policy("snapkv", &p).ok());
  EXPECT_EQ(p, fp::Policy::snapkv);
  EXPECT_TRUE(fp::needs_queries(fp::Policy::h2o));
  EXPECT_FALSE(fp::needs_queries(fp::Policy::knorm));
  const auto s = fp::parse_policy("lru", &p);
  EXPECT_NE(s.message().find("unknown policy 'lru'"), std::string::npos);
}

TEST(Policies, StreamingKeepsSinkAndMostRecent) {
  fc::LayerScores s;
  fp::streaming_scores(2, 10, &s);
  fc::Options opt;
  opt.select.sink = 2;
  std::vector<std::int32_t> kept;
  ASSERT_TRUE(fc::select_tokens(s, 5, opt.select, &kept).ok());
  EXPECT_EQ(kept, (std::vector<std::int32_t>{0, 1, 7, 8, 9, 0, 1, 7, 8, 9}));
}

TEST(Policies, KnormScoresAreNegativeKeyNorms) {
  const std::int64_t h = 2, n = 9, d = 5;
  const auto k = random_vec(h * n * d, 1);
  fc::LayerScores s;
  ASSERT_TRUE(
      fp::knorm_scores(fc::KVView<const float>(fc::hnd(k.data(), fc::Heads(h), fc::Tokens(n), fc::HeadDim(d))), &s)
          .ok());
  for (std::int64_t i = 0; i < h * n; ++i) {
    double sq = 0;
    for (std::int64_t c = 0; c < d; ++c) sq += double(k[i * d + c]) * k[i * d + c];
    EXPECT_FLOAT_EQ(s.score[i], static_cast<float>(-std::sqrt(sq)));
  }
}

TEST(Policies, RandomIsSeeded) {
  fc::LayerScores a, b, c;
  fp::random_scores(3, 50, 7, &a);
  fp::random_scores(3, 50, 7, &b);
  fp::random_scores(3, 50, 8, &c);
  EXPECT_EQ(a.score, b.score);
  EXPECT_NE(a.score, c.score);
}

TEST(Policies, H2oAccumulatesCausalAttentionOverQueryGroups) {
  const std::int64_t hk = 2, group = 2, n = 11, d = 4;
  const auto q = random_vec(hk * group * n * d, 2), k = random_vec(hk * n * d, 3);
  fc::LayerScores s;
  ASSERT_TRUE(
      fp::h2o_scores(fc::KVView<const float>(fc::hnd(q.data(), fc::Heads(hk * group), fc::Tokens(n), fc::HeadDim(d))),
                     fc::KVView<const float>(fc::hnd(k.data(), fc::Heads(hk), fc::Tokens(n), fc::HeadDim(d))), &s)
          .ok());
  for (std::int64_t h = 0; h < hk; ++h) {
    std::vector<double> acc(n, 0.0);
    for (std::int64_t g = 0; g < group; ++g)
      for (std::int64_t i = 0; i < n; ++i) {
        const auto p = direct_attention(q, k, n, d, h * group + g, h, i);
        for (std::int64_t j = 0; j <= i; ++j) acc[j] += p[j] / group;
      }
    for (std::int64_t t = 0; t < n; ++t) EXPECT_NEAR(s(h, t), acc[t], 1e-5) << h << " " << t;
  }
}

TEST(Policies, SnapkvPoolsWindowVotes) {
  const std::int64_t n = 20, d = 3, window = 4;
  const auto q = random_vec(n * d, 4), k = random_vec(n * d, 5);
  fp::PolicyOptions po;
  po.observation_window = window;
  po.pool_kernel = 3;
  fc::LayerScores s;
  ASSERT_TRUE(fp::snapkv_scores(fc::KVView<const float>(fc::hnd(q.data(), fc::Heads(1), fc::Tokens(n), fc::HeadDim(d))),
                                fc::KVView<const float>(fc::hnd(k.data(), fc::Heads(1), fc::Tokens(n), fc::HeadDim(d))),
                                po, &s)
                  .ok());
  std::vector<double> votes(n, 0.0);
  for (std::int64_t i = n - window; i < n; ++i) {
    const auto p = direct_attention(q, k, n, d, 0, 0, i);
    for (std::int64_t j = 0; j <= i; ++j) votes[j] += p[j];
  }
  for (std::int64_t t = 0; t < n - window; ++t) {
    double best = 0;
    for (std::int64_t u = std::max<std::int64_t>(0, t - 1); u <= std::min(n - window - 1, t + 1); ++u)
      best = std::max(best, votes[u]);
    EXPECT_NEAR(s(0, t), best, 1e-5) << t;
  }
  for (std::int64_t t = n - window; t < n; ++t) EXPECT_GT(s(0, t), s(0, 0));  // the window ranks first
}

TEST(Policies, QueriesAreCheckedByName) {
  std::vector<float> q(3 * 5 * 2), k(2 * 5 * 2);
  fc::LayerScores s;
  const auto st =
      fp::h2o_scores(fc::KVView<const float>(fc::hnd(q.data(), fc::Heads(3), fc::Tokens(5), fc::HeadDim(2))),
                     fc::KVView<const float>(fc::hnd(k.data(), fc::Heads(2), fc::Tokens(5), fc::HeadDim(2))), &s);
  EXPECT_NE(st.message().find("3 query heads are not a multiple of 2 KV heads"), std::string::npos) << st.message();
}

TEST(Policies, ModelCompressionWithBaselinesSplitsUniformly) {
  const std::int64_t layers = 3, h = 2, n = 40, d = 4;
  std::vector<std::vector<float>> data;
  std::vector<fc::KVView<const float>> qs, ks, vs;
  for (std::int64_t l = 0; l < layers; ++l) data.push_back(random_vec(h * n * d, 10 + l));
  for (std::int64_t l = 0; l < layers; ++l) {
    qs.push_back(fc::hnd(data[l].data(), fc::Heads(h), fc::Tokens(n), fc::HeadDim(d)));
    ks.push_back(fc::hnd(data[(l + 1) % layers].data(), fc::Heads(h), fc::Tokens(n), fc::HeadDim(d)));
    vs.push_back(fc::hnd(data[(l + 2) % layers].data(), fc::Heads(h), fc::Tokens(n), fc::HeadDim(d)));
  }
  for (auto p : {fp::Policy::streaming, fp::Policy::knorm, fp::Policy::random, fp::Policy::snapkv, fp::Policy::h2o}) {
    const auto m = fp::compress_model(p, qs, ks, vs, fc::Budget::ratio(0.25));
    EXPECT_EQ(m.budgets, (std::vector<std::int64_t>{10, 10, 10})) << fp::to_string(p);
  }
  EXPECT_THROW(fp::compress_model(fp::Policy::snapkv, {}, ks, vs, fc::Budget::ratio(0.25)), fc::Error);
}

TEST(Policies, NanScoresAreKeptNotMisordered) {
  std::vector<float> k(1 * 6 * 2, 1.0f);
  k[3 * 2] = std::numeric_limits<float>::quiet_NaN();
  fc::LayerScores s;
  ASSERT_TRUE(
      fp::knorm_scores(fc::KVView<const float>(fc::hnd(k.data(), fc::Heads(1), fc::Tokens(6), fc::HeadDim(2))), &s)
          .ok());
  std::vector<std::int32_t> kept;
  ASSERT_TRUE(fc::select_tokens(s, 2, fc::Options::paper().select, &kept).ok());
  EXPECT_EQ(kept, (std::vector<std::int32_t>{0, 3}));
}

}  // namespace

namespace {

TEST(Policies, KeydiffScoresAreMinusCosineToTheMeanUnitKey) {
  const std::int64_t heads = 2, n = 37, d = 5;
  std::mt19937_64 rng(17);
  std::normal_distribution<float> nd(0.5f, 1.0f);
  std::vector<float> k(static_cast<std::size_t>(heads * n * d));
  for (auto& x : k) x = nd(rng);
  std::fill(k.begin() + 3 * d, k.begin() + 4 * d, 0.0f);  // a zero key in head 0 scores 0
  fc::LayerScores s;
  ASSERT_TRUE(fp::keydiff_scores(
                  fc::KVView<const float>(fc::hnd(k.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(d))), &s)
                  .ok());
  for (std::int64_t h = 0; h < heads; ++h) {
    std::vector<double> anchor(d, 0.0);
    for (std::int64_t t = 0; t < n; ++t) {
      const float* r = k.data() + (h * n + t) * d;
      double norm = 0;
      for (std::int64_t c = 0; c < d; ++c) norm += double(r[c]) * r[c];
      if (norm > 0)
        for (std::int64_t c = 0; c < d; ++c) anchor[c] += r[c] / std::sqrt(norm);
    }
    for (std::int64_t t = 0; t < n; ++t) {
      const float* r = k.data() + (h * n + t) * d;
      double dot = 0, nk = 0, na = 0;
      for (std::int64_t c = 0; c < d; ++c)
        dot += anchor[c] * r[c], nk += double(r[c]) * r[c], na += anchor[c] * anchor[c];
      const double want = nk > 0 ? -dot / std::sqrt(nk * na) : 0.0;
      EXPECT_NEAR(s(h, t), want, 1e-5) << h << " " << t;
    }
  }
  EXPECT_EQ(s(0, 3), 0.0f);
  fp::Policy p;
  ASSERT_TRUE(fp::parse_policy("keydiff", &p).ok());
  EXPECT_EQ(p, fp::Policy::keydiff);
  EXPECT_FALSE(fp::needs_queries(p));
}

}  // namespace
