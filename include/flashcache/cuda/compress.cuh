#pragma once
// flashcache on the GPU: the front door.
//
//   score     blocked: one fused kernel; global: cuFFT (Makhoul) per sequence;
//             then image spans (Cache::spans) again, by a 2D low-pass per tile
//   energy    per-(layer, sequence) energy ratio R_l, protected counts
//   allocate  per-layer budgets on the device (no host round trip)
//   select    per (layer, sequence, head): protected, window, base sample, top scores, ascending
//   gather    dense compact K', V'   and/or   compact   in place in a paged cache
//
// Two phases, as in CUB / CUTLASS:
//   can_implement(cache, budget, opt, out, global)  everything checkable on the host
//   workspace_size(cache, opt, &bytes, global)      bytes of scratch a run needs
//   compress_async(cache, budget, opt, out, ws, bytes, stream, global)
// compress_and_wait() runs on a caller's workspace and waits; compress() also allocates it.
// The run allocates nothing, never synchronises the host and never throws, so
// an engine can capture it in a CUDA graph. What only the device can see (a
// bad page id, a budget below the protected set of one sequence) is recorded
// in the workspace; device_status() waits for the stream and reports it.
// compress() is the convenience wrapper: allocate, run, wait, report. The
// tensor-parallel pair score_async / select_async: tensor_parallel.cuh. Query tails
// (ScoreOptions::query = tail, Cache::tails) are raised during prefill by
// query_tails_async: query_tails.cuh.
//
// Where things are: the checks in can_implement.cuh, the stage order in
// run.cuh, one launch header per kernel file in launch/ (each filling its
// kernel's Params from the RunContext built once per call, run_context.cuh),
// limits and compiled head dims in limits.cuh.
#include <cuda_runtime.h>

#include <cstddef>

#include "flashcache/cuda/cache.cuh"
#include "flashcache/cuda/can_implement.cuh"
#include "flashcache/cuda/global_transform.cuh"
#include "flashcache/cuda/limits.cuh"
#include "flashcache/cuda/query_tails.cuh"
#include "flashcache/cuda/run.cuh"
#include "flashcache/cuda/status.cuh"
#include "flashcache/cuda/tensor_parallel.cuh"
#include "flashcache/cuda/workspace.cuh"
#include "flashcache/options.hpp"

namespace flashcache::gpu {

// Bytes of workspace compress_async() needs for this cache and options.
template <class T>
Status workspace_size(const Cache<T>& c, const Options& opt, std::size_t* bytes, const GlobalTransform* global = nullptr) {
  WorkspaceLayout layout;
  FLASHCACHE_RETURN_IF_ERROR(workspace_layout(c, opt, global, &layout));
  *bytes = layout.total;
  return Status::success();
}

// Scores, allocates, selects and (optionally) gathers / compacts, on `stream`.
// Never synchronises and never throws; a failed Status means nothing (or only
// part) was enqueued. Device-side failures: see device_status().
template <class T>
Status compress_async(const Cache<T>& c, const Budget& budget, const Options& opt, const Outputs<T>& out,
                      void* workspace, std::size_t workspace_bytes, cudaStream_t stream,
                      const GlobalTransform* global = nullptr) {
  return detail::prepared_run(c, budget, opt, out, workspace, workspace_bytes, global,
                              [&](const detail::RunContext<T>& run) {
                                FLASHCACHE_RETURN_IF_ERROR(detail::enqueue_scores(run, budget, out, stream, global));
                                return detail::enqueue_selection(run, budget, out, stream);
                              });
}

// Waits for `stream` and reports what the last run on `workspace` found on the device.
template <class T>
Status device_status(const Cache<T>& c, const Options& opt, const void* workspace, cudaStream_t stream,
                     const GlobalTransform* global = nullptr) {
  WorkspaceLayout layout;
  FLASHCACHE_RETURN_IF_ERROR(workspace_layout(c, opt, global, &layout));
  return device_status(workspace, layout, stream);
}

// Runs on the caller's workspace (at least workspace_size() bytes) and waits for
// `stream`: compress() for a caller whose own allocator holds the memory (a
// framework's caching allocator, the Python door). Reports host- and
// device-side failures alike; a global transform is bound for this call only.
template <class T>
Status compress_and_wait(const Cache<T>& c, const Budget& budget, const Options& opt, const Outputs<T>& out,
                         void* workspace, std::size_t workspace_bytes, cudaStream_t stream = nullptr,
                         const GlobalTransform* global = nullptr) {
  FLASHCACHE_RETURN_IF_ERROR(can_implement(c, budget, opt, out, global));
  WorkspaceLayout layout;
  FLASHCACHE_RETURN_IF_ERROR(workspace_layout(c, opt, global, &layout));
  // The global is bound to this workspace for this call only (refused if another caller holds it).
  const bool is_global = opt.score.transform == Transform::global;
  const Status bound = is_global ? global->bind(stream, Workspace(workspace, layout).fft_work()) : Status::success();
  const bool bound_here = is_global && bound.ok();
  const Status s = bound.ok() ? compress_async(c, budget, opt, out, workspace, workspace_bytes, stream, global) : bound;
  const Status device =
      s.ok() ? device_status(workspace, layout, stream) : cuda_status(cudaStreamSynchronize(stream), "waiting");
  if (bound_here) global->release_binding();  // the run has finished: the workspace may go away
  return s.ok() ? device : s;
}

// Convenience for simple callers: allocates the workspace, runs on `stream`,
// waits, frees, and reports host- and device-side failures alike.
template <class T>
Status compress(const Cache<T>& c, const Budget& budget, const Options& opt, const Outputs<T>& out,
                cudaStream_t stream = nullptr, const GlobalTransform* global = nullptr) {
  FLASHCACHE_RETURN_IF_ERROR(can_implement(c, budget, opt, out, global));  // before anything is allocated
  WorkspaceLayout layout;
  FLASHCACHE_RETURN_IF_ERROR(workspace_layout(c, opt, global, &layout));
  void* ws = nullptr;
  FLASHCACHE_RETURN_IF_ERROR(
      cuda_status(cudaMalloc(&ws, layout.total > 0 ? layout.total : 1), "allocating the workspace"));
  const Status s = compress_and_wait(c, budget, opt, out, ws, layout.total, stream, global);
  const Status freed = cuda_status(cudaFree(ws), "freeing the workspace");
  return s.ok() ? freed : s;
}

}  // namespace flashcache::gpu
