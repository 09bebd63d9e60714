#pragma once
// Stage 1b, energy: per (layer, sequence) the energies summed over the layer's
// heads and the ratio R_l = E_high(K)/E(K) + E_high(V)/E(V), plus the largest
// protected count over the heads (the least budget the layer can take).
//
// One CTA per (sequence, layer) sums the per-tile partials of the score pass
// in double, in a fixed order (strided per thread over every head's tiles, then
// a CUB block reduce, itself a fixed tree), so the result does not change from
// run to run. With image spans, the 2D pass's per-tile partials join the same sums.
#include <cub/block/block_reduce.cuh>

#include "flashcache/cuda/kernels/common.cuh"

namespace flashcache::gpu::kernels {

struct EnergyParams {
  int sequences = 0;
  int heads = 0;
  std::int64_t slot_count = 0;
  const std::int32_t* slots = nullptr;  // [B+1]
  const float4* energy_part = nullptr;  // [L][H][slot_count]
  const int* protected_part = nullptr;  // [L][H][slot_count]
  // Image spans: E_high of the span tokens and the span tokens whose 2D
  // score is unrankable, per tile (score_grid.cuh); the score pass left both
  // out of the slots above. grid_tiles 0: no spans.
  int grid_tiles = 0;
  const float2* grid_energy = nullptr;  // [L][H][B][grid_tiles]: K high, V high
  const int* grid_protected = nullptr;  // [L][H][B][grid_tiles]
  double* energy = nullptr;             // [L][B][4]
  double* ratio = nullptr;              // [L][B]
  int* protected_max = nullptr;         // [L][B]
  float* ratio_out = nullptr;           // optional caller copy, [L][B]
  int* status = nullptr;
};

inline constexpr int kEnergyThreads = 128;

// The larger of two, as a reduction operator (cub::Max is gone from CUB 3, cuda::maximum is not in CUB 1).
struct Larger {
  template <class V>
  __device__ V operator()(const V& a, const V& b) const {
    return a > b ? a : b;
  }
};

// Dynamic shared memory: one int per head (the protected counts).
inline std::size_t energy_smem_bytes(int heads) { return static_cast<std::size_t>(heads) * sizeof(int); }

// A template (never instantiated with another argument) so that the kernel has
// vague linkage: any number of translation units may include this header.
template <int kOneDefinition = 0>
__global__ void __launch_bounds__(kEnergyThreads) energy_kernel(EnergyParams p) {
  using Reduce = cub::BlockReduce<double, kEnergyThreads>;
  using ReduceInt = cub::BlockReduce<long long, kEnergyThreads>;
  __shared__ typename Reduce::TempStorage storage;
  __shared__ typename ReduceInt::TempStorage int_storage;
  extern __shared__ int head_count[];  // [heads]
  const int tid = static_cast<int>(threadIdx.x);
  if (stop_requested(p.status)) return;
  const int b = static_cast<int>(blockIdx.x), layer = static_cast<int>(blockIdx.y);
  const std::int64_t s0 = p.slots[b], s1 = p.slots[b + 1], n = s1 - s0;
  for (int h = tid; h < p.heads; h += kEnergyThreads) head_count[h] = 0;
  __syncthreads();

  // Every (head, slot) at once, strided over the threads in a fixed order, so
  // that no head's loads wait for another head's sum; the per-head counts are
  // integer sums (any order gives the same), the energies each thread's own.
  double e[4] = {0, 0, 0, 0};
  const std::int64_t layer_base = std::int64_t{layer} * p.heads;
  for (std::int64_t i = tid; i < p.heads * n; i += kEnergyThreads) {
    const int h = static_cast<int>(i / n);
    const std::int64_t at = (layer_base + h) * p.slot_count + s0 + i % n;
    const float4 part = p.energy_part[at];
    e[0] += part.x;
    e[1] += part.y;
    e[2] += part.z;
    e[3] += part.w;
    if (const int count = p.protected_part[at]) atomicAdd(&head_count[h], count);
  }
  for (std::int64_t i = tid; i < std::int64_t{p.heads} * p.grid_tiles; i += kEnergyThreads) {
    const int h = static_cast<int>(i / p.grid_tiles);
    const std::int64_t at = ((layer_base + h) * p.sequences + b) * p.grid_tiles + i % p.grid_tiles;
    const float2 part = p.grid_energy[at];
    e[1] += part.x;
    e[3] += part.y;
    if (const int count = p.grid_protected[at]) atomicAdd(&head_count[h], count);
  }
  __syncthreads();
  long long most_here = 0;
  for (int h = tid; h < p.heads; h += kEnergyThreads) most_here = most_here > head_count[h] ? most_here : head_count[h];
  const long long most = ReduceInt(int_storage).Reduce(most_here, Larger{});
  double sum[4];
  for (int i = 0; i < 4; ++i) {
    sum[i] = Reduce(storage).Sum(e[i]);
    __syncthreads();
  }
  if (tid == 0) {
    const std::int64_t at = std::int64_t{layer} * p.sequences + b;
    for (int i = 0; i < 4; ++i) p.energy[at * 4 + i] = sum[i];
    const double r = flashcache::rules::energy_ratio(sum[0], sum[1], sum[2], sum[3]);
    p.ratio[at] = r;
    p.protected_max[at] = static_cast<int>(most);
    if (p.ratio_out != nullptr) p.ratio_out[at] = static_cast<float>(r);
  }
}

// ---- R_l again, from sums reduced over tensor-parallel ranks ---------------------
struct RatioParams {
  int count = 0;                   // layers x sequences
  const double* energy = nullptr;  // [L][B][4], reduced
  double* ratio = nullptr;         // [L][B]
  float* ratio_out = nullptr;      // optional caller copy
  const int* status = nullptr;
};

inline constexpr int kRatioThreads = 256;

template <int kOneDefinition = 0>
__global__ void __launch_bounds__(kRatioThreads) ratio_kernel(RatioParams p) {
  const int i = static_cast<int>(blockIdx.x) * kRatioThreads + static_cast<int>(threadIdx.x);
  if (i >= p.count || failed(p.status)) return;  // no barrier in this kernel
  const double* e = p.energy + std::int64_t{i} * 4;
  const double r = flashcache::rules::energy_ratio(e[0], e[1], e[2], e[3]);
  p.ratio[i] = r;
  if (p.ratio_out != nullptr) p.ratio_out[i] = static_cast<float>(r);
}

}  // namespace flashcache::gpu::kernels
