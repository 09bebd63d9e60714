#pragma once
// Stage 1, Transform::blocked (flashcache/cuda/kernels/score_blocked.cuh): one
// fused kernel per block of tokens, run twice around the edge scan.
#include "flashcache/cuda/kernels/score_blocked.cuh"
#include "flashcache/cuda/kernels/score_blocked_edges.cuh"
#include "flashcache/cuda/run_context.cuh"

namespace flashcache::gpu::detail {

template <class T, int kHeadDim, int kTile>
Status launch_blocked_for(const kernels::BlockedParams<T>& p, dim3 grid, std::int64_t smem, cudaStream_t stream) {
  auto kernel = kernels::score_blocked_kernel<T, kHeadDim, kTile>;
  if (smem > kDefaultDynamicSmemBytes)
    FLASHCACHE_RETURN_IF_ERROR(
        cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
                    "raising the blocked kernel's shared memory"));
  kernel<<<grid, kernels::blocked_threads<kHeadDim>(), static_cast<std::size_t>(smem), stream>>>(p);
  return launched(p.resolve ? "score_blocked_kernel (resolve)" : "score_blocked_kernel");
}

template <class T>
Status score_blocked(const RunContext<T>& run, cudaStream_t stream) {
  const Cache<T>& c = run.cache;
  const Options& opt = run.opt;
  const Workspace& ws = run.ws;
  kernels::BlockedParams<T> p{};
  run.set_layer_rows(&p);
  p.block_size = static_cast<int>(opt.score.block_size);
  p.gamma = opt.score.gamma;
  p.protect = run.protect;
  p.grids = run.grids;
  p.grid_source = ws.grid_source();
  p.vector_ok = run.vector_ok;
  p.capacity = c.capacity;
  p.slot_count = ws.layout().slot_count;
  p.first_good = ws.first_good();
  p.last_good = ws.last_good();
  p.source = ws.source();
  p.scores = ws.scores();
  p.energy_part = static_cast<float4*>(ws.energy_part());
  p.protected_part = ws.protected_part();
  p.status = run.status;
  const dim3 grid(static_cast<unsigned>(ws.layout().slot_count), static_cast<unsigned>(c.heads),
                  static_cast<unsigned>(c.layers));
  const std::int64_t smem = blocked_smem_bytes(c.head_dim, sizeof(T), opt.score);
  auto pass = [&](bool resolve) {
    p.resolve = resolve;
    return dispatch_head_dim(c.head_dim, CompiledHeadDims{}, [&](auto head_dim) {
      constexpr int kHeadDim = decltype(head_dim)::value;
      if (blocked_tile(opt.score.block_size) == 64) return launch_blocked_for<T, kHeadDim, 64>(p, grid, smem, stream);
      return launch_blocked_for<T, kHeadDim, 128>(p, grid, smem, stream);
    });
  };
  // Pass 0 scores the blocks that start with a finite row; the scan finds the
  // stand-in row of the others; pass 1 scores those (see score_blocked.cuh).
  FLASHCACHE_RETURN_IF_ERROR(pass(false));
  kernels::EdgeParams e;
  e.sequences = c.sequences;
  e.block_size = static_cast<int>(opt.score.block_size);
  e.slot_count = ws.layout().slot_count;
  e.slots = run.layers.seq.slots;
  e.first_good = ws.first_good();
  e.last_good = ws.last_good();
  e.source = ws.source();
  e.status = run.status;
  kernels::blocked_edges_kernel<>
      <<<dim3(static_cast<unsigned>(c.sequences), static_cast<unsigned>(c.heads), static_cast<unsigned>(c.layers)),
         kernels::kEdgeThreads, 0, stream>>>(e);
  FLASHCACHE_RETURN_IF_ERROR(launched("blocked_edges_kernel"));
  return pass(true);
}

}  // namespace flashcache::gpu::detail
