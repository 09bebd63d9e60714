#pragma once
// Stage 1c, ScoreOptions::mean_weight: each token's squared distance from its
// head's mean K and V row over the sequence's finite tokens, divided by
// head_dim (score/rows.hpp's distance_from_mean, the residual against the DC
// base alone), into a [L][H][capacity] term that mix_tails_kernel then mixes
// into the scores as it mixes the keys' tails.
//
// One CTA per (sequence, head, layer), three passes over the sequence's rows:
// each row's finiteness (one warp per row) into the term buffer as a flag; the
// mean of the finite rows, one thread per column of K and V summing in double
// (a fixed order, so the result does not change from run to run), into shared
// memory; then each row's distance (one warp per row). A non-finite row's term
// is 0: its score is +inf, which the mix leaves alone.
//
// MeanDistance::key_cosine (KeyDiff's distance, keys only) takes the same
// passes: each finite row's key norm (-1 marks a non-finite row); the sum of
// the finite rows' unit keys as the anchor (its scale cancels in the cosine)
// and its norm; then each row's 1 - cos(key, anchor) by
// rules::key_cosine_distance, as score/rows.hpp's key_cosine_from_mean.
#include "flashcache/cuda/kernels/common.cuh"
#include "flashcache/cuda/kernels/score_blocked.cuh"  // row_is_finite

namespace flashcache::gpu::kernels {

template <class T>
struct MeanDistanceParams : LayerRows<T> {
  bool vector_ok = false;   // rows allow 16-byte loads
  bool key_cosine = false;  // MeanDistance::key_cosine, else kv_squared
  std::int64_t capacity = 0;
  float* term = nullptr;  // [L][H][capacity], packed tokens
  int* status = nullptr;
};

inline constexpr int kMeanDistanceThreads = 256;
inline constexpr int kMeanUnroll = 8;  // rows per step of the mean's column sums

// Dynamic shared memory: the mean K and V row, 2 head_dim floats (key_cosine: the
// anchor and its norm, which fit in the same).
constexpr std::size_t mean_distance_smem_bytes(std::int64_t head_dim) {
  return static_cast<std::size_t>(2 * head_dim) * sizeof(float);
}
// The largest head dim whose mean row fits without opting in to more.
inline constexpr std::int64_t kMeanDistanceMaxHeadDim =
    kDefaultDynamicSmemBytes / static_cast<std::int64_t>(mean_distance_smem_bytes(1));

// A warp's sum of a row's squared keys (lane 0 and every lane get it).
template <class T>
__device__ float key_norm(const T* k, std::int64_t d, int lane) {
  float sq = 0.0f;
  for (std::int64_t c = lane; c < d; c += 32) {
    const float x = load_float(k[c]);
    sq += x * x;
  }
#pragma unroll
  for (int s = 16; s > 0; s /= 2) sq += __shfl_xor_sync(0xffffffffu, sq, s);
  return sqrtf(sq);
}

// KeyDiff's distance for one CTA's head (see the file's comment); anchor is [d + 1] of shared memory.
template <class T>
__device__ void key_cosine_rows(const MeanDistanceParams<T>& p, int b, int head, const T* k, const T* v, float* term,
                                float* anchor) {
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  constexpr int kWarps = kMeanDistanceThreads / 32;
  const std::int64_t n = p.seq.len[b], d = p.head_dim;
  for (std::int64_t t = warp; t < n; t += kWarps) {
    const std::int64_t off = p.rows.offset(b, head, t);
    const bool ok = row_is_finite(k + off, v + off, p.head_dim, lane, p.vector_ok);
    const float norm = key_norm(k + off, d, lane);
    if (lane == 0) term[t] = ok ? norm : -1.0f;
  }
  __syncthreads();  // the norms, written by other warps, are read by every thread below

  for (std::int64_t c = tid; c < d; c += kMeanDistanceThreads) {
    double sum = 0;  // in token order: the same anchor on every run
    // kMeanUnroll rows' loads issued together, as the mean's column sums below, then added in token order.
    for (std::int64_t t0 = 0; t0 < n; t0 += kMeanUnroll) {
      float value[kMeanUnroll], norm[kMeanUnroll];
#pragma unroll
      for (int u = 0; u < kMeanUnroll; ++u) {
        const std::int64_t t = t0 + u;
        value[u] = t < n ? load_float(k[p.rows.offset(b, head, t) + c]) : 0.0f;
        norm[u] = t < n ? term[t] : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kMeanUnroll; ++u)
        if (norm[u] > 0.0f) sum += static_cast<double>(value[u] / norm[u]);
    }
    anchor[c] = static_cast<float>(sum);
  }
  __syncthreads();
  if (warp == 0) {
    float sq = 0.0f;
    for (std::int64_t c = lane; c < d; c += 32) sq += anchor[c] * anchor[c];
#pragma unroll
    for (int s = 16; s > 0; s /= 2) sq += __shfl_xor_sync(0xffffffffu, sq, s);
    if (lane == 0) anchor[d] = sqrtf(sq);
  }
  __syncthreads();

  const float anchor_norm = anchor[d];
  for (std::int64_t t = warp; t < n; t += kWarps) {
    const std::int64_t off = p.rows.offset(b, head, t);
    const float norm = term[t];  // this warp's row only: no other warp writes it
    float dot = 0.0f;
    if (norm > 0.0f)
      for (std::int64_t c = lane; c < d; c += 32) dot += load_float(k[off + c]) * anchor[c];
#pragma unroll
    for (int s = 16; s > 0; s /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, s);
    // A zero key or a zero anchor has cosine 0; a non-finite row's term is 0 (its score is +inf).
    const float cosine = norm > 0.0f && anchor_norm > 0.0f ? dot / (norm * anchor_norm) : 0.0f;
    if (lane == 0) term[t] = norm < 0.0f ? 0.0f : static_cast<float>(rules::key_cosine_distance(cosine));
  }
}

template <class T>
__global__ void __launch_bounds__(kMeanDistanceThreads) mean_distance_kernel(MeanDistanceParams<T> p) {
  extern __shared__ float mean_row[];  // [2 d]: K's mean, then V's
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  constexpr int kWarps = kMeanDistanceThreads / 32;
  if (stop_requested(p.status)) return;
  const int b = static_cast<int>(blockIdx.x), head = static_cast<int>(blockIdx.y), layer = static_cast<int>(blockIdx.z);
  const std::int64_t n = p.seq.len[b], d = p.head_dim;
  float* term = p.term + (std::int64_t{layer} * gridDim.y + head) * p.capacity + p.seq.offset[b];
  const T* k = p.k[layer];
  const T* v = p.v[layer];
  if (p.key_cosine) {
    key_cosine_rows(p, b, head, k, v, term, mean_row);
    return;
  }

  for (std::int64_t t = warp; t < n; t += kWarps) {
    const std::int64_t off = p.rows.offset(b, head, t);
    const bool ok = row_is_finite(k + off, v + off, p.head_dim, lane, p.vector_ok);
    if (lane == 0) term[t] = ok ? 1.0f : 0.0f;
  }
  __syncthreads();  // the flags, written by other warps, are read by every thread below

  for (std::int64_t c = tid; c < 2 * d; c += kMeanDistanceThreads) {
    const T* x = c < d ? k + c : v + (c - d);
    double sum = 0;
    std::int64_t finite = 0;
    // kMeanUnroll rows' loads issued together (none waits on a flag), then added in token order.
    for (std::int64_t t0 = 0; t0 < n; t0 += kMeanUnroll) {
      float value[kMeanUnroll];
      bool use[kMeanUnroll];
#pragma unroll
      for (int u = 0; u < kMeanUnroll; ++u) {
        const std::int64_t t = t0 + u;
        value[u] = t < n ? load_float(x[p.rows.offset(b, head, t)]) : 0.0f;
        use[u] = t < n && term[t] != 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kMeanUnroll; ++u)
        if (use[u]) {
          sum += static_cast<double>(value[u]);
          ++finite;
        }
    }
    mean_row[c] = finite > 0 ? static_cast<float>(sum / static_cast<double>(finite)) : 0.0f;
  }
  __syncthreads();

  for (std::int64_t t = warp; t < n; t += kWarps) {
    const std::int64_t off = p.rows.offset(b, head, t);
    const bool finite = term[t] != 0.0f;  // this warp's row only: no other warp writes it
    float sum = 0.0f;
    if (finite)
      for (std::int64_t c = lane; c < d; c += 32) {
        const float dk = load_float(k[off + c]) - mean_row[c];
        const float dv = load_float(v[off + c]) - mean_row[d + c];
        sum += dk * dk + dv * dv;
      }
#pragma unroll
    for (int s = 16; s > 0; s /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, s);
    if (lane == 0) term[t] = finite ? sum / static_cast<float>(d) : 0.0f;
  }
}

}  // namespace flashcache::gpu::kernels
