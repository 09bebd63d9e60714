// Paged caches (flashcache/cuda/kernels/compact_paged.cuh, sequence_table.cuh):
// compaction in place against the CPU, a shared page refused before any row
// moves, a garbage indptr reported instead of a fault, and dynamic allocation
// refused with compaction by name.
#include <gtest/gtest.h>

#include "element_types.cuh"
#include "gpu_testing.cuh"
#include "host_fixture.cuh"

namespace flashcache::gpu_testing {
namespace {

using host::expect_error;

// Compaction against the CPU, for each element type.
FLASHCACHE_ELEMENT_TYPED_SUITE(GpuPaged);

TYPED_TEST(GpuPaged, PagedCachesCompactInPlace) {
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

// Found by a review of the kernels: a page listed twice (a shared prefix) is refused
// before any row moves.
TEST(GpuPagedChecks, SharedPageIsRefusedBeforeCompaction) {
  FLASHCACHE_REQUIRE_DEVICE();
  Case c;
  c.lengths = {40, 40};
  c.page_size = 16;
  c.opt = blocked(32);
  c.opt.allocate.mode = Allocation::uniform;
  c.compact = true;
  c.gather = false;
  HostCache<float> hc = make_cache<float>(c);
  hc.page_indices[3] = hc.page_indices[0];  // sequence 1's first page is sequence 0's first
  DeviceCache<float> dc(hc);
  const std::vector<float> before = dc.k[0].download();
  std::size_t bytes = 0;
  FLASHCACHE_OK(gpu::workspace_size(dc.cache, dc.opt, &bytes));
  DeviceArray<unsigned char> ws(bytes);
  FLASHCACHE_OK(compress_on(dc, c.budget, ws.get(), bytes, nullptr));
  expect_error(gpu::device_status(dc.cache, dc.opt, ws.get(), nullptr), Errc::unsupported, "appears again");
  EXPECT_EQ(before, dc.k[0].download()) << "no row moved";
}

// Found by a review of the kernels: a garbage indptr is reported, not an illegal address (which would
// leave the context unusable).
TEST(GpuPagedChecks, GarbageIndptrIsReportedNotAFault) {
  FLASHCACHE_REQUIRE_DEVICE();
  for (int variant = 0; variant < 2; ++variant) {
    Case c;
    c.lengths = {40, 40};
    c.page_size = 16;
    c.opt = blocked(32);
    c.gather = false;
    HostCache<float> hc = make_cache<float>(c);
    if (variant == 0)
      hc.indptr[2] = 1 << 30;  // the last sequence claims a billion pages
    else
      hc.indptr[0] = 1 << 30;  // and a table that starts far out
    DeviceCache<float> dc(hc);
    std::size_t bytes = 0;
    FLASHCACHE_OK(gpu::workspace_size(dc.cache, dc.opt, &bytes));
    DeviceArray<unsigned char> ws(bytes);
    FLASHCACHE_OK(compress_on(dc, c.budget, ws.get(), bytes, nullptr));
    expect_error(gpu::device_status(dc.cache, dc.opt, ws.get(), nullptr), Errc::invalid_shape, "indptr");
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "the context survived";
  }
}

// Dynamic allocation gives each layer its own length,
// which one shared page table cannot describe.
TEST(GpuPagedChecks, CompactionWithDynamicAllocationIsRefusedByName) {
  std::vector<float*> k{reinterpret_cast<float*>(0x10000000u), reinterpret_cast<float*>(0x11000000u)};
  std::vector<float*> v{reinterpret_cast<float*>(0x20000000u), reinterpret_cast<float*>(0x21000000u)};
  gpu::Cache<float> cache;
  cache.layers = 2;
  cache.k = k.data();
  cache.v = v.data();
  cache.heads = 2;
  cache.head_dim = 64;
  cache.head_stride = 64;
  cache.token_stride = 128;
  cache.capacity = 64;
  cache.sequences = 1;
  cache.pages.indptr = reinterpret_cast<const std::int32_t*>(0x1000);
  cache.pages.indices = reinterpret_cast<const std::int32_t*>(0x2000);
  cache.pages.last_page_len = reinterpret_cast<const std::int32_t*>(0x3000);
  cache.pages.page_size = 16;
  cache.pages.page_stride = 16 * 128;
  cache.pages.num_pages = 4;
  gpu::Outputs<float> out;
  std::int32_t* fake = reinterpret_cast<std::int32_t*>(0x4000);
  out.compact_in_place = true;
  out.new_len = fake;
  out.pages_freed = fake;
  Options opt = blocked(32);
  expect_error(gpu::can_implement(cache, Budget::ratio(0.5), opt, out), Errc::unsupported, "Allocation::dynamic");
  opt.allocate.mode = Allocation::uniform;
  EXPECT_TRUE(gpu::can_implement(cache, Budget::ratio(0.5), opt, out).ok());
  cache.layers = 1;  // one layer: nothing to disagree about
  opt.allocate.mode = Allocation::dynamic;
  EXPECT_TRUE(gpu::can_implement(cache, Budget::ratio(0.5), opt, out).ok());
}

}  // namespace
}  // namespace flashcache::gpu_testing
