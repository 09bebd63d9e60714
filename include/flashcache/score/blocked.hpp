#pragma once
// Score's blocked residual (CPU; ScoreOptions::transform == blocked, score.hpp): an
// explicit DCT basis over each block of ScoreOptions::block_size tokens (the last
// one shorter). The low-pass base is X - C^T (C X) with C the block's m lowest
// rows; a base chosen by energy (Base::peak, mixed; base.hpp) takes every
// coefficient of the block, then the base from the m chosen rows. The GPU's
// twin: flashcache/cuda/kernels/score_blocked.cuh.
#include <Eigen/Core>

#include <algorithm>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "flashcache/options.hpp"
#include "flashcache/score/base.hpp"
#include "flashcache/score/dct.hpp"
#include "flashcache/score/rows.hpp"
#include "flashcache/view.hpp"

namespace flashcache {
namespace detail {

// Keeps its bases (one per block length and rank) and block buffers between
// calls: nothing is allocated once it has seen a length and block size.
template <class Real>
class BlockedResidual {
 public:
  // Writes head h's per-token residuals and totals into out (each sized to
  // the tokens), reading token t from row source[t] (map_nonfinite_rows).
  template <class T>
  void compute(KVView<const T> k, KVView<const T> v, std::int64_t h, const std::vector<std::int64_t>& source,
               double gamma, std::int64_t block, Base kind, TokenResiduals<Real>* out) {
    const std::int64_t n = k.tokens, d = k.head_dim;
    // Buffers sized for a full block and written through topRows(), so that a
    // shorter last block does not reallocate them (Eigen would, on resize).
    const std::int64_t rows = std::min(block, n), most_m = lowpass_cutoff(rows, gamma);
    // A base chosen by energy needs every coefficient of the block.
    const std::int64_t coeff_rows = kind == Base::lowpass ? most_m : rows;
    Matrix* const buffers[3] = {&block_k_, &block_v_, &base_};
    for (Matrix* b : buffers)
      if (b->rows() != rows || b->cols() != d) b->resize(rows, d);
    if (coeff_.rows() != coeff_rows || coeff_.cols() != d) coeff_.resize(coeff_rows, d);
    if (kind != Base::lowpass) {
      if (chosen_basis_.rows() != most_m || chosen_basis_.cols() != rows) chosen_basis_.resize(most_m, rows);
      if (chosen_coeff_.rows() != most_m || chosen_coeff_.cols() != d) chosen_coeff_.resize(most_m, d);
      energy_.resize(static_cast<std::size_t>(rows));
      chosen_.resize(static_cast<std::size_t>(rows));
    }
    for (std::int64_t b0 = 0; b0 < n; b0 += block) {
      const std::int64_t len = std::min(block, n - b0), m = lowpass_cutoff(len, gamma);
      const Matrix& c = basis(len, kind == Base::lowpass ? m : len);  // m x len, or len x len
      for (std::int64_t t = 0; t < len; ++t) {
        const std::int64_t src = source[static_cast<std::size_t>(b0 + t)];
        for (std::int64_t j = 0; j < d; ++j) {
          block_k_(t, j) = source_element<Real>(k, h, src, j);
          block_v_(t, j) = source_element<Real>(v, h, src, j);
        }
      }
      for (auto [x, r] : {std::pair{&block_k_, &out->residual_k}, std::pair{&block_v_, &out->residual_v}}) {
        if (kind == Base::lowpass) {
          // Residual = X - C^T (C X), rank m, so 2 m len d multiply-adds per input.
          coeff_.topRows(m).noalias() = c * x->topRows(len);
          base_.topRows(len).noalias() = c.transpose() * coeff_.topRows(m);
        } else {
          // Every coefficient (len^2 d), then the base from the m chosen ones (m len d).
          coeff_.topRows(len).noalias() = c * x->topRows(len);
          for (std::int64_t f = 0; f < len; ++f) energy_[static_cast<std::size_t>(f)] = coeff_.row(f).squaredNorm();
          choose_base_frequencies(kind, energy_.data(), len, m, &order_, chosen_.data());
          for (std::int64_t f = 0, i = 0; f < len; ++f)
            if (chosen_[static_cast<std::size_t>(f)]) {
              chosen_basis_.row(i).head(len) = c.row(f);
              chosen_coeff_.row(i) = coeff_.row(f);
              ++i;
            }
          base_.topRows(len).noalias() = chosen_basis_.topLeftCorner(m, len).transpose() * chosen_coeff_.topRows(m);
        }
        for (std::int64_t t = 0; t < len; ++t)
          (*r)[static_cast<std::size_t>(b0 + t)] = (x->row(t) - base_.row(t)).squaredNorm();
      }
      for (std::int64_t t = 0; t < len; ++t) {
        out->total_k[static_cast<std::size_t>(b0 + t)] = block_k_.row(t).squaredNorm();
        out->total_v[static_cast<std::size_t>(b0 + t)] = block_v_.row(t).squaredNorm();
      }
    }
  }

 private:
  using Matrix = RowMatrix<Real>;

  const Matrix& basis(std::int64_t len, std::int64_t m) {
    const std::int64_t key = len * (len + 1) + m;
    auto it = bases_.find(key);
    if (it == bases_.end()) it = bases_.emplace(key, dct_basis<Real>(len, m)).first;
    return it->second;
  }

  Matrix block_k_, block_v_, coeff_, base_;
  // Chosen bases: the chosen rows of a block's basis and coefficients, the
  // frequencies' energies (of the transform at hand, K or V) and which are
  // chosen (order_ is choose_base_frequencies' scratch).
  Matrix chosen_basis_, chosen_coeff_;
  std::vector<Real> energy_;
  std::vector<std::uint8_t> chosen_;
  std::vector<std::int32_t> order_;
  std::map<std::int64_t, Matrix> bases_;
};

}  // namespace detail
}  // namespace flashcache
