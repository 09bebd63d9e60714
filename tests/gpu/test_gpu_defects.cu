// One test per defect a careful read of the kernels found (the first seven
// of its list), each written so that it fails on the code before the fix, and the
// tensor-parallel split (score_async, reduced sums, select_async). Device
// tests skip without a GPU; the host-side checks (refusals, messages, the
// shared rules) run anywhere, CI included.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "flashcache/rules.hpp"
#include "gpu_testing.cuh"

namespace flashcache::gpu_testing {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

void expect_error(const Status& s, Errc code, const std::string& words) {
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), code) << s.message();
  EXPECT_NE(s.message().find(words), std::string::npos) << "message: " << s.message();
}

Case one_sequence(std::int64_t n, Options opt, std::vector<Case::BadRow> bad, Budget budget = Budget::ratio(0.8)) {
  Case c;
  c.lengths = {n};
  c.heads = 2;
  c.head_dim = 64;
  c.opt = opt;
  c.bad_rows = std::move(bad);
  c.budget = budget;
  return c;
}

// Defects 1 and 2: a block whose first row is non-finite takes its stand-in
// row from outside itself. Every placement that exercises a different source
// (before the block, the block's own first finite row, after it, zeros), on
// both transforms, scores checked against the CPU.
TEST(GpuDefects, NonFiniteRowsAtBlockStartsMatchTheCpu) {
  FLASHCACHE_REQUIRE_DEVICE();
  struct Placement {
    const char* name;
    std::vector<Case::BadRow> rows;
    Budget budget;
  };
  const std::vector<Placement> placements = {
      {"NaN at token 0", {{0, 0, 0, 0, kNaN}}, Budget::ratio(0.5)},
      {"NaN at token 64 (a block start)", {{0, 1, 64, 64, kNaN}}, Budget::ratio(0.5)},
      {"NaN run 50..70 across a block start", {{0, 0, 50, 70, kNaN}}, Budget::ratio(0.5)},
      {"NaN run 0..70: no finite row before block 2", {{0, 0, 0, 70, kNaN}}, Budget::ratio(0.8)},
      {"a whole block 0..63 non-finite", {{0, 1, 0, 63, kInf}}, Budget::ratio(0.8)},
      {"a whole sequence of one head", {{0, 0, 0, 99, kNaN}}, Budget::ratio(1.0)},
      {"a head of inf (fp16 overflow)", {{0, 1, 0, 99, kInf}}, Budget::ratio(1.0)},
  };
  for (const Placement& pl : placements)
    for (Transform transform : {Transform::blocked, Transform::global}) {
      Case c = one_sequence(100, transform == Transform::blocked ? blocked(64) : global_transform(), pl.rows,
                            pl.budget);
      c.name = std::string(pl.name) + " / " + to_string(transform);
      run_and_check<float>(c);
      run_and_check<half_t>(c);
    }
}

// Defect 2: a long non-finite run used to cost a walk per block back to token
// 0 (quadratic); now it is a scan. 64K tokens, one head all inf, must agree
// with the CPU (a hang or timeout fails the test).
TEST(GpuDefects, LongNonFiniteRunIsLinear) {
  FLASHCACHE_REQUIRE_DEVICE();
  Case c = one_sequence(65536, blocked(64), {{0, 0, 0, 65535, kInf}}, Budget::ratio(1.0));
  c.name = "64K tokens, head 0 all inf";
  c.gather = false;
  run_and_check<half_t>(c);
}

// Exact ties: all-zero rows score 0 everywhere, and the
// kept set must be the CPU's, the lowest indices.
TEST(GpuDefects, ExactTiesGoToTheLowerIndex) {
  FLASHCACHE_REQUIRE_DEVICE();
  for (Transform transform : {Transform::blocked, Transform::global}) {
    Case c = one_sequence(257, transform == Transform::blocked ? blocked(64) : global_transform(), {},
                          Budget::ratio(0.3));
    c.all_zero = true;
    c.name = std::string("all zero / ") + to_string(transform);
    run_and_check<float>(c);
  }
}

// Defect 3: plan lengths {0, 100} against device lengths {30, 100} must be
// reported (the zero-length entry used to skip the comparison and let the
// packed offsets drift).
TEST(GpuDefects, ZeroLengthPlanEntryMismatchIsReported) {
  FLASHCACHE_REQUIRE_DEVICE();
  Case c;
  c.lengths = {30, 100};
  c.opt = global_transform();
  c.gather = false;
  const HostCache<float> hc = make_cache<float>(c);
  DeviceCache<float> dc(hc);
  const std::vector<std::int64_t> plan_lengths = {0, 100};
  gpu::GlobalTransform plan;
  FLASHCACHE_OK(gpu::GlobalTransform::create(plan_lengths.data(), 2, c.heads, c.head_dim, &plan));
  std::size_t bytes = 0;
  FLASHCACHE_OK(gpu::workspace_size(dc.cache, dc.opt, &bytes, &plan));
  DeviceArray<unsigned char> ws(bytes);
  FLASHCACHE_OK(gpu::compress_async(dc.cache, c.budget, dc.opt, dc.out, ws.get(), bytes, nullptr, &plan));
  expect_error(gpu::device_status(dc.cache, dc.opt, ws.get(), nullptr, &plan), Errc::invalid_shape,
               "sequence 0 has 30 tokens on the device but 0 in the GlobalTransform");
}

// Defect 4 (finite check with independent and 16-byte loads) rides on the
// placements above for aligned rows; these take the scalar paths: head dim
// 100, and a token stride padded by one element.
TEST(GpuDefects, NonFiniteRowsOnUnalignedRows) {
  FLASHCACHE_REQUIRE_DEVICE();
  for (Transform transform : {Transform::blocked, Transform::global})
    for (int variant = 0; variant < 2; ++variant) {
      Case c = one_sequence(150, transform == Transform::blocked ? blocked(64) : global_transform(),
                            {{0, 0, 64, 66, kNaN}, {0, 1, 0, 0, kInf}}, Budget::ratio(0.5));
      c.head_dim = variant == 0 ? 100 : 64;
      c.token_pad = variant == 0 ? 0 : 1;
      c.name = std::string(to_string(transform)) + (variant == 0 ? " head_dim 100" : " token stride + 1");
      run_and_check<float>(c);
    }
}

// Defect 5: one GlobalTransform serves one stream and workspace; another stream is
// refused by name, and release_binding() lets it move.
TEST(GpuDefects, GlobalTransformRefusesASecondStream) {
  FLASHCACHE_REQUIRE_DEVICE();
  Case c;
  c.lengths = {64};
  c.opt = global_transform();
  c.gather = false;
  const HostCache<float> hc = make_cache<float>(c);
  DeviceCache<float> dc(hc);
  gpu::GlobalTransform plan;
  FLASHCACHE_OK(gpu::GlobalTransform::create(c.lengths.data(), 1, c.heads, c.head_dim, &plan));
  std::size_t bytes = 0;
  FLASHCACHE_OK(gpu::workspace_size(dc.cache, dc.opt, &bytes, &plan));
  DeviceArray<unsigned char> ws(bytes);
  cudaStream_t a = nullptr, b = nullptr;
  FLASHCACHE_CUDA_OK(cudaStreamCreate(&a));
  FLASHCACHE_CUDA_OK(cudaStreamCreate(&b));
  FLASHCACHE_OK(gpu::compress_async(dc.cache, c.budget, dc.opt, dc.out, ws.get(), bytes, a, &plan));
  FLASHCACHE_OK(gpu::compress_async(dc.cache, c.budget, dc.opt, dc.out, ws.get(), bytes, a, &plan));
  expect_error(gpu::compress_async(dc.cache, c.budget, dc.opt, dc.out, ws.get(), bytes, b, &plan),
               Errc::invalid_option, "bound to another stream");
  FLASHCACHE_CUDA_OK(cudaStreamSynchronize(a));
  plan.release_binding();
  FLASHCACHE_OK(gpu::compress_async(dc.cache, c.budget, dc.opt, dc.out, ws.get(), bytes, b, &plan));
  FLASHCACHE_OK(gpu::device_status(dc.cache, dc.opt, ws.get(), b, &plan));
  FLASHCACHE_CUDA_OK(cudaStreamDestroy(a));
  FLASHCACHE_CUDA_OK(cudaStreamDestroy(b));
}

// Defect 6, device side: a page listed twice (a shared prefix) is refused
// before any row moves.
TEST(GpuDefects, SharedPageIsRefusedBeforeCompaction) {
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
  FLASHCACHE_OK(gpu::compress_async(dc.cache, c.budget, dc.opt, dc.out, ws.get(), bytes, nullptr));
  expect_error(gpu::device_status(dc.cache, dc.opt, ws.get(), nullptr), Errc::unsupported, "appears again");
  EXPECT_EQ(before, dc.k[0].download()) << "no row moved";
}

// Defect 7: a garbage indptr is reported, not an illegal address (which would
// leave the context unusable).
TEST(GpuDefects, GarbageIndptrIsReportedNotAFault) {
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
    FLASHCACHE_OK(gpu::compress_async(dc.cache, c.budget, dc.opt, dc.out, ws.get(), bytes, nullptr));
    expect_error(gpu::device_status(dc.cache, dc.opt, ws.get(), nullptr), Errc::invalid_shape, "indptr");
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "the context survived";
  }
}

// ---- tensor parallel: heads split over ranks, sums reduced between the phases --------

// Two simulated ranks on one device, each with half of every layer's heads:
// score_async, host-side reduction of the sums (energies added, protected
// counts maxed), select_async. Each rank must keep exactly what the one-rank
// run keeps for the same heads, with the same budgets.
TEST(GpuTensorParallel, TwoRanksWithReducedSumsKeepWhatOneRankKeeps) {
  FLASHCACHE_REQUIRE_DEVICE();
  for (Transform transform : {Transform::blocked, Transform::global}) {
    Case c;
    c.layers = 3;
    c.heads = 4;
    c.head_dim = 64;
    c.lengths = {300, 129};
    c.opt = transform == Transform::blocked ? blocked(64) : global_transform();
    c.opt.select.sink = 2;
    c.opt.allocate.min_layer_ratio = 0.05;
    c.nan_tokens = 3;
    c.budget = Budget::ratio(0.3);
    c.gather = false;
    SCOPED_TRACE(to_string(transform));
    const HostCache<float> hc = make_cache<float>(c);
    DeviceCache<float> full(hc);
    const int B = static_cast<int>(c.lengths.size());
    gpu::GlobalTransform plan_full, plan_rank[2];
    const bool global = transform == Transform::global;
    if (global) {
      FLASHCACHE_OK(gpu::GlobalTransform::create(c.lengths.data(), B, c.heads, c.head_dim, &plan_full));
      for (auto& p : plan_rank) FLASHCACHE_OK(gpu::GlobalTransform::create(c.lengths.data(), B, 2, c.head_dim, &p));
    }
    FLASHCACHE_OK(gpu::compress(full.cache, c.budget, full.opt, full.out, nullptr, global ? &plan_full : nullptr));
    const std::vector<std::int32_t> want = full.kept.download(), want_indptr = full.kept_indptr.download();

    struct Part {
      std::vector<float*> k, v;
      gpu::Cache<float> cache;
      gpu::Outputs<float> out;
      DeviceArray<std::int32_t> kept, kept_indptr;
      DeviceArray<unsigned char> ws;
      std::size_t bytes = 0;
    };
    Part part[2];
    const gpu::GlobalTransform* plans[2] = {global ? &plan_rank[0] : nullptr, global ? &plan_rank[1] : nullptr};
    for (int r = 0; r < 2; ++r) {
      Part& P = part[r];
      for (int l = 0; l < c.layers; ++l) {
        P.k.push_back(full.k_ptr[static_cast<std::size_t>(l)] + 2 * r * hc.head_stride);
        P.v.push_back(full.v_ptr[static_cast<std::size_t>(l)] + 2 * r * hc.head_stride);
      }
      P.cache = full.cache;
      P.cache.heads = 2;
      P.cache.k = P.k.data();
      P.cache.v = P.v.data();
      P.kept.resize(static_cast<std::size_t>(c.layers * 2 * hc.capacity));
      P.kept_indptr.resize(static_cast<std::size_t>(c.layers * (B + 1)));
      P.out.kept = P.kept.get();
      P.out.kept_indptr = P.kept_indptr.get();
      FLASHCACHE_OK(gpu::workspace_size(P.cache, full.opt, &P.bytes, plans[r]));
      P.ws.resize(P.bytes);
      FLASHCACHE_OK(gpu::score_async(P.cache, c.budget, full.opt, P.out, P.ws.get(), P.bytes, nullptr, plans[r]));
    }
    // The all-reduce, on the host: energies add, protected counts take the max.
    gpu::EnergySums sums[2];
    std::vector<double> energy[2];
    std::vector<int> protect[2];
    FLASHCACHE_CUDA_OK(cudaDeviceSynchronize());
    for (int r = 0; r < 2; ++r) {
      FLASHCACHE_OK(gpu::energy_sums(part[r].cache, full.opt, part[r].ws.get(), plans[r], &sums[r]));
      energy[r].resize(4 * sums[r].layer_sequences);
      protect[r].resize(sums[r].layer_sequences);
      FLASHCACHE_CUDA_OK(cudaMemcpy(energy[r].data(), sums[r].energy, energy[r].size() * 8, cudaMemcpyDeviceToHost));
      FLASHCACHE_CUDA_OK(
          cudaMemcpy(protect[r].data(), sums[r].protected_max, protect[r].size() * 4, cudaMemcpyDeviceToHost));
    }
    for (std::size_t i = 0; i < energy[0].size(); ++i) energy[0][i] += energy[1][i];
    for (std::size_t i = 0; i < protect[0].size(); ++i) protect[0][i] = std::max(protect[0][i], protect[1][i]);
    for (int r = 0; r < 2; ++r) {
      FLASHCACHE_CUDA_OK(cudaMemcpy(sums[r].energy, energy[0].data(), energy[0].size() * 8, cudaMemcpyHostToDevice));
      FLASHCACHE_CUDA_OK(
          cudaMemcpy(sums[r].protected_max, protect[0].data(), protect[0].size() * 4, cudaMemcpyHostToDevice));
      FLASHCACHE_OK(
          gpu::select_async(part[r].cache, c.budget, full.opt, part[r].out, part[r].ws.get(), part[r].bytes, nullptr,
                            plans[r]));
      FLASHCACHE_OK(gpu::device_status(part[r].cache, full.opt, part[r].ws.get(), nullptr, plans[r]));
      EXPECT_EQ(part[r].kept_indptr.download(), want_indptr) << "rank " << r << ": the same budgets";
      const std::vector<std::int32_t> got = part[r].kept.download();
      for (int l = 0; l < c.layers; ++l)
        for (int h = 0; h < 2; ++h)
          for (std::int32_t i = 0; i < want_indptr[static_cast<std::size_t>(l * (B + 1) + B)]; ++i)
            ASSERT_EQ(got[static_cast<std::size_t>((l * 2 + h) * hc.capacity + i)],
                      want[static_cast<std::size_t>((l * 4 + 2 * r + h) * hc.capacity + i)])
                << "rank " << r << " layer " << l << " head " << h << " kept row " << i;
    }
  }
}

// ---- host side: runs without a device ------------------------------------------

// Defect 6, host side: dynamic allocation gives each layer its own length,
// which one shared page table cannot describe.
TEST(GpuDefectsHost, CompactionWithDynamicAllocationIsRefusedByName) {
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

// The tensor-parallel entry points check like compress_async, and the sums
// lie where the workspace layout puts them.
TEST(GpuTensorParallelHost, SumsPointIntoTheWorkspaceAndBothPhasesCheckIt) {
  std::vector<float*> k{reinterpret_cast<float*>(0x10000000u)}, v{reinterpret_cast<float*>(0x20000000u)};
  gpu::Cache<float> cache;
  cache.k = k.data();
  cache.v = v.data();
  cache.heads = 2;
  cache.head_dim = 64;
  cache.head_stride = 64;
  cache.token_stride = 128;
  cache.capacity = 100;
  const Options opt = blocked(64);
  const gpu::Outputs<float> out{};
  expect_error(gpu::score_async(cache, Budget::ratio(0.5), opt, out, nullptr, 0, nullptr), Errc::invalid_shape,
               "workspace");
  expect_error(gpu::select_async(cache, Budget::ratio(0.5), opt, out, nullptr, 0, nullptr), Errc::invalid_shape,
               "workspace");
  expect_error(gpu::score_async(cache, Budget::ratio(1.5), opt, out, nullptr, 0, nullptr), Errc::invalid_budget,
               "keep ratio");
  gpu::WorkspaceLayout layout;
  ASSERT_TRUE(gpu::workspace_layout(cache, opt, nullptr, &layout).ok());
  alignas(256) static unsigned char fake_workspace[1];
  gpu::EnergySums sums;
  ASSERT_TRUE(gpu::energy_sums(cache, opt, fake_workspace, nullptr, &sums).ok());
  const auto base = reinterpret_cast<std::uintptr_t>(fake_workspace);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(sums.energy), base + layout.energy);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(sums.protected_max), base + layout.protected_max);
  EXPECT_EQ(sums.layer_sequences, 1u);
}

TEST(GpuDefectsHost, NewDeviceCodesHaveMessages) {
  using gpu::kernels::DeviceErrc;
  int w[gpu::kernels::kStatusWords] = {static_cast<int>(DeviceErrc::shared_page), 7, 12};
  expect_error(gpu::describe_device_status(w), Errc::unsupported, "page id 7 appears again at position 12");
  int i[gpu::kernels::kStatusWords] = {static_cast<int>(DeviceErrc::bad_indptr), 0, 1 << 30, 3};
  expect_error(gpu::describe_device_status(i), Errc::invalid_shape, "start at 0");
}

// The workspace of a paged cache has its page bitmap; the blocked transform its block edges.
TEST(GpuDefectsHost, WorkspaceHoldsTheNewRegions) {
  gpu::Shape s;
  s.layers = 2;
  s.heads = 3;
  s.head_dim = 64;
  s.sequences = 4;
  s.capacity = 1000;
  s.num_pages = 100;
  gpu::WorkspaceLayout w;
  ASSERT_TRUE(gpu::make_layout(s, blocked(64), 0, 0, &w).ok());
  EXPECT_GE(w.last_good - w.first_good, static_cast<std::size_t>(2 * 3 * w.slot_count * 4));
  EXPECT_GE(w.source - w.last_good, static_cast<std::size_t>(2 * 3 * w.slot_count * 4));
  EXPECT_GE(w.page_owners - w.source, static_cast<std::size_t>(2 * 3 * w.slot_count * 4));
  EXPECT_GE(w.total - w.page_owners, 16u);  // 100 bits
}

// The shared rules (rules.hpp) as the GPU path uses them.
TEST(GpuRules, AlwaysKeptScoresAreInfAndNaN) {
  EXPECT_TRUE(rules::always_kept_score(kInf));
  EXPECT_TRUE(rules::always_kept_score(kNaN));
  EXPECT_TRUE(rules::always_kept_score(std::numeric_limits<double>::quiet_NaN()));
  EXPECT_FALSE(rules::always_kept_score(0.0f));
  EXPECT_FALSE(rules::always_kept_score(std::numeric_limits<float>::max()));
  EXPECT_FALSE(rules::always_kept_score(-kInf));  // never a score; not forced either
}

TEST(GpuRules, ProtectFloorBudgetAndBlockSize) {
  EXPECT_TRUE(rules::is_protected(0, 10, 1, 0, false));
  EXPECT_TRUE(rules::is_protected(9, 10, 0, 1, false));
  EXPECT_TRUE(rules::is_protected(5, 10, 0, 0, true));
  EXPECT_FALSE(rules::is_protected(5, 10, 1, 1, false));
  EXPECT_EQ(rules::layer_floor(0, 0.1, 30), 3);   // 0.1 * 30 = 3.0000000000000004 stays 3
  EXPECT_EQ(rules::layer_floor(5, 0.1, 30), 5);   // the protected count wins
  EXPECT_EQ(rules::layer_floor(2, 0.1, 31), 4);   // ceil(3.1)
  EXPECT_EQ(rules::layer_floor(0, 0.0, 31), 0);
  EXPECT_EQ(rules::layer_budget(true, 0.25, 0, 10), 3);  // 2.5 rounds away from zero
  EXPECT_EQ(rules::layer_budget(false, 0.0, 7, 10), 7);
  EXPECT_EQ(rules::model_total(true, 0.2, 0, 1001, 3), 200);
  EXPECT_EQ(rules::model_total(false, 0.0, 5, 100, 3), 15);
  EXPECT_DOUBLE_EQ(rules::energy_ratio(4.0, 1.0, 2.0, 1.0), 0.75);
  EXPECT_DOUBLE_EQ(rules::energy_ratio(0.0, 0.0, 2.0, 1.0), 0.5);  // no K energy adds nothing
  EXPECT_TRUE(rules::block_size_ok(128, true));
  EXPECT_FALSE(rules::block_size_ok(129, true));
  EXPECT_TRUE(rules::block_size_ok(129, false));
  EXPECT_FALSE(rules::block_size_ok(0, false));
}

}  // namespace
}  // namespace flashcache::gpu_testing
