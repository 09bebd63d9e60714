#pragma once
// Complex FFT of any length over a panel of W independent columns (CPU).
//
// A panel stores element i of all W columns side by side (lane w of element i
// at [i * W + w]), real and imaginary parts in separate arrays. Every butterfly
// then works on W contiguous lanes, which the compiler vectorises, and a panel
// of a long sequence stays in cache. The DCT uses this to transform W head-dim
// columns of K and V at once.
//
// Lengths made of the radices 2, 3, 4, 5, ..., 31 run as a mixed-radix Stockham
// FFT (self-sorting, no bit reversal), O(n log n); radices 2, 3, 4 and 5 have
// butterflies of their own, the others a generic p-point DFT. A larger prime
// factor goes through Bluestein's chirp-z identity: a circular convolution of
// length >= 2n - 1, so prime lengths such as 4099 stay O(n log n) too. That
// length is the cheapest 2^a 3^b 5^c by the stage cost model below, not always
// a power of two: 4099 convolves over 9216 points instead of 16384. A length
// with small factors too (3678 = 6 x 613) sends only its large factor through
// Bluestein, as the first Stockham stage, when the model says that is cheaper.
#include <Eigen/Core>
#include <algorithm>

#include <cmath>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "flashcache/config.hpp"
#include "flashcache/score/fft_butterflies.hpp"

namespace flashcache {
namespace detail {

inline std::int64_t next_pow2(std::int64_t n) {
  std::int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

// Radices for the Stockham stages, 4s first; an empty result means "needs Bluestein".
inline std::vector<int> fft_radices(std::int64_t n, int max_prime) {
  std::vector<int> radices;
  while (n % 4 == 0) radices.push_back(4), n /= 4;
  while (n % 2 == 0) radices.push_back(2), n /= 2;
  for (int p = 3; p <= max_prime && n > 1; p += 2)
    while (n % p == 0) radices.push_back(p), n /= p;
  if (n != 1) radices.clear();
  return radices;
}

// The cost model that picks Bluestein's convolution length: per point and
// stage, a butterfly's real flops plus 4 for the pass over the panel. It only
// ranks lengths; it predicts no time.
inline double stage_cost(int radix) {
  switch (radix) {
    case 2:
      return 5.0 + 4.0;
    case 3:
      return 9.3 + 4.0;
    case 4:
      return 8.5 + 4.0;
    case 5:
      return 14.4 + 4.0;
    default:  // the generic p-point DFT: p complex multiply-adds per point
      return 8.0 * radix + 4.0;
  }
}

// The model's cost of a Stockham FFT over the radices.
inline double stockham_cost(std::int64_t n, const std::vector<int>& radices) {
  double cost = 0;
  for (int p : radices) cost += stage_cost(p);
  return cost * static_cast<double>(n);
}

// The cheapest 5-smooth length >= at_least by stage_cost (ties: the power of two).
inline std::int64_t bluestein_length(std::int64_t at_least) {
  std::int64_t best = next_pow2(at_least);
  double best_cost = stockham_cost(best, fft_radices(best, 5));
  for (std::int64_t m = at_least; m < best; ++m) {
    const std::vector<int> radices = fft_radices(m, 5);
    if (radices.empty()) continue;
    const double cost = stockham_cost(m, radices);
    if (cost < best_cost) best = m, best_cost = cost;
  }
  return best;
}

// The model's cost of Bluestein at length n: two FFTs and three passes over
// the convolution.
inline double bluestein_cost(std::int64_t n) {
  const std::int64_t m = bluestein_length(2 * n - 1);
  return 2.0 * stockham_cost(m, fft_radices(m, 5)) + 12.0 * static_cast<double>(m);
}

// exp(-2 pi i num / den) with the angle reduced first, in double.
inline void unit_root(std::int64_t num, std::int64_t den, double* re, double* im) {
  const double angle = -2.0 * M_PI * static_cast<double>(num % den) / static_cast<double>(den);
  *re = std::cos(angle);
  *im = std::sin(angle);
}

}  // namespace detail

template <class Real, int W>
class PanelFft {
 public:
  // Beyond this prime factor the generic butterfly costs more than Bluestein.
  static constexpr int kMaxDirectPrime = 31;

  explicit PanelFft(std::int64_t n) : n_(n) {
    if (n_ <= 1) return;
    radices_ = detail::fft_radices(n_, kMaxDirectPrime);
    if (radices_.empty()) {
      // n = small x large, the large part's prime factors all above kMaxDirectPrime.
      std::int64_t large = n_;
      for (std::int64_t p = 2; p <= kMaxDirectPrime; ++p)
        while (large % p == 0) large /= p;
      const std::int64_t small = n_ / large;
      const std::vector<int> small_radices = detail::fft_radices(small, kMaxDirectPrime);
      const double split = static_cast<double>(small) * detail::bluestein_cost(large) +
                           detail::stockham_cost(n_, small_radices) + 8.0 * static_cast<double>(n_);
      if (small > 1 && split < detail::bluestein_cost(n_)) {
        large_ = std::make_unique<PanelFft>(large);
        radices_ = small_radices;
        radices_.insert(radices_.begin(), static_cast<int>(large));
        gather_re_.resize(static_cast<std::size_t>(large * W));
        gather_im_.resize(static_cast<std::size_t>(large * W));
      }
    }
    if (!radices_.empty()) {
      choose_stages(n_);
      work_re_.resize(static_cast<std::size_t>(n_ * W));
      work_im_.resize(static_cast<std::size_t>(n_ * W));
      return;
    }
    // Bluestein: X[k] = c*[k] sum_j (x[j] c*[j]) c[k - j], chirp c[j] = exp(i pi j^2 / n).
    m_ = detail::bluestein_length(2 * n_ - 1);
    inner_ = std::make_unique<PanelFft>(m_);
    chirp_re_.resize(static_cast<std::size_t>(n_));
    chirp_im_.resize(static_cast<std::size_t>(n_));
    for (std::int64_t j = 0; j < n_; ++j) {
      double re, im;  // exp(-i pi j^2 / n) = exp(-2 pi i (j^2 mod 2n) / 2n)
      detail::unit_root((j * j) % (2 * n_), 2 * n_, &re, &im);
      chirp_re_[static_cast<std::size_t>(j)] = static_cast<Real>(re);
      chirp_im_[static_cast<std::size_t>(j)] = static_cast<Real>(-im);  // c[j] = exp(+i pi j^2 / n)
    }
    // Spectrum of the filter b[j] = c[j] for |j| < n (wrapped), scaled by the inverse's 1/m.
    std::vector<Real> b_re(static_cast<std::size_t>(m_ * W), Real(0)), b_im(b_re.size(), Real(0));
    auto set = [&](std::int64_t i, std::int64_t j) {
      for (int w = 0; w < W; ++w) {
        b_re[static_cast<std::size_t>(i * W + w)] = chirp_re_[static_cast<std::size_t>(j)];
        b_im[static_cast<std::size_t>(i * W + w)] = chirp_im_[static_cast<std::size_t>(j)];
      }
    };
    set(0, 0);
    for (std::int64_t j = 1; j < n_; ++j) set(j, j), set(m_ - j, j);
    inner_->forward(b_re.data(), b_im.data());
    filter_re_.resize(static_cast<std::size_t>(m_));
    filter_im_.resize(static_cast<std::size_t>(m_));
    for (std::int64_t i = 0; i < m_; ++i) {
      filter_re_[static_cast<std::size_t>(i)] = b_re[static_cast<std::size_t>(i * W)] / static_cast<Real>(m_);
      filter_im_[static_cast<std::size_t>(i)] = b_im[static_cast<std::size_t>(i * W)] / static_cast<Real>(m_);
    }
    conv_re_.resize(static_cast<std::size_t>(m_ * W));
    conv_im_.resize(static_cast<std::size_t>(m_ * W));
  }

  std::int64_t size() const { return n_; }
  // Bluestein runs: over the whole length, or over its large factor as the first stage.
  bool uses_bluestein() const { return m_ > 0 || large_ != nullptr; }
  // Bluestein's convolution length over the whole length (0 when Stockham stages run).
  std::int64_t convolution_length() const { return m_; }
  // The large factor the first Stockham stage sends through Bluestein (0: none).
  std::int64_t bluestein_factor() const { return large_ ? large_->size() : 0; }

  // In place: X[k] = sum_j x[j] exp(-2 pi i j k / n) per lane, unscaled.
  void forward(Real* re, Real* im) {
    if (n_ <= 1) return;
    if (m_ == 0)
      stockham(re, im);
    else
      bluestein(re, im);
  }

  // In place: x[j] = sum_k X[k] exp(+2 pi i j k / n) per lane, unscaled (no 1/n).
  void inverse(Real* re, Real* im) {
    // ifft(x) = conj(fft(conj(x))); conjugation is a sign flip of the imaginary panel.
    negate(im, n_);
    forward(re, im);
    negate(im, n_);
  }

 private:

  using Stage = detail::FftStage;

  static void negate(Real* x, std::int64_t n) {
    for (std::int64_t i = 0; i < n * W; ++i) x[i] = -x[i];
  }

  void choose_stages(std::int64_t n) {
    std::int64_t span = 1, classes = n;
    for (int p : radices_) {
      const std::int64_t next = span * p;
      classes /= p;
      Stage s{p, span, classes, tw_re_.size(), root_re_.size()};
      if (p > kMaxDirectPrime) {  // the Bluestein stage: first, so span 1 and no twiddles
        stages_.push_back(s);
        span = next;
        continue;
      }
      for (std::int64_t k = 0; k < span; ++k)
        for (int q = 1; q < p; ++q) {
          double re, im;
          detail::unit_root(q * k, next, &re, &im);
          tw_re_.push_back(static_cast<Real>(re));
          tw_im_.push_back(static_cast<Real>(im));
        }
      for (int q = 0; q < p * p; ++q) {
        double re, im;
        detail::unit_root((q / p) * (q % p), p, &re, &im);
        root_re_.push_back(static_cast<Real>(re));
        root_im_.push_back(static_cast<Real>(im));
      }
      stages_.push_back(s);
      span = next;
    }
  }

  // Mixed-radix Stockham. Before a stage, y[k * R + r] holds frequency k < L of
  // the length-L DFT of residue class r (stride R). A radix-p stage combines
  // the p classes r' + R' q into class r' of length L p:
  //   Y'[k + L s] = sum_q w_p^{q s} (w_{Lp}^{q k} y[k R + r' + R' q]),
  // written to y'[(k + L s) R' + r']; after the last stage y[k] = X[k].
  void stockham(Real* re, Real* im) {
    Real *src_re = re, *src_im = im, *dst_re = work_re_.data(), *dst_im = work_im_.data();
    for (const Stage& st : stages_) {
      switch (st.radix) {
        case 4:
          detail::fft_radix4<Real, W>(st, tw_re_.data(), tw_im_.data(), src_re, src_im, dst_re, dst_im);
          break;
        case 2:
          detail::fft_radix2<Real, W>(st, tw_re_.data(), tw_im_.data(), src_re, src_im, dst_re, dst_im);
          break;
        case 3:
          detail::fft_radix_odd<3, Real, W>(st, tw_re_.data(), tw_im_.data(), src_re, src_im, dst_re, dst_im);
          break;
        case 5:
          detail::fft_radix_odd<5, Real, W>(st, tw_re_.data(), tw_im_.data(), src_re, src_im, dst_re, dst_im);
          break;
        default:
          if (st.radix > kMaxDirectPrime) {
            large_stage(st, src_re, src_im, dst_re, dst_im);
            break;
          }
          generic(st, src_re, src_im, dst_re, dst_im);
          break;
      }
      std::swap(src_re, dst_re);
      std::swap(src_im, dst_im);
    }
    if (src_re != re) {
      std::copy(src_re, src_re + n_ * W, re);
      std::copy(src_im, src_im + n_ * W, im);
    }
  }

  // The first stage with the large factor p: span 1, so no twiddles, and
  // residue class r's p inputs x[r + R' q] give its outputs y[r + R' s] at the
  // same places. Each class is gathered into a p-point panel for Bluestein.
  void large_stage(const Stage& st, const Real* xr, const Real* xi, Real* yr, Real* yi) {
    const std::int64_t p = st.radix, Rn = st.stride;
    for (std::int64_t r = 0; r < Rn; ++r) {
      for (std::int64_t q = 0; q < p; ++q)
        for (int w = 0; w < W; ++w) {
          gather_re_[static_cast<std::size_t>(q * W + w)] = xr[(r + Rn * q) * W + w];
          gather_im_[static_cast<std::size_t>(q * W + w)] = xi[(r + Rn * q) * W + w];
        }
      large_->forward(gather_re_.data(), gather_im_.data());
      for (std::int64_t q = 0; q < p; ++q)
        for (int w = 0; w < W; ++w) {
          yr[(r + Rn * q) * W + w] = gather_re_[static_cast<std::size_t>(q * W + w)];
          yi[(r + Rn * q) * W + w] = gather_im_[static_cast<std::size_t>(q * W + w)];
        }
    }
  }

  void generic(const Stage& st, const Real* xr, const Real* xi, Real* yr, Real* yi) {
    const int p = st.radix;
    const std::int64_t L = st.span, Rn = st.stride, R = Rn * p;
    scratch_re_.resize(static_cast<std::size_t>(p));
    scratch_im_.resize(static_cast<std::size_t>(p));
    for (std::int64_t k = 0; k < L; ++k)
      for (std::int64_t i = 0; i < Rn * W; ++i) {
        // Twiddled inputs a_q, then the p-point DFT over q.
        for (int q = 0; q < p; ++q) {
          const Real vr = xr[(k * R + q * Rn) * W + i], vi = xi[(k * R + q * Rn) * W + i];
          if (q == 0) {
            scratch_re_[0] = vr;
            scratch_im_[0] = vi;
            continue;
          }
          const std::size_t t = st.twiddle + static_cast<std::size_t>(k * (p - 1) + q - 1);
          scratch_re_[static_cast<std::size_t>(q)] = vr * tw_re_[t] - vi * tw_im_[t];
          scratch_im_[static_cast<std::size_t>(q)] = vr * tw_im_[t] + vi * tw_re_[t];
        }
        for (int s = 0; s < p; ++s) {
          Real sr = 0, si = 0;
          for (int q = 0; q < p; ++q) {
            const std::size_t r = st.roots + static_cast<std::size_t>(s * p + q);
            sr += scratch_re_[static_cast<std::size_t>(q)] * root_re_[r] -
                  scratch_im_[static_cast<std::size_t>(q)] * root_im_[r];
            si += scratch_re_[static_cast<std::size_t>(q)] * root_im_[r] +
                  scratch_im_[static_cast<std::size_t>(q)] * root_re_[r];
          }
          yr[((k + L * s) * Rn) * W + i] = sr;
          yi[((k + L * s) * Rn) * W + i] = si;
        }
      }
  }

  // Three passes over the convolution beside its two forward FFTs: the
  // inverse FFT is conj(fft(conj(y))), its conjugations folded into the filter
  // product before it and the chirp product after it.
  void bluestein(Real* re, Real* im) {
    std::fill(conv_re_.begin() + n_ * W, conv_re_.end(), Real(0));
    std::fill(conv_im_.begin() + n_ * W, conv_im_.end(), Real(0));
    for (std::int64_t j = 0; j < n_; ++j) {  // a[j] = x[j] conj(c[j])
      const Real cr = chirp_re_[static_cast<std::size_t>(j)], ci = -chirp_im_[static_cast<std::size_t>(j)];
      for (int w = 0; w < W; ++w) {
        const std::size_t i = static_cast<std::size_t>(j * W + w);
        conv_re_[i] = re[i] * cr - im[i] * ci;
        conv_im_[i] = re[i] * ci + im[i] * cr;
      }
    }
    inner_->forward(conv_re_.data(), conv_im_.data());
    for (std::int64_t j = 0; j < m_; ++j) {
      const Real fr = filter_re_[static_cast<std::size_t>(j)], fi = filter_im_[static_cast<std::size_t>(j)];
      for (int w = 0; w < W; ++w) {
        const std::size_t i = static_cast<std::size_t>(j * W + w);
        const Real r = conv_re_[i] * fr - conv_im_[i] * fi;
        conv_im_[i] = -(conv_re_[i] * fi + conv_im_[i] * fr);  // conj of the product
        conv_re_[i] = r;
      }
    }
    inner_->forward(conv_re_.data(), conv_im_.data());  // conv = conj of this
    for (std::int64_t k = 0; k < n_; ++k) {             // X[k] = conj(c[k]) conv[k]
      const Real cr = chirp_re_[static_cast<std::size_t>(k)], ci = -chirp_im_[static_cast<std::size_t>(k)];
      for (int w = 0; w < W; ++w) {
        const std::size_t i = static_cast<std::size_t>(k * W + w);
        const Real vr = conv_re_[i], vi = -conv_im_[i];
        re[i] = vr * cr - vi * ci;
        im[i] = vr * ci + vi * cr;
      }
    }
  }

  std::int64_t n_;
  std::int64_t m_ = 0;  // Bluestein length; 0 when the Stockham stages run directly
  std::vector<int> radices_;
  std::vector<Stage> stages_;
  std::vector<Real> tw_re_, tw_im_, root_re_, root_im_, work_re_, work_im_, scratch_re_, scratch_im_;
  std::unique_ptr<PanelFft> inner_;          // the smooth FFT behind Bluestein
  std::unique_ptr<PanelFft> large_;          // the large factor's FFT (Bluestein) of the first stage
  std::vector<Real> gather_re_, gather_im_;  // one residue class of the first stage
  std::vector<Real> chirp_re_, chirp_im_, filter_re_, filter_im_, conv_re_, conv_im_;
};

}  // namespace flashcache
