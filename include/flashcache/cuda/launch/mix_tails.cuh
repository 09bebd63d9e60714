#pragma once
// Stage 1c (flashcache/cuda/kernels/mix_tails.cuh): with ScoreOptions::query = tail, each
// head's residual scores mixed with its keys' tails (Cache::tails).
#include "flashcache/cuda/run_context.cuh"
#include "flashcache/cuda/kernels/mix_tails.cuh"

namespace flashcache::gpu::detail {

template <class T>
Status mix_tails(const RunContext<T>& run, cudaStream_t stream) {
  kernels::MixTailsParams p;
  p.capacity = run.cache.capacity;
  p.seq = run.layers.seq;
  p.weight = run.opt.score.tail_weight;
  p.by_max = run.opt.score.tail_mix == TailMix::max;
  p.scores = run.ws.scores();
  p.tails = run.cache.tails;
  p.status = run.status;
  const dim3 grid(static_cast<unsigned>(run.cache.sequences), static_cast<unsigned>(run.cache.heads),
                  static_cast<unsigned>(run.cache.layers));
  kernels::mix_tails_kernel<><<<grid, kernels::kMixTailsThreads, 0, stream>>>(p);
  return launched("mix_tails_kernel");
}

}  // namespace flashcache::gpu::detail
