#pragma once
// Orthonormal DCT-II / DCT-III along the token axis, and the low-pass filter
// that yields the smooth Base KV (CPU).
//
//   X[k] = a_k sum_n x[n] cos(pi (2n + 1) k / (2N)),  a_0 = sqrt(1/N), a_k = sqrt(2/N)
//
// Dct transforms whole sequences in O(N log N) with Makhoul's reordering: a
// DCT-II of length N is one complex FFT of length N of the even/odd-permuted
// input plus a twiddle. Two real sequences share one complex FFT (one in the
// real part, one in the imaginary part): that is how K and V travel together.
// Data come in panels of W columns ([N][W], see fft.hpp), so W head-dim
// columns are transformed at once. dct_basis() gives the explicit basis for
// short blocks, where a small matrix product beats an FFT.
#include <Eigen/Core>

#include <cmath>
#include <cstdint>
#include <vector>

#include "fft.hpp"

namespace flashcache {

namespace detail {
// cos(pi * num / den) with num reduced mod 2*den first, so that long
// sequences keep full precision in the angle.
inline double cos_pi_ratio(std::int64_t num, std::int64_t den) {
  const std::int64_t r = num % (2 * den);
  return std::cos(M_PI * static_cast<double>(r) / static_cast<double>(den));
}
}  // namespace detail

// First m rows of the orthonormal DCT-II matrix of length n (m x n).
template <class Real>
Eigen::Matrix<Real, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> dct_basis(std::int64_t n, std::int64_t m) {
  Eigen::Matrix<Real, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> c(m, n);
  for (std::int64_t k = 0; k < m; ++k) {
    const double a = std::sqrt((k == 0 ? 1.0 : 2.0) / static_cast<double>(n));
    for (std::int64_t j = 0; j < n; ++j) c(k, j) = static_cast<Real>(a * detail::cos_pi_ratio((2 * j + 1) * k, 2 * n));
  }
  return c;
}

template <class Real, int W = 1>
class Dct {
 public:
  explicit Dct(std::int64_t n)
      : n_(n),
        fft_(n),
        re_(size(n)),
        im_(size(n)),
        c1_(size(n)),
        c2_(size(n)),
        tw_re_(scalar(n)),
        tw_im_(scalar(n)),
        scale_(scalar(n)) {
    for (std::int64_t k = 0; k < n_; ++k) {
      const double angle = -M_PI * static_cast<double>(k) / (2.0 * static_cast<double>(n_));  // exp(-i pi k / 2N)
      tw_re_[k] = static_cast<Real>(std::cos(angle));
      tw_im_[k] = static_cast<Real>(std::sin(angle));
      scale_[k] = static_cast<Real>(std::sqrt((k == 0 ? 1.0 : 2.0) / static_cast<double>(n_)));
    }
  }

  std::int64_t size() const { return n_; }

  // Orthonormal DCT-II of the panels x1 (and x2, which may be null) into X1 (X2).
  void forward(const Real* x1, const Real* x2, Real* X1, Real* X2) {
    unnormalized_forward(x1, x2);
    for (std::int64_t k = 0; k < n_; ++k)
      for (int w = 0; w < W; ++w) {
        X1[k * W + w] = c1_[k * W + w] * scale_[k];
        if (X2) X2[k * W + w] = c2_[k * W + w] * scale_[k];
      }
  }

  // Orthonormal DCT-III (the inverse of forward) of X1 (and X2, may be null).
  void inverse(const Real* X1, const Real* X2, Real* x1, Real* x2) {
    for (std::int64_t k = 0; k < n_; ++k)
      for (int w = 0; w < W; ++w) {
        c1_[k * W + w] = X1[k * W + w] / scale_[k];
        c2_[k * W + w] = X2 ? X2[k * W + w] / scale_[k] : Real(0);
      }
    unnormalized_inverse(n_, x1, x2);
  }

  // Base = C^T diag(k < m) C x for the panels x1 and x2 (x2/base2 may be null).
  // The scaling a_k cancels between the two transforms, so it is never applied.
  void lowpass(const Real* x1, const Real* x2, std::int64_t m, Real* base1, Real* base2) {
    unnormalized_forward(x1, x2);
    unnormalized_inverse(m, base1, base2);
  }

 private:
  static std::size_t size(std::int64_t n) { return static_cast<std::size_t>(n * W); }
  static std::size_t scalar(std::int64_t n) { return static_cast<std::size_t>(n); }
  // Makhoul's permutation: v[j] = x[2j] for the first ceil(N/2), then the odd samples reversed.
  std::int64_t source(std::int64_t j) const { return 2 * j < n_ ? 2 * j : 2 * (n_ - 1 - j) + 1; }

  // c1, c2 = sum_n x cos(pi (2n+1) k / 2N), without a_k.
  void unnormalized_forward(const Real* x1, const Real* x2) {
    for (std::int64_t j = 0; j < n_; ++j) {
      const std::int64_t s = source(j);
      for (int w = 0; w < W; ++w) {
        re_[j * W + w] = x1[s * W + w];
        im_[j * W + w] = x2 ? x2[s * W + w] : Real(0);
      }
    }
    fft_.forward(re_.data(), im_.data());
    for (std::int64_t k = 0; k < n_; ++k) {
      const std::int64_t r = k == 0 ? 0 : n_ - k;
      const Real tr = tw_re_[k] * Real(0.5), ti = tw_im_[k] * Real(0.5);
      for (int w = 0; w < W; ++w) {
        // Z[k] = (a, b), Z[N-k] = (c, e): the two real inputs' spectra are
        // V1 = (Z[k] + conj Z[N-k]) / 2 and V2 = (Z[k] - conj Z[N-k]) / 2i.
        const Real a = re_[k * W + w], b = im_[k * W + w], c = re_[r * W + w], e = im_[r * W + w];
        c1_[k * W + w] = tr * (a + c) - ti * (b - e);
        c2_[k * W + w] = tr * (b + e) - ti * (c - a);
      }
    }
  }

  // x1, x2 from c1, c2 (unnormalized coefficients), using only k < m.
  void unnormalized_inverse(std::int64_t m, Real* x1, Real* x2) {
    const Real inv_n = Real(1) / static_cast<Real>(n_);
    for (std::int64_t k = 0; k < n_; ++k) {
      const std::int64_t r = n_ - k;  // the partner coefficient X[N-k]; X[N] = 0
      const bool keep_k = k<m, keep_r = k> 0 && r < m;
      const Real tr = tw_re_[k], ti = -tw_im_[k];  // conj(twiddle)
      for (int w = 0; w < W; ++w) {
        // V = conj(tw) (X[k] - i X[N-k]) for each input; Z = V1 + i V2.
        const Real p1 = keep_k ? c1_[k * W + w] : Real(0), q1 = keep_r ? c1_[r * W + w] : Real(0);
        const Real p2 = keep_k ? c2_[k * W + w] : Real(0), q2 = keep_r ? c2_[r * W + w] : Real(0);
        const Real v1r = tr * p1 + ti * q1, v1i = ti * p1 - tr * q1;
        const Real v2r = tr * p2 + ti * q2, v2i = ti * p2 - tr * q2;
        re_[k * W + w] = v1r - v2i;
        im_[k * W + w] = v1i + v2r;
      }
    }
    fft_.inverse(re_.data(), im_.data());
    for (std::int64_t j = 0; j < n_; ++j) {
      const std::int64_t s = source(j);
      for (int w = 0; w < W; ++w) {
        x1[s * W + w] = re_[j * W + w] * inv_n;
        if (x2) x2[s * W + w] = im_[j * W + w] * inv_n;
      }
    }
  }

  std::int64_t n_;
  PanelFft<Real, W> fft_;
  std::vector<Real> re_, im_, c1_, c2_;  // FFT panel and unnormalized coefficients
  std::vector<Real> tw_re_, tw_im_, scale_;
};

}  // namespace flashcache
