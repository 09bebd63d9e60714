#pragma once
// Query tails on the device (query_tail.hpp has the definition and the CPU
// accumulator): one chunk of a prefill's queries raises each key's tail, the
// largest attention probability a fed query gives it,
//   tail[h][j] = max(tail[h][j], max over g in h's group, fed i >= j + min_distance
//                of min(1, exp(q_gi . k_hj * scale - lse_gi))),
// with lse_gi what FlashAttention returns per query (softmax_lse).
//
// One CTA per (tile of kTailKeys keys, query head): the keys of the tile in
// shared memory (rows padded by one float, so that the lanes of a warp, one key
// each, read distinct banks), the fed queries in tiles of kTailQueries, each
// warp taking queries of the tile in turn; every lane keeps its key's largest
// term, the warps' maxima meet in shared memory, and one atomicMax per key
// merges the query heads of a group and the chunks (the terms are >= 0, so
// their float bits order as ints). A non-finite logit gives 0, as on the CPU.
#include "flashcache/cuda/kernels/common.cuh"

namespace flashcache::gpu::kernels {

inline constexpr int kTailKeys = 32;      // one key per lane
inline constexpr int kTailWarps = 4;
inline constexpr int kTailThreads = 32 * kTailWarps;
inline constexpr int kTailQueries = 8;    // query rows per shared tile
inline constexpr int kTailMaxHeadDim = 256;

template <class T>
struct QueryTailsParams {
  const T* q = nullptr;  // query head g, row r at q + g * q_head_stride + r * q_token_stride
  std::int64_t q_head_stride = 0, q_token_stride = 0;
  std::int64_t chunk = 0;  // query rows, positions first .. first + chunk - 1
  std::int64_t first = 0;
  const T* k = nullptr;  // KV head h, position j at k + h * k_head_stride + j * k_token_stride
  std::int64_t k_head_stride = 0, k_token_stride = 0;
  int head_dim = 0;
  int group = 1;                // query heads per KV head
  const float* lse = nullptr;   // [query heads][chunk]
  float* tails = nullptr;       // KV head h, key j at tails[h * tail_stride + j]
  std::int64_t tail_stride = 0;
  std::int64_t stride = 1, from_position = 0, min_distance = 0;  // QueryTailOptions
  float scale = 1.0f;
};

// One (query, key) term of the tail: the host replay calls it too.
FLASHCACHE_INLINE float tail_term(float dot, float scale, float lse) {
  const float logit = dot * scale;
  if (!(logit - logit == 0.0f)) return 0.0f;  // a non-finite logit (NaN or inf) gives nothing
  const float p = expf(logit - lse);
  // A given lse may round below the largest logit (1 at most); a NaN lse adds nothing
  // (the CPU refuses a non-finite one; the device cannot say).
  return p < 1.0f ? p : (p >= 1.0f ? 1.0f : 0.0f);
}

FLASHCACHE_INLINE bool tail_fed(std::int64_t position, std::int64_t stride, std::int64_t from_position) {
  return position >= from_position && position % stride == 0;
}

// Shared memory of one CTA: the key tile and the query tile, floats.
FLASHCACHE_INLINE std::int64_t query_tails_smem_bytes(int head_dim) {
  return (std::int64_t{kTailKeys} * (head_dim + 1) + std::int64_t{kTailQueries} * head_dim) *
         static_cast<std::int64_t>(sizeof(float));
}

template <class T>
__global__ void __launch_bounds__(kTailThreads) query_tails_kernel(QueryTailsParams<T> p) {
  extern __shared__ __align__(16) unsigned char smem[];  // (one declaration for every kernel: the same type)
  const int d = p.head_dim, pitch = d + 1;
  float* keys = reinterpret_cast<float*>(smem);  // [kTailKeys][pitch]
  float* queries = keys + kTailKeys * pitch;     // [kTailQueries][d]
  __shared__ float warp_max[kTailWarps][kTailKeys];
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int g = static_cast<int>(blockIdx.y), h = g / p.group;
  const std::int64_t j0 = std::int64_t{blockIdx.x} * kTailKeys;
  const std::int64_t end = p.first + p.chunk;  // keys [0, end) are visible to the chunk's last query
  for (int e = tid; e < kTailKeys * d; e += kTailThreads) {
    const int r = e / d, c = e % d;
    const std::int64_t j = j0 + r;
    keys[r * pitch + c] = j < end ? load_float(p.k[h * p.k_head_stride + j * p.k_token_stride + c]) : 0.0f;
  }
  const std::int64_t j = j0 + lane;
  float best = 0.0f;
  // Queries that reach this tile: position i >= j0 + min_distance.
  const std::int64_t r_first = j0 + p.min_distance > p.first ? j0 + p.min_distance - p.first : 0;
  for (std::int64_t r0 = r_first; r0 < p.chunk; r0 += kTailQueries) {
    __syncthreads();  // the keys are loaded; the last query tile is read
    for (int e = tid; e < kTailQueries * d; e += kTailThreads) {
      const int r = e / d, c = e % d;
      const std::int64_t row = r0 + r;
      queries[r * d + c] = row < p.chunk ? load_float(p.q[g * p.q_head_stride + row * p.q_token_stride + c]) : 0.0f;
    }
    __syncthreads();
    for (int r = warp; r < kTailQueries; r += kTailWarps) {
      const std::int64_t row = r0 + r, i = p.first + row;
      if (row >= p.chunk || !tail_fed(i, p.stride, p.from_position)) continue;
      if (j >= end || i - j < p.min_distance) continue;  // causal, and at least min_distance back
      float dot = 0.0f;
      for (int c = 0; c < d; ++c) dot = fmaf(queries[r * d + c], keys[lane * pitch + c], dot);
      const float term = tail_term(dot, p.scale, p.lse[std::int64_t{g} * p.chunk + row]);
      best = term > best ? term : best;
    }
  }
  warp_max[warp][lane] = best;
  __syncthreads();
  if (warp == 0) {
    for (int w = 1; w < kTailWarps; ++w) best = warp_max[w][lane] > best ? warp_max[w][lane] : best;
    if (j < end && best > 0.0f)
      atomicMax(reinterpret_cast<int*>(p.tails + h * p.tail_stride + j), __float_as_int(best));
  }
}

}  // namespace flashcache::gpu::kernels
