#pragma once
// A straightforward GPU decode-attention step, the baseline that the GPU
// benchmark runs over a full and a compressed cache: one query token per
// sequence and query head over a dense cache,
//   out = softmax(q K^T / sqrt(d)) V,
// split over the sequence as FlashDecoding does. The same function as the CPU
// step in bench/decode_attention.hpp; a benchmark baseline, not the library.
//
// Layout. q and out: [batch][query_heads][head_dim] float. K and V: HND per
// sequence, batch-strided: row (sequence b, KV head h, token t) starts at
// element b * seq_stride + h * head_stride + t * head_dim. Every sequence has
// `tokens` rows (a compressed cache is a dense cache of its kept rows).
// GQA: query head j reads KV head j / (query_heads / kv_heads).
//
// Two kernels on the caller's stream, no allocation, no host sync:
//  1. split: one CTA per (split, KV head, sequence) reads its slice of the
//     sequence once; each K/V row is loaded with 16-byte loads and shared by
//     the `group` query heads of its KV head. fp32 online softmax (base 2),
//     and the CTA's warps merge their states in shared memory into one
//     partial (max, sum, acc[group][head_dim]) in the workspace.
//  2. merge: one CTA per (query head, sequence), one thread per element of
//     head_dim, merges the splits' partials and normalises.
//
// Element types: float and flashcache::bfloat16_t. head_dim 64 or 128;
// group (query_heads / kv_heads) 1 to 8.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "flashcache/types.hpp"

namespace flashcache::bench::gpu {

struct DecodeShape {
  int batch = 0;
  int query_heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  std::int64_t tokens = 0;  // rows per sequence and KV head
};

template <class T>
struct DecodeArgs {
  DecodeShape shape;
  const float* q = nullptr;  // device, [batch][query_heads][head_dim]
  const T* k = nullptr;      // device, see the layout above; 16-byte aligned
  const T* v = nullptr;
  std::int64_t seq_stride = 0;   // elements between sequences
  std::int64_t head_stride = 0;  // elements between KV heads (at least tokens * head_dim)
  float* out = nullptr;          // device, [batch][query_heads][head_dim]
  int splits = 1;                // splits of each sequence: decode_splits(), or any value >= 1
};

inline constexpr int kDecodeWarps = 4;     // warps per split CTA
inline constexpr int kDecodeMaxGroup = 8;  // query heads per KV head
inline constexpr int kDecodeMaxSplits = 4096;
inline constexpr std::int64_t kDecodeMinSplitTokens = 128;  // decode_splits() never goes below this per split

namespace detail {

inline constexpr float kLog2e = 1.4426950408889634f;

// Workspace: the partials' (max, sum) pairs, then their accumulators.
inline std::size_t partial_count(const DecodeShape& s, int splits) {
  return static_cast<std::size_t>(s.batch) * static_cast<std::size_t>(s.kv_heads) * static_cast<std::size_t>(splits);
}
inline std::size_t ml_bytes(const DecodeShape& s, int splits) {
  const int group = s.query_heads / s.kv_heads;
  const std::size_t bytes = partial_count(s, splits) * static_cast<std::size_t>(group) * 2 * sizeof(float);
  return (bytes + 255) / 256 * 256;
}

// exp2(x - m) for a state whose max is x, inside a merge whose max is m >= x;
// 0 for an empty state (x = -inf), also when every state is empty.
__device__ __forceinline__ float rescale(float x, float m) { return x == -INFINITY ? 0.0f : exp2f(x - m); }

// 16 bytes of T as floats.
template <class T>
struct Vec;
template <>
struct Vec<float> {
  static constexpr int kElems = 4;
  __device__ __forceinline__ static void load(const float* p, float (&out)[4]) {
    const float4 x = *reinterpret_cast<const float4*>(p);
    out[0] = x.x;
    out[1] = x.y;
    out[2] = x.z;
    out[3] = x.w;
  }
};
template <>
struct Vec<bfloat16_t> {
  static constexpr int kElems = 8;
  __device__ __forceinline__ static void load(const bfloat16_t* p, float (&out)[8]) {
    const uint4 x = *reinterpret_cast<const uint4*>(p);
    const unsigned w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // element 2i is the low half of word i (little endian)
      out[2 * i] = __uint_as_float(w[i] << 16);
      out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  }
};

// Raw 16-byte load, converted later so that all of an iteration's loads are
// in flight before the first use.
template <class T>
__device__ __forceinline__ uint4 load16(const T* p) {
  return *reinterpret_cast<const uint4*>(p);
}
template <class T>
__device__ __forceinline__ void to_floats(const uint4& raw, float (&out)[Vec<T>::kElems]) {
  Vec<T>::load(reinterpret_cast<const T*>(&raw), out);
}

// Kernel 1. Lanes of a warp form rows of C = D / E lanes (E elements of 16
// bytes each); a warp covers RPW = 32 / C consecutive rows per load and U
// loads per iteration, the CTA kDecodeWarps * RPW * U rows. Lanes of one row
// hold identical (max, sum) states, each lane its E columns of acc.
template <class T, int D, int G>
__global__ void __launch_bounds__(kDecodeWarps * 32)
    decode_split_kernel(DecodeArgs<T> a, float* __restrict__ ws_ml, float* __restrict__ ws_acc) {
  constexpr int E = Vec<T>::kElems;
  constexpr int C = D / E;
  constexpr int RPW = 32 / C;
  constexpr int U = 4;
  constexpr int kRowsPerIter = kDecodeWarps * RPW * U;
  static_assert(D % E == 0 && C <= 32 && 32 % C == 0, "a row is a power-of-two number of lanes, at most a warp");

  const int split = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y), b = static_cast<int>(blockIdx.z);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int r = lane / C, c = lane % C;  // row within the warp's load, column chunk
  const std::int64_t n = a.shape.tokens;
  const std::int64_t chunk = (n + a.splits - 1) / a.splits;
  const std::int64_t t0 = split * chunk, t1 = t0 + chunk < n ? t0 + chunk : n;

  // This lane's E columns of the group's queries, scaled so that logits come out in base 2.
  const float qscale = kLog2e / sqrtf(static_cast<float>(D));
  float q[G][E];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const float* qp = a.q + (static_cast<std::int64_t>(b) * a.shape.query_heads + h * G + g) * D + c * E;
#pragma unroll
    for (int e = 0; e < E; e += 4) {
      const float4 x = *reinterpret_cast<const float4*>(qp + e);
      q[g][e] = x.x * qscale;
      q[g][e + 1] = x.y * qscale;
      q[g][e + 2] = x.z * qscale;
      q[g][e + 3] = x.w * qscale;
    }
  }

  float m[G], l[G], acc[G][E];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[g][e] = 0.0f;
  }

  const std::int64_t head = static_cast<std::int64_t>(b) * a.seq_stride + static_cast<std::int64_t>(h) * a.head_stride;
  const T* kh = a.k + head + c * E;
  const T* vh = a.v + head + c * E;
  // The loop bound is the same for the whole CTA, so every shuffle sees all lanes.
  for (std::int64_t base = t0; base < t1; base += kRowsPerIter) {
    uint4 kraw[U], vraw[U];
    bool valid[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const std::int64_t t = base + (u * kDecodeWarps + warp) * RPW + r;
      valid[u] = t < t1;
      kraw[u] = valid[u] ? load16(kh + t * D) : make_uint4(0, 0, 0, 0);
      vraw[u] = valid[u] ? load16(vh + t * D) : make_uint4(0, 0, 0, 0);
    }
    // Logits: a partial dot product per lane, summed over the row's C lanes.
    float s[U][G];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float kf[E];
      to_floats<T>(kraw[u], kf);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < E; ++e) dot = fmaf(q[g][e], kf[e], dot);
#pragma unroll
        for (int off = C / 2; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
        s[u][g] = dot;
      }
    }
    // Online softmax over the iteration's U rows: one rescale per iteration.
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float m_new = m[g];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (valid[u]) m_new = fmaxf(m_new, s[u][g]);
      if (m_new == -INFINITY) continue;  // no row yet: nothing to add
      const float corr = rescale(m[g], m_new);
      l[g] *= corr;
#pragma unroll
      for (int e = 0; e < E; ++e) acc[g][e] *= corr;
      m[g] = m_new;
#pragma unroll
      for (int u = 0; u < U; ++u) s[u][g] = valid[u] ? exp2f(s[u][g] - m_new) : 0.0f;  // now p
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float vf[E];
      to_floats<T>(vraw[u], vf);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        if (m[g] == -INFINITY) continue;  // s[u][g] is still a logit (of no valid row)
        l[g] += s[u][g];
#pragma unroll
        for (int e = 0; e < E; ++e) acc[g][e] = fmaf(s[u][g], vf[e], acc[g][e]);
      }
    }
  }

  // Merge the warp's RPW row states (lanes c, c + C, ...).
#pragma unroll
  for (int off = C; off < 32; off *= 2) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float m_o = __shfl_xor_sync(0xffffffffu, m[g], off);
      const float l_o = __shfl_xor_sync(0xffffffffu, l[g], off);
      const float mm = fmaxf(m[g], m_o);
      const float wa = rescale(m[g], mm), wb = rescale(m_o, mm);
      l[g] = l[g] * wa + l_o * wb;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const float acc_o = __shfl_xor_sync(0xffffffffu, acc[g][e], off);
        acc[g][e] = acc[g][e] * wa + acc_o * wb;
      }
      m[g] = mm;
    }
  }

  // Merge the CTA's warps in shared memory into one partial.
  __shared__ float sm_m[kDecodeWarps][G], sm_l[kDecodeWarps][G];
  __shared__ __align__(16) float sm_acc[kDecodeWarps][G][D];
  if (r == 0) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      if (c == 0) {
        sm_m[warp][g] = m[g];
        sm_l[warp][g] = l[g];
      }
#pragma unroll
      for (int e = 0; e < E; e += 4)
        *reinterpret_cast<float4*>(&sm_acc[warp][g][c * E + e]) =
            make_float4(acc[g][e], acc[g][e + 1], acc[g][e + 2], acc[g][e + 3]);
    }
  }
  __syncthreads();
  const std::size_t p = (static_cast<std::size_t>(b) * a.shape.kv_heads + h) * a.splits + split;
  for (int i = static_cast<int>(threadIdx.x); i < G * D; i += kDecodeWarps * 32) {
    const int g = i / D, d = i % D;
    float mm = -INFINITY;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) mm = fmaxf(mm, sm_m[w][g]);
    float sum = 0.0f, num = 0.0f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) {
      const float wt = rescale(sm_m[w][g], mm);
      sum += sm_l[w][g] * wt;
      num += sm_acc[w][g][d] * wt;
    }
    ws_acc[(p * G + g) * D + d] = num;
    if (d == 0) {
      ws_ml[(p * G + g) * 2] = mm;
      ws_ml[(p * G + g) * 2 + 1] = sum;
    }
  }
}

// Kernel 2: thread d of CTA (query head, sequence) merges element d over the splits.
template <int D>
__global__ void __launch_bounds__(D) decode_merge_kernel(DecodeShape s, int splits, const float* __restrict__ ws_ml,
                                                         const float* __restrict__ ws_acc, float* __restrict__ out) {
  const int qh = static_cast<int>(blockIdx.x), b = static_cast<int>(blockIdx.y), d = static_cast<int>(threadIdx.x);
  const int group = s.query_heads / s.kv_heads, h = qh / group, g = qh % group;
  const std::size_t first = (static_cast<std::size_t>(b) * s.kv_heads + h) * splits;
  float mm = -INFINITY;
  for (int i = 0; i < splits; ++i) mm = fmaxf(mm, ws_ml[((first + i) * group + g) * 2]);
  float sum = 0.0f, num = 0.0f;
  for (int i = 0; i < splits; ++i) {
    const std::size_t p = (first + i) * group + g;
    const float wt = rescale(ws_ml[p * 2], mm);
    sum += ws_ml[p * 2 + 1] * wt;
    num += ws_acc[p * D + d] * wt;
  }
  out[(static_cast<std::size_t>(b) * s.query_heads + qh) * D + d] = sum > 0.0f ? num / sum : 0.0f;
}

// Calls f(kernel 1 instance, kernel 2 instance) for the shape's head_dim and
// group; false when they are not supported.
template <class T, class F>
bool dispatch(const DecodeShape& s, F&& f) {
  const int group = s.kv_heads > 0 ? s.query_heads / s.kv_heads : 0;
  auto by_group = [&](auto dim) {
    constexpr int D = decltype(dim)::value;
    switch (group) {
      case 1:
        f(decode_split_kernel<T, D, 1>, decode_merge_kernel<D>);
        return true;
      case 2:
        f(decode_split_kernel<T, D, 2>, decode_merge_kernel<D>);
        return true;
      case 3:
        f(decode_split_kernel<T, D, 3>, decode_merge_kernel<D>);
        return true;
      case 4:
        f(decode_split_kernel<T, D, 4>, decode_merge_kernel<D>);
        return true;
      case 5:
        f(decode_split_kernel<T, D, 5>, decode_merge_kernel<D>);
        return true;
      case 6:
        f(decode_split_kernel<T, D, 6>, decode_merge_kernel<D>);
        return true;
      case 7:
        f(decode_split_kernel<T, D, 7>, decode_merge_kernel<D>);
        return true;
      case 8:
        f(decode_split_kernel<T, D, 8>, decode_merge_kernel<D>);
        return true;
      default:
        return false;
    }
  };
  if (s.head_dim == 64) return by_group(std::integral_constant<int, 64>{});
  if (s.head_dim == 128) return by_group(std::integral_constant<int, 128>{});
  return false;
}

inline bool shape_ok(const DecodeShape& s) {
  return s.batch >= 0 && s.tokens >= 0 && s.kv_heads > 0 && s.query_heads > 0 && s.query_heads % s.kv_heads == 0 &&
         s.query_heads / s.kv_heads <= kDecodeMaxGroup && (s.head_dim == 64 || s.head_dim == 128) && s.batch <= 65535 &&
         s.kv_heads <= 65535;
}

}  // namespace detail

// Bytes of workspace one call with `splits` splits needs (0 for an unsupported shape).
inline std::size_t decode_workspace_bytes(const DecodeShape& s, int splits) {
  if (!detail::shape_ok(s) || splits < 1) return 0;
  const std::size_t acc = detail::partial_count(s, splits) * static_cast<std::size_t>(s.query_heads / s.kv_heads) *
                          static_cast<std::size_t>(s.head_dim) * sizeof(float);
  return detail::ml_bytes(s, splits) + acc;
}

// A split count that fills the device in one wave of split CTAs, with at
// least kDecodeMinSplitTokens rows per split. Host queries only (no sync).
template <class T>
cudaError_t decode_splits(const DecodeShape& s, int device, int* splits) {
  if (!detail::shape_ok(s) || splits == nullptr) return cudaErrorInvalidValue;
  int sms = 0;
  cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) return e;
  int per_sm = 0;
  detail::dispatch<T>(s, [&](auto split_kernel, auto) {
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, split_kernel, kDecodeWarps * 32, 0);
  });
  if (e != cudaSuccess) return e;
  const std::int64_t pairs = std::max<std::int64_t>(1, static_cast<std::int64_t>(s.batch) * s.kv_heads);
  const std::int64_t wave = static_cast<std::int64_t>(std::max(1, sms)) * std::max(1, per_sm);
  std::int64_t n = std::max<std::int64_t>(1, wave / pairs);
  n = std::min(n, std::max<std::int64_t>(1, (s.tokens + kDecodeMinSplitTokens - 1) / kDecodeMinSplitTokens));
  *splits = static_cast<int>(std::min<std::int64_t>(n, kDecodeMaxSplits));
  return cudaSuccess;
}

// Enqueues the two kernels on `stream`. cudaErrorInvalidValue for an
// unsupported shape, a misaligned pointer or stride, or too small a workspace.
template <class T>
cudaError_t decode_attention_async(const DecodeArgs<T>& a, void* workspace, std::size_t workspace_bytes,
                                   cudaStream_t stream) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, bfloat16_t>, "float or bfloat16_t elements");
  const DecodeShape& s = a.shape;
  if (!detail::shape_ok(s) || a.splits < 1 || a.splits > kDecodeMaxSplits) return cudaErrorInvalidValue;
  if (s.batch == 0) return cudaSuccess;
  constexpr std::int64_t kVec = 16 / static_cast<std::int64_t>(sizeof(T));
  auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  if (a.q == nullptr || a.out == nullptr || !aligned(a.q) || workspace == nullptr || !aligned(workspace))
    return cudaErrorInvalidValue;
  if (s.tokens > 0 && (a.k == nullptr || a.v == nullptr || !aligned(a.k) || !aligned(a.v) || a.seq_stride % kVec != 0 ||
                       a.head_stride % kVec != 0 || a.head_stride < s.tokens * s.head_dim ||
                       (s.batch > 1 && a.seq_stride < s.kv_heads * a.head_stride)))
    return cudaErrorInvalidValue;
  if (workspace_bytes < decode_workspace_bytes(s, a.splits)) return cudaErrorInvalidValue;
  float* ws_ml = static_cast<float*>(workspace);
  float* ws_acc = reinterpret_cast<float*>(static_cast<unsigned char*>(workspace) + detail::ml_bytes(s, a.splits));
  detail::dispatch<T>(s, [&](auto split_kernel, auto merge_kernel) {
    split_kernel<<<dim3(static_cast<unsigned>(a.splits), static_cast<unsigned>(s.kv_heads),
                        static_cast<unsigned>(s.batch)),
                   kDecodeWarps * 32, 0, stream>>>(a, ws_ml, ws_acc);
    merge_kernel<<<dim3(static_cast<unsigned>(s.query_heads), static_cast<unsigned>(s.batch)),
                   static_cast<unsigned>(s.head_dim), 0, stream>>>(s, a.splits, ws_ml, ws_acc, a.out);
  });
  return cudaGetLastError();
}

}  // namespace flashcache::bench::gpu
