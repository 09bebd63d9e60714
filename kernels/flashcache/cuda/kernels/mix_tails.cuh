#pragma once
// Stage 1c, query tails (ScoreOptions::query = tail) and the distance from the
// mean (mean_weight): per (sequence, head, layer) the residual scores and the
// second term, each over its mean on the rankable tokens, mixed by sum or by max
// (rules::tail_mix_scales, rules::mixed_tail_score: the CPU's mix_term, one
// definition), with the mean's weight at each sequence's keep ratio (rules::faded_weight).
//
// One CTA per (sequence, head, layer) sums the rankable tokens' scores and tails
// in double, strided per thread and then by a CUB block reduce (a fixed tree), so
// the result does not change from run to run; then rewrites the rankable scores
// in place. Always-kept scores (+inf, NaN) stay as they are.
#include <cub/block/block_reduce.cuh>

#include "flashcache/cuda/kernels/common.cuh"

namespace flashcache::gpu::kernels {

// A weight that follows each sequence's keep ratio (ScoreOptions::mean_full_keep):
// the budget as Budget holds it, and where the weight is full and where 0.
struct WeightFade {
  bool on = false;  // off: `weight` for every sequence
  double full_keep = 0, zero_keep = 0;
  bool budget_is_ratio = true;
  double budget_ratio = 1.0;
  std::int64_t budget_count = 0;
};

struct MixTailsParams {  // the grid is (sequence, head, layer)
  std::int64_t capacity = 0;
  SeqTable seq;
  double weight = 0.5;         // ScoreOptions::tail_weight (mean_weight)
  WeightFade fade;             // mean_weight only; a faded weight of 0 leaves the scores as they are
  bool by_max = false;         // ScoreOptions::tail_mix == TailMix::max
  float* scores = nullptr;     // [L][H][capacity], packed tokens
  const float* tails = nullptr;  // [L][H][capacity], the same packing
  int* status = nullptr;
};

inline constexpr int kMixTailsThreads = 256;

// The sums one CTA reduces: rankable scores, their tails, their count.
struct TailSums {
  double score = 0, tail = 0, rankable = 0;
};

FLASHCACHE_INLINE void add_tail_term(float score, float tail, TailSums* s) {
  if (rules::always_kept_score(score)) return;
  s->score += static_cast<double>(score);
  s->tail += static_cast<double>(tail);
  s->rankable += 1.0;
}

template <int kOneDefinition = 0>
__global__ void __launch_bounds__(kMixTailsThreads) mix_tails_kernel(MixTailsParams p) {
  using Reduce = cub::BlockReduce<double, kMixTailsThreads>;
  __shared__ typename Reduce::TempStorage storage;
  __shared__ double scale_residual, scale_tail;  // (a struct with initializers cannot be __shared__)
  if (stop_requested(p.status)) return;
  const int b = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y), layer = static_cast<int>(blockIdx.z);
  const int tid = static_cast<int>(threadIdx.x);
  const std::int64_t heads = gridDim.y;
  const std::int64_t base = (std::int64_t{layer} * heads + h) * p.capacity + p.seq.offset[b];
  const std::int64_t n = p.seq.len[b];
  double weight = p.weight;
  if (p.fade.on) {  // the whole CTA reads the same n: it returns together, before any barrier
    const double keep = rules::keep_share(p.fade.budget_is_ratio, p.fade.budget_ratio, p.fade.budget_count, n);
    weight = rules::faded_weight(p.weight, p.fade.full_keep, p.fade.zero_keep, keep);
    if (!(weight > 0)) return;  // the CPU Scorer mixes nothing at weight 0
  }
  float* score = p.scores + base;
  const float* tail = p.tails + base;
  TailSums mine;
  for (std::int64_t t = tid; t < n; t += kMixTailsThreads) add_tail_term(score[t], tail[t], &mine);
  TailSums sum;
  sum.score = Reduce(storage).Sum(mine.score);
  __syncthreads();
  sum.tail = Reduce(storage).Sum(mine.tail);
  __syncthreads();
  sum.rankable = Reduce(storage).Sum(mine.rankable);
  if (tid == 0) {
    const rules::TailMixScales s = rules::tail_mix_scales(weight, sum.score, sum.tail, sum.rankable);
    scale_residual = s.residual;
    scale_tail = s.tail;
  }
  __syncthreads();
  rules::TailMixScales s;
  s.residual = scale_residual;
  s.tail = scale_tail;
  for (std::int64_t t = tid; t < n; t += kMixTailsThreads)
    if (!rules::always_kept_score(score[t])) score[t] = rules::mixed_tail_score(s, p.by_max, score[t], tail[t]);
}

}  // namespace flashcache::gpu::kernels
