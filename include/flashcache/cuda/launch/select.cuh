#pragma once
// Stage 3 (flashcache/cuda/kernels/select.cuh): per (layer, sequence, head) the
// always-kept tokens, the window, the base sample and the top scores, ascending.
#include "flashcache/cuda/run_context.cuh"
#include "flashcache/cuda/kernels/select.cuh"

namespace flashcache::gpu::detail {

template <class T>
Status select_tokens(const RunContext<T>& run, std::int32_t* kept, std::int32_t* kept_indptr, cudaStream_t stream) {
  const Options& opt = run.opt;
  const Workspace& ws = run.ws;
  kernels::SelectParams p;
  p.sequences = run.cache.sequences;
  p.capacity = run.cache.capacity;
  p.seq = run.layers.seq;
  p.protect = run.protect;
  p.window_share = opt.select.window_share;
  p.base_share = opt.select.base_share;
  p.grid_base_share = opt.select.grid_base_share;
  p.grids = run.grids;
  p.base_mark = samples_base(opt.select, run.cache.spans) ? ws.base_mark() : nullptr;
  p.scores = ws.scores();
  p.budget = ws.budget();
  p.kept_indptr = kept_indptr;
  p.kept = kept;
  p.status = run.status;
  const dim3 grid(static_cast<unsigned>(run.cache.sequences), static_cast<unsigned>(run.cache.heads),
                  static_cast<unsigned>(run.cache.layers));
  if (p.base_mark != nullptr) {  // the base sample's picks, marked before the selection ranks them
    kernels::base_sample_kernel<><<<grid, kernels::kSelectThreads, 0, stream>>>(p);
    FLASHCACHE_RETURN_IF_ERROR(launched("base_sample_kernel"));
  }
  kernels::select_kernel<><<<grid, kernels::kSelectThreads, 0, stream>>>(p);
  return launched("select_kernel");
}

}  // namespace flashcache::gpu::detail
