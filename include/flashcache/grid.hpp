#pragma once
// Image spans: runs of tokens that form a 2D patch grid.
//
// A vision encoder emits an image as rows x cols patch tokens in raster order,
// so along the token axis vertical neighbours sit a whole row apart and a 1D
// DCT sees only the horizontal half of an image's smoothness. Tokens inside a
// GridSpan are scored with a separable 2D DCT over their grid instead (the
// low-pass zone below); every other token keeps the 1D transform. The rules
// here are shared by the CPU and GPU paths.
#include <cmath>
#include <cstdint>
#include <vector>

#include "config.hpp"
#include "error.hpp"
#include "rules.hpp"

namespace flashcache {

// Tokens [first, first + rows * cols) of a sequence, patch (r, c) at token
// first + r * cols + c.
struct GridSpan {
  std::int64_t first = 0;
  std::int64_t rows = 0;
  std::int64_t cols = 0;

  FLASHCACHE_INLINE std::int64_t tokens() const { return rows * cols; }
  FLASHCACHE_INLINE std::int64_t end() const { return first + rows * cols; }
};

// Which 2D frequencies (u down the rows, v across the columns) of a grid of
// rows x cols form the smooth base; both keep about gamma of the coefficients.
enum class GridZone {
  rectangle,  // u < ceil(sqrt(gamma) rows) and v < ceil(sqrt(gamma) cols): separable
  triangle,   // u / rows + v / cols < sqrt(2 gamma): isotropic, as JPEG's zig-zag
};

inline const char* to_string(GridZone z) { return z == GridZone::rectangle ? "rectangle" : "triangle"; }

namespace rules {

// Frequencies per axis of a rectangle zone: max(1, ceil(sqrt(gamma) n)).
FLASHCACHE_INLINE std::int64_t grid_axis_cutoff(std::int64_t n, double gamma) {
  if (n <= 0) return 0;
  const auto m = static_cast<std::int64_t>(ceil(sqrt(gamma) * static_cast<double>(n) - 1e-9));
  return m < 1 ? 1 : (m > n ? n : m);
}

// Whether frequency (u, v) of a rows x cols grid is in the low-pass zone. The
// DC term always is, so a zone is never empty.
FLASHCACHE_INLINE bool in_grid_zone(GridZone zone, std::int64_t u, std::int64_t v, std::int64_t rows, std::int64_t cols,
                                    double gamma) {
  if (u == 0 && v == 0) return true;
  if (zone == GridZone::rectangle) return u < grid_axis_cutoff(rows, gamma) && v < grid_axis_cutoff(cols, gamma);
  return static_cast<double>(u) / static_cast<double>(rows) + static_cast<double>(v) / static_cast<double>(cols) <
         sqrt(2.0 * gamma) - 1e-9;
}

// Edge length of tile `i` of an axis of n patches cut into tiles of `tile`:
// the last tile keeps what is left.
FLASHCACHE_INLINE std::int64_t tile_extent(std::int64_t n, std::int64_t tile, std::int64_t i) {
  const std::int64_t left = n - i * tile;
  return left < tile ? left : tile;
}

// The base sample's sub-grid of a span for `count` picks (1 <= count <= rows
// * cols): r rows by c columns of cells, about sqrt(count rows / cols) rows.
struct GridSampleShape {
  std::int64_t r = 0, c = 0;
};
FLASHCACHE_INLINE GridSampleShape grid_sample_shape(std::int64_t count, std::int64_t rows, std::int64_t cols) {
  const double aspect = static_cast<double>(rows) / static_cast<double>(cols);
  std::int64_t r = static_cast<std::int64_t>(llround(sqrt(static_cast<double>(count) * aspect)));
  r = r < 1 ? 1 : (r > rows ? rows : r);
  GridSampleShape s;
  s.c = (count + r - 1) / r < cols ? (count + r - 1) / r : cols;
  s.r = (count + s.c - 1) / s.c < rows ? (count + s.c - 1) / s.c : rows;
  return s;
}
// Token (within the sequence) of cell p = i * c + j of a span's sub-grid: the centre of the cell.
FLASHCACHE_INLINE std::int64_t grid_sample_token(std::int64_t first, std::int64_t rows, std::int64_t cols,
                                                 GridSampleShape s, std::int64_t p) {
  const std::int64_t i = p / s.c, j = p % s.c;
  return first + ((2 * i + 1) * rows / (2 * s.r)) * cols + (2 * j + 1) * cols / (2 * s.c);
}

}  // namespace rules

// Spans must have at least one row and column, start at a token >= 0 and not
// overlap (in any order).
inline Status check_grid_spans(const std::vector<GridSpan>& spans) {
  for (std::size_t i = 0; i < spans.size(); ++i) {
    const GridSpan& g = spans[i];
    if (g.first < 0 || g.rows < 1 || g.cols < 1)
      return make_error(Errc::invalid_option, "grid span ", i, " (first ", g.first, ", ", g.rows, " x ", g.cols,
                        "): needs first >= 0 and at least one row and column");
    if (g.rows > (std::int64_t{1} << 31) / g.cols || g.first > (std::int64_t{1} << 62) - g.tokens())
      return make_error(Errc::invalid_option, "grid span ", i, ": ", g.rows, " x ", g.cols, " tokens is too large");
    for (std::size_t j = 0; j < i; ++j)
      if (g.first < spans[j].end() && spans[j].first < g.end())
        return make_error(Errc::invalid_option, "grid spans ", j, " [", spans[j].first, ", ", spans[j].end(), ") and ",
                          i, " [", g.first, ", ", g.end(), ") overlap");
  }
  return Status::success();
}

// Every span must lie inside a sequence of `tokens` tokens.
inline Status check_grids_fit(const std::vector<GridSpan>& spans, std::int64_t tokens) {
  for (std::size_t i = 0; i < spans.size(); ++i)
    if (spans[i].end() > tokens)
      return make_error(Errc::invalid_shape, "grid span ", i, " [", spans[i].first, ", ", spans[i].end(),
                        ") reaches past the ", tokens, " tokens of the sequence");
  return Status::success();
}

}  // namespace flashcache
