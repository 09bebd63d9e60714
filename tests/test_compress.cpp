// The front door: compress() for one layer and compress_model() for many.
#include <gtest/gtest.h>
#include <flashcache/flashcache.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

namespace fc = flashcache;

namespace {

// A smooth layer (slow sinusoids along tokens) with optional noise.
std::vector<float> smooth(std::int64_t heads, std::int64_t n, std::int64_t d, double noise, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0, noise);
  std::vector<float> x(static_cast<std::size_t>(heads * n * d));
  for (std::int64_t h = 0; h < heads; ++h)
    for (std::int64_t t = 0; t < n; ++t)
      for (std::int64_t c = 0; c < d; ++c)
        x[(h * n + t) * d + c] = static_cast<float>(std::sin(0.01 * t * (c % 5 + 1) + h) + (noise > 0 ? nd(rng) : 0));
  return x;
}

TEST(Compress, PlantedOutlierIsKeptAtFivePercent) {
  const std::int64_t heads = 2, n = 400, d = 32;
  auto k = smooth(heads, n, d, 0.01, 1), v = smooth(heads, n, d, 0.01, 2);
  for (std::int64_t c = 0; c < d; ++c) {
    k[(0 * n + 217) * d + c] += 1.5f * ((c * 7) % 3 - 1.0f);  // head 0: token 217
    v[(1 * n + 31) * d + c] -= 1.0f;                          // head 1: token 31
  }
  for (auto tr : {fc::Transform::global, fc::Transform::blocked}) {
    fc::Options opt;
    opt.score.transform = tr;
    const auto out =
        fc::compress(fc::hnd(k.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(d)),
                     fc::hnd(v.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(d)), fc::Budget::ratio(0.05), opt);
    ASSERT_EQ(out.budget, 20);
    const auto* h0 = out.kept_head(0);
    const auto* h1 = out.kept_head(1);
    EXPECT_TRUE(std::binary_search(h0, h0 + out.budget, 217)) << fc::to_string(tr);
    EXPECT_TRUE(std::binary_search(h1, h1 + out.budget, 31)) << fc::to_string(tr);
  }
}

TEST(Compress, OutputHoldsTheKeptRowsAndMatchesTheStages) {
  const std::int64_t heads = 3, n = 123, d = 8;
  const auto k = smooth(heads, n, d, 0.2, 3), v = smooth(heads, n, d, 0.2, 4);
  fc::Options opt;
  opt.select.sink = 2;
  opt.select.window = 5;
  const auto kv = fc::hnd(k.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(d)),
             vv = fc::hnd(v.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(d));
  const auto out = fc::compress(kv, vv, fc::Budget::tokens(30), opt);
  // Same as running the stages by hand (the score at the budget's keep ratio, which the default's
  // distance from the mean follows).
  const auto scores = fc::score_layer(kv, vv, opt.score, fc::ScoreInputs{{}, {}, fc::Budget::tokens(30).keep_ratio(n)});
  std::vector<std::int32_t> kept;
  ASSERT_TRUE(fc::select_tokens(scores, 30, opt.select, &kept).ok());
  EXPECT_EQ(out.kept, kept);
  for (std::int64_t h = 0; h < heads; ++h)
    for (std::int64_t i = 0; i < 30; ++i)
      for (std::int64_t c = 0; c < d; ++c) {
        EXPECT_EQ(out.k_view()(h, i, c), kv(h, out.kept_head(h)[i], c));
        EXPECT_EQ(out.v_view()(h, i, c), vv(h, out.kept_head(h)[i], c));
      }
  EXPECT_EQ(out.kept_head(1)[0], 0);       // sink
  EXPECT_EQ(out.kept_head(1)[29], n - 1);  // window
}

TEST(Compress, ErrorsNameTheProblem) {
  const std::int64_t heads = 1, n = 20, d = 4;
  const auto k = smooth(heads, n, d, 0, 5), v = smooth(heads, n, d, 0, 6);
  fc::Options opt;
  opt.select.sink = 4;
  opt.select.window = 8;
  try {
    fc::compress(fc::hnd(k.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(d)),
                 fc::hnd(v.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(d)), fc::Budget::tokens(10), opt);
    FAIL() << "expected flashcache::Error";
  } catch (const fc::Error& e) {
    EXPECT_EQ(e.code(), fc::Errc::invalid_budget);
    EXPECT_NE(std::string(e.what()).find("keep budget 10 < 12 always-kept tokens"), std::string::npos) << e.what();
  }
  EXPECT_THROW(
      fc::compress(fc::hnd(k.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(d)),
                   fc::hnd(v.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(d)), fc::Budget::ratio(-0.1)),
      fc::Error);
}

struct Model {
  std::int64_t layers, heads, n, d;
  std::vector<std::vector<float>> k, v;
  std::vector<fc::KVView<const float>> kv() const {
    std::vector<fc::KVView<const float>> out;
    for (const auto& x : k) out.push_back(fc::hnd(x.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(d)));
    return out;
  }
  std::vector<fc::KVView<const float>> vv() const {
    std::vector<fc::KVView<const float>> out;
    for (const auto& x : v) out.push_back(fc::hnd(x.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(d)));
    return out;
  }
};

// Layer l gets noise l * 0.1: deeper layers hold more high-frequency energy.
Model noisy_model(std::int64_t layers, std::int64_t heads, std::int64_t n, std::int64_t d) {
  Model m{layers, heads, n, d, {}, {}};
  for (std::int64_t l = 0; l < layers; ++l) {
    m.k.push_back(smooth(heads, n, d, 0.02 + 0.1 * static_cast<double>(l), 10 + l));
    m.v.push_back(smooth(heads, n, d, 0.02 + 0.1 * static_cast<double>(l), 20 + l));
  }
  return m;
}

TEST(CompressModel, DynamicAllocationKeepsTheTotalAndFavoursHighEnergyLayers) {
  const Model m = noisy_model(4, 2, 150, 8);
  const auto out = fc::compress_model(m.kv(), m.vv(), fc::Budget::ratio(0.2));
  EXPECT_EQ(out.tokens_after(), std::llround(0.2 * 4 * 150));
  for (std::size_t l = 1; l < out.budgets.size(); ++l) {
    EXPECT_GT(out.energy_ratio[l], out.energy_ratio[l - 1]);
    EXPECT_GE(out.budgets[l], out.budgets[l - 1]);
  }
  EXPECT_GT(out.budgets.back(), out.budgets.front());
  for (std::size_t l = 0; l < out.layers.size(); ++l) {
    EXPECT_EQ(out.layers[l].budget, out.budgets[l]);
    EXPECT_EQ(out.layers[l].kept.size(), static_cast<std::size_t>(2 * out.budgets[l]));
  }
}

TEST(CompressModel, UniformAllocationKeepsTheSameRatioEverywhere) {
  const Model m = noisy_model(3, 2, 101, 4);
  fc::Options opt;
  opt.allocate.mode = fc::Allocation::uniform;
  const auto out = fc::compress_model(m.kv(), m.vv(), fc::Budget::ratio(0.2), opt);
  EXPECT_EQ(out.budgets, (std::vector<std::int64_t>{20, 20, 20}));
  const auto counted = fc::compress_model(m.kv(), m.vv(), fc::Budget::tokens(7), opt);
  EXPECT_EQ(counted.budgets, (std::vector<std::int64_t>{7, 7, 7}));
}

TEST(CompressModel, FloorsCoverProtectedAndMinimumRatio) {
  const Model m = noisy_model(3, 1, 100, 4);
  fc::Options opt;
  opt.select.sink = 4;
  opt.allocate.min_layer_ratio = 0.1;
  const auto out = fc::compress_model(m.kv(), m.vv(), fc::Budget::ratio(0.15), opt);
  for (auto b : out.budgets) EXPECT_GE(b, 10);
  EXPECT_EQ(out.tokens_after(), 45);
  opt.select.sink = 40;
  try {
    fc::compress_model(m.kv(), m.vv(), fc::Budget::ratio(0.3), opt);
    FAIL() << "expected flashcache::Error";
  } catch (const fc::Error& e) {
    EXPECT_NE(std::string(e.what()).find("total budget 90 < 120 always-kept tokens over 3 layers"), std::string::npos)
        << e.what();
  }
}

TEST(CompressModel, NonFiniteTokensAreCountedAndKept) {
  Model m = noisy_model(2, 2, 60, 4);
  m.k[1][(1 * 60 + 33) * 4 + 1] = std::numeric_limits<float>::quiet_NaN();
  const auto out = fc::compress_model(m.kv(), m.vv(), fc::Budget::ratio(0.1));
  EXPECT_EQ(out.nonfinite, 1);
  const auto& layer = out.layers[1];
  EXPECT_TRUE(std::binary_search(layer.kept_head(1), layer.kept_head(1) + layer.budget, 33));
}

TEST(CompressModel, LayerErrorsSayWhichLayer) {
  Model m = noisy_model(2, 2, 30, 4);
  auto kv = m.kv();
  kv[1].head_dim = 3;
  try {
    fc::compress_model(kv, m.vv(), fc::Budget::ratio(0.5));
    FAIL() << "expected flashcache::Error";
  } catch (const fc::Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 1: K is 2x30x3 but V is 2x30x4"), std::string::npos) << e.what();
  }
  EXPECT_THROW(fc::compress_model(m.kv(), std::vector<fc::KVView<const float>>{}, fc::Budget::ratio(0.5)), fc::Error);
}

// The arithmetic type comes first in every template of the front door, the
// element type is deduced: compress<double> scores as Scorer<double> does.
TEST(CompressModel, ArithmeticTypeIsTheFirstTemplateArgument) {
  Model m = noisy_model(1, 2, 45, 4);
  const auto out = fc::compress<double>(m.kv()[0], m.vv()[0], fc::Budget::ratio(0.3));
  const auto model = fc::compress_model<double>(m.kv(), m.vv(), fc::Budget::ratio(0.3));
  const fc::ScoreInputs at_the_budget{{}, {}, 0.3};
  const auto scores = fc::score_layer<double>(m.kv()[0], m.vv()[0], fc::ScoreOptions{}, at_the_budget);
  EXPECT_EQ(out.scores.score, scores.score);
  EXPECT_EQ(model.layers[0].scores.score, scores.score);
  const auto single = fc::score_layer<float>(m.kv()[0], m.vv()[0], fc::ScoreOptions{}, at_the_budget);
  EXPECT_NE(single.score, scores.score);  // float arithmetic rounds differently
}

}  // namespace
