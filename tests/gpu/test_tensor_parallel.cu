// Tensor parallel (flashcache/cuda/tensor_parallel.cuh): heads split over
// ranks, score_async, the sums reduced between the phases, select_async.
#include <gtest/gtest.h>

#include "gpu_testing.cuh"
#include "host_fixture.cuh"

namespace flashcache::gpu_testing {
namespace {

using host::expect_error;

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
      FLASHCACHE_OK(gpu::select_async(part[r].cache, c.budget, full.opt, part[r].out, part[r].ws.get(), part[r].bytes,
                                      nullptr, plans[r]));
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

}  // namespace
}  // namespace flashcache::gpu_testing
