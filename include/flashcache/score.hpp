#pragma once
// Stage 1, score: per-token outlier score and per-head energies (CPU).
//
// For every KV head: Base = lowpass(K) along tokens, score[n] = MSE(K[n], Kb[n])
// + MSE(V[n], Vb[n]), and the energies E(K), E_high(K) = ||K - Kb||^2 (Parseval),
// likewise for V, from which the layer's ratio R_l follows.
//
// Non-finite values: a token whose K or V row holds a NaN or infinity is
// certainly not smooth, so it scores +infinity and is always kept. So that it
// cannot spread through the transform, its rows are replaced for the transform
// by the nearest finite token before it (after it, for leading ones), and it
// adds nothing to the energies.
#include <Eigen/Core>

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <vector>

#include "dct.hpp"
#include "options.hpp"
#include "types.hpp"
#include "view.hpp"

namespace flashcache {

// Energies of one KV head, summed over its finite tokens.
struct HeadEnergy {
  double k_total = 0, k_high = 0;  // E(K), E_high(K)
  double v_total = 0, v_high = 0;  // E(V), E_high(V)
};

// High-frequency share high / total, 0 for an all-zero input.
inline double high_share(double high, double total) { return total > 0 ? high / total : 0.0; }

struct LayerScores {
  std::int64_t heads = 0;
  std::int64_t tokens = 0;
  std::vector<float> score;        // [heads][tokens]; +inf marks a non-finite token
  std::vector<HeadEnergy> energy;  // [heads]
  std::int64_t nonfinite = 0;      // (head, token) rows with a NaN or infinity in K or V

  float operator()(std::int64_t h, std::int64_t n) const { return score[static_cast<std::size_t>(h * tokens + n)]; }
  const float* head(std::int64_t h) const { return score.data() + h * tokens; }

  HeadEnergy layer_energy() const {
    HeadEnergy sum;
    for (const auto& e : energy) {
      sum.k_total += e.k_total;
      sum.k_high += e.k_high;
      sum.v_total += e.v_total;
      sum.v_high += e.v_high;
    }
    return sum;
  }
  // R_l = E_high(K)/E(K) + E_high(V)/E(V), summed over the layer's heads.
  double energy_ratio() const {
    const HeadEnergy e = layer_energy();
    return high_share(e.k_high, e.k_total) + high_share(e.v_high, e.v_total);
  }
};

// Scores layers one after another and keeps its transforms, bases and
// buffers between calls, so scoring a whole model allocates once per shape.
// Real is the arithmetic type (float in production, double for references).
template <class Real = float>
class Scorer {
 public:
  using Matrix = Eigen::Matrix<Real, Eigen::Dynamic, Eigen::Dynamic>;  // column-major: a column is a token axis

  template <class T>
  Status score(KVView<const T> k, KVView<const T> v, const Options& opt, LayerScores* out) {
    FLASHCACHE_RETURN_IF_ERROR(check_pair(k, v));
    FLASHCACHE_RETURN_IF_ERROR(check_options(opt));
    const std::int64_t heads = k.heads, n = k.tokens, d = k.head_dim;
    out->heads = heads;
    out->tokens = n;
    out->score.assign(static_cast<std::size_t>(heads * n), 0.0f);
    out->energy.assign(static_cast<std::size_t>(heads), HeadEnergy{});
    out->nonfinite = 0;
    if (k.empty()) return Status::success();

    xk_.resize(n, d);
    xv_.resize(n, d);
    bk_.resize(n, d);
    bv_.resize(n, d);
    bad_.assign(static_cast<std::size_t>(n), 0);
    for (std::int64_t h = 0; h < heads; ++h) {
      out->nonfinite += load_head(k, v, h);
      if (opt.transform == Transform::global)
        lowpass_global(n, d, opt.gamma);
      else
        lowpass_blocked(n, opt.gamma, opt.block_size);
      accumulate(h, n, d, out);
    }
    return Status::success();
  }

 private:
  // Copies head h of K and V into the column-major buffers, marks non-finite
  // tokens and patches their rows; returns how many there were.
  template <class T>
  std::int64_t load_head(KVView<const T> k, KVView<const T> v, std::int64_t h) {
    const std::int64_t n = k.tokens, d = k.head_dim;
    std::int64_t bad_count = 0, last_good = -1, first_good = -1;
    for (std::int64_t t = 0; t < n; ++t) {
      const T* kr = k.row(h, t);
      const T* vr = v.row(h, t);
      bool finite = true;
      for (std::int64_t c = 0; c < d; ++c) {
        const float kc = to_float(kr[c]), vc = to_float(vr[c]);
        finite = finite && std::isfinite(kc) && std::isfinite(vc);
        xk_(t, c) = static_cast<Real>(kc);
        xv_(t, c) = static_cast<Real>(vc);
      }
      bad_[static_cast<std::size_t>(t)] = !finite;
      if (!finite) {
        ++bad_count;
        if (last_good >= 0) {
          xk_.row(t) = xk_.row(last_good);
          xv_.row(t) = xv_.row(last_good);
        }
      } else {
        last_good = t;
        if (first_good < 0) first_good = t;
      }
    }
    // Leading non-finite rows copy the first finite row (zeros if there is none).
    for (std::int64_t t = 0; t < n && bad_[static_cast<std::size_t>(t)] && (first_good < 0 || t < first_good); ++t) {
      if (first_good >= 0) {
        xk_.row(t) = xk_.row(first_good);
        xv_.row(t) = xv_.row(first_good);
      } else {
        xk_.row(t).setZero();
        xv_.row(t).setZero();
      }
    }
    return bad_count;
  }

  void lowpass_global(std::int64_t n, std::int64_t d, double gamma) {
    Dct<Real>& dct = plan(n);
    const std::int64_t m = lowpass_cutoff(n, gamma);
    for (std::int64_t c = 0; c < d; ++c)
      dct.lowpass(xk_.col(c).data(), xv_.col(c).data(), m, bk_.col(c).data(), bv_.col(c).data());
  }

  void lowpass_blocked(std::int64_t n, double gamma, std::int64_t block) {
    for (std::int64_t b0 = 0; b0 < n; b0 += block) {
      const std::int64_t len = std::min(block, n - b0);
      const Matrix& c = basis(len, lowpass_cutoff(len, gamma));  // m x len
      coeff_.noalias() = c * xk_.middleRows(b0, len);
      bk_.middleRows(b0, len).noalias() = c.transpose() * coeff_;
      coeff_.noalias() = c * xv_.middleRows(b0, len);
      bv_.middleRows(b0, len).noalias() = c.transpose() * coeff_;
    }
  }

  void accumulate(std::int64_t h, std::int64_t n, std::int64_t d, LayerScores* out) {
    float* score = out->score.data() + h * n;
    HeadEnergy& e = out->energy[static_cast<std::size_t>(h)];
    const Real inv_d = Real(1) / static_cast<Real>(d);
    for (std::int64_t t = 0; t < n; ++t) {
      if (bad_[static_cast<std::size_t>(t)]) {
        score[t] = std::numeric_limits<float>::infinity();
        continue;
      }
      const Real rk = (xk_.row(t) - bk_.row(t)).squaredNorm();
      const Real rv = (xv_.row(t) - bv_.row(t)).squaredNorm();
      score[t] = static_cast<float>(rk * inv_d + rv * inv_d);
      e.k_high += static_cast<double>(rk);
      e.v_high += static_cast<double>(rv);
      e.k_total += static_cast<double>(xk_.row(t).squaredNorm());
      e.v_total += static_cast<double>(xv_.row(t).squaredNorm());
    }
  }

  Dct<Real>& plan(std::int64_t n) {
    auto it = plans_.find(n);
    if (it == plans_.end()) it = plans_.emplace(n, Dct<Real>(n)).first;
    return it->second;
  }

  const Matrix& basis(std::int64_t len, std::int64_t m) {
    auto it = bases_.find(len * (len + 1) + m);
    if (it == bases_.end()) it = bases_.emplace(len * (len + 1) + m, dct_basis<Real>(len, m)).first;
    return it->second;
  }

  Matrix xk_, xv_, bk_, bv_, coeff_;
  std::vector<std::uint8_t> bad_;
  std::map<std::int64_t, Dct<Real>> plans_;
  std::map<std::int64_t, Matrix> bases_;
};

// One-shot scoring of one layer; throws flashcache::Error on bad input.
template <class Real = float, class T>
LayerScores score_layer(KVView<T> k, KVView<T> v, const Options& opt = {}) {
  LayerScores out;
  Scorer<Real> scorer;
  throw_if_error(scorer.score(KVView<const T>(k), KVView<const T>(v), opt, &out));
  return out;
}

}  // namespace flashcache
