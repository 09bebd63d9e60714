#pragma once
// Stage 1, score (global transform, the paper's): one DCT over each whole
// sequence, O(N log N) per column through cuFFT with Makhoul's reordering,
// exactly as score/dct.hpp does on the CPU:
//   substitutes  which row stands in for each token (non-finite rows take the
//                nearest finite row before them, leading ones the first finite)
//   pack         z[col][j] = K[perm j][c] + i V[perm j][c], col = (head, c),
//                perm j = 2j for 2j < N, else 2(N-1-j)+1
//   (cuFFT forward, length N, batch heads x head_dim)
//   lowpass      per frequency pair (k, N-k): the two real DCT-II spectra from
//                Z[k], Z[N-k], zero k >= m, and the DCT-III input spectrum back
//                into z, all in place (the orthonormal scales cancel)
//                (a base chosen by energy: score_global_base.cuh's kernels instead)
//   (cuFFT inverse)
//   residual     base = z / N at the un-permuted position; per-token scores,
//                per-tile energies and protected counts as in the blocked pass
// The host loops over layers and sequences (lengths come from the GlobalTransform),
// reusing one z buffer per (layer, sequence), in stream order.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <cmath>

#include "flashcache/cuda/kernels/common.cuh"
#include "flashcache/cuda/kernels/score_blocked.cuh"

namespace flashcache::gpu::kernels {

inline constexpr int kGlobalTile = 32;  // tokens per residual CTA and per energy slot

// ---- substitutes -------------------------------------------------------------
// Two passes: finite_kernel marks every (layer, head, token) row (fully
// parallel, one warp per row, reading K and V once), then substitute_kernel
// scans the flags of one (layer, sequence, head) in token order and replaces
// them, in place, by the row the transform reads.
template <class T>
struct SubstituteParams : LayerRows<T> {
  bool vector_ok = false;  // rows allow 16-byte loads
  std::int64_t capacity = 0;
  std::int32_t* sub = nullptr;  // [L][H][capacity]: flags (1 finite), then the source token or -1 (zeros)
  int* status = nullptr;
};

inline constexpr int kFiniteThreads = 256;
inline constexpr int kFiniteRowsPerCta = 64;

template <class T>
__global__ void __launch_bounds__(kFiniteThreads) finite_kernel(SubstituteParams<T> p) {
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  if (stop_requested(p.status)) return;
  const int head = static_cast<int>(blockIdx.y), layer = static_cast<int>(blockIdx.z);
  const std::int64_t total = p.seq.offset[p.sequences];
  std::int32_t* flags = p.sub + (std::int64_t{layer} * gridDim.y + head) * p.capacity;
  const T* k = p.k[layer];
  const T* v = p.v[layer];
  for (int r = warp; r < kFiniteRowsPerCta; r += kFiniteThreads / 32) {
    const std::int64_t i = std::int64_t{blockIdx.x} * kFiniteRowsPerCta + r;  // packed token
    if (i >= total) break;                                                    // per warp; no barrier follows
    const int b = owner_of(p.seq.offset, p.sequences, i);
    const std::int64_t off = p.rows.offset(b, head, i - p.seq.offset[b]);
    const bool ok = row_is_finite(k + off, v + off, p.head_dim, lane, p.vector_ok);
    if (lane == 0) flags[i] = ok ? 1 : 0;
  }
}

inline constexpr int kSubstituteThreads = 256;

template <class T>
__global__ void __launch_bounds__(kSubstituteThreads) substitute_kernel(SubstituteParams<T> p) {
  using Scan = cub::BlockScan<int, kSubstituteThreads>;
  using Reduce = cub::BlockReduce<int, kSubstituteThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ typename Reduce::TempStorage reduce_storage;
  __shared__ int first_good_shared;
  const int tid = static_cast<int>(threadIdx.x);
  if (stop_requested(p.status)) return;
  const int b = static_cast<int>(blockIdx.x), head = static_cast<int>(blockIdx.y), layer = static_cast<int>(blockIdx.z);
  const int n = p.seq.len[b];
  std::int32_t* sub = p.sub + (std::int64_t{layer} * gridDim.y + head) * p.capacity + p.seq.offset[b];

  int carry = -1, first_good = 0x7fffffff;
  for (int base = 0; base < n; base += kSubstituteThreads) {
    const int t = base + tid;
    const bool good = t < n && sub[t] != 0;  // each thread reads and rewrites only its own t
    int last_good = -1, chunk_max = -1;
    Scan(scan_storage).InclusiveScan(good ? t : -1, last_good, MaxOf{}, chunk_max);
    __syncthreads();
    if (last_good < carry) last_good = carry;
    if (t < n) sub[t] = good ? t : last_good;  // -1: before the first finite row, fixed below
    if (chunk_max > carry) carry = chunk_max;
    const int chunk_first = Reduce(reduce_storage).Reduce(good ? t : 0x7fffffff, MinOf{});
    if (tid == 0) first_good_shared = chunk_first;
    __syncthreads();
    if (first_good_shared < first_good) first_good = first_good_shared;
    __syncthreads();
  }
  if (first_good != 0x7fffffff)  // leading non-finite rows take the first finite one
    for (int t = tid; t < n && t < first_good; t += kSubstituteThreads) sub[t] = first_good;
}

// ---- the GlobalTransform's lengths against the device's ------------------------------------
// Every sequence, zero-length ones included, before any pass uses the GlobalTransform's
// lengths: a mismatch stops the run (and names the sequence) instead of
// letting packed offsets drift. Its lengths travel as kernel
// parameters, kLengthsPerCheck at a time (no device copy, no allocation).
inline constexpr int kLengthsPerCheck = 256;

struct LengthCheckParams {
  const std::int32_t* seq_len = nullptr;  // the device's, from the sequence-table kernel
  int first = 0, count = 0;               // sequences [first, first + count)
  std::int32_t expected[kLengthsPerCheck];
  int* status = nullptr;
};

template <int kOneDefinition = 0>
__global__ void __launch_bounds__(kLengthsPerCheck) check_lengths_kernel(LengthCheckParams p) {
  const int i = static_cast<int>(threadIdx.x);
  if (i >= p.count || failed(p.status)) return;  // no barrier in this kernel
  const int b = p.first + i;
  if (p.seq_len[b] != p.expected[i]) raise(p.status, DeviceErrc::length_mismatch, b, p.seq_len[b], p.expected[i]);
}

// ---- pack --------------------------------------------------------------------
template <class T>
struct PackParams {
  const T* k = nullptr;  // this layer
  const T* v = nullptr;
  RowMap rows;
  int sequence = 0;
  int heads = 0, head_dim = 0;
  std::int64_t n = 0;                 // the GlobalTransform's length of this sequence
  const std::int32_t* sub = nullptr;  // this layer, head 0, packed token 0; heads `capacity` apart
  std::int64_t capacity = 0;
  SeqTable seq;         // the device's lengths and packed offsets
  float2* z = nullptr;  // [heads * head_dim][n]
  int* status = nullptr;
};

// 32 tokens x 32 columns per CTA, through shared memory so that reads go
// along rows (columns contiguous) and writes along z (tokens contiguous).
template <class T>
__global__ void __launch_bounds__(256) pack_kernel(PackParams<T> p) {
  __shared__ float2 tile[32][33];
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  if (stop_requested(p.status)) return;
  if (p.seq.len[p.sequence] != p.n) {  // check_lengths_kernel has reported it; stay clear of the buffers
    if (blockIdx.x == 0 && blockIdx.y == 0 && tx == 0 && ty == 0)
      raise(p.status, DeviceErrc::length_mismatch, p.sequence, p.seq.len[p.sequence], p.n);
    return;
  }
  const std::int32_t* sub = p.sub + p.seq.offset[p.sequence];
  const std::int64_t columns = std::int64_t{p.heads} * p.head_dim;
  const std::int64_t j0 = std::int64_t{blockIdx.x} * 32, col0 = std::int64_t{blockIdx.y} * 32;
  // A thread's column is the same in every row it loads: its head and channel are found once, in
  // 32-bit arithmetic (heads x head_dim is small), not by a 64-bit division per element, which made
  // this kernel issue-bound in the simulator's timing model.
  const std::int64_t col = col0 + tx;
  const bool col_ok = col < columns;
  const int h = col_ok ? static_cast<int>(col) / p.head_dim : 0, c = col_ok ? static_cast<int>(col) % p.head_dim : 0;
  const std::int32_t* sub_h = sub + h * p.capacity;
  for (int r = ty; r < 32; r += 8) {
    const std::int64_t j = j0 + r;
    float2 value = make_float2(0.0f, 0.0f);
    if (j < p.n && col_ok) {
      const std::int64_t token = 2 * j < p.n ? 2 * j : 2 * (p.n - 1 - j) + 1;
      const int s = sub_h[token];
      if (s >= 0) {
        const std::int64_t off = p.rows.offset(p.sequence, h, s) + c;
        value = make_float2(load_float(p.k[off]), load_float(p.v[off]));
      }
    }
    tile[r][tx] = value;
  }
  __syncthreads();
  for (int r = ty; r < 32; r += 8) {
    const std::int64_t out_col = col0 + r, j = j0 + tx;
    if (j < p.n && out_col < columns) p.z[out_col * p.n + j] = tile[tx][r];
  }
}

// ---- lowpass in the frequency domain -------------------------------------------
struct LowpassParams {
  float2* z = nullptr;  // [columns][n]
  std::int64_t n = 0;
  std::int64_t m = 0;  // kept frequencies
  const int* status = nullptr;
};

// Host and device: the host tests replay the chosen-base pass (score_global_base.cuh) with them.
__host__ __device__ __forceinline__ float2 cmul(float2 a, float2 b) {
  return make_float2(a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x);
}
__host__ __device__ __forceinline__ float2 conj(float2 a) { return make_float2(a.x, -a.y); }

// exp(-i pi k / (2n)), the fraction k / (2n) and its sine and cosine in double,
// rounded once to float. A float quotient k / (2n) is not exact (1 / 2000 is
// not a float): its rounding put every twiddle off by up to ~1e-7 rad, and the
// inverse transform's first output sums them over every frequency (N = 1000:
// token 0's score 1.4e-4 of the head's largest off the CPU's, 0.7e-4 with this).
__device__ __forceinline__ float2 twiddle(std::int64_t k, std::int64_t n) {
  double s, c;
  sincospi(-static_cast<double>(k) / static_cast<double>(2 * n), &s, &c);
  return make_float2(static_cast<float>(c), static_cast<float>(s));
}

// A template (never instantiated with another argument) so that the kernel has
// vague linkage: any number of translation units may include this header.
template <int kOneDefinition = 0>
__global__ void __launch_bounds__(256) lowpass_kernel(LowpassParams p) {
  if (failed(p.status)) return;  // no barrier in this kernel
  const std::int64_t k = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const std::int64_t n = p.n;
  if (k > n / 2) return;
  float2* z = p.z + std::int64_t{blockIdx.y} * n;
  const std::int64_t r = k == 0 ? 0 : n - k;  // partner frequency
  const float2 zk = z[k], zr = z[r];
  // Unscaled DCT-II of the two real sequences (real part: K, imaginary: V):
  //   X1[k] = Re(w_k (Z[k] + conj Z[N-k]) / 2),  X2[k] = Im(w_k (Z[k] - conj Z[N-k]) / 2).
  const float2 wk = twiddle(k, n), wr = twiddle(r, n);
  const float2 sum_k = cmul(wk, make_float2(0.5f * (zk.x + zr.x), 0.5f * (zk.y - zr.y)));
  const float2 dif_k = cmul(wk, make_float2(0.5f * (zk.x - zr.x), 0.5f * (zk.y + zr.y)));
  const float2 sum_r = cmul(wr, make_float2(0.5f * (zr.x + zk.x), 0.5f * (zr.y - zk.y)));
  const float2 dif_r = cmul(wr, make_float2(0.5f * (zr.x - zk.x), 0.5f * (zr.y + zk.y)));
  float x1k = sum_k.x, x2k = dif_k.y, x1r = sum_r.x, x2r = dif_r.y;
  if (k >= p.m) x1k = x2k = 0.0f;
  if (r >= p.m) x1r = x2r = 0.0f;
  // DCT-III input spectrum: V[k] = conj(w_k) ((X1[k] + X2[N-k]) + i (X2[k] - X1[N-k])), X[N] = 0.
  if (k == 0) {
    z[0] = cmul(conj(wk), make_float2(x1k, x2k));
    return;
  }
  z[k] = cmul(conj(wk), make_float2(x1k + x2r, x2k - x1r));
  if (r != k) z[r] = cmul(conj(wr), make_float2(x1r + x2k, x2r - x1k));
}

// ---- residual ------------------------------------------------------------------
template <class T>
struct ResidualParams {
  const T* k = nullptr;
  const T* v = nullptr;
  RowMap rows;
  SeqTable seq;
  int sequence = 0, layer = 0;
  int heads = 0, head_dim = 0;
  std::int64_t n = 0;
  std::int64_t capacity = 0, slot_count = 0;
  ProtectRule protect;
  GridSpans grids;  // span tokens add no E_high here and take their rank from the 2D pass (score_grid.cuh)
  const std::int32_t* sub = nullptr;  // this layer, head 0, packed token 0; heads `capacity` apart
  const float2* z = nullptr;          // [heads * head_dim][n], after the inverse FFT
  float* scores = nullptr;            // [L][H][capacity]
  float4* energy_part = nullptr;      // [L][H][slot_count]
  int* protected_part = nullptr;      // [L][H][slot_count]
  int* status = nullptr;
};

// One CTA per (32 tokens, head); 8 warps. Column tiles of 32 go through shared
// memory so that row reads stay along the head dim.
template <class T>
__global__ void __launch_bounds__(256) residual_kernel(ResidualParams<T> p) {
  __shared__ float2 tile[32][33];
  __shared__ float part[4][8][32];  // K residual, V residual, K total, V total per (warp, token)
  __shared__ int protected_count;
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  if (stop_requested(p.status)) return;
  const int head = static_cast<int>(blockIdx.y);
  const std::int64_t n0 = std::int64_t{blockIdx.x} * kGlobalTile;
  const int d = p.head_dim;
  if (p.seq.len[p.sequence] != p.n) return;  // reported by check_lengths_kernel; uniform
  const std::int32_t* sub = p.sub + head * p.capacity + p.seq.offset[p.sequence];
  const float inv_n = 1.0f / static_cast<float>(p.n);

  float rk = 0, rv = 0, ek = 0, ev = 0;  // this lane's token, this warp's columns
  const std::int64_t token = n0 + lane;
  const bool token_ok = token < p.n;
  const bool good = token_ok && sub[token] == token;
  const bool in_span = token_ok && p.grids.contains(token);
  const std::int64_t j = token % 2 == 0 ? token / 2 : p.n - 1 - (token - 1) / 2;  // Makhoul position
  for (int c0 = 0; c0 < d; c0 += 32) {
    for (int r = warp; r < 32; r += 8) {  // rows n0 + r, lanes along the head dim
      const std::int64_t t = n0 + r;
      const int c = c0 + lane;
      float2 value = make_float2(0.0f, 0.0f);
      if (t < p.n && c < d) {
        const int s = sub[t];
        if (s >= 0) {
          const std::int64_t off = p.rows.offset(p.sequence, head, s) + c;
          value = make_float2(load_float(p.k[off]), load_float(p.v[off]));
        }
      }
      tile[r][lane] = value;
    }
    __syncthreads();
    for (int cc = warp; cc < 32; cc += 8) {  // columns, lanes along tokens
      const int c = c0 + cc;
      if (token_ok && c < d) {
        const float2 x = tile[lane][cc];
        const float2 base = p.z[(std::int64_t{head} * d + c) * p.n + j];
        const float dk = x.x - base.x * inv_n, dv = x.y - base.y * inv_n;
        rk += dk * dk;
        rv += dv * dv;
        ek += x.x * x.x;
        ev += x.y * x.y;
      }
    }
    __syncthreads();
  }
  part[0][warp][lane] = rk;
  part[1][warp][lane] = rv;
  part[2][warp][lane] = ek;
  part[3][warp][lane] = ev;
  if (tid == 0) protected_count = 0;
  __syncthreads();

  const std::int64_t row = (std::int64_t{p.layer} * p.heads + head) * p.capacity + p.seq.offset[p.sequence];
  const std::int64_t slot =
      (std::int64_t{p.layer} * p.heads + head) * p.slot_count + p.seq.slots[p.sequence] + blockIdx.x;
  if (warp == 0) {
    float s[4] = {0, 0, 0, 0};
    for (int w = 0; w < 8; ++w)
      for (int q = 0; q < 4; ++q) s[q] += part[q][w][lane];
    if (token_ok) {
      const float inv_d = 1.0f / static_cast<float>(d);
      const float score = good ? s[0] * inv_d + s[1] * inv_d : __int_as_float(0x7f800000);
      p.scores[row + token] = score;
      // A finite span token is ranked by its 2D score: the grid pass counts it.
      const bool ranked_here = !in_span || !good;
      if ((ranked_here && flashcache::rules::always_kept_score(score)) ||
          p.protect(token, p.n, p.seq.offset[p.sequence] + token))
        atomicAdd(&protected_count, 1);
    }
    // Energies over finite tokens (E_high outside the spans), reduced in a fixed order across the warp.
    const bool high = good && !in_span;
    float e[4] = {good ? s[2] : 0.0f, high ? s[0] : 0.0f, good ? s[3] : 0.0f, high ? s[1] : 0.0f};
    for (int q = 0; q < 4; ++q)
      for (int o = 16; o >= 1; o >>= 1) e[q] += __shfl_xor_sync(0xffffffffu, e[q], o);
    if (lane == 0) p.energy_part[slot] = make_float4(e[0], e[1], e[2], e[3]);
  }
  __syncthreads();
  if (tid == 0) p.protected_part[slot] = protected_count;
}

}  // namespace flashcache::gpu::kernels
