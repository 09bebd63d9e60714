#pragma once
// Complex FFT of any length, O(n log n), for the CPU DCT.
//
// Eigen's FFT (kissfft) is fast for lengths made of small primes but falls
// back to an O(n * p) butterfly for a large prime factor p, so a prime length
// such as 4099 would cost O(n^2). Those lengths go through Bluestein's chirp-z
// identity instead: a circular convolution of power-of-two length >= 2n - 1.
#include <unsupported/Eigen/FFT>

#include <cmath>
#include <complex>
#include <cstdint>
#include <vector>

namespace flashcache {
namespace detail {

inline std::int64_t largest_prime_factor(std::int64_t n) {
  std::int64_t largest = 1;
  for (std::int64_t p = 2; p * p <= n; ++p)
    while (n % p == 0) {
      largest = p;
      n /= p;
    }
  return n > 1 ? n : largest;
}

inline std::int64_t next_pow2(std::int64_t n) {
  std::int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

}  // namespace detail

template <class Real>
class Fft {
 public:
  using Complex = std::complex<Real>;
  // Beyond this prime factor kissfft's generic butterfly costs more than Bluestein.
  static constexpr std::int64_t kMaxDirectPrime = 31;

  explicit Fft(std::int64_t n) : n_(n) {
    if (n_ <= 1 || detail::largest_prime_factor(n_) <= kMaxDirectPrime) return;
    // Bluestein: X[k] = c*[k] sum_j (x[j] c*[j]) c[k - j], with chirp c[j] = exp(i pi j^2 / n).
    m_ = detail::next_pow2(2 * n_ - 1);
    chirp_.resize(static_cast<std::size_t>(n_));
    for (std::int64_t j = 0; j < n_; ++j) {
      // j^2 mod 2n keeps the angle small and exact for long sequences.
      const auto r = static_cast<double>((j * j) % (2 * n_));
      const double angle = M_PI * r / static_cast<double>(n_);
      chirp_[static_cast<std::size_t>(j)] =
          Complex(static_cast<Real>(std::cos(angle)), static_cast<Real>(std::sin(angle)));
    }
    std::vector<Complex> b(static_cast<std::size_t>(m_), Complex(0));
    b[0] = chirp_[0];
    for (std::int64_t j = 1; j < n_; ++j)
      b[static_cast<std::size_t>(j)] = b[static_cast<std::size_t>(m_ - j)] = chirp_[static_cast<std::size_t>(j)];
    chirp_spectrum_.resize(static_cast<std::size_t>(m_));
    fft_.fwd(chirp_spectrum_.data(), b.data(), static_cast<int>(m_));
    // Fold the inverse transform's 1/m into the filter once.
    for (auto& c : chirp_spectrum_) c /= static_cast<Real>(m_);
    work_.resize(static_cast<std::size_t>(m_));
    work2_.resize(static_cast<std::size_t>(m_));
  }

  std::int64_t size() const { return n_; }
  bool uses_bluestein() const { return m_ > 0; }

  // out[k] = sum_j in[j] exp(-2 pi i j k / n), unscaled. in and out may alias.
  void forward(const Complex* in, Complex* out) {
    if (n_ == 1) {
      out[0] = in[0];
      return;
    }
    if (n_ <= 0) return;
    if (m_ == 0) {
      if (in == out) {
        work_.assign(in, in + n_);
        in = work_.data();
      }
      fft_.fwd(out, in, static_cast<int>(n_));
      return;
    }
    std::fill(work_.begin(), work_.end(), Complex(0));
    for (std::int64_t j = 0; j < n_; ++j)
      work_[static_cast<std::size_t>(j)] = in[j] * std::conj(chirp_[static_cast<std::size_t>(j)]);
    fft_.fwd(work2_.data(), work_.data(), static_cast<int>(m_));
    for (std::int64_t j = 0; j < m_; ++j)
      work2_[static_cast<std::size_t>(j)] *= chirp_spectrum_[static_cast<std::size_t>(j)];
    // Inverse FFT via conjugation: ifft(x) = conj(fft(conj(x))) / m (the 1/m is in the filter).
    for (auto& c : work2_) c = std::conj(c);
    fft_.fwd(work_.data(), work2_.data(), static_cast<int>(m_));
    for (std::int64_t k = 0; k < n_; ++k)
      out[k] = std::conj(work_[static_cast<std::size_t>(k)]) * std::conj(chirp_[static_cast<std::size_t>(k)]);
  }

  // out[j] = sum_k in[k] exp(+2 pi i j k / n), unscaled (no 1/n).
  void inverse(const Complex* in, Complex* out) {
    conj_.resize(static_cast<std::size_t>(n_));
    for (std::int64_t k = 0; k < n_; ++k) conj_[static_cast<std::size_t>(k)] = std::conj(in[k]);
    forward(conj_.data(), out);
    for (std::int64_t j = 0; j < n_; ++j) out[j] = std::conj(out[j]);
  }

 private:
  std::int64_t n_;
  std::int64_t m_ = 0;  // Bluestein convolution length, 0 when kissfft runs directly
  Eigen::FFT<Real> fft_;
  std::vector<Complex> chirp_, chirp_spectrum_, work_, work2_, conj_;
};

}  // namespace flashcache
