// Host-side parts of the GPU API: validation (can_implement), workspace
// sizing, device-status messages. No kernel is launched and no device is
// needed, so these run in CI.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "flashcache/cuda/compress.cuh"

namespace {

namespace fcc = flashcache::gpu;
using flashcache::bfloat16_t;
using flashcache::Budget;
using flashcache::Errc;
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
  o.transform = Transform::blocked;
  o.block_size = block;
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

TEST(GpuCanImplement, RefusesBadOptions) {
  DenseFixture f(1, 2, 16, 64);
  Options o = blocked();
  o.gamma = 0;
  expect_error(fcc::can_implement(f.cache, Budget::ratio(0.2), o), Errc::invalid_option, "gamma");
  expect_error(fcc::can_implement(f.cache, Budget::ratio(0.2), blocked(fcc::kMaxBlockSize + 1)), Errc::unsupported,
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
  o.transform = Transform::global;
  expect_error(fcc::can_implement(f.cache, Budget::ratio(0.2), o), Errc::invalid_option, "GlobalPlan");
  std::size_t bytes = 0;
  expect_error(fcc::workspace_size(f.cache, o, &bytes), Errc::invalid_option, "GlobalPlan");
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
  g.transform = Transform::global;
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
    EXPECT_LE(fcc::detail::blocked_smem_bytes(d, 2, blocked(64)), 48 * 1024) << "head_dim " << d;
  EXPECT_LE(fcc::detail::blocked_smem_bytes(256, 4, blocked(64)), fcc::kMaxSharedBytes);
}

TEST(GpuDeviceStatus, EveryCodeHasAMessageNamingTheProblem) {
  using fcc::kernels::DeviceErrc;
  auto message = [](DeviceErrc code, std::vector<int> info) {
    int w[fcc::kernels::kStatusWords] = {static_cast<int>(code)};
    for (std::size_t i = 0; i < info.size(); ++i) w[i + 1] = info[i];
    return fcc::describe_device_status(w);
  };
  EXPECT_TRUE(message(DeviceErrc::ok, {}).ok());
  expect_error(message(DeviceErrc::budget_below_protected, {2, 1, 3, 10, 12}), Errc::invalid_budget,
               "keep budget 10 < 12 protected tokens in head 3");
  expect_error(message(DeviceErrc::bad_page, {-1, 99, 64}), Errc::invalid_shape, "page id 99");
  expect_error(message(DeviceErrc::bad_page, {4, 0, 16}), Errc::invalid_shape, "last_page_len 0");
  expect_error(message(DeviceErrc::bad_indptr, {1, 10, 5}), Errc::invalid_shape, "indptr");
  expect_error(message(DeviceErrc::capacity_exceeded, {200, 100}), Errc::invalid_shape, "capacity is 100");
  expect_error(message(DeviceErrc::budget_exceeds_tokens, {0, 9, 7}), Errc::invalid_budget, "keep budget 9 > 7");
  expect_error(message(DeviceErrc::total_below_floors, {0, 5, 9}), Errc::invalid_budget, "total budget 5 < 9");
  expect_error(message(DeviceErrc::bad_energy_ratio, {3, 0}), Errc::invalid_option, "energy ratio");
  expect_error(message(DeviceErrc::output_capacity, {0, 50, 40}), Errc::invalid_shape, "out_capacity 40");
  expect_error(message(DeviceErrc::length_mismatch, {0, 9, 8}), Errc::invalid_shape, "GlobalPlan");
}

TEST(GpuGlobalPlan, RefusesBadArgumentsBeforeTouchingCufft) {
  fcc::GlobalPlan plan;
  std::int64_t lengths[2] = {10, -1};
  expect_error(fcc::GlobalPlan::create(lengths, 0, 4, 128, &plan), Errc::invalid_shape, "sequences");
  expect_error(fcc::GlobalPlan::create(nullptr, 2, 4, 128, &plan), Errc::invalid_shape, "lengths");
  std::int64_t bad[1] = {-1};
  expect_error(fcc::GlobalPlan::create(bad, 1, 4, 128, &plan), Errc::unsupported, "length");
}

}  // namespace
