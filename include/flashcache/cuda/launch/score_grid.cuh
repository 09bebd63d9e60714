#pragma once
// Stage 1, image spans (flashcache/cuda/kernels/score_grid.cuh): the 2D pass over
// Cache::spans, after either 1D pass, one CTA per (tile, head, layer).
#include "flashcache/cuda/run_context.cuh"
#include "flashcache/cuda/kernels/score_grid.cuh"

namespace flashcache::gpu::detail {

template <class T>
Status score_grids(const RunContext<T>& run, cudaStream_t stream) {
  const Cache<T>& c = run.cache;
  const Options& opt = run.opt;
  const Workspace& ws = run.ws;
  const GridLaunch& g = run.checked->grid;  // sized by the call's checks
  kernels::GridParams<T> p{};
  run.set_layer_rows(&p);
  p.grids = g.spans;
  p.zone = opt.score.grid_zone;
  p.gamma = opt.score.gamma;
  p.protect = run.protect;
  p.max_rows = static_cast<int>(g.max_rows);
  p.max_cols = static_cast<int>(g.max_cols);
  p.max_tokens = static_cast<int>(g.max_tokens);
  p.max_u = static_cast<int>(g.max_u);
  p.max_v = static_cast<int>(g.max_v);
  p.width = g.width;
  p.capacity = c.capacity;
  p.source = opt.score.transform == Transform::global ? ws.substitutes() : ws.grid_source();
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
