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
#include <cstddef>
#include <cstdint>
#include <vector>

#include "config.hpp"
#include "enum_names.hpp"
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

// The image spans of one request's sequence: a view of the caller's GridSpan
// array, given per call beside the protect mask (per-request data, not a
// setting). The same positions hold in every layer (and, on the GPU, in every
// sequence of the batch).
class ImageSpans {
 public:
  ImageSpans() = default;
  // Implicit, as a view: a std::vector<GridSpan> passes where ImageSpans is asked.
  ImageSpans(const std::vector<GridSpan>& spans) : data_(spans.data()), size_(spans.size()) {}  // NOLINT
  ImageSpans(const GridSpan* data, std::size_t size) : data_(data), size_(size) {}

  FLASHCACHE_INLINE const GridSpan* begin() const { return data_; }
  FLASHCACHE_INLINE const GridSpan* end() const { return data_ + size_; }
  FLASHCACHE_INLINE std::size_t size() const { return size_; }
  FLASHCACHE_INLINE bool empty() const { return size_ == 0; }
  FLASHCACHE_INLINE const GridSpan& operator[](std::size_t i) const { return data_[i]; }
  // As rules::recent_window_start() (host and device) reads spans.
  FLASHCACHE_INLINE int span_count() const { return static_cast<int>(size_); }
  FLASHCACHE_INLINE std::int64_t span_first(int g) const { return data_[g].first; }
  FLASHCACHE_INLINE std::int64_t span_end(int g) const { return data_[g].end(); }

 private:
  const GridSpan* data_ = nullptr;
  std::size_t size_ = 0;
};

// Which 2D frequencies (u down the rows, v across the columns) of a grid of
// rows x cols form the smooth base; both keep about gamma of the coefficients.
enum class GridZone {
  rectangle,  // u < ceil(sqrt(gamma) rows) and v < ceil(sqrt(gamma) cols): separable
  triangle,   // u / rows + v / cols < sqrt(2 gamma): isotropic, as JPEG's zig-zag
};

template <>
struct EnumNames<GridZone> {
  static constexpr EnumName<GridZone> table[] = {{GridZone::rectangle, "rectangle"}, {GridZone::triangle, "triangle"}};
};
inline const char* to_string(GridZone e) { return enum_name(e); }

// One tile of a span: patches [r0, r0 + tr) x [c0, c0 + tc) of its grid.
struct SpanTile {
  std::int64_t r0 = 0, c0 = 0, tr = 0, tc = 0;
};

// How the 2D pass cuts a rows x cols span into tiles: tile_rows x tile_cols
// patches, the last row and column of tiles keeping what is left, numbered
// row-major. The one definition the CPU scorer, the GPU workspace, launch and
// kernels all read.
struct SpanTiling {
  std::int64_t rows = 1, cols = 1;
  std::int64_t tile_rows = 1, tile_cols = 1;

  // ceil(n / tile) without forming n + tile - 1 (a tile near INT64_MAX overflows it).
  FLASHCACHE_INLINE std::int64_t down() const { return (rows - 1) / tile_rows + 1; }
  FLASHCACHE_INLINE std::int64_t across() const { return (cols - 1) / tile_cols + 1; }
  FLASHCACHE_INLINE std::int64_t count() const { return down() * across(); }
  // Tile q, 0 <= q < count().
  FLASHCACHE_INLINE SpanTile at(std::int64_t q) const {
    const std::int64_t i = q / across(), j = q % across();
    SpanTile t;
    t.r0 = i * tile_rows;
    t.c0 = j * tile_cols;
    t.tr = rows - t.r0 < tile_rows ? rows - t.r0 : tile_rows;
    t.tc = cols - t.c0 < tile_cols ? cols - t.c0 : tile_cols;
    return t;
  }
};

// A span of rows x cols patches (both >= 1) cut into tile x tile tiles, or
// kept whole when tile <= 0.
FLASHCACHE_INLINE SpanTiling span_tiling(std::int64_t rows, std::int64_t cols, std::int64_t tile) {
  SpanTiling s;
  s.rows = rows;
  s.cols = cols;
  s.tile_rows = tile > 0 ? tile : rows;
  s.tile_cols = tile > 0 ? tile : cols;
  return s;
}

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
inline Status check_grid_spans(ImageSpans spans) {
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
inline Status check_grids_fit(ImageSpans spans, std::int64_t tokens) {
  for (std::size_t i = 0; i < spans.size(); ++i)
    if (spans[i].end() > tokens)
      return make_error(Errc::invalid_shape, "grid span ", i, " [", spans[i].first, ", ", spans[i].end(),
                        ") reaches past the ", tokens, " tokens of the sequence");
  return Status::success();
}

}  // namespace flashcache
