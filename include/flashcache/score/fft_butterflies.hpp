#pragma once
// The vectorised butterflies of PanelFft's Stockham stages (fft.hpp): radices
// 2, 4, 3 and 5 on W lanes at once, as fixed-size Eigen arrays, so the code is
// vector code on any SIMD width. The generic p-point DFT and the Bluestein
// stage stay in PanelFft, which owns their scratch.
#include <Eigen/Core>

#include <cstddef>
#include <cstdint>

#include "flashcache/config.hpp"

namespace flashcache {
namespace detail {

// One Stockham stage: a radix-p stage combines p residue classes.
struct FftStage {
  int radix;
  std::int64_t span;    // L: length of the DFTs already done
  std::int64_t stride;  // R': residue classes after this stage
  std::size_t twiddle;  // offset into twiddle tables: (radix - 1) entries per k < L
  std::size_t roots;    // offset into the radix's own roots of unity (generic radices)
};

template <class Real, int W>
void fft_radix2(const FftStage& st, const Real* tw_re, const Real* tw_im, const Real* FLASHCACHE_RESTRICT xr,
                const Real* FLASHCACHE_RESTRICT xi, Real* FLASHCACHE_RESTRICT yr, Real* FLASHCACHE_RESTRICT yi) {
  using Lanes = Eigen::Array<Real, W, 1>;
  using In = Eigen::Map<const Lanes>;
  using Out = Eigen::Map<Lanes>;
  const std::int64_t L = st.span, Rn = st.stride, R = Rn * 2;
  const std::int64_t q = Rn * W, s = L * Rn * W;  // input and output distances
  for (std::int64_t k = 0; k < L; ++k) {
    const Real wr = tw_re[st.twiddle + static_cast<std::size_t>(k)];
    const Real wi = tw_im[st.twiddle + static_cast<std::size_t>(k)];
    for (std::int64_t r = 0; r < Rn; ++r) {
      const Real* FLASHCACHE_RESTRICT ir = xr + (k * R + r) * W;
      const Real* FLASHCACHE_RESTRICT ii = xi + (k * R + r) * W;
      Real* FLASHCACHE_RESTRICT o_r = yr + (k * Rn + r) * W;
      Real* FLASHCACHE_RESTRICT o_i = yi + (k * Rn + r) * W;
      const Lanes ar = In(ir), ai = In(ii), b_r = In(ir + q), b_i = In(ii + q);
      const Lanes br = b_r * wr - b_i * wi, bi = b_r * wi + b_i * wr;
      Out{o_r} = ar + br;
      Out{o_i} = ai + bi;
      Out{o_r + s} = ar - br;
      Out{o_i + s} = ai - bi;
    }
  }
}

template <class Real, int W>
void fft_radix4(const FftStage& st, const Real* tw_re, const Real* tw_im, const Real* FLASHCACHE_RESTRICT xr,
                const Real* FLASHCACHE_RESTRICT xi, Real* FLASHCACHE_RESTRICT yr, Real* FLASHCACHE_RESTRICT yi) {
  using Lanes = Eigen::Array<Real, W, 1>;
  const std::int64_t L = st.span, Rn = st.stride, R = Rn * 4;
  const std::int64_t q = Rn * W;      // distance between the four inputs
  const std::int64_t s = L * Rn * W;  // distance between the four outputs
  using In = Eigen::Map<const Lanes>;
  using Out = Eigen::Map<Lanes>;
  for (std::int64_t k = 0; k < L; ++k) {
    const std::size_t t = st.twiddle + static_cast<std::size_t>(3 * k);
    const Real w1r = tw_re[t], w1i = tw_im[t], w2r = tw_re[t + 1], w2i = tw_im[t + 1];
    const Real w3r = tw_re[t + 2], w3i = tw_im[t + 2];
    for (std::int64_t r = 0; r < Rn; ++r) {
      const Real* FLASHCACHE_RESTRICT i0r = xr + (k * R + r) * W;
      const Real* FLASHCACHE_RESTRICT i0i = xi + (k * R + r) * W;
      Real* FLASHCACHE_RESTRICT o0r = yr + (k * Rn + r) * W;
      Real* FLASHCACHE_RESTRICT o0i = yi + (k * Rn + r) * W;
      // One radix-4 butterfly on W lanes as fixed-size Eigen arrays: vector code on any SIMD width.
      const Lanes a0r = In(i0r), a0i = In(i0i);
      const Lanes b1r = In(i0r + q), b1i = In(i0i + q), b2r = In(i0r + 2 * q), b2i = In(i0i + 2 * q);
      const Lanes b3r = In(i0r + 3 * q), b3i = In(i0i + 3 * q);
      const Lanes a1r = b1r * w1r - b1i * w1i, a1i = b1r * w1i + b1i * w1r;
      const Lanes a2r = b2r * w2r - b2i * w2i, a2i = b2r * w2i + b2i * w2r;
      const Lanes a3r = b3r * w3r - b3i * w3i, a3i = b3r * w3i + b3i * w3r;
      const Lanes s02r = a0r + a2r, s02i = a0i + a2i, d02r = a0r - a2r, d02i = a0i - a2i;
      const Lanes s13r = a1r + a3r, s13i = a1i + a3i, d13r = a1r - a3r, d13i = a1i - a3i;
      Out{o0r} = s02r + s13r;
      Out{o0i} = s02i + s13i;
      Out{o0r + 2 * s} = s02r - s13r;
      Out{o0i + 2 * s} = s02i - s13i;
      // w_4 = -i: outputs 1 and 3 add / subtract -i (a1 - a3).
      Out{o0r + s} = d02r + d13i;
      Out{o0i + s} = d02i - d13r;
      Out{o0r + 3 * s} = d02r - d13i;
      Out{o0i + 3 * s} = d02i + d13r;
    }
  }
}

// Radices 3 and 5 share their loops; each twiddles its inputs a_1..a_{P-1}, then:
//  3: with w = exp(-2 pi i / 3) = -1/2 - i s, s = sqrt(3)/2, and d = a1 - a2,
//     Y0 = a0 + a1 + a2,  Y1 = a0 - (a1 + a2) / 2 - i s d,  Y2 = a0 - (a1 + a2) / 2 + i s d;
//  5: with c_j = cos(2 pi j / 5), s_j = sin(2 pi j / 5), b = a1 + a4, b' = a2 + a3,
//     d = a1 - a4, d' = a2 - a3:
//     Y0 = a0 + b + b',  Y1,4 = (a0 + c1 b + c2 b') -/+ i (s1 d + s2 d'),
//     Y2,3 = (a0 + c2 b + c1 b') -/+ i (s2 d - s1 d').
template <int P, class Real, int W>
void fft_radix_odd(const FftStage& st, const Real* tw_re, const Real* tw_im, const Real* FLASHCACHE_RESTRICT xr,
                   const Real* FLASHCACHE_RESTRICT xi, Real* FLASHCACHE_RESTRICT yr, Real* FLASHCACHE_RESTRICT yi) {
  static_assert(P == 3 || P == 5, "radix 3 or 5");
  using Lanes = Eigen::Array<Real, W, 1>;
  using In = Eigen::Map<const Lanes>;
  using Out = Eigen::Map<Lanes>;
  const std::int64_t L = st.span, Rn = st.stride, R = Rn * P;
  const std::int64_t q = Rn * W, s = L * Rn * W;
  for (std::int64_t k = 0; k < L; ++k) {
    const std::size_t t = st.twiddle + static_cast<std::size_t>((P - 1) * k);
    for (std::int64_t r = 0; r < Rn; ++r) {
      const Real* FLASHCACHE_RESTRICT ir = xr + (k * R + r) * W;
      const Real* FLASHCACHE_RESTRICT ii = xi + (k * R + r) * W;
      Real* FLASHCACHE_RESTRICT o_r = yr + (k * Rn + r) * W;
      Real* FLASHCACHE_RESTRICT o_i = yi + (k * Rn + r) * W;
      Lanes ar[static_cast<std::size_t>(P)], ai[static_cast<std::size_t>(P)];
      ar[0] = In(ir);
      ai[0] = In(ii);
      for (int j = 1; j < P; ++j) {
        const Lanes br = In(ir + j * q), bi = In(ii + j * q);
        const Real wr = tw_re[t + static_cast<std::size_t>(j - 1)], wi = tw_im[t + static_cast<std::size_t>(j - 1)];
        ar[j] = br * wr - bi * wi;
        ai[j] = br * wi + bi * wr;
      }
      if constexpr (P == 3) {
        const Real sin60 = static_cast<Real>(0.86602540378443864676);
        const Lanes sr = ar[1] + ar[2], si = ai[1] + ai[2], dr = (ar[1] - ar[2]) * sin60, di = (ai[1] - ai[2]) * sin60;
        const Lanes hr = ar[0] - Real(0.5) * sr, hi = ai[0] - Real(0.5) * si;
        Out{o_r} = ar[0] + sr;
        Out{o_i} = ai[0] + si;
        Out{o_r + s} = hr + di;  // -i s d = s di - i s dr
        Out{o_i + s} = hi - dr;
        Out{o_r + 2 * s} = hr - di;
        Out{o_i + 2 * s} = hi + dr;
      } else {
        const Real c1 = static_cast<Real>(0.30901699437494742410), c2 = static_cast<Real>(-0.80901699437494742410);
        const Real s1 = static_cast<Real>(0.95105651629515357212), s2 = static_cast<Real>(0.58778525229247312917);
        const Lanes br = ar[1] + ar[4], bi = ai[1] + ai[4], b2r = ar[2] + ar[3], b2i = ai[2] + ai[3];
        const Lanes dr = ar[1] - ar[4], di = ai[1] - ai[4], d2r = ar[2] - ar[3], d2i = ai[2] - ai[3];
        const Lanes t1r = ar[0] + c1 * br + c2 * b2r, t1i = ai[0] + c1 * bi + c2 * b2i;
        const Lanes t2r = ar[0] + c2 * br + c1 * b2r, t2i = ai[0] + c2 * bi + c1 * b2i;
        const Lanes u1r = s1 * dr + s2 * d2r, u1i = s1 * di + s2 * d2i;
        const Lanes u2r = s2 * dr - s1 * d2r, u2i = s2 * di - s1 * d2i;
        Out{o_r} = ar[0] + br + b2r;
        Out{o_i} = ai[0] + bi + b2i;
        Out{o_r + s} = t1r + u1i;  // -i u = u_i - i u_r
        Out{o_i + s} = t1i - u1r;
        Out{o_r + 4 * s} = t1r - u1i;
        Out{o_i + 4 * s} = t1i + u1r;
        Out{o_r + 2 * s} = t2r + u2i;
        Out{o_i + 2 * s} = t2i - u2r;
        Out{o_r + 3 * s} = t2r - u2i;
        Out{o_i + 3 * s} = t2i + u2r;
      }
    }
  }
}

}  // namespace detail
}  // namespace flashcache
