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

#include "flashcache/score/fft.hpp"

namespace flashcache {

namespace detail {
// cos(pi * num / den) with num reduced mod 2*den first, so that long
// sequences keep full precision in the angle.
inline double cos_pi_ratio(std::int64_t num, std::int64_t den) {
  const std::int64_t r = num % (2 * den);
  return std::cos(M_PI * static_cast<double>(r) / static_cast<double>(den));
}
}  // namespace detail

// A dense row-major matrix: the bases, coefficients and token tiles of the scorers.
template <class Real>
using RowMatrix = Eigen::Matrix<Real, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// First m rows of the orthonormal DCT-II matrix of length n (m x n).
template <class Real>
RowMatrix<Real> dct_basis(std::int64_t n, std::int64_t m) {
  RowMatrix<Real> c(m, n);
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
      : n_(n), fft_(n), re_(panel(n)), im_(panel(n)), tw_re_(scalars(n)), tw_im_(scalars(n)), scale_(scalars(n)) {
    for (std::int64_t k = 0; k < n_; ++k) {
      const double angle = -M_PI * static_cast<double>(k) / (2.0 * static_cast<double>(n_));  // exp(-i pi k / 2N)
      tw_re_[static_cast<std::size_t>(k)] = static_cast<Real>(std::cos(angle));
      tw_im_[static_cast<std::size_t>(k)] = static_cast<Real>(std::sin(angle));
      scale_[static_cast<std::size_t>(k)] = static_cast<Real>(std::sqrt((k == 0 ? 1.0 : 2.0) / static_cast<double>(n_)));
    }
  }

  std::int64_t size() const { return n_; }

  // Orthonormal DCT-II of the panels x1 (and x2, which may be null) into X1 (X2).
  void forward(const Real* x1, const Real* x2, Real* X1, Real* X2) {
    spectrum_of(x1, x2);
    for (std::int64_t k = 0; k < n_; ++k) {
      const Coefficients c = coefficients(k, k == 0 ? 0 : n_ - k);
      Out{X1 + k* W} = c.c1 * scale_[static_cast<std::size_t>(k)];
      if (X2) Out{X2 + k* W} = c.c2 * scale_[static_cast<std::size_t>(k)];
    }
  }

  // Orthonormal DCT-III (the inverse of forward) of X1 (and X2, may be null).
  void inverse(const Real* X1, const Real* X2, Real* x1, Real* x2) {
    const auto coeff = [&](const Real* X, std::int64_t j) -> Lanes {
      return X && j < n_ ? Lanes(In(X + j * W) / scale_[static_cast<std::size_t>(j)]) : Lanes(Lanes::Zero());
    };
    for (std::int64_t k = 0; k < n_; ++k)
      set_spectrum(k, coeff(X1, k), coeff(X1, n_ - k), coeff(X2, k), coeff(X2, n_ - k));
    inverse_to(x1, x2);
  }

  // Base = C^T diag(k < m) C x for the panels x1 and x2 (x2/base2 may be null).
  void lowpass(const Real* x1, const Real* x2, std::int64_t m, Real* base1, Real* base2) {
    spectrum_of(x1, x2);
    lowpass_spectrum(m);
    inverse_to(base1, base2);
  }

  // The scorer's fused form: adds sum_w (x - base)^2 of each token (row) to
  // residual1[t] and residual2[t], without writing the base anywhere.
  void lowpass_residual(const Real* x1, const Real* x2, std::int64_t m, Real* residual1, Real* residual2) {
    spectrum_of(x1, x2);
    lowpass_spectrum(m);
    fft_.inverse(re_.data(), im_.data());
    const Real inv_n = Real(1) / static_cast<Real>(n_);
    for (std::int64_t j = 0; j < n_; ++j) {
      const std::int64_t s = source(j);
      residual1[s] += (In(x1 + s * W) - In(re_.data() + j * W) * inv_n).square().sum();
      residual2[s] += (In(x2 + s * W) - In(im_.data() + j * W) * inv_n).square().sum();
    }
  }

 private:
  using Lanes = Eigen::Array<Real, W, 1>;
  using In = Eigen::Map<const Lanes>;
  using Out = Eigen::Map<Lanes>;
  struct Coefficients {
    Lanes c1, c2;
  };

  static std::size_t panel(std::int64_t n) { return static_cast<std::size_t>(n * W); }
  static std::size_t scalars(std::int64_t n) { return static_cast<std::size_t>(n); }
  // Makhoul's permutation: v[j] = x[2j] for the first ceil(N/2), then the odd samples reversed.
  std::int64_t source(std::int64_t j) const { return 2 * j < n_ ? 2 * j : 2 * (n_ - 1 - j) + 1; }

  // re_ + i im_ = FFT(v1 + i v2), the permuted inputs packed as one complex sequence.
  void spectrum_of(const Real* x1, const Real* x2) {
    for (std::int64_t j = 0; j < n_; ++j) {
      const std::int64_t s = source(j);
      Out{re_.data() + j * W} = In(x1 + s * W);
      if (x2)
        Out{im_.data() + j * W} = In(x2 + s * W);
      else
        Out{im_.data() + j * W}.setZero();
    }
    fft_.forward(re_.data(), im_.data());
  }

  // Inverse FFT of the spectrum, undo the permutation and the FFT's factor N.
  void inverse_to(Real* x1, Real* x2) {
    fft_.inverse(re_.data(), im_.data());
    const Real inv_n = Real(1) / static_cast<Real>(n_);
    for (std::int64_t j = 0; j < n_; ++j) {
      const std::int64_t s = source(j);
      Out{x1 + s* W} = In(re_.data() + j * W) * inv_n;
      if (x2) Out{x2 + s* W} = In(im_.data() + j * W) * inv_n;
    }
  }

  // Unnormalized coefficients (sum_n x cos(...), no a_k) at k of both inputs, all lanes.
  // Z[k] = (a, b), Z[r] = (c, e) with r = N - k: the inputs' spectra are
  // V1 = (Z[k] + conj Z[r]) / 2 and V2 = (Z[k] - conj Z[r]) / 2i, and X = Re(twiddle V).
  Coefficients coefficients(std::int64_t k, std::int64_t r) const {
    const In a(re_.data() + k * W), b(im_.data() + k * W), c(re_.data() + r * W), e(im_.data() + r * W);
    const Real tr = Real(0.5) * tw_re_[static_cast<std::size_t>(k)], ti = Real(0.5) * tw_im_[static_cast<std::size_t>(k)];
    return {tr * (a + c) - ti * (b - e), tr * (b + e) - ti * (c - a)};
  }

  // Z[k] from unnormalized coefficients p = X[k] and q = X[N-k] (X[N] = 0) of
  // both inputs: V = conj(twiddle) (p - i q), Z = V1 + i V2.
  void set_spectrum(std::int64_t k, const Lanes& p1, const Lanes& q1, const Lanes& p2, const Lanes& q2) {
    const Real tr = tw_re_[static_cast<std::size_t>(k)], ti = -tw_im_[static_cast<std::size_t>(k)];
    Out{re_.data() + k * W} = (tr * p1 + ti * q1) - (ti * p2 - tr * q2);
    Out{im_.data() + k * W} = (ti * p1 - tr * q1) + (tr * p2 + ti * q2);
  }

  // In place: the spectrum of the low-passed inputs (coefficients k >= m zeroed).
  // The pair (k, N-k) is read and written together, so no coefficient buffer is
  // needed; the scaling a_k cancels between the transforms and is never applied.
  void lowpass_spectrum(std::int64_t m) {
    const Lanes zero = Lanes::Zero();
    for (std::int64_t k = 0; 2 * k <= n_; ++k) {
      const std::int64_t r = k == 0 ? 0 : n_ - k;
      const bool keep_k = k<m, keep_r = k> 0 && r < m;
      const Coefficients ck = coefficients(k, r);
      const Coefficients cr = r != k ? coefficients(r, k) : ck;
      const Lanes& p1 = keep_k ? ck.c1 : zero;
      const Lanes& p2 = keep_k ? ck.c2 : zero;
      const Lanes& q1 = keep_r ? cr.c1 : zero;
      const Lanes& q2 = keep_r ? cr.c2 : zero;
      set_spectrum(k, p1, q1, p2, q2);
      if (r != k) set_spectrum(r, q1, p1, q2, p2);
    }
  }

  std::int64_t n_;
  PanelFft<Real, W> fft_;
  std::vector<Real> re_, im_;  // the FFT panel
  std::vector<Real> tw_re_, tw_im_, scale_;
};

}  // namespace flashcache
