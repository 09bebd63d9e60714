#pragma once
// The GPU test cases, typed on the element type. Each test_gpu_<type>.cu
// instantiates them for one type, so the three build in parallel.
// Every case runs the whole pipeline and checks each stage's output against
// the CPU reference (gpu_testing.cuh): scores, energy ratios, budgets, kept
// sets with their guarantees, gathered rows and compacted pages.
#include "gpu_testing.cuh"

namespace flashcache::gpu_testing {

template <class T>
class GpuPipeline : public ::testing::Test {};
TYPED_TEST_SUITE_P(GpuPipeline);

TYPED_TEST_P(GpuPipeline, BlockedScoresAwkwardLengthsBothLayouts) {
  FLASHCACHE_REQUIRE_DEVICE();
  std::vector<Case> cases;
  for (std::int64_t n : {1, 7, 257, 4099})
    for (bool nhd : {true, false}) {
      Case c;
      c.name = "blocked N=" + std::to_string(n) + (nhd ? " NHD" : " HND");
      c.lengths = {n};
      c.heads = 3;
      c.head_dim = 128;
      c.nhd = nhd;
      c.opt = blocked(64);
      c.seed = static_cast<std::uint64_t>(n) * 2 + nhd;
      cases.push_back(c);
    }
  for (const Case& c : cases) run_and_check<TypeParam>(c);
}

TYPED_TEST_P(GpuPipeline, BlockedEveryCompiledHeadDimAndTheGenericOne) {
  FLASHCACHE_REQUIRE_DEVICE();
  for (std::int64_t d : {64, 96, 128, 256, 40, 8}) {
    for (std::int64_t block : {16, 64, 100}) {
      if (d == 256 && block > 64 && sizeof(TypeParam) == 4) continue;  // refused: shared memory
      Case c;
      c.name = "head_dim " + std::to_string(d) + " block " + std::to_string(block);
      c.lengths = {333};
      c.head_dim = d;
      c.opt = blocked(block);
      c.opt.score.gamma = block == 16 ? 0.3 : 0.2;
      c.seed = static_cast<std::uint64_t>(d * 1000 + block);
      run_and_check<TypeParam>(c);
    }
  }
}

TYPED_TEST_P(GpuPipeline, GlobalScoresAwkwardLengths) {
  FLASHCACHE_REQUIRE_DEVICE();
  for (std::int64_t n : {1, 7, 257, 4099}) {
    Case c;
    c.name = "global N=" + std::to_string(n);
    c.lengths = {n};
    c.heads = 2;
    c.head_dim = 64;
    c.nhd = n % 2 == 1;
    c.opt = global_transform();
    c.seed = static_cast<std::uint64_t>(n) + 77;
    run_and_check<TypeParam>(c);
  }
}

TYPED_TEST_P(GpuPipeline, RaggedBatchWithProtectionNaNsAndDynamicAllocation) {
  FLASHCACHE_REQUIRE_DEVICE();
  for (Transform transform : {Transform::blocked, Transform::global})
    for (Allocation allocation : {Allocation::dynamic, Allocation::uniform}) {
      Case c;
      c.name = std::string(to_string(transform)) + " / " + to_string(allocation);
      c.layers = 3;
      c.heads = 2;
      c.head_dim = 64;
      c.lengths = {0, 33, 300, 1000, 57};
      c.opt = transform == Transform::blocked ? blocked(64) : global_transform();
      c.opt.allocate.mode = allocation;
      c.opt.select.sink = 1;
      c.opt.select.window = 2;
      c.opt.allocate.min_layer_ratio = 0.05;
      c.mask_every = 50;
      c.nan_tokens = 6;
      c.budget = Budget::ratio(0.3);
      c.seed = 1234;
      run_and_check<TypeParam>(c);
    }
}

// The library's defaults: 4 sink tokens and the newest half of each layer's
// budget, ranked above every score on the GPU, newest first, as on the CPU; then
// a fixed window larger than the share, and the share with a mask and NaNs.
TYPED_TEST_P(GpuPipeline, DefaultOptionsKeepTheRecentWindowShare) {
  FLASHCACHE_REQUIRE_DEVICE();
  for (int variant = 0; variant < 3; ++variant) {
    Case c;
    c.name = "defaults, variant " + std::to_string(variant);
    c.layers = 3;
    c.heads = 2;
    c.head_dim = 64;
    c.lengths = {0, 33, 300, 1000, 57};
    c.opt = Options{};
    if (variant == 1) {
      c.opt.score.transform = Transform::global;
      // Larger than round(0.25 * budget) in the short sequences (budgets 10 and 17), yet
      // within every budget with the sink: the CPU refuses a sink + window above a budget.
      c.opt.select.window = 5;
      c.opt.select.window_share = 0.25;
    }
    if (variant == 2) {
      c.mask_every = 37;
      c.nan_tokens = 4;
      c.opt.allocate.mode = Allocation::uniform;
    }
    c.budget = Budget::ratio(0.3);
    c.seed = 4321 + static_cast<std::uint64_t>(variant);
    run_and_check<TypeParam>(c);
  }
}

TYPED_TEST_P(GpuPipeline, PagedCachesCompactInPlace) {
  FLASHCACHE_REQUIRE_DEVICE();
  for (std::int64_t page : {1, 3, 16})
    for (bool nhd : {true, false}) {
      Case c;
      c.name = "page_size " + std::to_string(page) + (nhd ? " NHD" : " HND");
      c.layers = 2;
      c.heads = 2;
      c.head_dim = 64;
      c.lengths = {0, 1, 45, 200};
      c.page_size = page;
      c.nhd = nhd;
      c.opt = blocked(32);
      c.opt.allocate.mode = Allocation::uniform;
      c.budget = Budget::ratio(0.25);
      c.compact = true;
      c.seed = static_cast<std::uint64_t>(page) * 10 + nhd;
      run_and_check<TypeParam>(c);
    }
}

TYPED_TEST_P(GpuPipeline, BudgetsNoneAllAndCounts) {
  FLASHCACHE_REQUIRE_DEVICE();
  const std::vector<Budget> budgets = {Budget::tokens(0), Budget::ratio(1.0), Budget::tokens(1), Budget::tokens(50),
                                       Budget::ratio(0.5)};
  for (std::size_t i = 0; i < budgets.size(); ++i) {
    Case c;
    c.name = "budget case " + std::to_string(i);
    c.lengths = {50, 120};
    c.opt = blocked(64);
    c.budget = budgets[i];
    c.seed = 900 + i;
    run_and_check<TypeParam>(c);
  }
}

TYPED_TEST_P(GpuPipeline, BudgetBelowProtectedIsReported) {
  FLASHCACHE_REQUIRE_DEVICE();
  Case c;
  c.lengths = {100, 100};
  c.opt = blocked(64);
  c.opt.select.sink = 8;
  c.opt.select.window = 8;
  c.budget = Budget::tokens(10);
  c.gather = false;
  const Status s = run_expecting_device_failure<TypeParam>(c);
  EXPECT_EQ(s.code(), Errc::invalid_budget) << s.message();
  EXPECT_NE(s.message().find("protected"), std::string::npos) << s.message();
}

TYPED_TEST_P(GpuPipeline, CountAboveAShortSequenceIsReported) {
  FLASHCACHE_REQUIRE_DEVICE();
  Case c;
  c.lengths = {100, 5};
  c.opt = blocked(64);
  c.budget = Budget::tokens(10);
  c.gather = false;
  const Status s = run_expecting_device_failure<TypeParam>(c);
  EXPECT_EQ(s.code(), Errc::invalid_budget) << s.message();
  EXPECT_NE(s.message().find("sequence 1"), std::string::npos) << s.message();
}

TYPED_TEST_P(GpuPipeline, BlockedScoresAreReproducible) {
  FLASHCACHE_REQUIRE_DEVICE();
  Case c;
  c.layers = 2;
  c.lengths = {700, 300};
  c.opt = blocked(64);
  c.nan_tokens = 2;
  const std::vector<float> a = blocked_scores<TypeParam>(c), b = blocked_scores<TypeParam>(c);
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

TYPED_TEST_P(GpuPipeline, CapturesInACudaGraph) {
  FLASHCACHE_REQUIRE_DEVICE();
  FLASHCACHE_REQUIRE_GRAPHS();
  Case c;
  c.lengths = {500, 77};
  c.head_dim = 128;
  c.opt = blocked(64);
  c.opt.select.sink = 2;
  c.budget = Budget::ratio(0.3);
  EXPECT_EQ(graph_matches_direct<TypeParam>(c), "");
}

// Image spans (Cache::spans): their tokens scored by the 2D pass, against
// the CPU scorer, on odd shapes: spans of 7 x 5 and 6 x 6 patches in two
// sequences of different lengths, tiles of 3 and 8 (edge tiles of their own
// size), both zones, both transforms, the generic and a compiled head dim,
// non-finite rows inside the spans (one at a block start, so its stand-in
// comes from the blocked kernel's second pass), a mask and two layers with
// dynamic allocation (R_l includes the 2D residuals).
TYPED_TEST_P(GpuPipeline, ImageSpansMatchTheCpu) {
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
TYPED_TEST_P(GpuPipeline, ImageSpansOfAFullImage) {
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

// The base sample: evenly spaced tokens (base_share) and, inside image spans,
// a regular sub-grid (grid_base_share, 0.75 by default), after the sink and the
// recent window, as select.hpp picks them.
TYPED_TEST_P(GpuPipeline, BaseSampleMatchesTheCpu) {
  FLASHCACHE_REQUIRE_DEVICE();
  for (int variant = 0; variant < 4; ++variant) {
    const bool spans = variant >= 2;
    const Transform transform = variant % 2 ? Transform::global : Transform::blocked;
    Case c;
    c.name = std::string("base sample, ") + (spans ? "spans, " : "") + to_string(transform);
    c.layers = 2;
    c.heads = 2;
    c.head_dim = 64;
    c.lengths = {120, 97, 300};
    c.opt = Options{};  // sink 4, half the budget to the recent window, grid_base_share 0.75
    c.opt.score.transform = transform;
    if (transform == Transform::blocked) c.opt.score.base = Base::lowpass;  // the GPU's blocked kernel: low-pass only
    c.opt.score.block_size = 32;
    c.opt.select.base_share = spans ? 0.1 : 0.25;
    c.opt.allocate.mode = Allocation::uniform;  // exact budgets: the sample's picks follow the budget
    if (spans) c.spans = {{10, 7, 5}, {50, 6, 6}};
    c.mask_every = 23;
    c.nan_tokens = 3;
    c.budget = Budget::ratio(0.4);
    c.seed = 77 + static_cast<std::uint64_t>(variant);
    run_and_check<TypeParam>(c);
  }
}

TYPED_TEST_P(GpuPipeline, GridSpanPastAShortSequenceIsReported) {
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

// The Base KV chosen by energy (ScoreOptions::base peak, mixed) on the global
// transform, against the CPU (choose_base_frequencies, its scorer, the whole
// pipeline): one ragged batch of odd lengths (a single token, an empty
// sequence, 1000 tokens: more frequencies than the choose kernel's threads),
// two layers with dynamic allocation, the generic head dim 5 and 64, gamma 0.1
// to 0.3, a mask. Spectral data (Case::spectral): a clear choice.
TYPED_TEST_P(GpuPipeline, GlobalPeakAndMixedBasesMatchTheCpu) {
  FLASHCACHE_REQUIRE_DEVICE();
  int variant = 0;
  for (Base kind : {Base::peak, Base::mixed})
    for (std::int64_t d : {5, 64})
      for (double gamma : {0.1, 0.2, 0.3}) {
        Case c;
        c.name = std::string("global ") + to_string(kind) + " head_dim " + std::to_string(d) + " gamma " +
                 std::to_string(gamma);
        c.layers = 2;
        c.heads = 2;
        c.head_dim = d;
        c.lengths = {37, 0, 101, 250, 1, 1000};
        c.nhd = variant % 2 == 0;
        c.opt = global_transform();
        c.opt.score.base = kind;
        c.opt.score.gamma = gamma;
        c.mask_every = 29;  // no sink: the one-token sequence's model budget, round(0.3 x 2), is one token
        c.spectral = true;
        c.budget = Budget::ratio(0.3);
        c.seed = 600 + static_cast<std::uint64_t>(variant++);
        run_and_check<TypeParam>(c);
      }
}

// Transform::blocked keeps the low-pass base only on the GPU: refused by name, before any launch.
TYPED_TEST_P(GpuPipeline, BlockedRefusesAChosenBaseByName) {
  FLASHCACHE_REQUIRE_DEVICE();
  Case c;
  c.lengths = {100};
  c.opt = blocked(64);
  c.opt.score.base = Base::peak;
  c.gather = false;
  const Status s = run_expecting_device_failure<TypeParam>(c);
  EXPECT_EQ(s.code(), Errc::unsupported) << s.message();
  EXPECT_NE(s.message().find("with Transform::blocked"), std::string::npos) << s.message();
}

REGISTER_TYPED_TEST_SUITE_P(GpuPipeline, BlockedScoresAwkwardLengthsBothLayouts,
                            BlockedEveryCompiledHeadDimAndTheGenericOne, GlobalScoresAwkwardLengths,
                            RaggedBatchWithProtectionNaNsAndDynamicAllocation, DefaultOptionsKeepTheRecentWindowShare,
                            PagedCachesCompactInPlace, BudgetsNoneAllAndCounts, BudgetBelowProtectedIsReported,
                            CountAboveAShortSequenceIsReported, BlockedScoresAreReproducible, CapturesInACudaGraph,
                            ImageSpansMatchTheCpu, ImageSpansOfAFullImage, BaseSampleMatchesTheCpu,
                            GridSpanPastAShortSequenceIsReported, GlobalPeakAndMixedBasesMatchTheCpu,
                            BlockedRefusesAChosenBaseByName);

}  // namespace flashcache::gpu_testing
