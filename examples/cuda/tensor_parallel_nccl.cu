// Tensor parallel on several GPUs of one process: each rank holds a share of
// every layer's KV heads. The layer budgets depend on all heads (R_l, the
// largest protected count), so each rank scores its heads, the per-layer sums
// are all-reduced with NCCL on device buffers (energies: sum, protected
// counts: max), and each rank then selects with the same budgets.
//
//   1. per rank: a cache of 8 / ranks heads, a workspace, score_async
//   2. NCCL all-reduce of the sums energy_sums() points at, in one group
//   3. per rank: select_async; every rank must report the same layer budgets
#include <cuda_runtime.h>
#include <nccl.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "flashcache/cuda/compress.cuh"
#include "example_checks.hpp"

namespace fcg = flashcache::gpu;

#define CHECK_NCCL(expr)                                               \
  do {                                                                 \
    const ncclResult_t r_ = (expr);                                    \
    if (r_ != ncclSuccess) {                                           \
      std::fprintf(stderr, "%s: %s\n", #expr, ncclGetErrorString(r_)); \
      return 1;                                                        \
    }                                                                  \
  } while (0)

namespace {

constexpr int kLayers = 4, kHeads = 8, kHeadDim = 64, kTokens = 512;

// One rank's share: HND [heads][tokens][head_dim] float per layer, K and V.
struct Rank {
  int device = 0;
  cudaStream_t stream = nullptr;
  ncclComm_t comm = nullptr;
  std::vector<float*> k, v;
  std::int32_t *kept = nullptr, *kept_indptr = nullptr;
  void* workspace = nullptr;
  std::size_t bytes = 0;
  fcg::Cache<float> cache;
  fcg::Outputs<float> out;
};

float value(int layer, int head, int token, int column, bool is_k) {
  const float smooth = std::sin(0.05f * static_cast<float>(token) + 0.3f * static_cast<float>(column + head));
  const float outlier = (token % (11 + layer) == 3 && is_k) ? 2.5f : 0.0f;
  return (is_k ? 1.0f : 0.5f) * smooth + outlier + 0.01f * static_cast<float>(layer);
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("No CUDA device found: this example needs at least one GPU. Nothing to do.\n");
    return 0;
  }
  int ranks = 1;  // a power of two that divides the heads, at most the devices
  while (ranks * 2 <= devices && ranks * 2 <= kHeads) ranks *= 2;
  const int heads = kHeads / ranks;
  flashcache::Options opt;
  opt.score.transform = flashcache::Transform::blocked;
  opt.score.base = flashcache::Base::lowpass;  // the blocked kernel builds the low-pass base
  opt.score.block_size = 64;
  opt.select.sink = 4;
  const flashcache::Budget budget = flashcache::Budget::ratio(0.25);

  std::vector<Rank> rank(static_cast<std::size_t>(ranks));
  std::vector<int> device_ids(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) device_ids[static_cast<std::size_t>(r)] = r;
  std::vector<ncclComm_t> comms(static_cast<std::size_t>(ranks));
  CHECK_NCCL(ncclCommInitAll(comms.data(), ranks, device_ids.data()));

  // 1. Each rank: its heads, a workspace, the scores and its sums.
  for (int r = 0; r < ranks; ++r) {
    Rank& R = rank[static_cast<std::size_t>(r)];
    R.device = r;
    R.comm = comms[static_cast<std::size_t>(r)];
    CHECK_CUDA(cudaSetDevice(r));
    CHECK_CUDA(cudaStreamCreate(&R.stream));
    std::vector<float> host(static_cast<std::size_t>(heads) * kTokens * kHeadDim);
    for (int l = 0; l < kLayers; ++l)
      for (int which = 0; which < 2; ++which) {
        for (int h = 0; h < heads; ++h)
          for (int t = 0; t < kTokens; ++t)
            for (int c = 0; c < kHeadDim; ++c)
              host[(static_cast<std::size_t>(h) * kTokens + t) * kHeadDim + c] =
                  value(l, r * heads + h, t, c, which == 0);
        float* d = nullptr;
        CHECK_CUDA(cudaMalloc(&d, host.size() * sizeof(float)));
        CHECK_CUDA(cudaMemcpy(d, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
        (which == 0 ? R.k : R.v).push_back(d);
      }
    CHECK_CUDA(cudaMalloc(&R.kept, sizeof(std::int32_t) * kLayers * heads * kTokens));
    CHECK_CUDA(cudaMalloc(&R.kept_indptr, sizeof(std::int32_t) * kLayers * 2));
    R.cache = fcg::Cache<float>::dense_hnd(kLayers, R.k.data(), R.v.data(), heads, kHeadDim, kTokens);
    R.out.kept = R.kept;
    R.out.kept_indptr = R.kept_indptr;
    CHECK_STATUS(fcg::workspace_size(R.cache, opt, &R.bytes));
    CHECK_CUDA(cudaMalloc(&R.workspace, R.bytes));
    CHECK_STATUS(fcg::score_async(R.cache, budget, opt, R.out, R.workspace, R.bytes, R.stream));
  }

  // 2. The sums of all ranks, on device buffers, in stream order.
  CHECK_NCCL(ncclGroupStart());
  for (Rank& R : rank) {
    fcg::EnergySums sums;
    CHECK_STATUS(fcg::energy_sums(R.cache, opt, R.workspace, nullptr, &sums));
    CHECK_NCCL(ncclAllReduce(sums.energy, sums.energy, 4 * sums.layer_sequences, ncclFloat64, ncclSum, R.comm,
                             R.stream));
    CHECK_NCCL(ncclAllReduce(sums.protected_max, sums.protected_max, sums.layer_sequences, ncclInt32, ncclMax,
                             R.comm, R.stream));
  }
  CHECK_NCCL(ncclGroupEnd());

  // 3. Each rank selects its heads' tokens with the budgets every rank agrees on.
  std::vector<std::vector<std::int32_t>> budgets(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    Rank& R = rank[static_cast<std::size_t>(r)];
    CHECK_CUDA(cudaSetDevice(r));
    CHECK_STATUS(fcg::select_async(R.cache, budget, opt, R.out, R.workspace, R.bytes, R.stream));
    CHECK_STATUS(fcg::device_status(R.cache, opt, R.workspace, R.stream));
    std::vector<std::int32_t> indptr(kLayers * 2);
    CHECK_CUDA(cudaMemcpy(indptr.data(), R.kept_indptr, indptr.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost));
    for (int l = 0; l < kLayers; ++l) budgets[static_cast<std::size_t>(r)].push_back(indptr[l * 2 + 1] - indptr[l * 2]);
  }
  std::printf("%d rank(s), %d heads each; tokens kept per layer:", ranks, heads);
  for (int b : budgets[0]) std::printf(" %d", b);
  std::printf(" (of %d)\n", kTokens);
  bool agree = true;
  for (const auto& b : budgets) agree = agree && b == budgets[0];
  std::printf("every rank has the same budgets: %s\n", agree ? "yes" : "NO");

  for (Rank& R : rank) {
    cudaSetDevice(R.device);
    for (float* p : R.k) cudaFree(p);
    for (float* p : R.v) cudaFree(p);
    cudaFree(R.kept);
    cudaFree(R.kept_indptr);
    cudaFree(R.workspace);
    cudaStreamDestroy(R.stream);
    ncclCommDestroy(R.comm);
  }
  return agree ? 0 : 1;
}
