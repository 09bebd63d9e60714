#pragma once
// Stage 1, image spans (kernels/flashcache/score_grid.cuh): the 2D pass over
// Options::grids, after either 1D pass, one CTA per (tile, head, layer).
#include <algorithm>

#include "flashcache/cuda/run_context.cuh"
#include "flashcache/score_grid.cuh"

namespace flashcache::gpu::detail {

// The zone of a tr x tc tile: U rows of frequencies, V(0) columns (both prefixes, see score_grid.cuh).
inline void grid_zone_extent(std::int64_t tr, std::int64_t tc, const Options& opt, std::int64_t* u, std::int64_t* v) {
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
inline Status size_grid_launch(std::int64_t head_dim, const Options& opt, std::int64_t smem_limit, GridLaunch* out) {
  GridLaunch g;
  g.spans = grid_spans(opt);
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

template <class T>
Status score_grids(const RunContext<T>& run, cudaStream_t stream) {
  const Cache<T>& c = run.cache;
  const Options& opt = run.opt;
  const Workspace& ws = run.ws;
  const GridLaunch& g = run.checked->grid;  // sized by the call's checks
  kernels::GridParams<T> p{};
  run.set_layer_rows(&p);
  p.grids = g.spans;
  p.zone = opt.grid_zone;
  p.gamma = opt.gamma;
  p.protect = run.protect;
  p.max_rows = static_cast<int>(g.max_rows);
  p.max_cols = static_cast<int>(g.max_cols);
  p.max_tokens = static_cast<int>(g.max_tokens);
  p.max_u = static_cast<int>(g.max_u);
  p.max_v = static_cast<int>(g.max_v);
  p.width = g.width;
  p.capacity = c.capacity;
  p.source = opt.transform == Transform::global ? ws.substitutes() : ws.grid_source();
  p.scores = ws.scores();
  p.grid_energy = static_cast<float2*>(ws.grid_energy());
  p.grid_protected = ws.grid_protected();
  p.status = run.status;
  auto kernel = kernels::score_grid_kernel<T>;
  if (g.smem > kDefaultDynamicSmemBytes)
    FLASHCACHE_RETURN_IF_ERROR(
        cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(g.smem)),
                    "raising the grid kernel's shared memory"));
  const dim3 grid(static_cast<unsigned>(static_cast<std::int64_t>(c.sequences) * g.spans.tiles()),
                  static_cast<unsigned>(c.heads), static_cast<unsigned>(c.layers));
  kernel<<<grid, kernels::kGridThreads, static_cast<std::size_t>(g.smem), stream>>>(p);
  return launched("score_grid_kernel");
}

}  // namespace flashcache::gpu::detail
