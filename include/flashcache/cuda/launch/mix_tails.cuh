#pragma once
// Stage 1c (flashcache/cuda/kernels/mix_tails.cuh, mean_distance.cuh): a second
// term per token mixed into each head's residual scores, in the CPU Scorer's
// order: with ScoreOptions::mean_weight, each token's distance from its head's
// mean K and V (or KeyDiff's cosine, ScoreOptions::mean_distance); then, with
// ScoreOptions::query = tail, its key's tail (Cache::tails).
#include "flashcache/cuda/run_context.cuh"
#include "flashcache/cuda/kernels/mean_distance.cuh"
#include "flashcache/cuda/kernels/mix_tails.cuh"

namespace flashcache::gpu::detail {

// term [L][H][capacity] (packed as the scores) mixed into the scores with `weight` (at each
// sequence's keep ratio with `fade` on), by sum or by max.
template <class T>
Status mix_term(const RunContext<T>& run, const float* term, double weight, bool by_max, cudaStream_t stream,
                const kernels::WeightFade& fade = {}) {
  kernels::MixTailsParams p;
  p.capacity = run.cache.capacity;
  p.seq = run.layers.seq;
  p.weight = weight;
  p.fade = fade;
  p.by_max = by_max;
  p.scores = run.ws.scores();
  p.tails = term;
  p.status = run.status;
  const dim3 grid(static_cast<unsigned>(run.cache.sequences), static_cast<unsigned>(run.cache.heads),
                  static_cast<unsigned>(run.cache.layers));
  kernels::mix_tails_kernel<><<<grid, kernels::kMixTailsThreads, 0, stream>>>(p);
  return launched("mix_tails_kernel");
}

// The distance from each head's mean, mixed in with mean_weight at each sequence's keep ratio
// under `budget` (ScoreOptions::mean_full_keep; both bounds 0: mean_weight everywhere).
template <class T>
Status mix_mean_distance(const RunContext<T>& run, const Budget& budget, cudaStream_t stream) {
  kernels::MeanDistanceParams<T> p;
  run.set_layer_rows(&p);
  p.vector_ok = run.vector_ok;
  p.key_cosine = run.opt.score.mean_distance == MeanDistance::key_cosine;
  p.capacity = run.cache.capacity;
  p.term = run.ws.mean_distance();
  p.status = run.status;
  const dim3 grid(static_cast<unsigned>(run.cache.sequences), static_cast<unsigned>(run.cache.heads),
                  static_cast<unsigned>(run.cache.layers));
  kernels::mean_distance_kernel<T>
      <<<grid, kernels::kMeanDistanceThreads, kernels::mean_distance_smem_bytes(run.cache.head_dim), stream>>>(p);
  FLASHCACHE_RETURN_IF_ERROR(launched("mean_distance_kernel"));
  kernels::WeightFade fade;
  fade.on = true;
  fade.full_keep = run.opt.score.mean_full_keep;
  fade.zero_keep = run.opt.score.mean_zero_keep;
  fade.budget_is_ratio = budget.is_ratio();
  fade.budget_ratio = budget.ratio_value();
  fade.budget_count = budget.token_count();
  return mix_term(run, p.term, run.opt.score.mean_weight, run.opt.score.mean_mix == TailMix::max, stream, fade);
}

template <class T>
Status mix_tails(const RunContext<T>& run, cudaStream_t stream) {
  return mix_term(run, run.cache.tails, run.opt.score.tail_weight, run.opt.score.tail_mix == TailMix::max, stream);
}

}  // namespace flashcache::gpu::detail
