#pragma once
// Orthonormal DCT-II / DCT-III along the token axis, and the low-pass filter
// that yields the smooth Base KV (CPU).
//
//   X[k] = a_k sum_n x[n] cos(pi (2n + 1) k / (2N)),  a_0 = sqrt(1/N), a_k = sqrt(2/N)
//
// Dct transforms whole sequences in O(N log N) with Makhoul's reordering: a
// DCT-II of length N is one complex FFT of length N of the even/odd-permuted
// input plus a twiddle. Two real columns share one complex FFT (one in the
// real part, one in the imaginary part), which is how K and V travel together.
// dct_basis() gives the explicit basis for short blocks, where a small matrix
// product beats an FFT.
#include <Eigen/Core>

#include <cmath>
#include <complex>
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
Eigen::Matrix<Real, Eigen::Dynamic, Eigen::Dynamic> dct_basis(std::int64_t n, std::int64_t m) {
  Eigen::Matrix<Real, Eigen::Dynamic, Eigen::Dynamic> c(m, n);
  for (std::int64_t k = 0; k < m; ++k) {
    const double a = std::sqrt((k == 0 ? 1.0 : 2.0) / static_cast<double>(n));
    for (std::int64_t j = 0; j < n; ++j) c(k, j) = static_cast<Real>(a * detail::cos_pi_ratio((2 * j + 1) * k, 2 * n));
  }
  return c;
}

template <class Real>
class Dct {
 public:
  using Complex = std::complex<Real>;

  explicit Dct(std::int64_t n)
      : n_(n),
        fft_(n),
        z_(static_cast<std::size_t>(n)),
        spectrum_(static_cast<std::size_t>(n)),
        twiddle_(static_cast<std::size_t>(n)),
        scale_(static_cast<std::size_t>(n)) {
    for (std::int64_t k = 0; k < n_; ++k) {
      // exp(-i pi k / (2N))
      const double angle = -M_PI * static_cast<double>(k) / (2.0 * static_cast<double>(n_));
      twiddle_[static_cast<std::size_t>(k)] =
          Complex(static_cast<Real>(std::cos(angle)), static_cast<Real>(std::sin(angle)));
      scale_[static_cast<std::size_t>(k)] =
          static_cast<Real>(std::sqrt((k == 0 ? 1.0 : 2.0) / static_cast<double>(n_)));
    }
  }

  std::int64_t size() const { return n_; }

  // Orthonormal DCT-II of x1 (and x2, which may be null) into X1 (X2).
  void forward(const Real* x1, const Real* x2, Real* X1, Real* X2) {
    const std::int64_t n = n_;
    // Makhoul: v[j] = x[2j] for the first ceil(N/2), then the odd samples reversed.
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t src = (2 * j < n) ? 2 * j : 2 * (n - 1 - j) + 1;
      z_[static_cast<std::size_t>(j)] = Complex(x1[src], x2 ? x2[src] : Real(0));
    }
    fft_.forward(z_.data(), spectrum_.data());
    for (std::int64_t k = 0; k < n; ++k) {
      // Separate the two real sequences' spectra: V1 = (Z[k] + conj Z[-k]) / 2, V2 = (Z[k] - conj Z[-k]) / 2i.
      const Complex zk = spectrum_[static_cast<std::size_t>(k)];
      const Complex zr = std::conj(spectrum_[static_cast<std::size_t>(k == 0 ? 0 : n - k)]);
      const Complex w = twiddle_[static_cast<std::size_t>(k)] * scale_[static_cast<std::size_t>(k)] * Real(0.5);
      X1[k] = std::real(w * (zk + zr));
      if (X2) X2[k] = std::real(w * (zk - zr) * Complex(0, -1));
    }
  }

  // Orthonormal DCT-III (the inverse of forward) of X1 (and X2, may be null).
  void inverse(const Real* X1, const Real* X2, Real* x1, Real* x2) {
    const std::int64_t n = n_;
    for (std::int64_t k = 0; k < n; ++k) {
      // Undo the scaling, then V[k] = conj(twiddle) (Xu[k] - i Xu[N-k]), Xu[N] = 0.
      const auto kk = static_cast<std::size_t>(k);
      const auto rk = static_cast<std::size_t>(n - k);
      const Real inv_a = Real(1) / scale_[kk];
      const Real x1k = X1[k] * inv_a, x1r = k == 0 ? Real(0) : X1[n - k] / scale_[rk];
      const Complex tw = std::conj(twiddle_[kk]);
      Complex v = tw * Complex(x1k, -x1r);
      if (X2) {
        const Real x2k = X2[k] * inv_a, x2r = k == 0 ? Real(0) : X2[n - k] / scale_[rk];
        v += Complex(0, 1) * (tw * Complex(x2k, -x2r));
      }
      spectrum_[kk] = v;
    }
    fft_.inverse(spectrum_.data(), z_.data());
    const Real inv_n = Real(1) / static_cast<Real>(n);
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t dst = (2 * j < n) ? 2 * j : 2 * (n - 1 - j) + 1;
      x1[dst] = std::real(z_[static_cast<std::size_t>(j)]) * inv_n;
      if (x2) x2[dst] = std::imag(z_[static_cast<std::size_t>(j)]) * inv_n;
    }
  }

  // Base = C^T diag(k < m) C x for one or two columns. out may alias the coefficients' scratch only.
  void lowpass(const Real* x1, const Real* x2, std::int64_t m, Real* base1, Real* base2) {
    coeff1_.resize(static_cast<std::size_t>(n_));
    coeff2_.resize(static_cast<std::size_t>(n_));
    forward(x1, x2, coeff1_.data(), x2 ? coeff2_.data() : nullptr);
    for (std::int64_t k = m; k < n_; ++k)
      coeff1_[static_cast<std::size_t>(k)] = coeff2_[static_cast<std::size_t>(k)] = Real(0);
    inverse(coeff1_.data(), x2 ? coeff2_.data() : nullptr, base1, base2);
  }

 private:
  std::int64_t n_;
  Fft<Real> fft_;
  std::vector<Complex> z_, spectrum_, twiddle_;
  std::vector<Real> scale_, coeff1_, coeff2_;
};

}  // namespace flashcache
