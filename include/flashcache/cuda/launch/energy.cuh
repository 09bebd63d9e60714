#pragma once
// Stage 1b (flashcache/cuda/kernels/energy.cuh): per-(layer, sequence) energy sums,
// R_l and the largest protected count over the heads; or, in a tensor-parallel
// run, R_l alone from sums already reduced over the ranks.
#include "flashcache/cuda/kernels/energy.cuh"
#include "flashcache/cuda/run_context.cuh"

namespace flashcache::gpu::detail {

template <class T>
Status sum_energy(const RunContext<T>& run, float* ratio_out, cudaStream_t stream) {
  const WorkspaceLayout& layout = run.ws.layout();
  const Workspace& ws = run.ws;
  kernels::EnergyParams p;
  p.sequences = run.cache.sequences;
  p.heads = static_cast<int>(run.cache.heads);
  p.slot_count = layout.slot_count;
  p.slots = run.layers.seq.slots;
  p.energy_part = static_cast<const float4*>(ws.energy_part());
  p.protected_part = ws.protected_part();
  p.grid_tiles = static_cast<int>(layout.grid_tiles);
  p.grid_energy = static_cast<const float2*>(ws.grid_energy());
  p.grid_protected = ws.grid_protected();
  p.energy = ws.energy();
  p.ratio = ws.ratio();
  p.protected_max = ws.protected_max();
  p.ratio_out = ratio_out;
  p.status = run.status;
  kernels::energy_kernel<><<<dim3(static_cast<unsigned>(run.cache.sequences), static_cast<unsigned>(run.cache.layers)),
                             kernels::kEnergyThreads, kernels::energy_smem_bytes(p.heads), stream>>>(p);
  return launched("energy_kernel");
}

// R_l of every (layer, sequence) from the energy sums (after a reduction over ranks).
template <class T>
Status energy_ratios(const RunContext<T>& run, float* ratio_out, cudaStream_t stream) {
  kernels::RatioParams p;
  p.count = run.cache.layers * run.cache.sequences;
  p.energy = run.ws.energy();
  p.ratio = run.ws.ratio();
  p.ratio_out = ratio_out;
  p.status = run.status;
  kernels::ratio_kernel<><<<static_cast<unsigned>(kernels::ceil_div(p.count, kernels::kRatioThreads)),
                            kernels::kRatioThreads, 0, stream>>>(p);
  return launched("ratio_kernel");
}

}  // namespace flashcache::gpu::detail
