#pragma once
// Stage 1, score (blocked transform): one fused pass per block of tokens.
//
// One CTA per (layer, KV head, block of `block_size` tokens of one sequence).
// It reads the block's K and V rows once (16-byte loads when aligned) into
// shared memory, and each thread owns one head-dim column at a time, held in
// registers. With the block's truncated DCT basis C (m x len) in shared memory,
// the residual x - C^T C x is formed in place, one frequency at a time:
//     y_k = <C_k, x>,  x -= y_k C_k      (k < m)
// which equals the two-step low-pass because the rows of C are orthonormal.
// A full block of the 64-row tile without non-finite or image-span rows, the
// common case, does it over half the rows (full_block_residual, in
// score_blocked_column.cuh with the rest of a column's work: C's even rows are
// symmetric, its odd rows antisymmetric), half the multiply-adds.
// Per-token squared residuals are summed over columns by a warp
// "transpose-reduce" (each lane ends up owning kTile/32 tokens), then across
// warps through shared memory. Energies are reduced in a fixed order, so the
// results are reproducible run to run (no float atomics).
//
// Non-finite tokens score +inf; for the transform their rows are replaced by
// the nearest finite row before them in the sequence (after it for leading
// ones, zeros if the sequence has none), exactly as score.hpp does on the CPU.
// A block that starts with such rows needs a row from outside itself, which
// only the other blocks know. So the kernel runs twice around a small scan:
//   pass 0 (every block)  scores the blocks that begin with a finite row, and
//                         records each block's first and last finite token;
//   blocked_edges_kernel  per (layer, head, sequence), a scan over the blocks
//                         (score_blocked_edges.cuh):
//                         which row stands in for each deferred block's
//                         leading non-finite rows (O(blocks), whatever the run);
//   pass 1 (resolve)      only the deferred blocks, with that row; the others
//                         return after reading one int.
// The decision to defer or to resolve comes from memory written before a
// barrier (or by an earlier kernel), so every thread of a CTA takes it alike.
#include <cstdint>

#include "flashcache/cuda/kernels/common.cuh"
#include "flashcache/cuda/kernels/score_blocked_column.cuh"
#include "flashcache/cuda/kernels/smem_layout.cuh"
#include "flashcache/rules.hpp"

namespace flashcache::gpu::kernels {

template <class T>
struct BlockedParams : LayerRows<T> {
  int block_size = 0;
  double gamma = 0.2;
  ProtectRule protect;
  // Image spans: their rows add no E_high here and leave their rank to the 2D
  // pass (score_grid.cuh), which reads the row each one's transform reads
  // from `grid_source` ([L][H][capacity], packed tokens; -1 zeros).
  GridSpans grids;
  std::int32_t* grid_source = nullptr;
  bool vector_ok = false;       // rows and strides allow 16-byte loads
  bool resolve = false;         // pass 1: only the blocks pass 0 deferred
  std::int64_t capacity = 0;    // score row length per (layer, head)
  std::int64_t slot_count = 0;  // partial slots per (layer, head)
  // [L][H][slot_count] each, token indices within the sequence, -1 for none:
  std::int32_t* first_good = nullptr;    // pass 0: the block's first finite token
  std::int32_t* last_good = nullptr;     // pass 0: the block's last finite token
  const std::int32_t* source = nullptr;  // edges: stand-in for leading non-finite rows (see kSource*)
  float* scores = nullptr;               // [L][H][capacity]
  float4* energy_part = nullptr;         // [L][H][slot_count]: K total, K high, V total, V high
  int* protected_part = nullptr;         // [L][H][slot_count]
  int* status = nullptr;
};

// What blocked_edges_kernel leaves in `source` for a block (besides a token
// index >= 0: the nearest finite row before the block, or after it when
// neither the block nor anything before it has one).
inline constexpr std::int32_t kSourceNone = -3;          // the block starts finite: nothing to resolve
inline constexpr std::int32_t kSourceFirstInBlock = -2;  // leading rows take the block's first finite row
inline constexpr std::int32_t kSourceZeros = -1;         // the sequence has no finite row for this head

// Is every element of a K/V row pair finite? One warp; all loads are issued
// unconditionally (no short-circuit chain of dependent loads), 16 bytes at a
// time when the row allows it.
template <class T>
__device__ bool row_is_finite(const T* k, const T* v, int head_dim, int lane, bool vector_ok) {
  bool ok = true;
  if (vector_ok) {
    constexpr int kPerVec = 16 / sizeof(T);
    for (int q = lane; q < head_dim / kPerVec; q += 32) {
      const uint4 a = reinterpret_cast<const uint4*>(k)[q];
      const uint4 b = reinterpret_cast<const uint4*>(v)[q];
      const T* ea = reinterpret_cast<const T*>(&a);
      const T* eb = reinterpret_cast<const T*>(&b);
#pragma unroll
      for (int i = 0; i < kPerVec; ++i) ok &= isfinite(load_float(ea[i])) & isfinite(load_float(eb[i]));
    }
  } else {
    for (int c = lane; c < head_dim; c += 32) ok &= isfinite(load_float(k[c])) & isfinite(load_float(v[c]));
  }
  return __all_sync(0xffffffffu, ok);
}

template <class T, int kHeadDim, int kTile>
__global__ void __launch_bounds__(blocked_threads<kHeadDim>()) score_blocked_kernel(BlockedParams<T> p) {
  constexpr int kThreads = blocked_threads<kHeadDim>();
  constexpr int kWarps = kThreads / 32;
  constexpr int kPerLane = kTile / 32;
  static_assert(kThreads % 32 == 0, "whole warps");
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  if (stop_requested(p.status)) return;
  const int head = static_cast<int>(blockIdx.y), layer = static_cast<int>(blockIdx.z);
  const std::int64_t slot = blockIdx.x;
  if (slot >= p.seq.slots[p.sequences]) return;
  const std::int64_t slot_index = (std::int64_t{layer} * gridDim.y + head) * p.slot_count + slot;
  if (p.resolve && p.source[slot_index] == kSourceNone) return;  // written by an earlier kernel: uniform
  const int b = owner_of(p.seq.slots, p.sequences, slot);
  const std::int64_t n_seq = p.seq.len[b];
  const std::int64_t t0 = (slot - p.seq.slots[b]) * p.block_size;
  const int len = static_cast<int>(n_seq - t0 < p.block_size ? n_seq - t0 : p.block_size);
  const int m = static_cast<int>(flashcache::lowpass_cutoff(len, p.gamma));
  const int d = kHeadDim > 0 ? kHeadDim : p.head_dim;
  const T* kbase = p.k[layer];
  const T* vbase = p.v[layer];

  extern __shared__ __align__(16) unsigned char smem[];
  // The carve-up is the host's, sized for the largest m (that of a full block).
  const BlockedSmem lay(d, sizeof(T), kTile, flashcache::lowpass_cutoff(p.block_size, p.gamma), kThreads);
  T* tile_k = reinterpret_cast<T*>(smem);
  T* tile_v = reinterpret_cast<T*>(smem + lay.tile_bytes);
  T* ext_k = reinterpret_cast<T*>(smem + 2 * lay.tile_bytes);
  T* ext_v = reinterpret_cast<T*>(smem + 2 * lay.tile_bytes + lay.ext_bytes);
  float* basis = reinterpret_cast<float*>(smem + lay.basis);
  float* part_k = reinterpret_cast<float*>(smem + lay.partk);
  float* part_v = reinterpret_cast<float*>(smem + lay.partv);
  int* bad = reinterpret_cast<int*>(smem + lay.bad);  // bit 0: non-finite row; bit 1: row of an image span
  int* src = reinterpret_cast<int*>(smem + lay.src);
  float* energy = reinterpret_cast<float*>(smem + lay.energy);
  int* misc = reinterpret_cast<int*>(
      smem + lay.misc);  // [0] protected count, [1] any non-finite or span row, [2] first finite row, [3] zero

  // 1. Which rows belong to an image span (bit 1); nothing is non-finite yet.
  for (int n = tid; n < kTile; n += kThreads) bad[n] = (n < len && p.grids.contains(t0 + n)) ? 2 : 0;
  if (tid == 0) misc[0] = misc[1] = misc[3] = 0;
  __syncthreads();

  // 2. Load the block's rows as stored, 16 bytes at a time when allowed, and
  // mark rows holding a NaN or infinity in K or V (bit 0) on the way.
  if (p.vector_ok) {
    constexpr int kPerVec = 16 / sizeof(T);
    constexpr int kBatch = 4;  // loads in flight per thread before the first store waits on one
    const int vec_per_row = d / kPerVec, vectors = len * vec_per_row;
    for (int i0 = tid; i0 < vectors; i0 += kBatch * kThreads) {
      uint4 kw[kBatch], vw[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int i = i0 + j * kThreads;
        if (i < vectors) {
          const std::int64_t off =
              p.rows.offset(b, head, t0 + i / vec_per_row) + std::int64_t{i % vec_per_row} * kPerVec;
          kw[j] = *reinterpret_cast<const uint4*>(kbase + off);
          vw[j] = *reinterpret_cast<const uint4*>(vbase + off);
        }
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int i = i0 + j * kThreads;
        if (i < vectors) {
          reinterpret_cast<uint4*>(tile_k)[i] = kw[j];
          reinterpret_cast<uint4*>(tile_v)[i] = vw[j];
          if (has_non_finite<T>(kw[j], vw[j])) atomicOr(&bad[i / vec_per_row], 1);
        }
      }
    }
  } else {
    for (int i = tid; i < len * d; i += kThreads) {
      const int n = i / d, c = i % d;
      const std::int64_t off = p.rows.offset(b, head, t0 + n) + c;
      tile_k[i] = kbase[off];
      tile_v[i] = vbase[off];
      if (!isfinite(load_float(tile_k[i])) || !isfinite(load_float(tile_v[i]))) atomicOr(&bad[n], 1);
    }
  }
  __syncthreads();
  // Is any row non-finite or a span row? One warp asks; most blocks are clean.
  if (warp == 0) {
    int flags = 0;
    for (int n = lane; n < len; n += 32) flags |= bad[n];
    if (__any_sync(0xffffffffu, flags != 0) && lane == 0) misc[1] = 1;
  }
  __syncthreads();
  // misc[1] was written before the barrier above and is never rewritten: every thread agrees.
  const bool clean = misc[1] == 0;

  // 3. Where each row's values come from: itself, an earlier finite row of the
  // block, or (rows before the block's first finite one) a stand-in.
  //    src >= 0: that row of the tile; -1: zeros; -2: the external row; -3: a stand-in, resolved below.
  if (clean) {
    for (int n = tid; n < len; n += kThreads) src[n] = n;
    if (tid == 0) {
      misc[2] = len > 0 ? 0 : -1;
      if (!p.resolve) {
        p.first_good[slot_index] = len > 0 ? static_cast<std::int32_t>(t0) : -1;
        p.last_good[slot_index] = len > 0 ? static_cast<std::int32_t>(t0 + len - 1) : -1;
      }
    }
  } else if (tid == 0) {
    int last_good = -1, first_good = -1;
    for (int n = 0; n < len; ++n) {
      if (!(bad[n] & 1)) {
        src[n] = n;
        last_good = n;
        if (first_good < 0) first_good = n;
      } else {
        src[n] = last_good >= 0 ? last_good : -3;
      }
    }
    misc[2] = first_good;
    if (!p.resolve) {
      p.first_good[slot_index] = first_good >= 0 ? static_cast<std::int32_t>(t0 + first_good) : -1;
      p.last_good[slot_index] = last_good >= 0 ? static_cast<std::int32_t>(t0 + last_good) : -1;
    }
  }
  __syncthreads();
  // bad[0] was written before the barrier above and is never rewritten: every thread agrees.
  const bool leading_bad = len > 0 && (bad[0] & 1) != 0;
  if (!p.resolve && leading_bad) return;  // deferred to pass 1, once the stand-in is known
  if (p.resolve) {
    const std::int32_t stand_in = p.source[slot_index];
    if (stand_in >= 0) {
      const std::int64_t off = p.rows.offset(b, head, stand_in);
      for (int c = tid; c < d; c += kThreads) {
        ext_k[c] = kbase[off + c];
        ext_v[c] = vbase[off + c];
      }
    }
    if (tid == 0) {
      const int lead = stand_in >= 0 ? -2 : (stand_in == kSourceFirstInBlock ? misc[2] : -1);
      for (int n = 0; n < len && src[n] == -3; ++n) src[n] = lead;
    }
    __syncthreads();
  }

  // A full block without non-finite or span rows takes the symmetric path (full_block_residual),
  // at the 64-row tile only: at 128 rows it needs over 220 registers (2 CTAs per SM, not 4).
  constexpr bool kSymmetric = kTile == 64;
  const bool full_clean = kSymmetric && clean && len == kTile;

  // 4. The block's basis, zero-padded to kTile columns:
  //    C[k][n] = a_k cos(pi (2n+1) k / (2 len)), the angle reduced mod 2 pi exactly.
  //    The symmetric path reads the first half of each row only.
  const int basis_cols = full_clean ? kTile / 2 : kTile;
  for (int i = tid; i < m * basis_cols; i += kThreads) {
    const int k = i / basis_cols, n = i % basis_cols;
    float value = 0.0f;
    if (n < len) {
      const int r = ((2 * n + 1) * k) % (4 * len);
      const float a = k == 0 ? sqrtf(1.0f / static_cast<float>(len)) : sqrtf(2.0f / static_cast<float>(len));
      value = a * cospif(static_cast<float>(r) / static_cast<float>(2 * len));
    }
    basis[k * kTile + n] = value;
  }
  __syncthreads();

  // 5. Column by column: residual in registers, per-token sums, energies.
  float acc_k[kPerLane], acc_v[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) acc_k[i] = acc_v[i] = 0.0f;
  float k_total = 0, k_high = 0, v_total = 0, v_high = 0;
  const float4* basis4 = reinterpret_cast<const float4*>(basis);
  const int reload = misc[3];  // 0, written before the barrier above (see step 5's update loop)

  for (int c0 = 0; c0 < d; c0 += kThreads) {  // uniform trip count: every lane joins the shuffles
    const int c = c0 + tid;
    const bool active = kHeadDim > 0 || c < d;  // a compiled head dim has one thread per column
#pragma unroll 1
    for (int which = 0; which < 2; ++which) {
      const T* tile = which == 0 ? tile_k : tile_v;
      const T* ext = which == 0 ? ext_k : ext_v;
      float x[kTile];
      float total = 0.0f, high = 0.0f;
      if (full_clean) {  // never at the 128-row tile (kSymmetric): the compiler drops the branch there
        total = full_block_residual<T, kTile>(tile, d, c, active, m, basis4, reload, x);
      } else {
        total = block_residual<T, kTile>(tile, ext, src, bad, d, c, active, len, m, basis4, reload, x, &high);
      }
      transpose_reduce(x, lane);
      const float scale = full_clean ? 0.25f : 1.0f;  // full_block_residual's squares are four times the residual's
      if (full_clean) {
        // Every row counts: the residual's energy is the sum of this lane's token
        // sums (over all lanes, the block's), and the column's total adds it.
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) high += x[i];
        high *= scale;
        total += high;
      }
      if (which == 0) {
        k_total += total;
        k_high += high;
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) acc_k[i] = fmaf(scale, x[i], acc_k[i]);
      } else {
        v_total += total;
        v_high += high;
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) acc_v[i] = fmaf(scale, x[i], acc_v[i]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    part_k[warp * kTile + kPerLane * lane + i] = acc_k[i];
    part_v[warp * kTile + kPerLane * lane + i] = acc_v[i];
  }
  energy[0 * kThreads + tid] = k_total;
  energy[1 * kThreads + tid] = k_high;
  energy[2 * kThreads + tid] = v_total;
  energy[3 * kThreads + tid] = v_high;
  __syncthreads();

  // 6. Scores, the protected count, and the block's energies.
  const std::int64_t row = (std::int64_t{layer} * gridDim.y + head) * p.capacity + p.seq.offset[b] + t0;
  const std::int64_t packed = p.seq.offset[b] + t0;
  const float inv_d = 1.0f / static_cast<float>(d);
  int protected_here = 0;
  for (int n = tid; n < len; n += kThreads) {
    float rk = 0, rv = 0;
    for (int w = 0; w < kWarps; ++w) {
      rk += part_k[w * kTile + n];
      rv += part_v[w * kTile + n];
    }
    const int flags = bad[n];
    const float score = (flags & 1) ? __int_as_float(0x7f800000) : rk * inv_d + rv * inv_d;
    p.scores[row + n] = score;
    // A finite span row is ranked by its 2D score: the grid pass counts it.
    const bool ranked_here = flags != 2;
    protected_here +=
        ((ranked_here && flashcache::rules::always_kept_score(score)) || p.protect(t0 + n, n_seq, packed + n)) ? 1 : 0;
    if (flags & 2) {  // the row the 2D transform reads for this token
      const int s = src[n];
      p.grid_source[row + n] = s >= 0 ? static_cast<std::int32_t>(t0 + s) : (s == -2 ? p.source[slot_index] : -1);
    }
  }
  if (protected_here) atomicAdd(&misc[0], protected_here);  // integer sum: order does not matter
  __syncthreads();
  if (tid < 4) {
    float s = 0.0f;
    for (int i = 0; i < kThreads; ++i) s += energy[tid * kThreads + i];
    reinterpret_cast<float*>(&p.energy_part[slot_index])[tid] = s;
  }
  if (tid == 0) p.protected_part[slot_index] = misc[0];
}

}  // namespace flashcache::gpu::kernels
