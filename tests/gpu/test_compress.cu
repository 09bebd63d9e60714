// The front door (flashcache/cuda/compress.cuh) as a whole: can_implement's
// checks, the workspace's layout and size, the device status's messages, the
// rules shared with the CPU, and a run captured in a CUDA graph. All but the
// capture are host-side and run anywhere, CI included.
#include <gtest/gtest.h>

#include "element_types.cuh"
#include "flashcache/rules.hpp"
#include "gpu_testing.cuh"
#include "host_fixture.cuh"

namespace flashcache::gpu_testing {
namespace {

using host::expect_error;

// The whole run path, for each element type.
FLASHCACHE_ELEMENT_TYPED_SUITE(GpuCompress);

TYPED_TEST(GpuCompress, CapturesInACudaGraph) {
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

}  // namespace
}  // namespace flashcache::gpu_testing

namespace flashcache::gpu_testing::host {
namespace {

TEST(GpuCanImplement, AcceptsTheQwenShape) {
  DenseFixture f(28, 4, 8192, 128);
  EXPECT_TRUE(fcc::can_implement(f.cache, Budget::ratio(0.2), blocked()).ok());
}

TEST(GpuCanImplement, RefusesLayerCounts) {
  DenseFixture f(1, 2, 16, 64);
  f.cache.layers = 0;
  expect_error(fcc::can_implement(f.cache, Budget::ratio(0.2), blocked()), Errc::unsupported, "layers");
  DenseFixture g(fcc::kMaxLayers + 1, 2, 16, 64);
  expect_error(fcc::can_implement(g.cache, Budget::ratio(0.2), blocked()), Errc::unsupported, "layers");
}

// Score options only the CPU has are refused by name, before any launch.
TEST(GpuCanImplement, RefusesCpuOnlyScoreOptionsByName) {
  DenseFixture f(1, 2, 16, 64);
  Options opt = blocked();
  opt.score.normalize_terms = true;
  expect_error(fcc::can_implement(f.cache, Budget::ratio(0.2), opt), Errc::unsupported, "normalize_terms");
  opt.score.normalize_terms = false;
  opt.score.bridge = 2;
  expect_error(fcc::can_implement(f.cache, Budget::ratio(0.2), opt), Errc::unsupported, "bridge");
}

// mean_weight runs on the GPU (kernels/mean_distance.cuh), with either distance, up to
// the head dim its shared mean row allows, and is refused by name past it.
TEST(GpuCanImplement, MeanWeightUpToItsHeadDim) {
  Options opt = blocked();
  opt.score.mean_weight = 0.5;
  DenseFixture f(1, 2, 16, 64);
  EXPECT_TRUE(fcc::can_implement(f.cache, Budget::ratio(0.2), opt).ok());
  opt.score.mean_full_keep = 0.5;  // the weight that follows the budget, too
  opt.score.mean_zero_keep = 0.25;
  EXPECT_TRUE(fcc::can_implement(f.cache, Budget::ratio(0.2), opt).ok());
  opt.score.mean_distance = MeanDistance::key_cosine;  // KeyDiff's distance shares the kernel and its limit
  EXPECT_TRUE(fcc::can_implement(f.cache, Budget::ratio(0.2), opt).ok());
  DenseFixture wide(1, 1, 16, fcc::checks::kMeanDistanceMaxHeadDim + 8);
  expect_error(fcc::can_implement(wide.cache, Budget::ratio(0.2), opt), Errc::unsupported, "mean_weight with head_dim");
}

// Query tails: Cache::tails given exactly when ScoreOptions::query asks for them.
TEST(GpuCanImplement, QueryTailsNeedTheCachesTails) {
  DenseFixture f(1, 2, 16, 64);
  Options opt = Options::with_query_tail(blocked());
  expect_error(fcc::can_implement(f.cache, Budget::ratio(0.2), opt), Errc::invalid_option, "Cache::tails is null");
  f.cache.tails = fake<const float>(0x20000000u);
  EXPECT_TRUE(fcc::can_implement(f.cache, Budget::ratio(0.2), opt).ok());
  expect_error(fcc::can_implement(f.cache, Budget::ratio(0.2), blocked()), Errc::invalid_option,
               "ScoreOptions::query is none");
  f.cache.tails = fake<const float>(0x20000002u);
  expect_error(fcc::can_implement(f.cache, Budget::ratio(0.2), opt), Errc::invalid_shape, "aligned");
}

TEST(GpuCanImplement, RefusesNullPointersAndShapes) {
  DenseFixture f(2, 2, 16, 64);
  f.k[1] = nullptr;
  expect_error(fcc::can_implement(f.cache, Budget::ratio(0.2), blocked()), Errc::invalid_shape, "layer 1");
  DenseFixture g(1, 0, 16, 64);
  expect_error(fcc::can_implement(g.cache, Budget::ratio(0.2), blocked()), Errc::invalid_shape, "heads");
  DenseFixture h(1, 2, 16, 64);
  h.cache.sequences = 3;  // no indptr
  expect_error(fcc::can_implement(h.cache, Budget::ratio(0.2), blocked()), Errc::invalid_shape, "indptr");
}

TEST(GpuCanImplement, RefusesOverlappingStrides) {
  DenseFixture f(1, 4, 16, 64);
  f.cache.token_stride = 64;  // NHD rows of 4 heads cannot be 64 elements apart
  expect_error(fcc::can_implement(f.cache, Budget::ratio(0.2), blocked()), Errc::invalid_stride, "overlap");
}

TEST(GpuCanImplement, RefusesBudgetsOutOfRange) {
  DenseFixture f(1, 2, 16, 64);
  expect_error(fcc::can_implement(f.cache, Budget::ratio(1.5), blocked()), Errc::invalid_budget, "ratio");
  expect_error(fcc::can_implement(f.cache, Budget::tokens(-1), blocked()), Errc::invalid_budget, "negative");
  expect_error(fcc::can_implement(f.cache, Budget::tokens(17), blocked()), Errc::invalid_budget, "capacity");
  EXPECT_TRUE(fcc::can_implement(f.cache, Budget::tokens(16), blocked()).ok());
  EXPECT_TRUE(fcc::can_implement(f.cache, Budget::tokens(0), blocked()).ok());
}

// The layout factories set the strides each layout's comment in cache.cuh
// gives, and leave every other field at its default.
TEST(GpuCache, FactoriesSetTheStridesOfEachLayout) {
  std::vector<bfloat16_t*> k = {fake<bfloat16_t>(0x10000000u)}, v = {fake<bfloat16_t>(0x20000000u)};
  const auto* indptr = reinterpret_cast<const std::int32_t*>(std::uintptr_t{0x30000000u});
  const std::int64_t heads = 3, d = 40, tokens = 37;
  const auto nhd = fcc::Cache<bfloat16_t>::dense_nhd(1, k.data(), v.data(), heads, d, tokens, 2, indptr);
  EXPECT_EQ(nhd.head_stride, d);
  EXPECT_EQ(nhd.token_stride, heads * d);
  EXPECT_EQ(nhd.capacity, tokens);
  EXPECT_EQ(nhd.sequences, 2);
  EXPECT_EQ(nhd.indptr, indptr);
  EXPECT_FALSE(nhd.paged());
  EXPECT_EQ(nhd.protect, nullptr);
  const auto hnd = fcc::Cache<bfloat16_t>::dense_hnd(1, k.data(), v.data(), heads, d, tokens);
  EXPECT_EQ(hnd.head_stride, tokens * d);
  EXPECT_EQ(hnd.token_stride, d);
  EXPECT_EQ(hnd.sequences, 1);
  EXPECT_EQ(hnd.indptr, nullptr);
  EXPECT_TRUE(fcc::can_implement(hnd, Budget::ratio(0.5), blocked()).ok());

  fcc::PageTable table;
  table.indptr = indptr;
  table.indices = indptr + 8;
  table.last_page_len = indptr + 16;
  table.page_size = 5;
  table.num_pages = 7;
  const auto pn = fcc::Cache<bfloat16_t>::paged_nhd(1, k.data(), v.data(), heads, d, table, 2, 35);
  const auto ph = fcc::Cache<bfloat16_t>::paged_hnd(1, k.data(), v.data(), heads, d, table, 2, 35);
  for (const auto* c : {&pn, &ph}) {
    EXPECT_TRUE(c->paged());
    EXPECT_EQ(c->pages.page_stride, 5 * heads * d);
    EXPECT_EQ(c->pages.indices, table.indices);
    EXPECT_EQ(c->capacity, 35);
    const Status s = fcc::can_implement(*c, Budget::ratio(0.5), blocked());
    EXPECT_TRUE(s.ok()) << s.message();
  }
  EXPECT_EQ(pn.head_stride, d);
  EXPECT_EQ(pn.token_stride, heads * d);
  EXPECT_EQ(ph.head_stride, 5 * d);
  EXPECT_EQ(ph.token_stride, d);
}

TEST(GpuCanImplement, RefusesBadOptions) {
  DenseFixture f(1, 2, 16, 64);
  Options o = blocked();
  o.score.gamma = 0;
  expect_error(fcc::can_implement(f.cache, Budget::ratio(0.2), o), Errc::invalid_option, "gamma");
  expect_error(fcc::can_implement(f.cache, Budget::ratio(0.2), blocked(flashcache::rules::kMaxGpuBlockSize + 1)),
               Errc::unsupported, "block_size");
}

TEST(GpuCanImplement, RefusesSharedMemoryOverflowNamingTheFix) {
  // float, head_dim 256, blocks of 128: K and V tiles alone take 256 KB.
  std::vector<float*> k{fake<float>(0x10000000u)}, v{fake<float>(0x20000000u)};
  fcc::Cache<float> c;
  c.k = k.data();
  c.v = v.data();
  c.heads = 1;
  c.head_dim = 256;
  c.head_stride = 256;
  c.token_stride = 256;
  c.capacity = 100;
  expect_error(fcc::can_implement(c, Budget::ratio(0.2), blocked(128)), Errc::unsupported, "smaller block_size");
  EXPECT_TRUE(fcc::can_implement(c, Budget::ratio(0.2), blocked(64)).ok());
}

TEST(GpuCanImplement, GlobalNeedsAPlan) {
  DenseFixture f(1, 2, 16, 64);
  Options o;
  o.score.transform = Transform::global;
  expect_error(fcc::can_implement(f.cache, Budget::ratio(0.2), o), Errc::invalid_option, "GlobalTransform");
  std::size_t bytes = 0;
  expect_error(fcc::workspace_size(f.cache, o, &bytes), Errc::invalid_option, "GlobalTransform");
}

TEST(GpuCanImplement, PagedCachesNeedTheirTables) {
  DenseFixture f(1, 2, 64, 64);
  f.cache.pages.indices = fake<const std::int32_t>(0x1000);
  expect_error(fcc::can_implement(f.cache, Budget::ratio(0.2), blocked()), Errc::invalid_shape, "last_page_len");
  f.cache.pages.indptr = fake<const std::int32_t>(0x2000);
  f.cache.pages.last_page_len = fake<const std::int32_t>(0x3000);
  expect_error(fcc::can_implement(f.cache, Budget::ratio(0.2), blocked()), Errc::invalid_shape, "page_size");
  f.cache.pages.page_size = 16;
  f.cache.pages.num_pages = 4;
  f.cache.pages.page_stride = 16 * 2 * 64 - 1;  // one element short of a page
  expect_error(fcc::can_implement(f.cache, Budget::ratio(0.2), blocked()), Errc::invalid_stride, "page_stride");
  f.cache.pages.page_stride = 16 * 2 * 64;
  EXPECT_TRUE(fcc::can_implement(f.cache, Budget::ratio(0.2), blocked()).ok());
}

TEST(GpuCanImplement, OutputsAreChecked) {
  DenseFixture f(1, 2, 64, 64);
  fcc::Outputs<bfloat16_t> out;
  out.compact_in_place = true;
  expect_error(fcc::can_implement(f.cache, Budget::ratio(0.2), blocked(), out), Errc::invalid_option, "paged");
  fcc::Outputs<bfloat16_t> dense;
  std::vector<bfloat16_t*> k_out{fake<bfloat16_t>(0x40000000u)};
  dense.k_out = k_out.data();
  expect_error(fcc::can_implement(f.cache, Budget::ratio(0.2), blocked(), dense), Errc::invalid_shape, "both");
  fcc::Outputs<bfloat16_t> kept_only;
  kept_only.kept = fake<std::int32_t>(0x5000);
  expect_error(fcc::can_implement(f.cache, Budget::ratio(0.2), blocked(), kept_only), Errc::invalid_shape, "kept");
}

TEST(GpuWorkspace, RegionsAreAlignedDisjointAndCoverTheProblem) {
  fcc::Shape s;
  s.layers = 3;
  s.heads = 4;
  s.head_dim = 128;
  s.sequences = 5;
  s.capacity = 1000;
  fcc::WorkspaceLayout w;
  ASSERT_TRUE(fcc::make_layout(s, blocked(64), 0, 0, &w).ok());
  EXPECT_EQ(w.tile, 64);
  EXPECT_EQ(w.slot_count, 1000 / 64 + 5);
  const std::vector<std::size_t> starts = {
      w.status,         w.seq_len,       w.seq_offset,  w.seq_slots,     w.scores,     w.energy_part,
      w.protected_part, w.energy,        w.ratio,       w.protected_max, w.budget,     w.scratch_ratio,
      w.scratch_tokens, w.scratch_floor, w.scratch_out, w.kept,          w.kept_indptr};
  for (std::size_t i = 0; i < starts.size(); ++i) {
    EXPECT_EQ(starts[i] % 256, 0u) << "region " << i;
    if (i > 0) EXPECT_GT(starts[i], starts[i - 1]) << "region " << i;
  }
  EXPECT_GE(w.kept - w.scores, 3u * 4 * 1000 * 4);  // scores hold [L][H][capacity] floats
  EXPECT_GE(w.total, w.kept_indptr + 3 * 6 * 4);
}

TEST(GpuWorkspace, GlobalAddsSpectrumAndFftWork) {
  fcc::Shape s;
  s.layers = 2;
  s.heads = 4;
  s.head_dim = 128;
  s.sequences = 1;
  s.capacity = 4099;
  Options g;
  g.score.transform = Transform::global;
  fcc::WorkspaceLayout blocked_layout, global_layout;
  ASSERT_TRUE(fcc::make_layout(s, blocked(64), 0, 0, &blocked_layout).ok());
  ASSERT_TRUE(fcc::make_layout(s, g, 4099, 12345, &global_layout).ok());
  EXPECT_EQ(global_layout.tile, fcc::kGlobalSlotTokens);
  EXPECT_GE(global_layout.total - global_layout.spectrum, 4u * 128 * 4099 * 8 + 12345);
  EXPECT_GE(global_layout.fft_work, global_layout.spectrum + 4u * 128 * 4099 * 8);
  EXPECT_FALSE(fcc::make_layout(s, g, 5000, 0, &global_layout).ok());  // longer than the capacity
}

TEST(GpuWorkspace, SizeQueryMatchesTheLayoutAndGrowsWithTokens) {
  DenseFixture small(28, 4, 8192, 128), large(28, 4, 65536, 128);
  std::size_t a = 0, b = 0;
  ASSERT_TRUE(fcc::workspace_size(small.cache, blocked(), &a).ok());
  ASSERT_TRUE(fcc::workspace_size(large.cache, blocked(), &b).ok());
  EXPECT_GT(a, 0u);
  EXPECT_GT(b, a);
  fcc::WorkspaceLayout w;
  ASSERT_TRUE(fcc::workspace_layout(small.cache, blocked(), nullptr, &w).ok());
  EXPECT_EQ(w.total, a);
}

TEST(GpuWorkspace, EmptyCacheStillHasAWorkspace) {
  DenseFixture f(1, 2, 0, 64);
  std::size_t bytes = 0;
  ASSERT_TRUE(fcc::workspace_size(f.cache, blocked(), &bytes).ok());
  EXPECT_GT(bytes, 0u);  // status word, per-sequence tables
}

TEST(GpuCompressAsync, RefusesAMissingOrShortWorkspaceWithoutTouchingTheDevice) {
  DenseFixture f(1, 2, 64, 64);
  fcc::Outputs<bfloat16_t> out;
  expect_error(fcc::compress_async(f.cache, Budget::ratio(0.2), blocked(), out, nullptr, 0, nullptr),
               Errc::invalid_shape, "workspace");
  std::size_t bytes = 0;
  ASSERT_TRUE(fcc::workspace_size(f.cache, blocked(), &bytes).ok());
  expect_error(
      fcc::compress_async(f.cache, Budget::ratio(0.2), blocked(), out, fake<void>(0x100000), bytes - 1, nullptr),
      Errc::invalid_shape, "workspace");
}

TEST(GpuSharedMemory, CommonShapesFitWithoutOptIn) {
  // bf16 / half at head dims 64..128 with blocks of 64 stay under 48 KB.
  for (std::int64_t d : {64, 96, 128})
    EXPECT_LE(fcc::detail::blocked_smem_bytes(d, 2, blocked(64).score), 48 * 1024) << "head_dim " << d;
  EXPECT_LE(fcc::detail::blocked_smem_bytes(256, 4, blocked(64).score), fcc::kMaxSharedBytes);
}

TEST(GpuDeviceStatus, EveryCodeHasAMessageNamingTheProblem) {
  using fcc::kernels::DeviceErrc;
  auto message = [](DeviceErrc code, std::vector<int> info) {
    int w[fcc::kernels::kStatusWords] = {static_cast<int>(code)};
    for (std::size_t i = 0; i < info.size(); ++i) w[i + 1] = info[i];
    return fcc::describe_device_status(w);
  };
  EXPECT_TRUE(message(DeviceErrc::ok, {}).ok());
  expect_error(message(DeviceErrc::budget_below_always_kept, {2, 1, 3, 10, 12}), Errc::invalid_budget,
               "keep budget 10 < 12 always-kept tokens in head 3");
  expect_error(message(DeviceErrc::bad_page, {-1, 99, 64}), Errc::invalid_shape, "page id 99");
  expect_error(message(DeviceErrc::bad_page, {4, 0, 16}), Errc::invalid_shape, "last_page_len 0");
  expect_error(message(DeviceErrc::bad_indptr, {1, 10, 5}), Errc::invalid_shape, "indptr");
  expect_error(message(DeviceErrc::capacity_exceeded, {200, 100}), Errc::invalid_shape, "capacity is 100");
  expect_error(message(DeviceErrc::budget_exceeds_tokens, {0, 9, 7}), Errc::invalid_budget, "keep budget 9 > 7");
  expect_error(message(DeviceErrc::total_below_floors, {0, 5, 9}), Errc::invalid_budget, "total budget 5 < 9");
  expect_error(message(DeviceErrc::bad_energy_ratio, {3, 0}), Errc::invalid_option, "energy ratio");
  expect_error(message(DeviceErrc::output_capacity, {0, 50, 40}), Errc::invalid_shape, "out_capacity 40");
  expect_error(message(DeviceErrc::length_mismatch, {0, 9, 8}), Errc::invalid_shape, "GlobalTransform");
  expect_error(message(DeviceErrc::grid_past_sequence, {1, 50, 0, 20, 56}), Errc::invalid_shape,
               "grid span 0 [20, 56) reaches past the 50 tokens of sequence 1");
}

TEST(GpuDeviceStatus, NewDeviceCodesHaveMessages) {
  using fcc::kernels::DeviceErrc;
  int w[fcc::kernels::kStatusWords] = {static_cast<int>(DeviceErrc::shared_page), 7, 12};
  expect_error(fcc::describe_device_status(w), Errc::unsupported, "page id 7 appears again at position 12");
  int i[fcc::kernels::kStatusWords] = {static_cast<int>(DeviceErrc::bad_indptr), 0, 1 << 30, 3};
  expect_error(fcc::describe_device_status(i), Errc::invalid_shape, "start at 0");
}

// The workspace of a paged cache has its page bitmap; the blocked transform its block edges.
TEST(GpuWorkspace, WorkspaceHoldsTheNewRegions) {
  fcc::Shape s;
  s.layers = 2;
  s.heads = 3;
  s.head_dim = 64;
  s.sequences = 4;
  s.capacity = 1000;
  s.num_pages = 100;
  fcc::WorkspaceLayout w;
  ASSERT_TRUE(fcc::make_layout(s, blocked(64), 0, 0, &w).ok());
  EXPECT_GE(w.last_good - w.first_good, static_cast<std::size_t>(2 * 3 * w.slot_count * 4));
  EXPECT_GE(w.source - w.last_good, static_cast<std::size_t>(2 * 3 * w.slot_count * 4));
  EXPECT_GE(w.page_owners - w.source, static_cast<std::size_t>(2 * 3 * w.slot_count * 4));
  EXPECT_GE(w.total - w.page_owners, 16u);  // 100 bits
}

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// The shared rules (rules.hpp) as the GPU path uses them.
TEST(GpuRules, AlwaysKeptScoresAreInfAndNaN) {
  EXPECT_TRUE(flashcache::rules::always_kept_score(kInf));
  EXPECT_TRUE(flashcache::rules::always_kept_score(kNaN));
  EXPECT_TRUE(flashcache::rules::always_kept_score(std::numeric_limits<double>::quiet_NaN()));
  EXPECT_FALSE(flashcache::rules::always_kept_score(0.0f));
  EXPECT_FALSE(flashcache::rules::always_kept_score(std::numeric_limits<float>::max()));
  EXPECT_FALSE(flashcache::rules::always_kept_score(-kInf));  // never a score; not forced either
}

TEST(GpuRules, ProtectFloorBudgetAndBlockSize) {
  EXPECT_TRUE(flashcache::rules::is_protected(0, 10, 1, 0, false));
  EXPECT_TRUE(flashcache::rules::is_protected(9, 10, 0, 1, false));
  EXPECT_TRUE(flashcache::rules::is_protected(5, 10, 0, 0, true));
  EXPECT_FALSE(flashcache::rules::is_protected(5, 10, 1, 1, false));
  EXPECT_EQ(flashcache::rules::layer_floor(0, 0.1, 30), 3);  // 0.1 * 30 = 3.0000000000000004 stays 3
  EXPECT_EQ(flashcache::rules::layer_floor(5, 0.1, 30), 5);  // the protected count wins
  EXPECT_EQ(flashcache::rules::layer_floor(2, 0.1, 31), 4);  // ceil(3.1)
  EXPECT_EQ(flashcache::rules::layer_floor(0, 0.0, 31), 0);
  EXPECT_EQ(flashcache::rules::layer_budget(true, 0.25, 0, 10), 3);  // 2.5 rounds away from zero
  EXPECT_EQ(flashcache::rules::layer_budget(false, 0.0, 7, 10), 7);
  EXPECT_EQ(flashcache::rules::model_total(true, 0.2, 0, 1001, 3), 200);
  EXPECT_EQ(flashcache::rules::model_total(false, 0.0, 5, 100, 3), 15);
  EXPECT_DOUBLE_EQ(flashcache::rules::energy_ratio(4.0, 1.0, 2.0, 1.0), 0.75);
  EXPECT_DOUBLE_EQ(flashcache::rules::energy_ratio(0.0, 0.0, 2.0, 1.0), 0.5);  // no K energy adds nothing
  EXPECT_TRUE(flashcache::rules::block_size_ok(128, true));
  EXPECT_FALSE(flashcache::rules::block_size_ok(129, true));
  EXPECT_TRUE(flashcache::rules::block_size_ok(129, false));
  EXPECT_FALSE(flashcache::rules::block_size_ok(0, false));
}

}  // namespace
}  // namespace flashcache::gpu_testing::host
