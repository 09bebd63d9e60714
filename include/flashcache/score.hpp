#pragma once
// Stage 1, score: per-token outlier score and per-head energies (CPU).
//
// For every KV head: Base = the chosen frequencies of K along tokens (the lowest
// by default; Options::base, base.hpp), score[n] = MSE(K[n], Kb[n]) + MSE(V[n],
// Vb[n]), and the energies E(K), E_high(K) = ||K - Kb||^2 (Parseval), likewise
// for V, from which the layer's ratio R_l follows.
//
// Tokens of an image span (Options::grids) are scored the same way over their
// 2D patch grid instead: Base = the 2D low-pass of the grid (or of each tile).
//
// Non-finite values: a token whose K or V row holds a NaN or infinity is
// certainly not smooth, so it scores +infinity and is always kept. So that it
// cannot spread through the transform, its rows are replaced for the transform
// by the nearest finite token before it (after it, for leading ones), and it
// adds nothing to the energies.
#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "base.hpp"
#include "dct.hpp"
#include "grid.hpp"
#include "options.hpp"
#include "rules.hpp"
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

// A layer's scores in caller memory: score[h * tokens + t].
struct ScoreView {
  const float* data = nullptr;
  std::int64_t heads = 0;
  std::int64_t tokens = 0;

  float operator()(std::int64_t h, std::int64_t n) const { return data[h * tokens + n]; }
  const float* head(std::int64_t h) const { return data + h * tokens; }
};

struct LayerScores {
  std::int64_t heads = 0;
  std::int64_t tokens = 0;
  std::vector<float> score;        // [heads][tokens]; +inf marks a non-finite token
  std::vector<HeadEnergy> energy;  // [heads]
  std::int64_t nonfinite = 0;      // (head, token) rows with a NaN or infinity in K or V

  float operator()(std::int64_t h, std::int64_t n) const { return score[static_cast<std::size_t>(h * tokens + n)]; }
  const float* head(std::int64_t h) const { return score.data() + h * tokens; }
  ScoreView view() const { return {score.data(), heads, tokens}; }

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
    return rules::energy_ratio(e.k_total, e.k_high, e.v_total, e.v_high);
  }
};

// Scores layers one after another and keeps its transforms, bases and
// buffers between calls, so scoring a whole model allocates once per shape.
// Real is the arithmetic type (float in production, double for references).
template <class Real = float>
class Scorer {
 public:
  // Head-dim columns transformed together: one SIMD register's worth, so that a
  // panel of a long sequence still fits in L2 (measured: 4 float lanes beat 8
  // and 16 on an SSE2 build at 2K-64K tokens).
  static constexpr int kLanes = EIGEN_IDEAL_MAX_ALIGN_BYTES / static_cast<int>(sizeof(Real)) > 2
                                    ? EIGEN_IDEAL_MAX_ALIGN_BYTES / static_cast<int>(sizeof(Real))
                                    : 2;

  // Scores one layer into caller buffers: score[h * tokens + t] and energy[h]
  // for every head, and the count of non-finite (head, token) rows into
  // *nonfinite when it is not null. Nothing is allocated once the scorer has
  // seen this sequence length and block size (a test counts, Eigen's
  // allocations included).
  template <class T>
  Status score(KVView<const T> k, KVView<const T> v, const Options& opt, float* score, HeadEnergy* energy,
               std::int64_t* nonfinite = nullptr) {
    FLASHCACHE_RETURN_IF_ERROR(check_pair(k, v));
    FLASHCACHE_RETURN_IF_ERROR(check_options(opt));
    const std::int64_t heads = k.heads, n = k.tokens;
    if (nonfinite != nullptr) *nonfinite = 0;
    if (heads * n > 0 && score == nullptr) return make_error(Errc::invalid_shape, "score: null score buffer");
    if (heads > 0 && energy == nullptr) return make_error(Errc::invalid_shape, "score: null energy buffer");
    std::fill(score, score + heads * n, 0.0f);
    std::fill(energy, energy + heads, HeadEnergy{});
    if (k.empty()) return Status::success();
    FLASHCACHE_RETURN_IF_ERROR(check_grids_fit(opt.grids, n));
    if (opt.rope.derotate && k.head_dim % 2 != 0)
      return make_error(Errc::invalid_option, "rope derotate needs an even head_dim, got ", k.head_dim);

    residual_k_.resize(static_cast<std::size_t>(n));
    residual_v_.resize(static_cast<std::size_t>(n));
    std::int64_t bad = 0;
    for (std::int64_t h = 0; h < heads; ++h) {
      bad += map_nonfinite_rows(k, v, h);
      std::fill(residual_k_.begin(), residual_k_.end(), Real(0));
      std::fill(residual_v_.begin(), residual_v_.end(), Real(0));
      HeadEnergy& e = energy[h];
      if (opt.rope.derotate) {
        // The transform reads one de-rotated head from float buffers instead.
        derotated_head(k, v, h, opt.rope);
        const KVView<const float> kh = hnd(derotated_k_.data(), Heads(1), Tokens(n), HeadDim(k.head_dim));
        const KVView<const float> vh = hnd(derotated_v_.data(), Heads(1), Tokens(n), HeadDim(k.head_dim));
        residuals(kh, vh, 0, opt, &e);
      } else {
        residuals(k, v, h, opt, &e);
      }
      write_scores(opt.normalize_terms, k.head_dim, score + h * n);
    }
    if (nonfinite != nullptr) *nonfinite = bad;
    return Status::success();
  }

  // Scores one layer into an owning LayerScores (resized to the layer).
  template <class T>
  Status score(KVView<const T> k, KVView<const T> v, const Options& opt, LayerScores* out) {
    FLASHCACHE_RETURN_IF_ERROR(check_pair(k, v));
    out->heads = k.heads;
    out->tokens = k.tokens;
    out->score.resize(static_cast<std::size_t>(k.heads * k.tokens));
    out->energy.resize(static_cast<std::size_t>(k.heads));
    return score(k, v, opt, out->score.data(), out->energy.data(), &out->nonfinite);
  }

 private:
  using Panel = std::vector<Real>;
  using Block = Eigen::Matrix<Real, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

  // source_[t]: the row the transform reads for token t. A finite token reads
  // itself; a non-finite one the nearest finite token before it (after it,
  // when it leads), or -1 (zeros) when the head has none. Returns the count.
  template <class T>
  std::int64_t map_nonfinite_rows(KVView<const T> k, KVView<const T> v, std::int64_t h) {
    const std::int64_t n = k.tokens, d = k.head_dim;
    source_.resize(static_cast<std::size_t>(n));
    std::int64_t bad = 0, last_good = -1;
    for (std::int64_t t = 0; t < n; ++t) {
      const T* kr = k.row(h, t);
      const T* vr = v.row(h, t);
      bool finite = true;
      for (std::int64_t c = 0; c < d; ++c) {
        const bool k_ok = std::isfinite(to_float(kr[c])), v_ok = std::isfinite(to_float(vr[c]));
        finite &= k_ok & v_ok;  // no branch per element
      }
      if (finite) {
        if (last_good < 0)  // leading non-finite tokens take the first finite one
          for (std::int64_t u = 0; u < t; ++u) source_[static_cast<std::size_t>(u)] = t;
        last_good = t;
      } else {
        ++bad;
      }
      source_[static_cast<std::size_t>(t)] = finite ? t : last_good;
    }
    return bad;
  }

  // Element c of the row the transform reads for token t, as Real.
  template <class T>
  static Real element(KVView<const T> x, std::int64_t h, std::int64_t src, std::int64_t c) {
    return src < 0 ? Real(0) : static_cast<Real>(to_float(x(h, src, c)));
  }

  // Per-token residual and total energies of head h (1D, then the 2D spans
  // over their own tokens), and the head's energies from them (Parseval).
  template <class T>
  void residuals(KVView<const T> k, KVView<const T> v, std::int64_t h, const Options& opt, HeadEnergy* e) {
    total_k_.assign(static_cast<std::size_t>(k.tokens), Real(0));
    total_v_.assign(static_cast<std::size_t>(k.tokens), Real(0));
    if (opt.transform == Transform::global && opt.base == Base::lowpass)
      residuals_global(k, v, h, opt.gamma);
    else if (opt.transform == Transform::global)
      residuals_global_chosen(k, v, h, opt.gamma, opt.base);
    else
      residuals_blocked(k, v, h, opt.gamma, opt.block_size, opt.base);
    for (const GridSpan& g : opt.grids) {
      const SpanTiling tiling = span_tiling(g, opt);
      for (std::int64_t q = 0; q < tiling.count(); ++q) {
        const SpanTile t = tiling.at(q);
        residuals_tile(k, v, h, g, t.r0, t.tr, t.c0, t.tc, opt);
      }
    }
    // Energies of the finite tokens: E from the input, E_high from the residual.
    for (std::int64_t t = 0; t < k.tokens; ++t)
      if (source_[static_cast<std::size_t>(t)] == t)
        add_energy(e, total_k_[static_cast<std::size_t>(t)], residual_k_[static_cast<std::size_t>(t)],
                   total_v_[static_cast<std::size_t>(t)], residual_v_[static_cast<std::size_t>(t)]);
  }

  // One tile of a span (rows [r0, r0 + tr), columns [c0, c0 + tc) of its
  // grid): residual = X - B^T (B X) with B the tile's 2D low-pass basis.
  template <class T>
  void residuals_tile(KVView<const T> k, KVView<const T> v, std::int64_t h, const GridSpan& g, std::int64_t r0,
                      std::int64_t tr, std::int64_t c0, std::int64_t tc, const Options& opt) {
    const std::int64_t len = tr * tc, d = k.head_dim;
    const Block& b = grid_basis(tr, tc, opt.grid_zone, opt.gamma);  // m x len
    // Buffers only grow (rows used through topRows), so edge tiles and later
    // calls of the same shapes allocate nothing.
    for (Block* x : {&tile_k_, &tile_v_, &tile_base_})
      if (x->rows() < len || x->cols() != d) x->resize(std::max<std::int64_t>(len, x->rows()), d);
    if (tile_coeff_.rows() < b.rows() || tile_coeff_.cols() != d)
      tile_coeff_.resize(std::max<std::int64_t>(b.rows(), tile_coeff_.rows()), d);
    const std::int64_t m = b.rows();
    auto token = [&](std::int64_t i) { return g.first + (r0 + i / tc) * g.cols + c0 + i % tc; };
    for (std::int64_t i = 0; i < len; ++i) {
      const std::int64_t src = source_[static_cast<std::size_t>(token(i))];
      for (std::int64_t j = 0; j < d; ++j) {
        tile_k_(i, j) = element(k, h, src, j);
        tile_v_(i, j) = element(v, h, src, j);
      }
    }
    for (auto [x, r] : {std::pair{&tile_k_, &residual_k_}, std::pair{&tile_v_, &residual_v_}}) {
      tile_coeff_.topRows(m).noalias() = b * x->topRows(len);
      tile_base_.topRows(len).noalias() = b.transpose() * tile_coeff_.topRows(m);
      for (std::int64_t i = 0; i < len; ++i)
        (*r)[static_cast<std::size_t>(token(i))] = (x->row(i) - tile_base_.row(i)).squaredNorm();
    }
  }

  // score[t] = MSE_K + MSE_V of token t, +inf for a non-finite token. With
  // `normalize`, each term is divided by its mean over the head's finite tokens.
  void write_scores(bool normalize, std::int64_t head_dim, float* score) const {
    const auto n = static_cast<std::int64_t>(source_.size());
    Real scale_k = Real(1) / static_cast<Real>(head_dim), scale_v = scale_k;
    if (normalize) {
      double sum_k = 0, sum_v = 0;
      std::int64_t finite = 0;
      for (std::int64_t t = 0; t < n; ++t)
        if (source_[static_cast<std::size_t>(t)] == t) {
          sum_k += static_cast<double>(residual_k_[static_cast<std::size_t>(t)]);
          sum_v += static_cast<double>(residual_v_[static_cast<std::size_t>(t)]);
          ++finite;
        }
      // An all-smooth term (mean 0) stays 0 rather than becoming 0/0.
      scale_k = sum_k > 0 ? static_cast<Real>(static_cast<double>(finite) / sum_k) : Real(0);
      scale_v = sum_v > 0 ? static_cast<Real>(static_cast<double>(finite) / sum_v) : Real(0);
    }
    for (std::int64_t t = 0; t < n; ++t)
      score[t] = source_[static_cast<std::size_t>(t)] != t
                     ? std::numeric_limits<float>::infinity()
                     : static_cast<float>(residual_k_[static_cast<std::size_t>(t)] * scale_k +
                                          residual_v_[static_cast<std::size_t>(t)] * scale_v);
  }

  // Head h of K rotated back to its pre-RoPE form and V, both as float rows.
  // Token t sits at position first_position + t; pair (i, i + d/2) (half) or
  // (2i, 2i + 1) (interleaved) turned by -pos * theta^(-2i/d). A non-finite row
  // stays non-finite; map_nonfinite_rows() has already routed around it.
  template <class T>
  void derotated_head(KVView<const T> k, KVView<const T> v, std::int64_t h, const RopeOptions& rope) {
    const std::int64_t n = k.tokens, d = k.head_dim, half = d / 2;
    derotated_k_.resize(static_cast<std::size_t>(n * d));
    derotated_v_.resize(static_cast<std::size_t>(n * d));
    inv_freq_.resize(static_cast<std::size_t>(half));
    for (std::int64_t i = 0; i < half; ++i)
      inv_freq_[static_cast<std::size_t>(i)] =
          std::pow(rope.theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
    for (std::int64_t t = 0; t < n; ++t) {
      float* kr = derotated_k_.data() + t * d;
      float* vr = derotated_v_.data() + t * d;
      for (std::int64_t c = 0; c < d; ++c) {
        kr[c] = to_float(k(h, t, c));
        vr[c] = to_float(v(h, t, c));
      }
      const double pos = static_cast<double>(rope.first_position + t);
      for (std::int64_t i = 0; i < half; ++i) {
        const std::int64_t a = rope.layout == RopeLayout::half ? i : 2 * i;
        const std::int64_t b = rope.layout == RopeLayout::half ? i + half : 2 * i + 1;
        const double angle = pos * inv_freq_[static_cast<std::size_t>(i)];
        const double c = std::cos(angle), s = std::sin(angle);
        const double x = kr[a], y = kr[b];
        kr[a] = static_cast<float>(x * c + y * s);
        kr[b] = static_cast<float>(y * c - x * s);
      }
    }
  }

  // Loads head-dim columns [c0, c0 + kLanes) of head h into the panels xk_ and
  // xv_ ([tokens][kLanes]; lanes past the head dim stay zero: they add nothing)
  // and adds their squares to the tokens' totals.
  template <class T>
  void load_panel(KVView<const T> k, KVView<const T> v, std::int64_t h, std::int64_t c0) {
    constexpr int W = kLanes;
    const int lanes = static_cast<int>(std::min<std::int64_t>(W, k.head_dim - c0));
    for (std::int64_t t = 0; t < k.tokens; ++t) {
      const std::int64_t src = source_[static_cast<std::size_t>(t)];
      Real* xk = xk_.data() + t * W;
      Real* xv = xv_.data() + t * W;
      for (int w = 0; w < W; ++w) {
        xk[w] = w < lanes ? element(k, h, src, c0 + w) : Real(0);
        xv[w] = w < lanes ? element(v, h, src, c0 + w) : Real(0);
      }
      for (int w = 0; w < W; ++w) {
        total_k_[static_cast<std::size_t>(t)] += xk[w] * xk[w];
        total_v_[static_cast<std::size_t>(t)] += xv[w] * xv[w];
      }
    }
  }

  template <class T>
  void residuals_global(KVView<const T> k, KVView<const T> v, std::int64_t h, double gamma) {
    constexpr int W = kLanes;
    const std::int64_t n = k.tokens, d = k.head_dim, m = lowpass_cutoff(n, gamma);
    Dct<Real, W>& dct = plan(n);
    for (Panel* p : {&xk_, &xv_}) p->resize(static_cast<std::size_t>(n * W));
    for (std::int64_t c0 = 0; c0 < d; c0 += W) {
      load_panel(k, v, h, c0);
      dct.lowpass_residual(xk_.data(), xv_.data(), m, residual_k_.data(), residual_v_.data());
    }
  }

  // The global transform with a base chosen by energy (Base::peak, mixed):
  // every head-dim panel's full spectrum is kept, the frequencies' energies
  // summed over the panels pick the base, then the residual is the inverse
  // transform of the other coefficients. Two transforms per panel, as the
  // low-pass path; n x d coefficients of K and of V are held meanwhile.
  template <class T>
  void residuals_global_chosen(KVView<const T> k, KVView<const T> v, std::int64_t h, double gamma, Base kind) {
    constexpr int W = kLanes;
    const std::int64_t n = k.tokens, d = k.head_dim, m = lowpass_cutoff(n, gamma);
    const std::int64_t panels = (d + W - 1) / W;
    Dct<Real, W>& dct = plan(n);
    for (Panel* p : {&xk_, &xv_}) p->resize(static_cast<std::size_t>(n * W));
    for (Panel* p : {&spectrum_k_, &spectrum_v_}) p->resize(static_cast<std::size_t>(panels * n * W));
    energy_k_.assign(static_cast<std::size_t>(n), Real(0));
    energy_v_.assign(static_cast<std::size_t>(n), Real(0));
    for (std::int64_t p = 0; p < panels; ++p) {
      load_panel(k, v, h, p * W);
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
    for (std::int64_t p = 0; p < panels; ++p) {
      Real* sk = spectrum_k_.data() + p * n * W;
      Real* sv = spectrum_v_.data() + p * n * W;
      for (std::int64_t f = 0; f < n; ++f)  // the residual's spectrum: the base's frequencies removed
        for (int w = 0; w < W; ++w) {
          if (chosen_k_[static_cast<std::size_t>(f)]) sk[f * W + w] = Real(0);
          if (chosen_v_[static_cast<std::size_t>(f)]) sv[f * W + w] = Real(0);
        }
      dct.inverse(sk, sv, xk_.data(), xv_.data());
      for (std::int64_t t = 0; t < n; ++t)
        for (int w = 0; w < W; ++w) {
          residual_k_[static_cast<std::size_t>(t)] += xk_[static_cast<std::size_t>(t * W + w)] * xk_[static_cast<std::size_t>(t * W + w)];
          residual_v_[static_cast<std::size_t>(t)] += xv_[static_cast<std::size_t>(t * W + w)] * xv_[static_cast<std::size_t>(t * W + w)];
        }
    }
  }

  template <class T>
  void residuals_blocked(KVView<const T> k, KVView<const T> v, std::int64_t h, double gamma, std::int64_t block,
                         Base kind) {
    const std::int64_t n = k.tokens, d = k.head_dim;
    // Buffers sized for a full block and written through topRows(), so that a
    // shorter last block does not reallocate them (Eigen would, on resize).
    const std::int64_t rows = std::min(block, n), most_m = lowpass_cutoff(rows, gamma);
    // A base chosen by energy needs every coefficient of the block.
    const std::int64_t coeff_rows = kind == Base::lowpass ? most_m : rows;
    Block* const buffers[3] = {&block_k_, &block_v_, &base_};
    for (Block* b : buffers)
      if (b->rows() != rows || b->cols() != d) b->resize(rows, d);
    if (coeff_.rows() != coeff_rows || coeff_.cols() != d) coeff_.resize(coeff_rows, d);
    if (kind != Base::lowpass) {
      if (chosen_basis_.rows() != most_m || chosen_basis_.cols() != rows) chosen_basis_.resize(most_m, rows);
      if (chosen_coeff_.rows() != most_m || chosen_coeff_.cols() != d) chosen_coeff_.resize(most_m, d);
      energy_k_.resize(static_cast<std::size_t>(rows));
      chosen_k_.resize(static_cast<std::size_t>(rows));
    }
    for (std::int64_t b0 = 0; b0 < n; b0 += block) {
      const std::int64_t len = std::min(block, n - b0), m = lowpass_cutoff(len, gamma);
      const Block& c = basis(len, kind == Base::lowpass ? m : len);  // m x len, or len x len
      for (std::int64_t t = 0; t < len; ++t) {
        const std::int64_t src = source_[static_cast<std::size_t>(b0 + t)];
        for (std::int64_t j = 0; j < d; ++j) {
          block_k_(t, j) = element(k, h, src, j);
          block_v_(t, j) = element(v, h, src, j);
        }
      }
      for (auto [x, r] : {std::pair{&block_k_, &residual_k_}, std::pair{&block_v_, &residual_v_}}) {
        if (kind == Base::lowpass) {
          // Residual = X - C^T (C X), rank m, so 2 m len d multiply-adds per input.
          coeff_.topRows(m).noalias() = c * x->topRows(len);
          base_.topRows(len).noalias() = c.transpose() * coeff_.topRows(m);
        } else {
          // Every coefficient (len^2 d), then the base from the m chosen ones (m len d).
          coeff_.topRows(len).noalias() = c * x->topRows(len);
          for (std::int64_t f = 0; f < len; ++f) energy_k_[static_cast<std::size_t>(f)] = coeff_.row(f).squaredNorm();
          choose_base_frequencies(kind, energy_k_.data(), len, m, &order_, chosen_k_.data());
          for (std::int64_t f = 0, i = 0; f < len; ++f)
            if (chosen_k_[static_cast<std::size_t>(f)]) {
              chosen_basis_.row(i).head(len) = c.row(f);
              chosen_coeff_.row(i) = coeff_.row(f);
              ++i;
            }
          base_.topRows(len).noalias() =
              chosen_basis_.topLeftCorner(m, len).transpose() * chosen_coeff_.topRows(m);
        }
        for (std::int64_t t = 0; t < len; ++t)
          (*r)[static_cast<std::size_t>(b0 + t)] = (x->row(t) - base_.row(t)).squaredNorm();
      }
      for (std::int64_t t = 0; t < len; ++t) {
        total_k_[static_cast<std::size_t>(b0 + t)] = block_k_.row(t).squaredNorm();
        total_v_[static_cast<std::size_t>(b0 + t)] = block_v_.row(t).squaredNorm();
      }
    }
  }

  static void add_energy(HeadEnergy* e, Real k_total, Real k_high, Real v_total, Real v_high) {
    e->k_total += static_cast<double>(k_total);
    e->k_high += static_cast<double>(k_high);
    e->v_total += static_cast<double>(v_total);
    e->v_high += static_cast<double>(v_high);
  }

  Dct<Real, kLanes>& plan(std::int64_t n) {
    auto it = plans_.find(n);
    if (it == plans_.end()) it = plans_.emplace(n, std::make_unique<Dct<Real, kLanes>>(n)).first;
    return *it->second;
  }

  const Block& basis(std::int64_t len, std::int64_t m) {
    const std::int64_t key = len * (len + 1) + m;
    auto it = bases_.find(key);
    if (it == bases_.end()) it = bases_.emplace(key, dct_basis<Real>(len, m)).first;
    return it->second;
  }

  // The 2D low-pass basis of a tr x tc tile: one row per frequency (u, v) in
  // the zone, the outer product of the 1D DCT-II rows u and v (m x tr tc).
  const Block& grid_basis(std::int64_t tr, std::int64_t tc, GridZone zone, double gamma) {
    const GridKey key{tr, tc, zone, gamma};
    auto it = grid_bases_.find(key);
    if (it != grid_bases_.end()) return it->second;
    const Block row_basis = dct_basis<Real>(tr, tr), col_basis = dct_basis<Real>(tc, tc);
    std::int64_t m = 0;
    for (std::int64_t u = 0; u < tr; ++u)
      for (std::int64_t w = 0; w < tc; ++w) m += rules::in_grid_zone(zone, u, w, tr, tc, gamma);
    Block b(m, tr * tc);
    std::int64_t row = 0;
    for (std::int64_t u = 0; u < tr; ++u)
      for (std::int64_t w = 0; w < tc; ++w) {
        if (!rules::in_grid_zone(zone, u, w, tr, tc, gamma)) continue;
        for (std::int64_t i = 0; i < tr; ++i)
          for (std::int64_t j = 0; j < tc; ++j) b(row, i * tc + j) = row_basis(u, i) * col_basis(w, j);
        ++row;
      }
    return grid_bases_.emplace(key, std::move(b)).first->second;
  }

  using GridKey = std::tuple<std::int64_t, std::int64_t, GridZone, double>;
  std::map<GridKey, Block> grid_bases_;
  Block tile_k_, tile_v_, tile_coeff_, tile_base_;
  std::vector<std::int64_t> source_;
  std::vector<float> derotated_k_, derotated_v_;
  std::vector<double> inv_freq_;
  std::vector<Real> residual_k_, residual_v_, total_k_, total_v_;
  Panel xk_, xv_;
  Block block_k_, block_v_, coeff_, base_;
  // Bases chosen by energy (Base::peak, mixed): the full spectra of one head
  // (global) or the chosen rows of a block's basis and coefficients, the
  // frequencies' energies and which are chosen.
  Panel spectrum_k_, spectrum_v_;
  Block chosen_basis_, chosen_coeff_;
  std::vector<Real> energy_k_, energy_v_;
  std::vector<std::uint8_t> chosen_k_, chosen_v_;
  std::vector<std::int32_t> order_;
  std::map<std::int64_t, std::unique_ptr<Dct<Real, kLanes>>> plans_;
  std::map<std::int64_t, Block> bases_;
};

#if FLASHCACHE_EXCEPTIONS
// One-shot scoring of one layer; throws flashcache::Error on bad input.
template <class Real = float, class T>
LayerScores score_layer(KVView<T> k, KVView<T> v, const Options& opt = {}) {
  LayerScores out;
  Scorer<Real> scorer;
  throw_if_error(scorer.score(KVView<const T>(k), KVView<const T>(v), opt, &out));
  return out;
}
#endif

}  // namespace flashcache
