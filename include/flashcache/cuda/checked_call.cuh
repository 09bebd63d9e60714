#pragma once
// What one call's checks (can_implement.cuh) work out that its run needs again,
// and the launch sizes both read: the device's shared-memory limit, the blocked
// kernel's and the image-span pass's shared memory, the spans as kernel
// parameters. RunContext (run_context.cuh) carries a CheckedCall into the launches.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "flashcache/cuda/kernels/smem_layout.cuh"  // BlockedSmem, GridSmem (and common.cuh's GridSpans)
#include "flashcache/cuda/limits.cuh"
#include "flashcache/error.hpp"
#include "flashcache/grid.hpp"
#include "flashcache/options.hpp"

namespace flashcache::gpu::detail {

// The shared memory one CTA may opt in to on the current device, or
// kMaxSharedBytes (sm_90) when there is no device to ask (host-only checks).
inline std::int64_t max_shared_bytes() {
  int device = 0, bytes = 0;
  if (cudaGetDevice(&device) == cudaSuccess &&
      cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) == cudaSuccess && bytes > 0)
    return bytes;
  (void)cudaGetLastError();  // the failed query's error is not the caller's
  return kMaxSharedBytes;
}

// The request's image spans as kernel parameters (at most kMaxGridSpans,
// checked by can_implement), each cut as span_tiling() cuts it.
inline kernels::GridSpans grid_spans(ImageSpans spans, const ScoreOptions& opt) {
  kernels::GridSpans g;
  const bool whole = opt.transform == Transform::global;
  std::int64_t longest = 1;
  for (const GridSpan& s : spans) longest = std::max({longest, s.rows, s.cols});
  // A tile wider than every span cuts nothing: the same tiles, and an int.
  const std::int64_t tile = whole ? 0 : std::min(std::max<std::int64_t>(opt.grid_tile, 1), longest);
  g.count = static_cast<int>(std::min<std::size_t>(spans.size(), kernels::kMaxGridSpans));
  g.tile = static_cast<std::int32_t>(tile);
  for (int i = 0; i < g.count; ++i) {
    const GridSpan& s = spans[static_cast<std::size_t>(i)];
    g.first[i] = static_cast<std::int32_t>(s.first);
    g.rows[i] = static_cast<std::int32_t>(s.rows);
    g.cols[i] = static_cast<std::int32_t>(s.cols);
    g.tile_start[i + 1] = static_cast<std::int32_t>(g.tile_start[i] + span_tiling(s.rows, s.cols, tile).count());
  }
  return g;
}

// Tile width of the blocked kernel for a block size.
inline int blocked_tile(std::int64_t block_size) { return block_size <= 64 ? 64 : 128; }

// kernels::blocked_threads<D>() of the kernel a head dim runs (D = 0 when it has none of its own).
inline int blocked_thread_count(std::int64_t head_dim) {
  for (int d : kCompiledHeadDims)
    if (d == head_dim) return d;
  return kernels::kBlockedGenericThreads;
}

inline std::int64_t blocked_smem_bytes(std::int64_t head_dim, std::int64_t elem_bytes, const ScoreOptions& opt) {
  const int tile = blocked_tile(opt.block_size);
  const kernels::BlockedSmem s(head_dim, elem_bytes, tile, lowpass_cutoff(opt.block_size, opt.gamma),
                               blocked_thread_count(head_dim));
  return s.total;
}

// The zone of a tr x tc tile: U rows of frequencies, V(0) columns (both prefixes, see score_grid.cuh).
inline void grid_zone_extent(std::int64_t tr, std::int64_t tc, const ScoreOptions& opt, std::int64_t* u,
                             std::int64_t* v) {
  *u = 0;
  while (*u < tr && rules::in_grid_zone(opt.grid_zone, *u, 0, tr, tc, opt.gamma)) ++*u;
  *v = 0;
  while (*v < tc && rules::in_grid_zone(opt.grid_zone, 0, *v, tr, tc, opt.gamma)) ++*v;
}

// How the 2D pass runs: the spans, the largest tile and zone (the shared-memory
// carve-up, kernels::GridSmem), the head-dim columns per chunk and the bytes.
struct GridLaunch {
  kernels::GridSpans spans;
  std::int64_t max_rows = 0, max_cols = 0, max_tokens = 0, max_u = 0, max_v = 0;
  std::int64_t widest_rows = 0, widest_cols = 0;  // the tile with the most tokens
  int width = 1;
  std::int64_t smem = 0;

  std::int64_t smem_for(int w) const {
    return kernels::GridSmem(max_rows, max_cols, max_tokens, max_u, max_v, w).total;
  }
};

// The widest column chunk (at most kGridMaxWidth) under kGridPreferredSmem,
// evened out over the head dim; refused when one column at a time still needs
// more than `smem_limit` bytes.
inline Status size_grid_launch(std::int64_t head_dim, ImageSpans spans, const ScoreOptions& opt, std::int64_t smem_limit,
                               GridLaunch* out) {
  GridLaunch g;
  g.spans = grid_spans(spans, opt);
  for (int i = 0; i < g.spans.count; ++i) {
    const SpanTiling tiling = span_tiling(g.spans.rows[i], g.spans.cols[i], g.spans.tile);
    // The first and the last tile: between them every shape a tile of this span takes.
    const SpanTile first = tiling.at(0), last = tiling.at(tiling.count() - 1);
    const std::int64_t row_extents[2] = {first.tr, last.tr};
    const std::int64_t col_extents[2] = {first.tc, last.tc};
    for (const std::int64_t tr : row_extents)
      for (const std::int64_t tc : col_extents) {
        std::int64_t u = 0, v = 0;
        grid_zone_extent(tr, tc, opt, &u, &v);
        g.max_rows = std::max(g.max_rows, tr);
        g.max_cols = std::max(g.max_cols, tc);
        g.max_u = std::max(g.max_u, u);
        g.max_v = std::max(g.max_v, v);
        if (tr * tc > g.max_tokens) {
          g.max_tokens = tr * tc;
          g.widest_rows = tr;
          g.widest_cols = tc;
        }
      }
  }
  int width = static_cast<int>(std::min<std::int64_t>(kernels::kGridMaxWidth, std::max<std::int64_t>(head_dim, 1)));
  while (width > 1 && g.smem_for(width) > kernels::kGridPreferredSmem) width /= 2;
  const std::int64_t chunks = kernels::ceil_div(std::max<std::int64_t>(head_dim, 1), width);
  g.width = static_cast<int>(kernels::ceil_div(std::max<std::int64_t>(head_dim, 1), chunks));
  g.smem = g.smem_for(g.width);
  if (g.smem > smem_limit) {
    if (opt.transform == Transform::global)
      return make_error(Errc::unsupported, "grid span of ", g.widest_rows, " x ", g.widest_cols,
                        " patches with Transform::global: its 2D pass needs ", g.smem,
                        " bytes of shared memory (one head-dim column at a time) > ", smem_limit,
                        " this device allows; use Transform::blocked (grid_tile x grid_tile tiles)");
    return make_error(Errc::unsupported, "grid_tile ", opt.grid_tile, ": a tile of ", g.widest_rows, " x ",
                      g.widest_cols, " patches needs ", g.smem, " bytes of shared memory > ", smem_limit,
                      " this device allows; use a smaller grid_tile");
  }
  *out = g;
  return Status::success();
}

// What a call's checks (can_implement.cuh) worked out for its run: the device's
// shared-memory limit and the 2D pass's launch (sized only with image spans).
struct CheckedCall {
  std::int64_t smem_limit = 0;
  GridLaunch grid;
};

}  // namespace flashcache::gpu::detail
