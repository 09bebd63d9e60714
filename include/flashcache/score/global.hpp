#pragma once
// Score's global residual (CPU; ScoreOptions::transform == global, score.hpp): one
// DCT over a head's whole sequence, head-dim columns kLanes at a time. The
// low-pass base takes the m = lowpass_cutoff(n, gamma) lowest frequencies; a
// base chosen by energy (Base::peak, mixed; base.hpp) keeps every panel's full
// spectrum, picks the base from the frequencies' energies summed over the
// panels, then inverts the other coefficients. The GPU's twin:
// flashcache/cuda/kernels/score_global.cuh.
#include <Eigen/Core>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "flashcache/options.hpp"
#include "flashcache/score/base.hpp"
#include "flashcache/score/dct.hpp"
#include "flashcache/score/rows.hpp"
#include "flashcache/view.hpp"

namespace flashcache {
namespace detail {

// Keeps its transforms (one per sequence length) and panels between calls:
// nothing is allocated once it has seen a length.
template <class Real>
class GlobalResidual {
 public:
  // Head-dim columns transformed together: one SIMD register's worth, so that a
  // panel of a long sequence still fits in L2 (measured: 4 float lanes beat 8
  // and 16 on an SSE2 build at 2K-64K tokens).
  static constexpr int kLanes = EIGEN_IDEAL_MAX_ALIGN_BYTES / static_cast<int>(sizeof(Real)) > 2
                                    ? EIGEN_IDEAL_MAX_ALIGN_BYTES / static_cast<int>(sizeof(Real))
                                    : 2;

  // Adds head h's per-token residuals to out->residual_k/v and its totals to
  // out->total_k/v (each sized to the tokens), reading token t from row
  // source[t] (map_nonfinite_rows).
  template <class T>
  void compute(KVView<const T> k, KVView<const T> v, std::int64_t h, const std::vector<std::int64_t>& source,
               double gamma, Base kind, TokenResiduals<Real>* out) {
    if (kind == Base::lowpass)
      lowpass(k, v, h, source, gamma, out);
    else
      chosen(k, v, h, source, gamma, kind, out);
  }

 private:
  using Panel = std::vector<Real>;

  // Loads head-dim columns [c0, c0 + kLanes) of head h into the panels xk_ and
  // xv_ ([tokens][kLanes]; lanes past the head dim stay zero: they add nothing)
  // and adds their squares to the tokens' totals.
  // The totals are summed in registers, lane by lane in order (the same
  // floats as adding each square to memory, without its store-load chain).
  template <class T>
  void load_panel(KVView<const T> k, KVView<const T> v, std::int64_t h, const std::vector<std::int64_t>& source,
                  std::int64_t c0, TokenResiduals<Real>* out) {
    constexpr int W = kLanes;
    const int lanes = static_cast<int>(std::min<std::int64_t>(W, k.head_dim - c0));
    Real* FLASHCACHE_RESTRICT total_k = out->total_k.data();
    Real* FLASHCACHE_RESTRICT total_v = out->total_v.data();
    for (std::int64_t t = 0; t < k.tokens; ++t) {
      const std::int64_t src = source[static_cast<std::size_t>(t)];
      Real* FLASHCACHE_RESTRICT xk = xk_.data() + t * W;
      Real* FLASHCACHE_RESTRICT xv = xv_.data() + t * W;
      if (src < 0) {
        for (int w = 0; w < W; ++w) xk[w] = xv[w] = Real(0);
      } else {
        const T* FLASHCACHE_RESTRICT rk = k.row(h, src) + c0;
        const T* FLASHCACHE_RESTRICT rv = v.row(h, src) + c0;
        for (int w = 0; w < W; ++w) {
          xk[w] = w < lanes ? static_cast<Real>(to_float(rk[w])) : Real(0);
          xv[w] = w < lanes ? static_cast<Real>(to_float(rv[w])) : Real(0);
        }
      }
      Real sk = total_k[t], sv = total_v[t];
      for (int w = 0; w < W; ++w) {
        sk += xk[w] * xk[w];
        sv += xv[w] * xv[w];
      }
      total_k[t] = sk;
      total_v[t] = sv;
    }
  }

  template <class T>
  void lowpass(KVView<const T> k, KVView<const T> v, std::int64_t h, const std::vector<std::int64_t>& source,
               double gamma, TokenResiduals<Real>* out) {
    constexpr int W = kLanes;
    const std::int64_t n = k.tokens, d = k.head_dim, m = lowpass_cutoff(n, gamma);
    Dct<Real, W>& dct = dct_of_length(n);
    for (Panel* p : {&xk_, &xv_}) p->resize(static_cast<std::size_t>(n * W));
    for (std::int64_t c0 = 0; c0 < d; c0 += W) {
      load_panel(k, v, h, source, c0, out);
      dct.lowpass_residual(xk_.data(), xv_.data(), m, out->residual_k.data(), out->residual_v.data());
    }
  }

  // A base chosen by energy: two transforms per panel, as the low-pass path;
  // n x d coefficients of K and of V are held meanwhile.
  template <class T>
  void chosen(KVView<const T> k, KVView<const T> v, std::int64_t h, const std::vector<std::int64_t>& source,
              double gamma, Base kind, TokenResiduals<Real>* out) {
    constexpr int W = kLanes;
    const std::int64_t n = k.tokens, d = k.head_dim, m = lowpass_cutoff(n, gamma);
    const std::int64_t panels = (d + W - 1) / W;
    Dct<Real, W>& dct = dct_of_length(n);
    for (Panel* p : {&xk_, &xv_}) p->resize(static_cast<std::size_t>(n * W));
    for (Panel* p : {&spectrum_k_, &spectrum_v_}) p->resize(static_cast<std::size_t>(panels * n * W));
    energy_k_.assign(static_cast<std::size_t>(n), Real(0));
    energy_v_.assign(static_cast<std::size_t>(n), Real(0));
    for (std::int64_t p = 0; p < panels; ++p) {
      load_panel(k, v, h, source, p * W, out);
      Real* sk = spectrum_k_.data() + p * n * W;
      Real* sv = spectrum_v_.data() + p * n * W;
      dct.forward(xk_.data(), xv_.data(), sk, sv);
      for (std::int64_t f = 0; f < n; ++f)
        for (int w = 0; w < W; ++w) {
          energy_k_[static_cast<std::size_t>(f)] += sk[f * W + w] * sk[f * W + w];
          energy_v_[static_cast<std::size_t>(f)] += sv[f * W + w] * sv[f * W + w];
        }
    }
    chosen_k_.resize(static_cast<std::size_t>(n));
    chosen_v_.resize(static_cast<std::size_t>(n));
    choose_base_frequencies(kind, energy_k_.data(), n, m, &order_, chosen_k_.data());
    choose_base_frequencies(kind, energy_v_.data(), n, m, &order_, chosen_v_.data());
    Real* FLASHCACHE_RESTRICT rk = out->residual_k.data();
    Real* FLASHCACHE_RESTRICT rv = out->residual_v.data();
    for (std::int64_t p = 0; p < panels; ++p) {
      Real* sk = spectrum_k_.data() + p * n * W;
      Real* sv = spectrum_v_.data() + p * n * W;
      for (std::int64_t f = 0; f < n; ++f) {  // the residual's spectrum: the base's frequencies removed
        if (chosen_k_[static_cast<std::size_t>(f)])
          for (int w = 0; w < W; ++w) sk[f * W + w] = Real(0);
        if (chosen_v_[static_cast<std::size_t>(f)])
          for (int w = 0; w < W; ++w) sv[f * W + w] = Real(0);
      }
      dct.inverse(sk, sv, xk_.data(), xv_.data());
      const Real* FLASHCACHE_RESTRICT xk = xk_.data();
      const Real* FLASHCACHE_RESTRICT xv = xv_.data();
      for (std::int64_t t = 0; t < n; ++t) {  // lane by lane in order, in registers (see load_panel)
        Real ek = rk[t], ev = rv[t];
        for (int w = 0; w < W; ++w) {
          ek += xk[t * W + w] * xk[t * W + w];
          ev += xv[t * W + w] * xv[t * W + w];
        }
        rk[t] = ek;
        rv[t] = ev;
      }
    }
  }

  Dct<Real, kLanes>& dct_of_length(std::int64_t n) {
    auto it = dcts_.find(n);
    if (it == dcts_.end()) it = dcts_.emplace(n, std::make_unique<Dct<Real, kLanes>>(n)).first;
    return *it->second;
  }

  Panel xk_, xv_;
  // Chosen bases: the full spectra of one head, the frequencies' energies and
  // which are chosen (order_ is choose_base_frequencies' scratch).
  Panel spectrum_k_, spectrum_v_;
  std::vector<Real> energy_k_, energy_v_;
  std::vector<std::uint8_t> chosen_k_, chosen_v_;
  std::vector<std::int32_t> order_;
  std::map<std::int64_t, std::unique_ptr<Dct<Real, kLanes>>> dcts_;
};

}  // namespace detail
}  // namespace flashcache
