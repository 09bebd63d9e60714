#pragma once
// One column of score_blocked_kernel's block (score_blocked.cuh): its residual
// against the block's truncated DCT basis, in registers, and the warp
// "transpose-reduce" that sums the columns' squared residuals per token; and
// the test of 16-byte loads for NaN and infinity that the kernel's load uses.
#include <cstdint>

#include "flashcache/cuda/kernels/common.cuh"

namespace flashcache::gpu::kernels {

// Sums a kN-value register array over the 32 lanes of a warp by recursive
// halving: afterwards x[i], i < kN/32, holds the sum for index i + (kN/32) * lane.
template <int kN, int kHalf, int kOffset>
__device__ __forceinline__ void transpose_reduce_step(float (&x)[kN], int lane) {
  const bool upper = (lane & kOffset) != 0;
  // A group of shuffles issued before the first add waits on one; groups of at
  // most 16 past 64 values, so that the received values do not take the kernel
  // past its registers (at 128 values a whole step's 64 would).
  constexpr int kGroup = kN > 64 && kHalf > 16 ? 16 : kHalf;
#pragma unroll
  for (int i0 = 0; i0 < kHalf; i0 += kGroup) {
    float got[kGroup];
#pragma unroll
    for (int i = 0; i < kGroup; ++i)
      got[i] = __shfl_xor_sync(0xffffffffu, upper ? x[i0 + i] : x[i0 + i + kHalf], kOffset);
#pragma unroll
    for (int i = 0; i < kGroup; ++i) x[i0 + i] = (upper ? x[i0 + i + kHalf] : x[i0 + i]) + got[i];
  }
  if constexpr (kOffset > 1) transpose_reduce_step<kN, kHalf / 2, kOffset / 2>(x, lane);
}

template <int kN>
__device__ __forceinline__ void transpose_reduce(float (&x)[kN], int lane) {
  static_assert(kN >= 32 && (kN & (kN - 1)) == 0, "a power of two of at least 32 values");
  transpose_reduce_step<kN, kN / 2, 16>(x, lane);
}

// Exponent bits of every element packed in a 32-bit word, one unit of the
// exponent, and each element's top bit: an element is NaN or infinite exactly
// when its exponent is all ones, and adding one unit to the masked exponent
// then carries into its top bit (never past it, so elements do not mix).
template <class T>
struct PackedExponent;
template <>
struct PackedExponent<float> {
  static constexpr std::uint32_t kMask = 0x7F800000u, kUnit = 0x00800000u, kTop = 0x80000000u;
};
template <>
struct PackedExponent<flashcache::half_t> {
  static constexpr std::uint32_t kMask = 0x7C007C00u, kUnit = 0x04000400u, kTop = 0x80008000u;
};
template <>
struct PackedExponent<flashcache::bfloat16_t> {
  static constexpr std::uint32_t kMask = 0x7F807F80u, kUnit = 0x00800080u, kTop = 0x80008000u;
};

// Do a K and a V 16-byte load hold a NaN or an infinity? Three integer
// operations per word, where converting and testing each element would take
// several each.
template <class T>
__device__ __forceinline__ bool has_non_finite(const uint4& k, const uint4& v) {
  using E = PackedExponent<T>;
  auto carry = [](std::uint32_t w) { return (w & E::kMask) + E::kUnit; };
  const std::uint32_t any =
      carry(k.x) | carry(k.y) | carry(k.z) | carry(k.w) | carry(v.x) | carry(v.y) | carry(v.z) | carry(v.w);
  return (any & E::kTop) != 0;
}

// One step of full_block_residual: frequency k (even: its row `even` of the
// basis) folded out of s, and with kPair frequency k + 1 (odd: the next row)
// out of t. Adds their coefficients' energy to *kept.
template <bool kPair, int kHalf>
__device__ __forceinline__ void fold_frequencies(float (&s)[kHalf], float (&t)[kHalf], const float4* even, int reload,
                                                 float* kept) {
  constexpr int kRow4 = kHalf / 2;  // float4s per basis row (kTile floats)
  const float4* odd = even + kRow4;
  const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float e0 = 0, e1 = 0, e2 = 0, e3 = 0, o0 = 0, o1 = 0, o2 = 0, o3 = 0;
  // Each step's basis is read one step ahead: no multiply-add waits on its own load.
  float4 we = even[0], wo = kPair ? odd[0] : zero;
#pragma unroll
  for (int q = 0; q < kHalf / 4; ++q) {
    const bool ahead = q + 1 < kHalf / 4;
    const float4 ne = ahead ? even[q + 1] : we, no = kPair && ahead ? odd[q + 1] : wo;
    e0 = fmaf(we.x, s[4 * q], e0);
    e1 = fmaf(we.y, s[4 * q + 1], e1);
    e2 = fmaf(we.z, s[4 * q + 2], e2);
    e3 = fmaf(we.w, s[4 * q + 3], e3);
    if constexpr (kPair) {
      o0 = fmaf(wo.x, t[4 * q], o0);
      o1 = fmaf(wo.y, t[4 * q + 1], o1);
      o2 = fmaf(wo.z, t[4 * q + 2], o2);
      o3 = fmaf(wo.w, t[4 * q + 3], o3);
    }
    we = ne;
    wo = no;
  }
  const float ye = (e0 + e1) + (e2 + e3), yo = (o0 + o1) + (o2 + o3);
  *kept = fmaf(ye, ye, fmaf(yo, yo, *kept));
  const float minus_2ye = -2.0f * ye, minus_2yo = -2.0f * yo;  // negated once, not in every multiply-add
  // The basis read again, `reload` as in the general loop (block_residual): no row held in registers.
  we = even[reload];
  wo = kPair ? odd[reload] : zero;
#pragma unroll
  for (int q = 0; q < kHalf / 4; ++q) {
    const bool ahead = q + 1 < kHalf / 4;
    const float4 ne = ahead ? even[q + 1 + reload] : we, no = kPair && ahead ? odd[q + 1 + reload] : wo;
    s[4 * q] = fmaf(we.x, minus_2ye, s[4 * q]);
    s[4 * q + 1] = fmaf(we.y, minus_2ye, s[4 * q + 1]);
    s[4 * q + 2] = fmaf(we.z, minus_2ye, s[4 * q + 2]);
    s[4 * q + 3] = fmaf(we.w, minus_2ye, s[4 * q + 3]);
    if constexpr (kPair) {
      t[4 * q] = fmaf(wo.x, minus_2yo, t[4 * q]);
      t[4 * q + 1] = fmaf(wo.y, minus_2yo, t[4 * q + 1]);
      t[4 * q + 2] = fmaf(wo.z, minus_2yo, t[4 * q + 2]);
      t[4 * q + 3] = fmaf(wo.w, minus_2yo, t[4 * q + 3]);
    }
    we = ne;
    wo = no;
  }
}

// The residual of one column of a full, clean block (kTile rows, all finite),
// by the DCT's symmetry: C[k][kTile-1-n] = (-1)^k C[k][n]. With
// s[n] = x[n] + x[kTile-1-n] and t[n] = x[n] - x[kTile-1-n] (n < kTile/2), an even
// frequency reads and changes only s, an odd one only t, each over half the
// rows: half the multiply-adds and basis reads of the general loop. Leaves FOUR
// times the squared residuals in sq[] ((s +- t)^2: the caller scales the sums
// once instead of every element) and returns the energy of the column's kept
// frequencies: by Parseval, its sum of squares is that plus the residual's.
template <class T, int kTile>
__device__ __forceinline__ float full_block_residual(const T* tile, int d, int c, bool active, int m,
                                                     const float4* basis4, int reload, float (&sq)[kTile]) {
  constexpr int kHalf = kTile / 2, kRow4 = kTile / 4;
  float s[kHalf], t[kHalf];
  T raw[kTile];  // every load issued before the first use: no wait on each one in turn
#pragma unroll
  for (int n = 0; n < kTile; ++n) raw[n] = active ? tile[n * d + c] : T{};
#pragma unroll
  for (int n = 0; n < kHalf; ++n) {
    const float a = load_float(raw[n]), b = load_float(raw[kTile - 1 - n]);
    s[n] = a + b;
    t[n] = a - b;
  }
  // x -= y_k C_k on both halves at once: the folded half loses 2 y_k C_k. An
  // even and an odd frequency at a time (independent: s and t), for twice the
  // instructions in flight; an odd count ends with an even one alone.
  float kept = 0.0f;
  int k = 0;
  for (; k + 1 < m; k += 2) fold_frequencies<true, kHalf>(s, t, basis4 + k * kRow4, reload, &kept);
  if (k < m) fold_frequencies<false, kHalf>(s, t, basis4 + k * kRow4, reload, &kept);
#pragma unroll
  for (int n = 0; n < kHalf; ++n) {
    const float lo = s[n] + t[n], hi = s[n] - t[n];  // twice the residuals of rows n and kTile-1-n
    sq[n] = lo * lo;
    sq[kTile - 1 - n] = hi * hi;
  }
  return kept;
}

// The residual of one column of any block: rows read through src (a stand-in
// for a non-finite one), the non-finite and span rows left out of the column's
// energies. Leaves the squared residuals in x[], adds the finite rows' squared
// residuals outside the spans to *high and returns their sum of squares of x.
template <class T, int kTile>
__device__ __forceinline__ float block_residual(const T* tile, const T* ext, const int* src, const int* bad, int d,
                                                int c, bool active, int len, int m, const float4* basis4, int reload,
                                                float (&x)[kTile], float* high) {
  float total = 0.0f;
#pragma unroll
  for (int n = 0; n < kTile; ++n) {
    float value = 0.0f;
    if (active && n < len) {
      const int s = src[n];
      value = s >= 0 ? load_float(tile[s * d + c]) : (s == -2 ? load_float(ext[c]) : 0.0f);
      if (!(bad[n] & 1)) total += value * value;
    }
    x[n] = value;
  }
  // No `n < len` guards: past len the basis and x are zero, so the padded
  // columns add nothing to y_k and stay zero (predicates would cost more
  // than the FMAs they skip, and only the last block of a sequence is short).
  for (int k = 0; k < m; ++k) {
    float y0 = 0, y1 = 0, y2 = 0, y3 = 0;
#pragma unroll
    for (int q = 0; q < kTile / 4; ++q) {
      const float4 w = basis4[k * (kTile / 4) + q];
      y0 = fmaf(w.x, x[4 * q], y0);
      y1 = fmaf(w.y, x[4 * q + 1], y1);
      y2 = fmaf(w.z, x[4 * q + 2], y2);
      y3 = fmaf(w.w, x[4 * q + 3], y3);
    }
    const float minus_y = -((y0 + y1) + (y2 + y3));  // negated once, not in every multiply-add
    // Read the basis again below rather than keep its row live in registers
    // across both loops (at kTile 128 that spills; at 64 it takes the kernel
    // past 128 registers, 4 CTAs per SM to 3): `reload` is 0, but the compiler
    // cannot know it, so the loads are not merged.
#pragma unroll
    for (int q = 0; q < kTile / 4; ++q) {
      const float4 w = basis4[k * (kTile / 4) + q + reload];
      x[4 * q] = fmaf(w.x, minus_y, x[4 * q]);
      x[4 * q + 1] = fmaf(w.y, minus_y, x[4 * q + 1]);
      x[4 * q + 2] = fmaf(w.z, minus_y, x[4 * q + 2]);
      x[4 * q + 3] = fmaf(w.w, minus_y, x[4 * q + 3]);
    }
  }
#pragma unroll
  for (int n = 0; n < kTile; ++n) {
    x[n] = x[n] * x[n];                     // zero for padding rows and inactive lanes
    if (n < len && !bad[n]) *high += x[n];  // finite rows outside the spans
  }
  return total;
}

}  // namespace flashcache::gpu::kernels
