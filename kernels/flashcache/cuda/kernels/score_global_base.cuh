#pragma once
// Stage 1, score (global transform) with a base chosen by energy
// (ScoreOptions::base peak or mixed): the three kernels that stand in for
// score_global.cuh's lowpass_kernel between the same two cuFFT calls. They
// reuse its frequency-pair formulas and twiddles.
#include <cub/block/block_scan.cuh>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "flashcache/cuda/kernels/common.cuh"
#include "flashcache/cuda/kernels/radix_select.cuh"
#include "flashcache/cuda/kernels/score_global.cuh"

namespace flashcache::gpu::kernels {

// ---- a base chosen by energy (ScoreOptions::base peak, mixed) -------------------------
// The low-pass path above is the paper's and stays as it is. With a base
// chosen by energy three steps replace lowpass_kernel, between the same two
// cuFFT calls (docs/ALGORITHM.md item 2, score/base.hpp's choose_base_frequencies):
//   base_energy_kernel   per (head, frequency pair (k, N-k)): K's and V's real
//                        DCT-II spectra from Z[k], Z[N-k] exactly as lowpass_kernel
//                        derives them, squared and summed over the head dim in
//                        column order (one thread per pair, no atomics)
//   base_choose_kernel   one CTA per (head, K|V): the base frequencies, a radix
//                        select over the energies' ordered bits as select_kernel's
//                        (ties to the lower frequency), a 0/1 byte per frequency
//   chosen_base_kernel   lowpass_kernel with "k is chosen" for "k < m", K's and
//                        V's own choices
// Energies are compared, not reported: they are kept as N/2 times the
// orthonormal energy, the unscaled sum for k > 0 and half of it for k = 0
// (a_k^2 = (k == 0 ? 1 : 2) / N; halving is exact), so the order is the
// orthonormal one without a rounding step.

// How many of the lowest frequencies every kind keeps before ranking by energy:
// score/base.hpp's base_low_frequencies (host only), the same rule, for the device.
__host__ __device__ constexpr std::int64_t base_low_count(Base kind, std::int64_t m) {
  return kind == Base::lowpass ? m : kind == Base::mixed ? (m + 1) / 2 : 0;
}

// twiddle(k, n) on the device; on the host (the tests' replays) the same angle in double.
__host__ __device__ __forceinline__ float2 base_twiddle(std::int64_t k, std::int64_t n) {
#if defined(__CUDA_ARCH__)
  return twiddle(k, n);
#else
  const double a = -3.14159265358979323846 * static_cast<double>(k) / static_cast<double>(2 * n);
  return make_float2(static_cast<float>(std::cos(a)), static_cast<float>(std::sin(a)));
#endif
}

// The unscaled DCT-II of K (x1) and V (x2) at frequency k and at its partner r,
// from Z[k] and Z[r] (lowpass_kernel's formulas, line for line).
struct DctPair {
  float x1k, x2k, x1r, x2r;
};

__host__ __device__ __forceinline__ DctPair dct_pair(float2 zk, float2 zr, float2 wk, float2 wr) {
  const float2 sum_k = cmul(wk, make_float2(0.5f * (zk.x + zr.x), 0.5f * (zk.y - zr.y)));
  const float2 dif_k = cmul(wk, make_float2(0.5f * (zk.x - zr.x), 0.5f * (zk.y + zr.y)));
  const float2 sum_r = cmul(wr, make_float2(0.5f * (zr.x + zk.x), 0.5f * (zr.y - zk.y)));
  const float2 dif_r = cmul(wr, make_float2(0.5f * (zr.x - zk.x), 0.5f * (zr.y + zk.y)));
  return DctPair{sum_k.x, dif_k.y, sum_r.x, dif_r.y};
}

// Energies of frequencies k and r = N - k (r = 0 for k = 0) of one head:
// e[0], e[1] K's at k and r, e[2], e[3] V's, summed over the head dim in
// column order. `z` is this head's first column, columns n apart.
__host__ __device__ __forceinline__ void base_energy_pair(const float2* z, std::int64_t n, int head_dim, std::int64_t k,
                                                          float e[4]) {
  const std::int64_t r = k == 0 ? 0 : n - k;
  const float2 wk = base_twiddle(k, n), wr = base_twiddle(r, n);
  float ek = 0.0f, er = 0.0f, vk = 0.0f, vr = 0.0f;
  for (int c = 0; c < head_dim; ++c) {
    const float2* col = z + std::int64_t{c} * n;
    const DctPair x = dct_pair(col[k], col[r], wk, wr);
    ek += x.x1k * x.x1k;
    er += x.x1r * x.x1r;
    vk += x.x2k * x.x2k;
    vr += x.x2r * x.x2r;
  }
  const float half_at_zero = k == 0 ? 0.5f : 1.0f;  // a_0^2 = a_k^2 / 2: exact
  e[0] = ek * half_at_zero;
  e[1] = er;
  e[2] = vk * half_at_zero;
  e[3] = vr;
}

// One frequency pair of one column, in place: the chosen coefficients of K
// (keep_k*) and of V (keep_v*) kept, the others zeroed, and the DCT-III input
// spectrum back into z (lowpass_kernel's write-back).
__host__ __device__ __forceinline__ void chosen_base_pair(float2* z, std::int64_t n, std::int64_t k, bool keep_kk,
                                                          bool keep_kr, bool keep_vk, bool keep_vr) {
  const std::int64_t r = k == 0 ? 0 : n - k;
  const float2 wk = base_twiddle(k, n), wr = base_twiddle(r, n);
  const DctPair x = dct_pair(z[k], z[r], wk, wr);
  const float x1k = keep_kk ? x.x1k : 0.0f, x1r = keep_kr ? x.x1r : 0.0f;
  const float x2k = keep_vk ? x.x2k : 0.0f, x2r = keep_vr ? x.x2r : 0.0f;
  if (k == 0) {
    z[0] = cmul(conj(wk), make_float2(x1k, x2k));
    return;
  }
  z[k] = cmul(conj(wk), make_float2(x1k + x2r, x2k - x1r));
  if (r != k) z[r] = cmul(conj(wr), make_float2(x1r + x2k, x2r - x1k));
}

// Float bits as an unsigned key in the float order (common.cuh's ordered_key,
// for the host as well): energies are >= 0, NaN (overflowed input) sorts lowest.
__host__ __device__ __forceinline__ std::uint32_t energy_key(float e) {
  if (e == 0.0f) e = 0.0f;
  if (e != e) return 0u;
#if defined(__CUDA_ARCH__)
  const std::uint32_t u = __float_as_uint(e);
#else
  std::uint32_t u = 0;
  std::memcpy(&u, &e, sizeof u);
#endif
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// What the choice needs besides the energies: the `low` lowest frequencies
// are in the base, then `rest` more, the strongest of frequencies [low, n).
struct BaseCount {
  std::int64_t low = 0, rest = 0;
};
__host__ __device__ __forceinline__ BaseCount base_count(Base kind, std::int64_t n, std::int64_t m) {
  const std::int64_t most = m < n ? m : n;
  const std::int64_t want = base_low_count(kind, m);
  BaseCount b;
  b.low = want < most ? want : most;
  b.rest = most - b.low;
  return b;
}

struct BaseEnergyParams {
  const float2* z = nullptr;  // [heads * head_dim][n], after the forward FFT
  std::int64_t n = 0;
  int head_dim = 0;
  float* energy = nullptr;  // [2][heads][n]: K's, then V's (N/2 x orthonormal)
  const int* status = nullptr;
};

inline constexpr int kBaseEnergyThreads = 256;

// One thread per frequency pair (k, N - k), k = 0 .. N/2, of one head (blockIdx.y).
template <int kOneDefinition = 0>
__global__ void __launch_bounds__(kBaseEnergyThreads) base_energy_kernel(BaseEnergyParams p) {
  if (failed(p.status)) return;  // no barrier in this kernel
  const std::int64_t k = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const std::int64_t n = p.n;
  if (k > n / 2) return;
  const int head = static_cast<int>(blockIdx.y), heads = static_cast<int>(gridDim.y);
  float e[4];
  base_energy_pair(p.z + std::int64_t{head} * p.head_dim * n, n, p.head_dim, k, e);
  float* ek = p.energy + std::int64_t{head} * n;
  float* ev = p.energy + (std::int64_t{heads} + head) * n;
  const std::int64_t r = k == 0 ? 0 : n - k;
  ek[k] = e[0];
  ev[k] = e[2];
  if (r != k) {
    ek[r] = e[1];
    ev[r] = e[3];
  }
}

struct BaseChooseParams {
  const float* energy = nullptr;   // [2][heads][n]
  std::uint8_t* chosen = nullptr;  // [2][heads][n]: 1 = in the base
  std::int64_t n = 0, m = 0;
  Base kind = Base::peak;
  const int* status = nullptr;
};

inline constexpr int kBaseChooseThreads = kRadixThreads;

// One CTA per (head, K | V) (blockIdx.x, blockIdx.y): the low frequencies, then
// the `rest` strongest of the others. The radix select (radix_select.cuh) finds
// the key of the rest-th strongest and how many frequencies with exactly that
// key are taken (the lowest ones); a last pass in frequency order writes every byte.
template <int kOneDefinition = 0>
__global__ void __launch_bounds__(kBaseChooseThreads) base_choose_kernel(BaseChooseParams p) {
  using Scan = RadixScan;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ RadixShared radix;
  const int tid = static_cast<int>(threadIdx.x);
  if (stop_requested(p.status)) return;
  const int heads = static_cast<int>(gridDim.x);
  const std::int64_t row = (std::int64_t{blockIdx.y} * heads + blockIdx.x) * p.n;
  const float* energy = p.energy + row;
  std::uint8_t* chosen = p.chosen + row;
  const std::int64_t n = p.n;
  const BaseCount count = base_count(p.kind, n, p.m);
  const std::int64_t candidates = n - count.low;
  enum { kNone, kAll, kThreshold };
  const int mode = count.rest <= 0 ? kNone : (count.rest >= candidates ? kAll : kThreshold);

  RadixThreshold top;
  if (mode == kThreshold) {
    auto candidate = [&](std::int64_t k, std::uint32_t* key) {
      *key = energy_key(energy[k]);
      return true;
    };
    top = block_radix_select(count.low, n, static_cast<int>(count.rest), candidate, radix, scan_storage);
  }
  const std::uint32_t threshold = top.key;
  const int take_equal = top.take_equal;

  int equal_seen = 0;
  for (std::int64_t base = 0; base < n; base += kBaseChooseThreads) {
    const std::int64_t k = base + tid;
    const bool ranked = k < n && k >= count.low;
    const std::uint32_t key = ranked && mode == kThreshold ? energy_key(energy[k]) : 0u;
    const bool equal = ranked && mode == kThreshold && key == threshold;
    int equal_rank = 0, equal_here = 0;
    Scan(scan_storage).ExclusiveSum(equal ? 1 : 0, equal_rank, equal_here);
    __syncthreads();
    const bool in_base =
        (k < n && k < count.low) || (ranked && mode == kAll) ||
        (ranked && mode == kThreshold && (key > threshold || (equal && equal_seen + equal_rank < take_equal)));
    if (k < n) chosen[k] = in_base ? 1 : 0;
    equal_seen += equal_here;
  }
}

struct ChosenBaseParams {
  float2* z = nullptr;  // [heads * head_dim][n]
  std::int64_t n = 0;
  int heads = 0, head_dim = 0;
  const std::uint8_t* chosen = nullptr;  // [2][heads][n]
  const int* status = nullptr;
};

// lowpass_kernel's launch: one thread per frequency pair, blockIdx.y the column.
template <int kOneDefinition = 0>
__global__ void __launch_bounds__(256) chosen_base_kernel(ChosenBaseParams p) {
  if (failed(p.status)) return;  // no barrier in this kernel
  const std::int64_t k = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const std::int64_t n = p.n;
  if (k > n / 2) return;
  const std::int64_t col = blockIdx.y;
  const std::int64_t head = col / p.head_dim;
  const std::int64_t r = k == 0 ? 0 : n - k;
  const std::uint8_t* ck = p.chosen + head * n;
  const std::uint8_t* cv = p.chosen + (p.heads + head) * n;
  chosen_base_pair(p.z + col * n, n, k, ck[k] != 0, ck[r] != 0, cv[k] != 0, cv[r] != 0);
}

}  // namespace flashcache::gpu::kernels
