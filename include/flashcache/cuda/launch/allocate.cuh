#pragma once
// Stage 2 (flashcache/cuda/kernels/allocate.cuh): per-layer budgets on the device,
// with the CPU's rules (rules.hpp), no host round trip.
#include "flashcache/cuda/kernels/allocate.cuh"
#include "flashcache/cuda/run_context.cuh"

namespace flashcache::gpu::detail {

template <class T>
Status allocate_budgets(const RunContext<T>& run, const Budget& budget, std::int32_t* kept_indptr,
                        cudaStream_t stream) {
  const Workspace& ws = run.ws;
  kernels::AllocateParams p;
  p.layers = run.cache.layers;
  p.sequences = run.cache.sequences;
  p.is_ratio = budget.is_ratio();
  p.ratio = budget.ratio_value();
  p.count = budget.token_count();
  p.dynamic = run.opt.allocate.mode == Allocation::dynamic;
  p.min_layer_ratio = run.opt.allocate.min_layer_ratio;
  p.len = ws.seq_len();
  p.energy_ratio = ws.ratio();
  p.protected_max = ws.protected_max();
  p.scratch_ratio = ws.scratch_ratio();
  p.scratch_tokens = ws.scratch_tokens();
  p.scratch_floor = ws.scratch_floor();
  p.scratch_out = ws.scratch_out();
  p.budget = ws.budget();
  p.kept_indptr = kept_indptr;
  p.status = run.status;
  kernels::allocate_kernel<><<<1, kernels::kAllocateThreads, 0, stream>>>(p);
  return launched("allocate_kernel");
}

}  // namespace flashcache::gpu::detail
