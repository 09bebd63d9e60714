// Host-side parts of the GPU API: validation (can_implement), workspace
// sizing, device-status messages. No kernel is launched and no device is
// needed, so these run in CI.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "flashcache/score/base.hpp"
#include "flashcache/plan.hpp"
#include "flashcache/cuda/compress.cuh"
#include "flashcache/score.hpp"
#include "flashcache/select.hpp"

namespace {

namespace fcc = flashcache::gpu;
using flashcache::bfloat16_t;
using flashcache::Budget;
using flashcache::Errc;
using flashcache::GridSpan;
using flashcache::GridZone;
using flashcache::half_t;
using flashcache::Options;
using flashcache::Status;
using flashcache::Transform;

// A fake device address: validation never dereferences it.
template <class T>
T* fake(std::uintptr_t at) {
  return reinterpret_cast<T*>(at);
}

// A dense NHD bf16 cache of `layers` layers with fake, aligned pointers.
struct DenseFixture {
  std::vector<bfloat16_t*> k, v;
  fcc::Cache<bfloat16_t> cache;
  DenseFixture(int layers, std::int64_t heads, std::int64_t tokens, std::int64_t d) {
    for (int l = 0; l < layers; ++l) {
      k.push_back(fake<bfloat16_t>(0x10000000u + 0x1000000u * static_cast<unsigned>(l)));
      v.push_back(fake<bfloat16_t>(0x80000000u + 0x1000000u * static_cast<unsigned>(l)));
    }
    cache.layers = layers;
    cache.k = k.data();
    cache.v = v.data();
    cache.heads = heads;
    cache.head_dim = d;
    cache.head_stride = d;
    cache.token_stride = heads * d;
    cache.capacity = tokens;
  }
};

Options blocked(std::int64_t block = 64) {
  Options o;
  o.score.transform = Transform::blocked;
  o.score.block_size = block;
  o.score.base = flashcache::Base::lowpass;  // the GPU's blocked kernel takes the low-pass base only, whatever the default
  return o;
}

void expect_error(const Status& s, Errc code, const std::string& words) {
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), code) << s.message();
  EXPECT_NE(s.message().find(words), std::string::npos) << "message: " << s.message();
}

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
  expect_error(fcc::can_implement(f.cache, Budget::ratio(0.2), blocked(flashcache::rules::kMaxGpuBlockSize + 1)), Errc::unsupported,
               "block_size");
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

// One layer with Allocation::dynamic: allocate_kernel resolves the budget on
// its own, but refuses it below the min_layer_ratio floor, as the CPU's
// BudgetPlanner (check_allocation) does, with the same numbers in the message;
// a budget below only the protected count is select_kernel's to report
// (budget_below_always_kept). Allocation::uniform has no floor, on either side.
TEST(GpuAllocate, OneDynamicLayerKeepsTheCpusMinLayerRatioFloor) {
  namespace kn = fcc::kernels;
  using DeviceErrc = kn::DeviceErrc;
  int refused = 0;
  for (std::int64_t n : {1, 30, 100, 4097})
    for (double ratio_floor : {0.0, 0.05, 0.1, 0.5, 1.0})
      for (std::int64_t protect : {0, 3, 20})
        for (const Budget& budget : {Budget::ratio(0.0), Budget::ratio(0.02), Budget::ratio(0.1), Budget::ratio(0.3),
                                     Budget::ratio(1.0), Budget::tokens(0), Budget::tokens(1), Budget::tokens(5),
                                     Budget::tokens(50)}) {
          const long long want =
              flashcache::rules::layer_budget(budget.is_ratio(), budget.ratio_value(), budget.token_count(), n);
          if (want > n) continue;  // budget_exceeds_tokens, before any floor
          const std::int64_t protected_count = std::min(protect, n);
          SCOPED_TRACE("n " + std::to_string(n) + " min_layer_ratio " + std::to_string(ratio_floor) + " protected " +
                       std::to_string(protected_count) + " budget " + std::to_string(want));
          flashcache::LayerSummary summary;
          summary.tokens = n;
          summary.protected_count = protected_count;
          Options o;
          o.allocate.min_layer_ratio = ratio_floor;
          for (flashcache::Allocation allocation : {flashcache::Allocation::dynamic, flashcache::Allocation::uniform}) {
            o.allocate.mode = allocation;
            const bool dynamic = allocation == flashcache::Allocation::dynamic;
            std::int64_t planned = -1;
            flashcache::BudgetPlanner planner;
            const Status cpu = planner.plan(&summary, 1, budget, o.allocate, &planned);
            const long long missed = kn::lone_layer_floor_missed(dynamic, want, protected_count, ratio_floor, n);
            if (missed > 0) {
              ++refused;
              const std::string words = "total budget " + std::to_string(want) + " < " + std::to_string(missed);
              expect_error(cpu, Errc::invalid_budget, words);
              int w[kn::kStatusWords] = {static_cast<int>(DeviceErrc::total_below_floors), 0, static_cast<int>(want),
                                         static_cast<int>(missed)};
              expect_error(fcc::describe_device_status(w), Errc::invalid_budget, words);
            } else if (!cpu.ok()) {
              EXPECT_TRUE(dynamic) << cpu.message();
              EXPECT_LT(want, protected_count) << cpu.message();  // select_kernel refuses it
            } else {
              EXPECT_EQ(planned, want);
            }
          }
        }
  EXPECT_GT(refused, 20);
}

TEST(GpuGlobalTransform, RefusesBadArgumentsBeforeTouchingCufft) {
  fcc::GlobalTransform plan;
  std::int64_t lengths[2] = {10, -1};
  expect_error(fcc::GlobalTransform::create(lengths, 0, 4, 128, &plan), Errc::invalid_shape, "sequences");
  expect_error(fcc::GlobalTransform::create(nullptr, 2, 4, 128, &plan), Errc::invalid_shape, "lengths");
  std::int64_t bad[1] = {-1};
  expect_error(fcc::GlobalTransform::create(bad, 1, 4, 128, &plan), Errc::unsupported, "length");
}

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

// ---- the base sample of select_kernel: its rules and its order of passes --------

// base_sample_kernel (flashcache/cuda/kernels/select.cuh) replayed on the host, one
// token or cell at a time where the kernel scans a CTA's worth: which tokens it
// marks, given the forced ones.
std::vector<std::uint8_t> base_sample_as_the_kernel_does(const std::vector<std::uint8_t>& forced, std::int64_t recent,
                                                         std::int64_t budget, const Options& opt,
                                                         const std::vector<GridSpan>& spans) {
  namespace kn = fcc::kernels;
  const auto n = static_cast<std::int64_t>(forced.size());
  std::vector<std::uint8_t> mark(forced.size(), 0);
  const kn::GridSpans grids = fcc::detail::grid_spans(spans, opt.score);
  long long forced_count = 0;
  for (std::uint8_t f : forced) forced_count += f;
  const std::int64_t window_start = flashcache::rules::recent_window_start(n, recent, grids);
  auto in_window = [&](std::int64_t t) { return t >= window_start && !grids.contains(t); };
  long long window_free = 0;
  for (std::int64_t t = window_start; t < n; ++t) window_free += in_window(t) && !forced[static_cast<std::size_t>(t)];
  const long long room = budget - forced_count;
  const long long window_taken = std::min(window_free, room);
  const long long room_left = room - window_taken;
  const long long free = n - forced_count - window_taken;
  auto taken = [&](std::int64_t t) { return in_window(t) || forced[static_cast<std::size_t>(t)] != 0; };
  auto mark_evenly = [&](long long count, long long pool, auto eligible) {
    count = std::min(count, pool);
    if (count <= 0) return;
    long long rank = 0;
    for (std::int64_t t = 0; t < n; ++t)
      if (eligible(t)) {
        if (kn::evenly_spaced_pick(rank, count, pool)) mark[static_cast<std::size_t>(t)] = 1;
        ++rank;
      }
  };
  if (room_left <= 0 || free <= 0) return mark;
  if (grids.count == 0) {
    mark_evenly(std::min<long long>(std::llround(opt.select.base_share * static_cast<double>(budget)), room_left), free,
                [&](std::int64_t t) { return !taken(t); });
    return mark;
  }
  long long marked = 0, free_in_spans = 0;
  for (int g = 0; g < grids.count; ++g) {
    const long long first = grids.first[g], rows = grids.rows[g], cols = grids.cols[g];
    long long part = 0;
    for (long long t = first; t < first + rows * cols; ++t) part += !taken(t);
    free_in_spans += part;
    long long count = kn::base_share_of(opt.select.grid_base_share, budget, part, free);
    count = std::min({count, room_left - marked, rows * cols});
    if (count <= 0) continue;
    const kn::GridSampleShape shape = kn::grid_sample_shape(count, rows, cols);
    long long eligible = 0;
    for (long long cell = 0; cell < shape.r * shape.c; ++cell) {
      const long long t = kn::grid_sample_token(first, rows, cols, shape, cell);
      if (taken(t)) continue;
      if (eligible < count) mark[static_cast<std::size_t>(t)] = 1;
      ++eligible;
    }
    marked += std::min(eligible, count);
  }
  const long long outside = kn::base_share_of(opt.select.base_share, budget, free - free_in_spans, free);
  mark_evenly(std::min(outside, room_left - marked), free - free_in_spans,
              [&](std::int64_t t) { return !taken(t) && !grids.contains(t); });
  return mark;
}

TEST(GpuBaseSample, TheKernelsPassesPickWhatTheCpuPicks) {
  std::mt19937_64 rng(5);
  int sampled = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const std::int64_t n = 1 + static_cast<std::int64_t>(rng() % 160);
    std::vector<std::uint8_t> forced(static_cast<std::size_t>(n), 0);
    const int every = 3 + static_cast<int>(rng() % 20);
    for (std::int64_t t = 0; t < n; ++t) forced[static_cast<std::size_t>(t)] = (rng() % every) == 0 || t < 2;
    std::int64_t forced_count = 0;
    for (std::uint8_t f : forced) forced_count += f;
    const std::int64_t budget = forced_count + static_cast<std::int64_t>(rng() % (n - forced_count + 1));
    Options o;
    std::vector<GridSpan> given;
    o.select.window = 0;
    o.select.window_share = (rng() % 3) * 0.25;
    o.select.base_share = (rng() % 3) * 0.2;
    o.select.grid_base_share = (rng() % 4) * 0.25;
    // Up to three spans that fit, in any order, sometimes none.
    const int spans = static_cast<int>(rng() % 4);
    std::int64_t at = static_cast<std::int64_t>(rng() % 8);
    for (int g = 0; g < spans; ++g) {
      const std::int64_t rows = 1 + static_cast<std::int64_t>(rng() % 7),
                         cols = 1 + static_cast<std::int64_t>(rng() % 9);
      if (at + rows * cols > n) break;
      given.push_back({at, rows, cols});
      at += rows * cols + static_cast<std::int64_t>(rng() % 10);
    }
    if (given.size() > 1 && rng() % 2) std::swap(given.front(), given.back());
    SCOPED_TRACE("trial " + std::to_string(trial));
    // The CPU: forced, then the window, then the sample (select_tokens' order).
    std::vector<std::uint8_t> keep = forced;
    const std::int64_t recent = flashcache::window_tokens(o.select, budget);
    std::int64_t taken = forced_count;
    taken += flashcache::keep_recent(n, recent, budget - taken, given, keep.data());
    std::vector<std::uint8_t> before = keep;
    flashcache::keep_base_sample(n, budget, budget - taken, o.select, given, keep.data());
    const std::vector<std::uint8_t> mark = base_sample_as_the_kernel_does(forced, recent, budget, o, given);
    std::int64_t picks = 0;
    for (std::int64_t t = 0; t < n; ++t) {
      const bool cpu = keep[static_cast<std::size_t>(t)] && !before[static_cast<std::size_t>(t)];
      ASSERT_EQ(mark[static_cast<std::size_t>(t)] != 0, cpu) << "token " << t << " of " << n << ", budget " << budget;
      ASSERT_FALSE(mark[static_cast<std::size_t>(t)] && before[static_cast<std::size_t>(t)]) << "token " << t;
      picks += cpu;
    }
    ASSERT_LE(taken + picks, budget);
    sampled += picks > 0;
  }
  EXPECT_GT(sampled, 1000);  // most trials do sample something
}

TEST(GpuBaseSample, KeysOrderTheWindowThenTheSampleAboveEveryScore) {
  namespace kn = fcc::kernels;
  // ordered_key of the largest finite float: its bits with the sign bit set.
  EXPECT_GT(kn::kBaseSampleKey, 0x7F7FFFFFu | 0x80000000u);
  EXPECT_LT(kn::kBaseSampleKey, 0xFFFFFFFFu - static_cast<std::uint32_t>(kn::kMaxWindowAge));
}

// select_kernel's recent window replayed on the host with the kernel's own
// helpers (window_picks_start, window_pick, window_key): where the picks start,
// then the keys of the free tokens and the radix select's rule (the `room`
// highest keys, ties to the lower index). Scores stand in below kBaseSampleKey.
// `keys_only`: the picks start at the window's start (the keys alone decide).
std::vector<std::uint8_t> window_as_the_kernel_does(const std::vector<std::uint8_t>& forced, std::int64_t window_start,
                                                    long long room, const fcc::kernels::GridSpans& grids,
                                                    bool keys_only = false) {
  namespace kn = fcc::kernels;
  const auto n = static_cast<std::int64_t>(forced.size());
  auto free_in_window = [&](std::int64_t t) {
    return kn::window_pick(t, window_start, grids) && !forced[static_cast<std::size_t>(t)];
  };
  long long window_free = 0;
  for (std::int64_t t = window_start; t < n; ++t) window_free += free_in_window(t);
  std::int64_t picks_from = window_start;
  const long long skip = window_free - room;
  if (skip > 0 && !keys_only) {
    picks_from = n;
    long long rank = 0;
    for (std::int64_t t = window_start; t < n; ++t) {
      const bool e = free_in_window(t);
      if (kn::window_picks_start(e, rank, skip)) picks_from = t;
      rank += e;
    }
  }
  // Key in the high word, the complement of the token in the low: larger first is
  // the higher key, ties to the lower token.
  std::vector<std::uint64_t> order;
  order.reserve(forced.size());
  for (std::int64_t t = 0; t < n; ++t) {
    if (forced[static_cast<std::size_t>(t)]) continue;
    const std::uint32_t key = kn::window_pick(t, picks_from, grids)
                                  ? kn::window_key(n - 1 - t)
                                  : 0x80000000u + static_cast<std::uint32_t>((t * 2654435761ull) % 0x7F000000u);
    order.push_back(std::uint64_t{key} << 32 | (0xFFFFFFFFu - static_cast<std::uint32_t>(t)));
  }
  std::vector<std::uint8_t> picked(forced.size(), 0);
  const auto take = static_cast<std::ptrdiff_t>(std::min<long long>(room, static_cast<long long>(order.size())));
  std::nth_element(order.begin(), order.begin() + take, order.end(), std::greater<>());
  for (std::ptrdiff_t i = 0; i < take; ++i) {
    const std::uint64_t item = order[static_cast<std::size_t>(i)];
    if ((item >> 32) > kn::kBaseSampleKey) picked[0xFFFFFFFFu - (item & 0xFFFFFFFFu)] = 1;  // a window pick
  }
  return picked;
}

TEST(GpuSelect, AWindowLongerThanTheKeysTakesItsNewestTokensAsTheCpu) {
  namespace kn = fcc::kernels;
  // 9M window tokens: more than kMaxWindowAge, so keys alone tie the oldest.
  const std::int64_t n = 9'100'300, recent = 9'000'000;
  ASSERT_GT(recent, kn::kMaxWindowAge);
  const std::vector<GridSpan> spans{{n - 70'000, 100, 300}};  // inside the window: never part of it
  const kn::GridSpans grids = fcc::detail::grid_spans(spans, flashcache::ScoreOptions{});
  std::vector<std::uint8_t> forced(static_cast<std::size_t>(n), 0);
  for (std::int64_t t = 0; t < n; ++t) forced[static_cast<std::size_t>(t)] = t < 4 || t % 997 == 5 || t >= n - 16;
  const std::int64_t window_start = flashcache::rules::recent_window_start(n, recent, grids);
  ASSERT_GT(window_start, 0);
  ASSERT_FALSE(forced[static_cast<std::size_t>(window_start)]);
  long long window_free = 0;
  for (std::int64_t t = window_start; t < n; ++t)
    window_free += !grids.contains(t) && !forced[static_cast<std::size_t>(t)];
  for (long long room : {1LL, 10LL, 5000LL, 8'500'000LL, window_free - 1, window_free, window_free + 7}) {
    SCOPED_TRACE("room " + std::to_string(room));
    std::vector<std::uint8_t> cpu = forced;
    const std::int64_t marked = flashcache::keep_recent(n, recent, room, spans, cpu.data());
    ASSERT_EQ(marked, std::min(room, window_free));
    const std::vector<std::uint8_t> gpu = window_as_the_kernel_does(forced, window_start, room, grids);
    std::int64_t mismatches = 0, first = -1, picks = 0;
    for (std::int64_t t = 0; t < n; ++t) {
      const bool want = cpu[static_cast<std::size_t>(t)] && !forced[static_cast<std::size_t>(t)];
      const bool got = gpu[static_cast<std::size_t>(t)] != 0;
      picks += got;
      if (want != got && mismatches++ == 0) first = t;
    }
    EXPECT_EQ(mismatches, 0) << "first at token " << first;
    EXPECT_EQ(picks, marked);
  }
  // The keys alone (the picks from the window's start) take the oldest of the tied ones.
  const long long room = 8'500'000;
  std::vector<std::uint8_t> cpu = forced;
  flashcache::keep_recent(n, recent, room, spans, cpu.data());
  const std::vector<std::uint8_t> keys_only = window_as_the_kernel_does(forced, window_start, room, grids, true);
  EXPECT_TRUE(keys_only[static_cast<std::size_t>(window_start)] && !cpu[static_cast<std::size_t>(window_start)]);
}

// ---- a base chosen by energy (ScoreOptions::base peak, mixed), global transform -------

Options global_base(flashcache::Base kind, double gamma = 0.2) {
  Options o;
  o.score.transform = Transform::global;
  o.score.base = kind;
  o.score.gamma = gamma;
  return o;
}

TEST(GpuChosenBase, CanImplementTakesPeakAndMixedGlobalAndRefusesThemBlockedByName) {
  DenseFixture f(2, 2, 16, 64);
  for (flashcache::Base kind : {flashcache::Base::peak, flashcache::Base::mixed}) {
    SCOPED_TRACE(flashcache::to_string(kind));
    Options b = blocked();
    b.score.base = kind;
    const Status s = fcc::can_implement(f.cache, Budget::ratio(0.2), b);
    expect_error(s, Errc::unsupported, std::string("base ") + flashcache::to_string(kind) + " with Transform::blocked");
    expect_error(s, Errc::unsupported, "only the m low rows of the DCT basis");
    expect_error(s, Errc::unsupported, "use Transform::global");
    // Global: the base is no reason to refuse. Without a plan the plan is.
    expect_error(fcc::can_implement(f.cache, Budget::ratio(0.2), global_base(kind)), Errc::invalid_option,
                 "needs a GlobalTransform");
    // Lengths 0 and 1 make no cuFFT plan, so a plan exists without a device.
    const std::int64_t lengths[] = {1};
    fcc::GlobalTransform plan;
    ASSERT_TRUE(fcc::GlobalTransform::create(lengths, 1, 2, 64, &plan).ok());
    const Status ok = fcc::can_implement(f.cache, Budget::ratio(0.2), global_base(kind), {}, &plan);
    EXPECT_TRUE(ok.ok()) << ok.message();
  }
  EXPECT_TRUE(fcc::can_implement(f.cache, Budget::ratio(0.2), blocked()).ok());  // lowpass blocked: as before
}

TEST(GpuChosenBase, WorkspaceHoldsEnergiesAndChoicesForTheLongestSequence) {
  fcc::Shape s;
  s.layers = 3;
  s.heads = 4;
  s.head_dim = 64;
  s.sequences = 2;
  s.capacity = 1000;
  const std::int64_t longest = 701;
  fcc::WorkspaceLayout low, peak, mixed, blocked_peak;
  ASSERT_TRUE(fcc::make_layout(s, global_base(flashcache::Base::lowpass), longest, 4096, &low).ok());
  ASSERT_TRUE(fcc::make_layout(s, global_base(flashcache::Base::peak), longest, 4096, &peak).ok());
  ASSERT_TRUE(fcc::make_layout(s, global_base(flashcache::Base::mixed), longest, 4096, &mixed).ok());
  Options bp = blocked();
  bp.score.base = flashcache::Base::peak;
  ASSERT_TRUE(fcc::make_layout(s, bp, 0, 0, &blocked_peak).ok());
  EXPECT_EQ(low.base_energy, 0u);  // the low-pass path: no new region, the same carve-up as before
  EXPECT_EQ(low.base_chosen, 0u);
  EXPECT_EQ(blocked_peak.base_energy, 0u);
  const std::size_t frequencies = 2u * 4 * static_cast<std::size_t>(longest);
  for (const fcc::WorkspaceLayout* w : {&peak, &mixed}) {
    EXPECT_EQ(w->base_energy % 256, 0u);
    EXPECT_EQ(w->base_chosen % 256, 0u);
    EXPECT_GE(w->base_energy, w->fft_work + 4096);                 // after the cuFFT work area
    EXPECT_GE(w->base_chosen, w->base_energy + frequencies * 4);   // float [2][H][longest]
    EXPECT_GE(w->total, w->base_chosen + frequencies);             // bytes [2][H][longest]
    EXPECT_GE(w->total - low.total, frequencies * 5);
    EXPECT_LT(w->total - low.total, frequencies * 5 + 2 * 256);
  }
}

// base_choose_kernel replayed on the host, one frequency at a time where the
// kernel scans a CTA's worth: the same keys, passes, bins and tie rule.
std::vector<std::uint8_t> choose_as_the_kernel_does(const float* energy, std::int64_t n, std::int64_t m,
                                                    flashcache::Base kind) {
  namespace kn = fcc::kernels;
  const kn::BaseCount count = kn::base_count(kind, n, m);
  const std::int64_t candidates = n - count.low;
  enum { kNone, kAll, kThreshold };
  const int mode = count.rest <= 0 ? kNone : (count.rest >= candidates ? kAll : kThreshold);
  std::uint32_t prefix = 0, prefix_mask = 0;
  long long need = count.rest;
  if (mode == kThreshold) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      long long hist[256] = {};
      for (std::int64_t k = count.low; k < n; ++k) {
        const std::uint32_t key = kn::energy_key(energy[k]);
        if ((key & prefix_mask) == prefix) ++hist[(key >> shift) & 255u];
      }
      long long above = 0, still = 0;
      int chosen_bin = -1;
      for (int bin = 255; bin >= 0; --bin) {
        if (above < need && above + hist[bin] >= need) {
          chosen_bin = bin;
          still = need - above;
        }
        above += hist[bin];
      }
      EXPECT_GE(chosen_bin, 0);
      prefix |= static_cast<std::uint32_t>(chosen_bin) << shift;
      prefix_mask |= 255u << shift;
      need = still;
    }
  }
  std::vector<std::uint8_t> chosen(static_cast<std::size_t>(n), 0);
  long long equal_seen = 0;
  for (std::int64_t k = 0; k < n; ++k) {
    const bool ranked = k >= count.low;
    const std::uint32_t key = ranked && mode == kThreshold ? kn::energy_key(energy[k]) : 0u;
    const bool equal = ranked && mode == kThreshold && key == prefix;
    chosen[static_cast<std::size_t>(k)] =
        !ranked || mode == kAll || (mode == kThreshold && (key > prefix || (equal && equal_seen < need)));
    equal_seen += equal;
  }
  return chosen;
}

TEST(GpuChosenBase, TheChoiceIsChooseBaseFrequenciesWithItsTies) {
  std::mt19937_64 rng(3);
  std::vector<std::int32_t> order;
  int runs = 0, differs_from_lowpass = 0;
  for (std::int64_t n : {1, 2, 3, 37, 101, 250, 256, 257, 1000, 4099})
    for (double gamma : {0.1, 0.2, 0.3, 0.5, 1.0})
      for (flashcache::Base kind : {flashcache::Base::lowpass, flashcache::Base::peak, flashcache::Base::mixed})
        for (int spread : {0, 1, 4, 1 << 20}) {  // 0: all tie; small: many ties; large: few
          std::vector<float> e(static_cast<std::size_t>(n));
          for (float& x : e) x = spread == 0 ? 0.0f : static_cast<float>(rng() % (spread + 1)) * 0.25f;
          if (spread == 4 && n > 3) e[1] = std::numeric_limits<float>::infinity();  // overflowed: the strongest
          const std::int64_t m = flashcache::lowpass_cutoff(n, gamma);
          SCOPED_TRACE("n " + std::to_string(n) + " gamma " + std::to_string(gamma) + " " +
                       flashcache::to_string(kind) + " spread " + std::to_string(spread));
          std::vector<std::uint8_t> want(static_cast<std::size_t>(n));
          flashcache::choose_base_frequencies(kind, e.data(), n, m, &order, want.data());
          const std::vector<std::uint8_t> got = choose_as_the_kernel_does(e.data(), n, m, kind);
          ASSERT_EQ(got, want);
          std::int64_t count = 0, low = 0;
          for (std::int64_t k = 0; k < n; ++k) {
            count += got[static_cast<std::size_t>(k)];
            if (k < m) low += got[static_cast<std::size_t>(k)];
          }
          EXPECT_EQ(count, m);
          differs_from_lowpass += low != m;
          ++runs;
        }
  EXPECT_EQ(runs, 10 * 5 * 3 * 4);
  EXPECT_GT(differs_from_lowpass, 100);
}

// The global path's arithmetic with a chosen base, on the host, for `heads`
// heads of dense [h][t][c] K and V: pack (Makhoul), the forward DFT (double,
// rounded to float: cuFFT's place), base_energy_pair per (head, pair),
// the choice, chosen_base_pair per (column, pair), the inverse DFT, then the
// residual pass's scores. Also returns the energies and the choices.
struct HostChosenRun {
  std::vector<float> energy;          // [2][heads][n]
  std::vector<std::uint8_t> chosen;   // [2][heads][n]
  std::vector<float> scores;          // [heads][n]
};

void dft(std::vector<float2>* z, std::int64_t n, std::int64_t columns, double sign) {
  std::vector<double> cs(static_cast<std::size_t>(n)), sn(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const double a = 2 * 3.14159265358979323846 * static_cast<double>(i) / static_cast<double>(n);
    cs[static_cast<std::size_t>(i)] = std::cos(a);
    sn[static_cast<std::size_t>(i)] = sign * std::sin(a);
  }
  std::vector<double> re(static_cast<std::size_t>(n)), im(static_cast<std::size_t>(n));
  for (std::int64_t col = 0; col < columns; ++col) {
    float2* x = z->data() + col * n;
    for (std::int64_t k = 0; k < n; ++k) {
      double sr = 0, si = 0;
      for (std::int64_t j = 0; j < n; ++j) {
        const std::size_t w = static_cast<std::size_t>((j * k) % n);
        sr += x[j].x * cs[w] - x[j].y * sn[w];
        si += x[j].x * sn[w] + x[j].y * cs[w];
      }
      re[static_cast<std::size_t>(k)] = sr;
      im[static_cast<std::size_t>(k)] = si;
    }
    for (std::int64_t k = 0; k < n; ++k)
      x[k] = make_float2(static_cast<float>(re[static_cast<std::size_t>(k)]), static_cast<float>(im[static_cast<std::size_t>(k)]));
  }
}

HostChosenRun run_chosen_base_on_host(const std::vector<float>& k, const std::vector<float>& v, int heads,
                                      std::int64_t n, int d, double gamma, flashcache::Base kind) {
  namespace kn = fcc::kernels;
  const std::int64_t columns = std::int64_t{heads} * d;
  auto at = [&](int h, std::int64_t t, int c) { return static_cast<std::size_t>((h * n + t) * d + c); };
  std::vector<float2> z(static_cast<std::size_t>(columns * n));
  for (std::int64_t col = 0; col < columns; ++col)
    for (std::int64_t j = 0; j < n; ++j) {  // pack_kernel's permutation
      const std::int64_t t = 2 * j < n ? 2 * j : 2 * (n - 1 - j) + 1;
      const int h = static_cast<int>(col / d), c = static_cast<int>(col % d);
      z[static_cast<std::size_t>(col * n + j)] = make_float2(k[at(h, t, c)], v[at(h, t, c)]);
    }
  dft(&z, n, columns, -1.0);  // cuFFT forward
  HostChosenRun out;
  out.energy.assign(static_cast<std::size_t>(2 * heads * n), std::numeric_limits<float>::quiet_NaN());
  for (int h = 0; h < heads; ++h)
    for (std::int64_t f = 0; f <= n / 2; ++f) {  // base_energy_kernel's threads
      float e[4];
      kn::base_energy_pair(z.data() + std::int64_t{h} * d * n, n, d, f, e);
      const std::int64_t r = f == 0 ? 0 : n - f;
      float* ek = out.energy.data() + h * n;
      float* ev = out.energy.data() + (heads + h) * n;
      ek[f] = e[0];
      ev[f] = e[2];
      if (r != f) {
        ek[r] = e[1];
        ev[r] = e[3];
      }
    }
  const std::int64_t m = flashcache::lowpass_cutoff(n, gamma);
  out.chosen.resize(out.energy.size());
  for (int row = 0; row < 2 * heads; ++row) {  // base_choose_kernel's CTAs
    const std::vector<std::uint8_t> c = choose_as_the_kernel_does(out.energy.data() + row * n, n, m, kind);
    std::copy(c.begin(), c.end(), out.chosen.begin() + row * n);
  }
  for (std::int64_t col = 0; col < columns; ++col) {  // chosen_base_kernel's threads
    const std::int64_t h = col / d;
    const std::uint8_t* ck = out.chosen.data() + h * n;
    const std::uint8_t* cv = out.chosen.data() + (heads + h) * n;
    for (std::int64_t f = 0; f <= n / 2; ++f) {
      const std::int64_t r = f == 0 ? 0 : n - f;
      kn::chosen_base_pair(z.data() + col * n, n, f, ck[f] != 0, ck[r] != 0, cv[f] != 0, cv[r] != 0);
    }
  }
  dft(&z, n, columns, 1.0);  // cuFFT inverse (unnormalised)
  out.scores.assign(static_cast<std::size_t>(heads * n), 0.0f);
  const float inv_n = 1.0f / static_cast<float>(n), inv_d = 1.0f / static_cast<float>(d);
  for (int h = 0; h < heads; ++h)
    for (std::int64_t t = 0; t < n; ++t) {  // residual_kernel
      const std::int64_t j = t % 2 == 0 ? t / 2 : n - 1 - (t - 1) / 2;
      float rk = 0, rv = 0;
      for (int c = 0; c < d; ++c) {
        const float2 base = z[static_cast<std::size_t>((std::int64_t{h} * d + c) * n + j)];
        const float dk = k[at(h, t, c)] - base.x * inv_n, dv = v[at(h, t, c)] - base.y * inv_n;
        rk += dk * dk;
        rv += dv * dv;
      }
      out.scores[static_cast<std::size_t>(h * n + t)] = rk * inv_d + rv * inv_d;
    }
  return out;
}

// Orthonormal DCT-II energies of one head's K (or V), in double: sum over the head dim.
std::vector<double> dct_energies(const std::vector<float>& x, int h, std::int64_t n, int d) {
  std::vector<double> e(static_cast<std::size_t>(n), 0.0);
  const double pi = 3.14159265358979323846;
  for (std::int64_t f = 0; f < n; ++f) {
    const double a = std::sqrt((f == 0 ? 1.0 : 2.0) / static_cast<double>(n));
    for (int c = 0; c < d; ++c) {
      double s = 0;
      for (std::int64_t t = 0; t < n; ++t)
        s += x[static_cast<std::size_t>((h * n + t) * d + c)] *
             std::cos(pi * static_cast<double>(f) * static_cast<double>(2 * t + 1) / static_cast<double>(2 * n));
      e[static_cast<std::size_t>(f)] += a * a * s * s;
    }
  }
  return e;
}

TEST(GpuChosenBase, HostRunOfTheKernelArithmeticMatchesTheCpuScorer) {
  const int heads = 2;
  int runs = 0, not_lowpass = 0, near_ties = 0;
  for (std::int64_t n : {37, 101, 250})
    for (int d : {5, 64}) {
      std::mt19937_64 rng(static_cast<std::uint64_t>(n * 100 + d));
      std::normal_distribution<float> noise(0.0f, 0.3f);
      std::vector<float> k(static_cast<std::size_t>(heads * n * d)), v(k.size());
      for (int h = 0; h < heads; ++h)
        for (std::int64_t t = 0; t < n; ++t)
          for (int c = 0; c < d; ++c) {
            // Smooth, a pattern of period 4 (a high frequency the peak base takes), noise, outliers.
            const float smooth = std::sin(0.05f * static_cast<float>(t) + 0.7f * static_cast<float>(c + h));
            const float pattern = (t % 4 == 1 ? 1.5f : -0.5f) * std::cos(0.3f * static_cast<float>(c));
            const std::size_t i = static_cast<std::size_t>((h * n + t) * d + c);
            k[i] = smooth + pattern + noise(rng) + (t % 17 == 3 ? 3.0f : 0.0f);
            v[i] = 0.5f * smooth - (h == 1 ? pattern : 0.0f) + noise(rng);
          }
      const auto kv = flashcache::hnd<const float>(k.data(), flashcache::Heads(heads), flashcache::Tokens(n),
                                                   flashcache::HeadDim(d));
      const auto vv = flashcache::hnd<const float>(v.data(), flashcache::Heads(heads), flashcache::Tokens(n),
                                                   flashcache::HeadDim(d));
      std::vector<std::vector<double>> cpu_energy;  // [K|V][head]
      for (const std::vector<float>* x : {&k, &v})
        for (int h = 0; h < heads; ++h) cpu_energy.push_back(dct_energies(*x, h, n, d));
      for (double gamma : {0.1, 0.2, 0.3})
        for (flashcache::Base kind : {flashcache::Base::peak, flashcache::Base::mixed}) {
          SCOPED_TRACE("n " + std::to_string(n) + " d " + std::to_string(d) + " gamma " + std::to_string(gamma) +
                       " " + flashcache::to_string(kind));
          const Options o = global_base(kind, gamma);
          flashcache::Scorer<double> scorer;
          flashcache::LayerScores cpu;
          ASSERT_TRUE(scorer.score(kv, vv, o.score, &cpu).ok());
          const HostChosenRun host = run_chosen_base_on_host(k, v, heads, n, d, gamma, kind);
          const std::int64_t m = flashcache::lowpass_cutoff(n, gamma);
          bool same_choice = true;
          for (int row = 0; row < 2 * heads; ++row) {
            const std::vector<double>& e = cpu_energy[static_cast<std::size_t>(row)];
            // The kernel's energies are N/2 times the orthonormal ones.
            double largest = 0;
            for (double x : e) largest = std::max(largest, x);
            for (std::int64_t f = 0; f < n; ++f)
              ASSERT_NEAR(host.energy[static_cast<std::size_t>(row * n + f)] * 2.0 / static_cast<double>(n),
                          e[static_cast<std::size_t>(f)], 1e-5 * largest)
                  << "row " << row << " frequency " << f;
            std::vector<std::uint8_t> want(static_cast<std::size_t>(n));
            std::vector<std::int32_t> order;
            flashcache::choose_base_frequencies(kind, e.data(), n, m, &order, want.data());
            const std::uint8_t* got = host.chosen.data() + row * n;
            std::int64_t low = 0;
            for (std::int64_t f = 0; f < m; ++f) low += got[f];
            not_lowpass += low != m;
            if (std::equal(want.begin(), want.end(), got)) continue;
            // Float against double may only part at a near tie: every frequency the
            // kernel ranked in is as strong, within rounding, as every one it left out.
            same_choice = false;
            ++near_ties;
            const std::int64_t first_ranked = fcc::kernels::base_count(kind, n, m).low;
            double weakest_in = largest, strongest_out = 0;
            for (std::int64_t f = first_ranked; f < n; ++f) {
              const double x = e[static_cast<std::size_t>(f)];
              if (got[f]) weakest_in = std::min(weakest_in, x);
              else strongest_out = std::max(strongest_out, x);
            }
            EXPECT_GE(weakest_in, strongest_out - 1e-5 * largest) << "row " << row;
          }
          if (same_choice) {
            double largest = 0;
            for (float s : cpu.score) largest = std::max(largest, static_cast<double>(s));
            for (int h = 0; h < heads; ++h)
              for (std::int64_t t = 0; t < n; ++t)
                ASSERT_NEAR(host.scores[static_cast<std::size_t>(h * n + t)], cpu(h, t), 1e-5 * largest)
                    << "head " << h << " token " << t;
          }
          ++runs;
        }
    }
  EXPECT_EQ(runs, 3 * 2 * 3 * 2);
  EXPECT_GT(not_lowpass, 24);  // the peak and mixed bases do take the pattern's frequencies
  EXPECT_LE(near_ties, 2);
  RecordProperty("rows_not_lowpass", not_lowpass);  // in --gtest_output=xml
  RecordProperty("near_ties", near_ties);
}

// Every energy 0 (an all-zero head): every frequency ties and the lowest win,
// so peak and mixed take the low-pass base and every score is 0.
TEST(GpuChosenBase, AllZeroHeadsTieToTheLowestFrequencies) {
  for (std::int64_t n : {37, 250})
    for (flashcache::Base kind : {flashcache::Base::peak, flashcache::Base::mixed}) {
      const int d = 5;
      const std::vector<float> k(static_cast<std::size_t>(n * d), 0.0f), v(k.size(), 0.0f);
      const HostChosenRun host = run_chosen_base_on_host(k, v, 1, n, d, 0.2, kind);
      const std::int64_t m = flashcache::lowpass_cutoff(n, 0.2);
      for (int row = 0; row < 2; ++row)
        for (std::int64_t f = 0; f < n; ++f)
          EXPECT_EQ(host.chosen[static_cast<std::size_t>(row * n + f)], f < m ? 1 : 0) << "frequency " << f;
      for (float s : host.scores) EXPECT_EQ(s, 0.0f);
    }
}

}  // namespace
