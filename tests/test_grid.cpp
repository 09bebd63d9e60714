// Image spans scored over their 2D patch grid, against a naive double 2D DCT
// written from the definitions (separable textbook DCT-II/III, zone by its
// formula), plus the grid base sample and the span checks.
#include <gtest/gtest.h>
#include <flashcache/flashcache.hpp>

#include <cmath>
#include <limits>
#include <tuple>

#include "reference.hpp"

namespace fc = flashcache;
using fc::testing::naive_lowpass_2d;
using fc::testing::naive_score;
using fc::testing::random_normal;

namespace {

struct Layer {
  std::int64_t heads, tokens, dim;
  std::vector<float> k, v;  // HND
  std::vector<double> head(const std::vector<float>& x, std::int64_t h) const {
    return {x.begin() + h * tokens * dim, x.begin() + (h + 1) * tokens * dim};
  }
  fc::KVView<const float> k_view() const {
    return fc::hnd(k.data(), fc::Heads(heads), fc::Tokens(tokens), fc::HeadDim(dim));
  }
  fc::KVView<const float> v_view() const {
    return fc::hnd(v.data(), fc::Heads(heads), fc::Tokens(tokens), fc::HeadDim(dim));
  }
};

Layer random_layer(std::int64_t heads, std::int64_t tokens, std::int64_t dim, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Layer l{heads, tokens, dim, {}, {}};
  for (double x : random_normal(static_cast<std::size_t>(heads * tokens * dim), rng)) l.k.push_back(float(x));
  for (double x : random_normal(static_cast<std::size_t>(heads * tokens * dim), rng)) l.v.push_back(float(x));
  return l;
}

// The zone from its definition in grid.hpp's comments, written out again.
bool in_zone(fc::GridZone zone, std::int64_t u, std::int64_t v, std::int64_t rows, std::int64_t cols, double gamma) {
  if (zone == fc::GridZone::rectangle)
    return u < std::max(1.0, std::ceil(std::sqrt(gamma) * double(rows) - 1e-9)) &&
           v < std::max(1.0, std::ceil(std::sqrt(gamma) * double(cols) - 1e-9));
  return (u == 0 && v == 0) || double(u) / double(rows) + double(v) / double(cols) < std::sqrt(2 * gamma) - 1e-9;
}

// Per-token residual energies (K and V summed, not divided by d) of one head
// over a span, tile by tile, in double precision.
void naive_span(const std::vector<double>& k, const std::vector<double>& v, std::int64_t d, const fc::GridSpan& g,
                std::int64_t tile_rows, std::int64_t tile_cols, fc::GridZone zone, double gamma,
                std::vector<double>* score, double* k_high, double* v_high) {
  for (std::int64_t r0 = 0; r0 < g.rows; r0 += tile_rows)
    for (std::int64_t c0 = 0; c0 < g.cols; c0 += tile_cols) {
      const std::int64_t tr = std::min(tile_rows, g.rows - r0), tc = std::min(tile_cols, g.cols - c0);
      auto token = [&](std::int64_t i, std::int64_t j) { return g.first + (r0 + i) * g.cols + c0 + j; };
      for (std::int64_t c = 0; c < d; ++c)
        for (int which = 0; which < 2; ++which) {
          const std::vector<double>& src = which == 0 ? k : v;
          std::vector<double> tile(static_cast<std::size_t>(tr * tc));
          for (std::int64_t i = 0; i < tr; ++i)
            for (std::int64_t j = 0; j < tc; ++j) tile[i * tc + j] = src[token(i, j) * d + c];
          const auto base = naive_lowpass_2d(
              tile, tr, tc, [&](std::int64_t u, std::int64_t w) { return in_zone(zone, u, w, tr, tc, gamma); });
          for (std::int64_t i = 0; i < tr; ++i)
            for (std::int64_t j = 0; j < tc; ++j) {
              const double r = tile[i * tc + j] - base[i * tc + j];
              (*score)[token(i, j)] += r * r / double(d);
              *(which == 0 ? k_high : v_high) += r * r;
            }
        }
    }
}

using Case = std::tuple<fc::Transform, fc::GridZone, double /*gamma*/>;
class GridScores : public ::testing::TestWithParam<Case> {};

// Two spans of awkward shapes in a sequence with text around them: span
// tokens match the 2D reference, the others their 1D scores without spans.
TEST_P(GridScores, MatchNaive2dReference) {
  const auto [transform, zone, gamma] = GetParam();
  const Layer l = random_layer(3, 89, 6, 11);
  fc::Options plain = fc::Options::paper();
  plain.score.transform = transform;
  plain.score.block_size = 16;
  plain.score.gamma = gamma;
  fc::Options opt = plain;
  const std::vector<fc::GridSpan> spans = {{3, 7, 5}, {50, 6, 6}};
  opt.score.grid_zone = zone;
  opt.score.grid_tile = 3;
  const bool tiled = transform == fc::Transform::blocked;

  fc::LayerScores with, without;
  fc::Scorer<double> scorer;
  ASSERT_TRUE(scorer.score(l.k_view(), l.v_view(), opt.score, &with, fc::ScoreInputs{spans, {}}).ok());
  ASSERT_TRUE(scorer.score(l.k_view(), l.v_view(), plain.score, &without).ok());
  for (std::int64_t h = 0; h < l.heads; ++h) {
    const auto k = l.head(l.k, h), v = l.head(l.v, h);
    const auto one_d = naive_score(k, v, l.tokens, l.dim, gamma, tiled ? plain.score.block_size : 0);
    std::vector<double> score(static_cast<std::size_t>(l.tokens), 0.0);
    const auto per_token = [&](const std::vector<double>& x, std::int64_t t) {
      double s = 0;
      for (std::int64_t c = 0; c < l.dim; ++c) s += x[t * l.dim + c] * x[t * l.dim + c];
      return s;
    };
    double k_total = 0, v_total = 0;
    for (std::int64_t t = 0; t < l.tokens; ++t) k_total += per_token(k, t), v_total += per_token(v, t);
    // Outside the spans: the 1D reference, K and V apart for their energies.
    const std::vector<double> zeros(k.size(), 0.0);
    const auto k_only = naive_score(k, zeros, l.tokens, l.dim, gamma, tiled ? plain.score.block_size : 0);
    const auto v_only = naive_score(zeros, v, l.tokens, l.dim, gamma, tiled ? plain.score.block_size : 0);
    double k_high = 0, v_high = 0;
    for (std::int64_t t = 0; t < l.tokens; ++t) {
      bool in_span = false;
      for (const fc::GridSpan& g : spans) in_span |= t >= g.first && t < g.end();
      if (!in_span) {
        score[t] = one_d.score[t];
        k_high += k_only.score[t] * double(l.dim);
        v_high += v_only.score[t] * double(l.dim);
      }
    }
    for (const fc::GridSpan& g : spans)
      naive_span(k, v, l.dim, g, tiled ? opt.score.grid_tile : g.rows, tiled ? opt.score.grid_tile : g.cols, zone,
                 gamma, &score, &k_high, &v_high);
    for (std::int64_t t = 0; t < l.tokens; ++t) {
      EXPECT_NEAR(with(h, t), score[t], 3e-7 * (1 + score[t])) << "head " << h << " token " << t;  // float scores
      bool in_span = false;
      for (const fc::GridSpan& g : spans) in_span |= t >= g.first && t < g.end();
      if (!in_span) {
        EXPECT_EQ(with(h, t), without(h, t)) << "a span changed token " << t << " outside it";
      }
    }
    EXPECT_NEAR(with.energy[h].k_total, k_total, 1e-9 * k_total);
    EXPECT_NEAR(with.energy[h].v_total, v_total, 1e-9 * v_total);
    EXPECT_NEAR(with.energy[h].k_high, k_high, 1e-9 * k_total);
    EXPECT_NEAR(with.energy[h].v_high, v_high, 1e-9 * v_total);
  }
  // float arithmetic agrees with the double one.
  fc::LayerScores single;
  fc::Scorer<float> float_scorer;
  ASSERT_TRUE(float_scorer.score(l.k_view(), l.v_view(), opt.score, &single, fc::ScoreInputs{spans, {}}).ok());
  for (std::size_t i = 0; i < single.score.size(); ++i)
    EXPECT_NEAR(single.score[i], with.score[i], 1e-4 * (1 + with.score[i]));
}

INSTANTIATE_TEST_SUITE_P(Grid, GridScores,
                         ::testing::Combine(::testing::Values(fc::Transform::global, fc::Transform::blocked),
                                            ::testing::Values(fc::GridZone::rectangle, fc::GridZone::triangle),
                                            ::testing::Values(0.2, 0.5)));

// A smooth image (a plane over the patch grid) has no 2D outliers, while the
// 1D transform along raster order sees a jump at every row end.
TEST(Grid, SmoothImageIsSmoothIn2dOnly) {
  const std::int64_t rows = 12, cols = 11, d = 4, n = rows * cols;
  std::vector<float> k(static_cast<std::size_t>(n * d)), v(k.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      for (std::int64_t j = 0; j < d; ++j) {
        const auto t = static_cast<std::size_t>((r * cols + c) * d + j);
        k[t] = static_cast<float>(std::cos(M_PI * (r + 0.5) / rows) * (j + 1));
        v[t] = static_cast<float>(std::cos(M_PI * (c + 0.5) / cols) - j);
      }
  const float* kp = k.data();
  const float* vp = v.data();
  const fc::Options opt = fc::Options::paper();
  const std::vector<fc::GridSpan> image = {{0, rows, cols}};
  fc::Scorer<double> scorer;
  fc::LayerScores a, b;
  ASSERT_TRUE(scorer
                  .score(fc::hnd(kp, fc::Heads(1), fc::Tokens(n), fc::HeadDim(d)),
                         fc::hnd(vp, fc::Heads(1), fc::Tokens(n), fc::HeadDim(d)), opt.score, &a)
                  .ok());
  ASSERT_TRUE(scorer
                  .score(fc::hnd(kp, fc::Heads(1), fc::Tokens(n), fc::HeadDim(d)),
                         fc::hnd(vp, fc::Heads(1), fc::Tokens(n), fc::HeadDim(d)), opt.score, &b,
                         fc::ScoreInputs{image, {}})
                  .ok());
  double max_1d = 0, max_2d = 0;
  for (std::int64_t t = 0; t < n; ++t)
    max_1d = std::max<double>(max_1d, a(0, t)), max_2d = std::max<double>(max_2d, b(0, t));
  EXPECT_GT(max_1d, 1e-2);
  EXPECT_LT(max_2d, 1e-10);
  EXPECT_LT(b.energy_ratio(), 1e-10);
  EXPECT_GT(a.energy_ratio(), 1e-3);
}

// A NaN inside a span scores +inf and does not spread to its tile.
TEST(Grid, NonFiniteTokenInsideASpanStaysItsOwn) {
  Layer l = random_layer(2, 40, 5, 3);
  l.k[static_cast<std::size_t>((1 * 40 + 17) * 5 + 2)] = std::numeric_limits<float>::quiet_NaN();
  fc::Options opt;
  const std::vector<fc::GridSpan> spans = {{4, 6, 6}};
  opt.score.transform = fc::Transform::blocked;
  opt.score.grid_tile = 4;
  fc::LayerScores s;
  fc::Scorer<float> scorer;
  ASSERT_TRUE(scorer.score(l.k_view(), l.v_view(), opt.score, &s, fc::ScoreInputs{spans, {}}).ok());
  EXPECT_EQ(s(1, 17), std::numeric_limits<float>::infinity());
  EXPECT_EQ(s.nonfinite, 1);
  for (std::int64_t h = 0; h < 2; ++h)
    for (std::int64_t t = 0; t < 40; ++t)
      if (h != 1 || t != 17) {
        EXPECT_TRUE(std::isfinite(s(h, t))) << h << "," << t;
      }
}

TEST(Grid, SpansAreChecked) {
  const Layer l = random_layer(1, 30, 4, 5);
  fc::Scorer<float> scorer;
  fc::LayerScores s;
  auto message = [&](std::vector<fc::GridSpan> spans, std::int64_t tile = 8) {
    fc::Options opt;
    opt.score.grid_tile = tile;
    return scorer.score(l.k_view(), l.v_view(), opt.score, &s, fc::ScoreInputs{spans, {}}).message();
  };
  EXPECT_NE(message({{0, 0, 4}}).find("at least one row and column"), std::string::npos);
  EXPECT_NE(message({{-1, 2, 2}}).find("first >= 0"), std::string::npos);
  EXPECT_NE(message({{0, 3, 3}, {8, 2, 2}}).find("overlap"), std::string::npos);
  EXPECT_NE(message({{10, 5, 5}}).find("reaches past the 30 tokens"), std::string::npos);
  EXPECT_NE(message({{0, 2, 2}}, 0).find("grid_tile 0"), std::string::npos);
  const std::vector<fc::GridSpan> any_order = {{10, 4, 5}, {1, 3, 3}};  // any order, touching is fine
  EXPECT_TRUE(scorer.score(l.k_view(), l.v_view(), fc::ScoreOptions{}, &s, fc::ScoreInputs{any_order, {}}).ok());
}

// The base sample of a span is a regular sub-grid: 16 picks of a 16 x 16 span
// are rows and columns {2, 6, 10, 14}.
TEST(Grid, BaseSampleIsARegularSubGrid) {
  const fc::GridSpan g{1, 16, 16};
  std::vector<std::uint8_t> keep(static_cast<std::size_t>(g.end()), 0);
  EXPECT_EQ(fc::keep_grid_sample(g, 16, keep.data()), 16);
  for (std::int64_t r = 0; r < 16; ++r)
    for (std::int64_t c = 0; c < 16; ++c)
      EXPECT_EQ(keep[static_cast<std::size_t>(g.first + r * 16 + c)], (r % 4 == 2 && c % 4 == 2) ? 1 : 0)
          << r << "," << c;
  EXPECT_EQ(keep[0], 0);
  // A 6 x 12 span and 8 picks: 2 rows (2, 5... centres 1 and 4) by 4 columns.
  const fc::GridSpan wide{0, 6, 12};
  std::vector<std::uint8_t> k2(72, 0);
  EXPECT_EQ(fc::keep_grid_sample(wide, 8, k2.data()), 8);
  for (std::int64_t t = 0; t < 72; ++t)
    EXPECT_EQ(k2[static_cast<std::size_t>(t)], ((t / 12 == 1 || t / 12 == 4) && (t % 12) % 3 == 1) ? 1 : 0) << t;
}

// With base_share, selection spends the base share on the spans' sub-grids in
// proportion to their free tokens, and the budget is exact.
TEST(Grid, SelectionSpendsTheBaseShareOnSubGrids) {
  const Layer l = random_layer(2, 1 + 64 + 1 + 64 + 10, 4, 9);
  fc::Options opt;
  opt.select.sink = 0;
  opt.select.window_share = 0;
  opt.select.base_share = 1.0;  // everything on the base sample: the kept set is the sub-grids
  opt.select.grid_base_share = 1.0;
  const std::vector<fc::GridSpan> spans = {{1, 8, 8}, {66, 8, 8}};
  fc::LayerScores s;
  fc::Scorer<float> scorer;
  ASSERT_TRUE(scorer.score(l.k_view(), l.v_view(), opt.score, &s, fc::ScoreInputs{spans, {}}).ok());
  std::vector<std::int32_t> kept(2 * 28);
  fc::SelectWorkspace ws;
  ASSERT_TRUE(fc::select_tokens(s.view(), 28, opt.select, {}, spans, &ws, fc::KeptView{kept.data(), 28}).ok());
  int in_first = 0, in_second = 0;
  for (int i = 0; i < 28; ++i) {
    in_first += kept[static_cast<std::size_t>(i)] >= 1 && kept[static_cast<std::size_t>(i)] < 65;
    in_second += kept[static_cast<std::size_t>(i)] >= 66 && kept[static_cast<std::size_t>(i)] < 130;
  }
  // 28 of 140 free tokens: 12.8 -> 13 per span, 2 elsewhere.
  EXPECT_EQ(in_first, 13);
  EXPECT_EQ(in_second, 13);
  for (int i = 1; i < 28; ++i) EXPECT_LT(kept[static_cast<std::size_t>(i - 1)], kept[static_cast<std::size_t>(i)]);
}

// base_share covers the tokens outside spans, grid_base_share those inside:
// with only the latter, the base sample stays inside the span.
TEST(Grid, GridBaseShareStaysInsideSpans) {
  const fc::GridSpan g{10, 6, 6};
  std::vector<std::uint8_t> keep(60, 0);
  fc::Options opt;
  const std::vector<fc::GridSpan> spans = {g};
  opt.select.base_share = 0;
  opt.select.grid_base_share = 1;
  // 60 free tokens, budget 20: the span's part is round(20 * 36 / 60) = 12.
  EXPECT_EQ(fc::keep_base_sample(60, 20, 20, opt.select, spans, keep.data()), 12);
  for (std::int64_t t = 0; t < 60; ++t)
    if (t < g.first || t >= g.end()) {
      EXPECT_EQ(keep[static_cast<std::size_t>(t)], 0) << t;
    }
  // And the other way round: round(20 * 24 / 60) = 8 evenly spaced tokens outside.
  std::fill(keep.begin(), keep.end(), 0);
  opt.select.base_share = 1;
  opt.select.grid_base_share = 0;
  EXPECT_EQ(fc::keep_base_sample(60, 20, 20, opt.select, spans, keep.data()), 8);
  for (std::int64_t t = g.first; t < g.end(); ++t) EXPECT_EQ(keep[static_cast<std::size_t>(t)], 0) << t;
  // The room caps the sample.
  std::fill(keep.begin(), keep.end(), 0);
  opt.select.grid_base_share = 1;
  EXPECT_EQ(fc::keep_base_sample(60, 20, 5, opt.select, spans, keep.data()), 5);
}

}  // namespace
