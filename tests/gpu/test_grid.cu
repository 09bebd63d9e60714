// Image spans (Cache::spans, flashcache/cuda/kernels/score_grid.cuh): the
// checks, the tiles and their workspace, host runs of the 2D pass's arithmetic
// against the CPU scorer, and the device's pipeline with spans against the CPU.
#include <gtest/gtest.h>

#include <functional>

#include "element_types.cuh"
#include "flashcache/score.hpp"
#include "gpu_testing.cuh"
#include "host_fixture.cuh"

namespace flashcache::gpu_testing {
namespace {

using host::expect_error;

// Image spans against the CPU, for each element type.
FLASHCACHE_ELEMENT_TYPED_SUITE(GpuGrids);

// Image spans (Cache::spans): their tokens scored by the 2D pass, against
// the CPU scorer, on odd shapes: spans of 7 x 5 and 6 x 6 patches in two
// sequences of different lengths, tiles of 3 and 8 (edge tiles of their own
// size), both zones, both transforms, the generic and a compiled head dim,
// non-finite rows inside the spans (one at a block start, so its stand-in
// comes from the blocked kernel's second pass), a mask and two layers with
// dynamic allocation (R_l includes the 2D residuals).
TYPED_TEST(GpuGrids, ImageSpansMatchTheCpu) {
  FLASHCACHE_REQUIRE_DEVICE();
  for (Transform transform : {Transform::blocked, Transform::global})
    for (GridZone zone : {GridZone::rectangle, GridZone::triangle})
      for (std::int64_t tile : {3, 8}) {
        if (transform == Transform::global && tile != 3) continue;  // one tile per span
        Case c;
        c.name = std::string("grids ") + to_string(transform) + " " + to_string(zone) + " tile " + std::to_string(tile);
        c.layers = 2;
        c.heads = 2;
        c.head_dim = tile == 3 ? 40 : 64;
        c.lengths = {89, 120};
        c.nhd = tile == 3;
        c.opt = transform == Transform::blocked ? blocked(16) : global_transform();
        c.spans = {{3, 7, 5}, {40, 6, 6}};
        c.opt.score.grid_zone = zone;
        c.opt.score.grid_tile = tile;
        c.opt.select.sink = 2;
        c.mask_every = 17;
        c.bad_rows = {{0, 1, 44, 44}, {1, 0, 3, 4}, {1, 1, 48, 49}};
        c.budget = Budget::ratio(0.3);
        c.seed = 31 + static_cast<std::uint64_t>(tile) * 4 + (zone == GridZone::triangle) * 2 +
                 (transform == Transform::global);
        run_and_check<TypeParam>(c);
      }
}

// A LLaVA-sized image (24 x 24 patches) inside longer sequences: the whole grid
// in one CTA (global; more tokens than threads), and 8 x 8 tiles over a paged cache.
TYPED_TEST(GpuGrids, ImageSpansOfAFullImage) {
  FLASHCACHE_REQUIRE_DEVICE();
  for (Transform transform : {Transform::blocked, Transform::global}) {
    Case c;
    c.name = std::string("24 x 24 image, ") + to_string(transform);
    c.heads = 2;
    c.head_dim = 128;
    c.lengths = {700, 650};
    c.opt = transform == Transform::blocked ? blocked(64) : global_transform();
    c.spans = {{10, 24, 24}, {600, 5, 9}};
    c.opt.score.grid_zone = GridZone::triangle;
    c.opt.score.grid_tile = 8;
    c.opt.select.sink = 4;
    if (transform == Transform::blocked) c.page_size = 16;
    c.nan_tokens = 3;
    c.budget = Budget::ratio(0.2);
    c.seed = 2024 + (transform == Transform::global);
    run_and_check<TypeParam>(c);
  }
}

TYPED_TEST(GpuGrids, GridSpanPastAShortSequenceIsReported) {
  FLASHCACHE_REQUIRE_DEVICE();
  Case c;
  c.lengths = {100, 50};
  c.opt = blocked(64);
  c.spans = {{20, 6, 6}};
  c.gather = false;
  const Status s = run_expecting_device_failure<TypeParam>(c);
  EXPECT_EQ(s.code(), Errc::invalid_shape) << s.message();
  EXPECT_NE(s.message().find("reaches past the 50 tokens of sequence 1"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace flashcache::gpu_testing

namespace flashcache::gpu_testing::host {
namespace {

// ---- image spans (Cache::spans) ----------------------------------------------

// Options and the image spans a request gives with them (the cache's spans on the GPU).
struct Spanned {
  Options opt;
  std::vector<GridSpan> spans;
};
Spanned with_spans(Options o, std::vector<GridSpan> spans) { return {o, std::move(spans)}; }

// The fixture's cache holding the request's spans.
template <class Fixture>
fcc::Cache<bfloat16_t> with_cache_spans(const Fixture& f, const std::vector<GridSpan>& spans) {
  fcc::Cache<bfloat16_t> c = f.cache;
  c.spans = spans;
  return c;
}

TEST(GpuGrids, AcceptedWithBothTransformsZonesAndTiles) {
  DenseFixture f(2, 2, 200, 64);
  for (GridZone zone : {GridZone::rectangle, GridZone::triangle})
    for (std::int64_t tile : {1, 3, 8, 100}) {
      Spanned r = with_spans(blocked(16), {{3, 7, 5}, {40, 6, 6}});
      r.opt.score.grid_zone = zone;
      r.opt.score.grid_tile = tile;
      EXPECT_TRUE(fcc::can_implement(with_cache_spans(f, r.spans), Budget::ratio(0.3), r.opt).ok()) << "tile " << tile;
    }
}

TEST(GpuGrids, RefusesMoreSpansThanTheKernelParametersHold) {
  DenseFixture f(1, 2, 200, 64);
  std::vector<GridSpan> spans;
  for (int i = 0; i <= fcc::kMaxGridSpans; ++i) spans.push_back({3 * i, 1, 2});
  expect_error(fcc::can_implement(with_cache_spans(f, spans), Budget::ratio(0.3), blocked()), Errc::unsupported,
               "at most 16");
  spans.pop_back();
  EXPECT_TRUE(fcc::can_implement(with_cache_spans(f, spans), Budget::ratio(0.3), blocked()).ok());
}

TEST(GpuGrids, RefusesOverlappingSpans) {
  DenseFixture f(1, 2, 200, 64);
  expect_error(fcc::can_implement(with_cache_spans(f, {{40, 6, 6}, {3, 7, 6}}), Budget::ratio(0.3), blocked()),
               Errc::invalid_option, "overlap");
  std::size_t bytes = 0;
  EXPECT_TRUE(fcc::workspace_size(with_cache_spans(f, {{40, 6, 6}, {3, 7, 5}}), blocked(), &bytes).ok());
}

TEST(GpuGrids, TheBaseSampleTakesOneByteATokenOfWorkspace) {
  DenseFixture f(2, 3, 200, 64);
  for (double base : {0.0, 0.25})
    for (double grid : {0.0, 0.75})
      for (bool spans : {false, true}) {
        const Spanned r = with_spans(blocked(), spans ? std::vector<GridSpan>{{3, 7, 5}} : std::vector<GridSpan>{});
        Options o = r.opt;
        o.select.base_share = base;
        o.select.grid_base_share = grid;
        const fcc::Cache<bfloat16_t> c = with_cache_spans(f, r.spans);
        EXPECT_TRUE(fcc::can_implement(c, Budget::ratio(0.3), o).ok());
        fcc::WorkspaceLayout w;
        ASSERT_TRUE(fcc::workspace_layout(c, o, nullptr, &w).ok());
        // Without spans grid_base_share samples nothing, on the CPU too.
        const bool samples = base > 0 || (spans && grid > 0);
        EXPECT_EQ(fcc::samples_base(o.select, r.spans), samples);
        if (samples) EXPECT_GE(w.total - w.base_mark, 2u * 3 * 200);
      }
}

TEST(GpuGrids, RefusesASpanPastTheCapacity) {
  DenseFixture f(1, 2, 70, 64);
  expect_error(fcc::can_implement(with_cache_spans(f, {{3, 7, 5}, {40, 6, 6}}), Budget::ratio(0.3), blocked()),
               Errc::invalid_shape, "grid span 1 [40, 76) reaches past the capacity of 70 tokens");
}

TEST(GpuGrids, RefusesTilesTooLargeForSharedMemoryNamingTheFix) {
  // A 200 x 200 span as one tile: more shared memory than sm_90 has, even one column at a time.
  DenseFixture f(1, 2, 40000, 128);
  const std::vector<GridSpan> big = {{0, 200, 200}};
  const fcc::Cache<bfloat16_t> c = with_cache_spans(f, big);
  Options o = blocked();
  o.score.grid_tile = 1000;
  expect_error(fcc::can_implement(c, Budget::ratio(0.3), o), Errc::unsupported, "smaller grid_tile");
  o.score.grid_tile = 16;
  EXPECT_TRUE(fcc::can_implement(c, Budget::ratio(0.3), o).ok());
  flashcache::ScoreOptions g;
  g.transform = Transform::global;
  fcc::detail::GridLaunch launch;
  expect_error(fcc::detail::size_grid_launch(128, big, g, fcc::kMaxSharedBytes, &launch), Errc::unsupported,
               "use Transform::blocked");
  // The whole grid of a 24 x 24 image (LLaVA) fits, and a few thousand patches still do.
  const std::vector<GridSpan> llava = {{0, 24, 24}}, larger = {{0, 64, 64}};
  EXPECT_TRUE(fcc::detail::size_grid_launch(128, llava, g, fcc::kMaxSharedBytes, &launch).ok());
  EXPECT_TRUE(fcc::detail::size_grid_launch(128, larger, g, fcc::kMaxSharedBytes, &launch).ok());
}

TEST(GpuGrids, LaunchStaysUnderTheDefaultSharedMemoryForUsualTiles) {
  for (std::int64_t d : {40, 64, 128, 256})
    for (std::int64_t tile : {3, 8, 16}) {
      const std::vector<GridSpan> spans = {{3, 7, 5}, {40, 24, 24}};
      Options o = blocked();
      o.score.grid_tile = tile;
      fcc::detail::GridLaunch launch;
      ASSERT_TRUE(fcc::detail::size_grid_launch(d, spans, o.score, fcc::kMaxSharedBytes, &launch).ok());
      EXPECT_LE(launch.smem, fcc::kernels::kGridPreferredSmem) << "head_dim " << d << " tile " << tile;
      EXPECT_GE(launch.width, 1);
      EXPECT_LE(launch.width, d);
      // Chunks of `width` columns cover the head dim with less than one chunk of padding.
      const std::int64_t chunks = (d + launch.width - 1) / launch.width;
      EXPECT_LT(chunks * launch.width - d, chunks) << "head_dim " << d << " tile " << tile;
    }
}

TEST(GpuGrids, TilesCoverEverySpanTokenOnceAndTheWorkspaceHoldsThem) {
  for (Transform transform : {Transform::blocked, Transform::global})
    // The largest tile (a caller meaning "no tiling") must not overflow the tile count.
    for (std::int64_t tile :
         std::initializer_list<std::int64_t>{1, 3, 8, 1000, std::numeric_limits<std::int64_t>::max()}) {
      const std::vector<GridSpan> given = {{40, 6, 6}, {3, 7, 5}, {80, 1, 9}};
      Options o = blocked();
      o.score.transform = transform;
      o.score.grid_tile = tile;
      const fcc::kernels::GridSpans spans = fcc::detail::grid_spans(given, o.score);
      ASSERT_EQ(spans.tiles(), fcc::grid_tile_count(given, o.score));
      std::vector<int> seen(100, 0);
      for (int q = 0; q < spans.tiles(); ++q) {
        const fcc::kernels::GridTile t = fcc::kernels::grid_tile_at(spans, q);
        ASSERT_GE(t.tr, 1);
        ASSERT_GE(t.tc, 1);
        if (transform == Transform::blocked) {
          EXPECT_LE(t.tr, tile);
          EXPECT_LE(t.tc, tile);
        }
        for (int i = 0; i < t.tr * t.tc; ++i) ++seen[static_cast<std::size_t>(t.token(spans, i))];
      }
      for (std::int64_t token = 0; token < 100; ++token) {
        bool inside = false;
        for (const GridSpan& g : given) inside = inside || (token >= g.first && token < g.end());
        EXPECT_EQ(seen[static_cast<std::size_t>(token)], inside ? 1 : 0) << "token " << token << " tile " << tile;
        EXPECT_EQ(spans.contains(token), inside) << "token " << token;
      }
      fcc::Shape shape;
      shape.layers = 2;
      shape.heads = 3;
      shape.head_dim = 64;
      shape.sequences = 2;
      shape.capacity = 100;
      fcc::WorkspaceLayout with, without;
      ASSERT_TRUE(fcc::make_layout(shape, o, 100, 0, &without).ok());
      shape.spans = given;
      ASSERT_TRUE(fcc::make_layout(shape, o, 100, 0, &with).ok());
      EXPECT_EQ(with.grid_tiles, spans.tiles());
      const std::size_t parts = 2u * 3 * 2 * static_cast<std::size_t>(spans.tiles());
      EXPECT_GE(with.grid_protected - with.grid_energy, parts * 8);
      EXPECT_GE(with.total - without.total, parts * 12 + (transform == Transform::blocked ? 2u * 3 * 100 * 4 : 0));
    }
}

// A span over 2^30 patches wide in tiles over 2^30: cols + tile - 1 (the tile
// count's intermediate, about tiles x tile) passes 2^31. grid_tile_at must
// cut it as the host's 64-bit tiling (grid_spans, grid_tile_count) does.
TEST(GpuGrids, TileIndicesOfAVeryWideOrTallSpanAreTheHostsSixtyFourBitOnes) {
  namespace kn = fcc::kernels;
  const std::int64_t tile = (std::int64_t{1} << 30) + 1, along = 2147483638;  // rows x cols < 2^31
  for (bool wide : {true, false}) {
    SCOPED_TRACE(wide ? "one row" : "one column");
    const std::vector<GridSpan> given = {{0, wide ? 1 : along, wide ? along : 1}};
    Options o = blocked();
    o.score.grid_tile = tile;
    const GridSpan& g = given[0];
    const kn::GridSpans spans = fcc::detail::grid_spans(given, o.score);
    ASSERT_EQ(spans.tiles(), fcc::grid_tile_count(given, o.score));
    ASSERT_EQ(spans.tiles(), 2);
    const std::int64_t across = kn::ceil_div(g.cols, tile), down = kn::ceil_div(g.rows, tile);
    EXPECT_GT(std::max(across, down) * tile, std::int64_t{2147483647});
    std::int64_t covered = 0;
    for (int q = 0; q < spans.tiles(); ++q) {
      const kn::GridTile t = kn::grid_tile_at(spans, q);
      const std::int64_t i = q / across, j = q % across;  // the host's tiling, 64-bit
      EXPECT_EQ(t.span, 0);
      EXPECT_EQ(t.r0, i * tile) << "tile " << q;
      EXPECT_EQ(t.c0, j * tile) << "tile " << q;
      EXPECT_EQ(t.tr, std::min(tile, g.rows - i * tile)) << "tile " << q;
      EXPECT_EQ(t.tc, std::min(tile, g.cols - j * tile)) << "tile " << q;
      covered += std::int64_t{t.tr} * t.tc;
      EXPECT_EQ(t.token(spans, 0), (i * tile) * g.cols + j * tile) << "tile " << q;
    }
    EXPECT_EQ(covered, g.tokens());
    const kn::GridTile last = kn::grid_tile_at(spans, spans.tiles() - 1);
    EXPECT_EQ(last.token(spans, last.tr * last.tc - 1), g.end() - 1);
  }
}

// The 2D pass's arithmetic run on the host, item by item as score_grid_kernel's
// threads run it (GridTileMath), for one head of dense [n][d] K and V, against
// the CPU scorer's scores of the span tokens. `width` 0: the launch's own.
struct HostGridRun {
  std::vector<float> scores;  // span tokens; NaN elsewhere
  double k_high = 0, v_high = 0;
};

HostGridRun run_grid_pass_on_host(const std::vector<float>& k, const std::vector<float>& v,
                                  const std::vector<std::int32_t>& source, std::int64_t n, int d, const Options& opt,
                                  const std::vector<GridSpan>& spans, int width) {
  namespace kn = fcc::kernels;
  HostGridRun out;
  out.scores.assign(static_cast<std::size_t>(n), std::numeric_limits<float>::quiet_NaN());
  fcc::detail::GridLaunch g;
  const flashcache::Status planned = fcc::detail::size_grid_launch(d, spans, opt.score, fcc::kMaxSharedBytes, &g);
  EXPECT_TRUE(planned.ok()) << planned.message();
  if (width > 0) g.width = width;
  const kn::GridSmem lay(g.max_rows, g.max_cols, g.max_tokens, g.max_u, g.max_v, g.width);
  std::vector<float> smem(static_cast<std::size_t>(lay.total / 4), std::numeric_limits<float>::quiet_NaN());
  auto* base = reinterpret_cast<unsigned char*>(smem.data());
  for (int q = 0; q < g.spans.tiles(); ++q) {
    const kn::GridTile tile = kn::grid_tile_at(g.spans, q);
    kn::GridTileMath m(lay, base, tile.tr, tile.tc, g.width);
    const int tokens = m.tokens();
    for (int u = 0; u < m.tr; ++u) m.zone_row(u, opt.score.grid_zone, opt.score.gamma);
    m.zone_extent();
    EXPECT_LE(m.n_u, g.max_u);
    EXPECT_LE(m.n_v, g.max_v);
    for (int i = 0; i < m.table_items(); ++i) m.table(i);
    for (int t = 0; t < 2 * tokens; ++t) m.acc[t] = 0.0f;
    for (int c0 = 0; c0 < d; c0 += g.width) {
      for (int t = 0; t < tokens; ++t)
        for (int w = 0; w < g.width; ++w) {
          const std::int32_t s = source[static_cast<std::size_t>(tile.token(g.spans, t))];
          const bool on = c0 + w < d && s >= 0;
          *m.x_at(0, t, w) = on ? k[static_cast<std::size_t>(s * d + c0 + w)] : 0.0f;
          *m.x_at(1, t, w) = on ? v[static_cast<std::size_t>(s * d + c0 + w)] : 0.0f;
        }
      for (int i = 0; i < m.column_items(); ++i) m.columns_forward(i);
      for (int i = 0; i < m.row_items(); ++i) m.rows_forward(i);
      for (int i = 0; i < m.column_items(); ++i) m.rows_inverse(i);
      for (int i = 0; i < m.residual_items(); ++i) m.residual(i);
      for (int t = 0; t < tokens; ++t) m.accumulate(t);
    }
    for (int t = 0; t < tokens; ++t) {
      const std::int64_t token = tile.token(g.spans, t);
      const bool good = source[static_cast<std::size_t>(token)] == token;
      const float inv_d = 1.0f / static_cast<float>(d);
      out.scores[static_cast<std::size_t>(token)] =
          good ? m.acc[t] * inv_d + m.acc[tokens + t] * inv_d : std::numeric_limits<float>::infinity();
      if (good) {
        out.k_high += m.acc[t];
        out.v_high += m.acc[tokens + t];
      }
    }
  }
  return out;
}

TEST(GpuGrids, HostRunOfTheKernelArithmeticMatchesTheCpuScorer) {
  const std::int64_t n = 89;
  const int d = 40;
  std::mt19937_64 rng(7);
  std::normal_distribution<float> noise(0.0f, 0.3f);
  std::vector<float> k(static_cast<std::size_t>(n * d)), v(k.size());
  for (std::int64_t t = 0; t < n; ++t)
    for (int c = 0; c < d; ++c) {
      const float smooth = std::sin(0.2f * static_cast<float>(t % 7) + 0.5f * static_cast<float>(c));
      k[static_cast<std::size_t>(t * d + c)] = smooth + noise(rng) + (t % 13 == 5 ? 2.0f : 0.0f);
      v[static_cast<std::size_t>(t * d + c)] = 0.5f * smooth - noise(rng);
    }
  k[static_cast<std::size_t>(44 * d + 3)] = std::numeric_limits<float>::quiet_NaN();  // inside the 6 x 6 span
  k[static_cast<std::size_t>(3 * d)] = std::numeric_limits<float>::infinity();        // the first token of the 7 x 5
  // score.hpp's stand-ins: the nearest finite token before, else the first after.
  std::vector<std::int32_t> source(static_cast<std::size_t>(n));
  std::int32_t last_good = -1;
  for (std::int32_t t = 0; t < n; ++t) {
    bool finite = true;
    for (int c = 0; c < d; ++c)
      finite = finite && std::isfinite(k[static_cast<std::size_t>(t * d + c)]) &&
               std::isfinite(v[static_cast<std::size_t>(t * d + c)]);
    if (finite) {
      if (last_good < 0)
        for (std::int32_t u = 0; u < t; ++u) source[static_cast<std::size_t>(u)] = t;
      last_good = t;
    }
    source[static_cast<std::size_t>(t)] = finite ? t : last_good;
  }
  const auto kv =
      flashcache::hnd<const float>(k.data(), flashcache::Heads(1), flashcache::Tokens(n), flashcache::HeadDim(d));
  const auto vv =
      flashcache::hnd<const float>(v.data(), flashcache::Heads(1), flashcache::Tokens(n), flashcache::HeadDim(d));
  int runs = 0;
  for (Transform transform : {Transform::blocked, Transform::global})
    for (GridZone zone : {GridZone::rectangle, GridZone::triangle})
      for (std::int64_t tile : {3, 8})
        for (double gamma : {0.2, 0.35})
          for (int width : {0, 1, 7}) {
            if (transform == Transform::global && tile != 3) continue;  // one tile per span
            const std::vector<GridSpan> spans = {{3, 7, 5}, {40, 6, 6}};
            Options o = blocked(16);
            o.score.mean_weight = 0.0;  // the residual alone: what the 2D pass computes
            o.score.transform = transform;
            o.score.grid_zone = zone;
            o.score.grid_tile = tile;
            o.score.gamma = gamma;
            SCOPED_TRACE(std::string(flashcache::to_string(transform)) + " " + flashcache::to_string(zone) + " tile " +
                         std::to_string(tile) + " gamma " + std::to_string(gamma) + " width " + std::to_string(width));
            flashcache::Scorer<double> scorer;
            flashcache::LayerScores cpu;
            ASSERT_TRUE(scorer.score(kv, vv, o.score, &cpu, flashcache::ScoreInputs{spans, {}}).ok());
            const HostGridRun host = run_grid_pass_on_host(k, v, source, n, d, o, spans, width);
            double largest = 0;
            for (std::int64_t t = 0; t < n; ++t)
              if (std::isfinite(cpu(0, t))) largest = std::max(largest, static_cast<double>(cpu(0, t)));
            int compared = 0;
            for (std::int64_t t = 0; t < n; ++t) {
              const float got = host.scores[static_cast<std::size_t>(t)];
              if (std::isnan(got)) continue;  // outside the spans
              ++compared;
              const float want = cpu(0, t);
              if (std::isinf(want))
                EXPECT_TRUE(std::isinf(got)) << "token " << t;
              else
                EXPECT_NEAR(got, want, 1e-5 * largest) << "token " << t;
            }
            EXPECT_EQ(compared, 35 + 36);
            ++runs;
          }
  EXPECT_EQ(runs, 2 * 2 * 2 * 3 + 2 * 2 * 3);
}

// The energies the 2D pass adds: the CPU's E_high with spans minus without
// them is the span tokens' 2D residuals minus their 1D ones.
TEST(GpuGrids, HostRunEnergyIsTheSpanTokensResidual) {
  const std::int64_t n = 64;
  const int d = 8;
  std::mt19937_64 rng(11);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  std::vector<float> k(static_cast<std::size_t>(n * d)), v(k.size());
  for (auto& x : k) x = noise(rng);
  for (auto& x : v) x = noise(rng);
  std::vector<std::int32_t> source(static_cast<std::size_t>(n));
  for (std::int32_t t = 0; t < n; ++t) source[static_cast<std::size_t>(t)] = t;
  // Block size 1: the 1D residual of every token is 0, so E_high with spans is the 2D part alone.
  const std::vector<GridSpan> spans = {{5, 5, 9}};
  Options o = blocked(1);
  o.score.grid_tile = 4;
  o.score.grid_zone = GridZone::triangle;
  const auto kv =
      flashcache::hnd<const float>(k.data(), flashcache::Heads(1), flashcache::Tokens(n), flashcache::HeadDim(d));
  const auto vv =
      flashcache::hnd<const float>(v.data(), flashcache::Heads(1), flashcache::Tokens(n), flashcache::HeadDim(d));
  flashcache::Scorer<double> scorer;
  flashcache::LayerScores cpu;
  ASSERT_TRUE(scorer.score(kv, vv, o.score, &cpu, flashcache::ScoreInputs{spans, {}}).ok());
  const HostGridRun host = run_grid_pass_on_host(k, v, source, n, d, o, spans, 0);
  EXPECT_GT(host.k_high, 0.0);
  EXPECT_NEAR(host.k_high, cpu.energy[0].k_high, 1e-4 * cpu.energy[0].k_total);
  EXPECT_NEAR(host.v_high, cpu.energy[0].v_high, 1e-4 * cpu.energy[0].v_total);
}

}  // namespace
}  // namespace flashcache::gpu_testing::host
