#pragma once
// Score's grid residual (CPU; image spans, the image spans (ImageSpans), score.hpp): the
// tokens of one tile of a span (SpanTiling, grid.hpp) scored over their 2D
// patch grid, residual = X - B^T (B X) with B the tile's 2D low-pass basis:
// the frequencies (u, v) of the zone (rules::in_grid_zone). The GPU's twin:
// flashcache/cuda/kernels/score_grid.cuh.
#include <Eigen/Core>

#include <algorithm>
#include <cstdint>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "flashcache/grid.hpp"
#include "flashcache/rules.hpp"
#include "flashcache/score/dct.hpp"
#include "flashcache/score/rows.hpp"
#include "flashcache/view.hpp"

namespace flashcache {
namespace detail {

// Keeps its bases (one per tile shape, zone and gamma) and tile buffers
// between calls: nothing is allocated once it has seen the tile shapes.
template <class Real>
class GridResidual {
 public:
  // Overwrites the residuals in out of the tokens of tile t of span g of head
  // h, reading token i from row source[i] (map_nonfinite_rows). The totals
  // stay those of the 1D pass.
  template <class T>
  void compute(KVView<const T> k, KVView<const T> v, std::int64_t h, const std::vector<std::int64_t>& source,
               const GridSpan& g, const SpanTile& t, GridZone zone, double gamma, TokenResiduals<Real>* out) {
    const std::int64_t r0 = t.r0, tr = t.tr, c0 = t.c0, tc = t.tc;
    const std::int64_t len = tr * tc, d = k.head_dim;
    const Matrix& b = basis(tr, tc, zone, gamma);  // m x len
    // Buffers only grow (rows used through topRows), so edge tiles and later
    // calls of the same shapes allocate nothing.
    for (Matrix* x : {&tile_k_, &tile_v_, &tile_base_})
      if (x->rows() < len || x->cols() != d) x->resize(std::max<std::int64_t>(len, x->rows()), d);
    if (tile_coeff_.rows() < b.rows() || tile_coeff_.cols() != d)
      tile_coeff_.resize(std::max<std::int64_t>(b.rows(), tile_coeff_.rows()), d);
    const std::int64_t m = b.rows();
    auto token = [&](std::int64_t i) { return g.first + (r0 + i / tc) * g.cols + c0 + i % tc; };
    for (std::int64_t i = 0; i < len; ++i) {
      const std::int64_t src = source[static_cast<std::size_t>(token(i))];
      for (std::int64_t j = 0; j < d; ++j) {
        tile_k_(i, j) = source_element<Real>(k, h, src, j);
        tile_v_(i, j) = source_element<Real>(v, h, src, j);
      }
    }
    for (auto [x, r] : {std::pair{&tile_k_, &out->residual_k}, std::pair{&tile_v_, &out->residual_v}}) {
      tile_coeff_.topRows(m).noalias() = b * x->topRows(len);
      tile_base_.topRows(len).noalias() = b.transpose() * tile_coeff_.topRows(m);
      for (std::int64_t i = 0; i < len; ++i)
        (*r)[static_cast<std::size_t>(token(i))] = (x->row(i) - tile_base_.row(i)).squaredNorm();
    }
  }

 private:
  using Matrix = RowMatrix<Real>;

  // The 2D low-pass basis of a tr x tc tile: one row per frequency (u, v) in
  // the zone, the outer product of the 1D DCT-II rows u and v (m x tr tc).
  const Matrix& basis(std::int64_t tr, std::int64_t tc, GridZone zone, double gamma) {
    const Key key{tr, tc, zone, gamma};
    auto it = bases_.find(key);
    if (it != bases_.end()) return it->second;
    const Matrix row_basis = dct_basis<Real>(tr, tr), col_basis = dct_basis<Real>(tc, tc);
    std::int64_t m = 0;
    for (std::int64_t u = 0; u < tr; ++u)
      for (std::int64_t w = 0; w < tc; ++w) m += rules::in_grid_zone(zone, u, w, tr, tc, gamma);
    Matrix b(m, tr * tc);
    std::int64_t row = 0;
    for (std::int64_t u = 0; u < tr; ++u)
      for (std::int64_t w = 0; w < tc; ++w) {
        if (!rules::in_grid_zone(zone, u, w, tr, tc, gamma)) continue;
        for (std::int64_t i = 0; i < tr; ++i)
          for (std::int64_t j = 0; j < tc; ++j) b(row, i * tc + j) = row_basis(u, i) * col_basis(w, j);
        ++row;
      }
    return bases_.emplace(key, std::move(b)).first->second;
  }

  using Key = std::tuple<std::int64_t, std::int64_t, GridZone, double>;
  std::map<Key, Matrix> bases_;
  Matrix tile_k_, tile_v_, tile_coeff_, tile_base_;
};

}  // namespace detail
}  // namespace flashcache
