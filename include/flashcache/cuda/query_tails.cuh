#pragma once
// Query tails on the device: what an engine calls after each prefill chunk's
// attention, with FlashAttention's per-query log-sum-exp (softmax_lse), to raise
// the keys' tails that compress_async then mixes into the scores (Cache::tails,
// ScoreOptions::query = tail; Options::with_query_tail() is the chosen preset).
//
//   // tails: [layers][kv heads][capacity] floats, zeroed once per prompt
//   for each layer l, after chunk [first, first + chunk):
//     gpu::query_tails_async(q_l, first, k_l, lse_l, tails_l, last_queries(prompt_tokens), stream);
//
// The arguments are the CPU's TailAccumulator::add (query_tail.hpp), with
// device pointers: q [query heads][chunk][d] and k [KV heads][>= first + chunk][d]
// as views (any strides; float, half or bfloat16), lse [query heads][chunk]
// (required: the device does not recompute it), tails one layer's [KV heads][>= first + chunk].
// Chunks and query heads merge by atomic maxima, so their order does not
// matter and the result does not change from run to run. Allocates nothing,
// never synchronises. In a batch, sequence b's tails are `tails_l` plus its
// packed offset, with `tokens` = capacity (the row stride of Cache::tails). K
// is one view of the sequence's keys at positions 0..: a paged cache's keys
// must be given as such a view (the kernel does not walk page tables).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "flashcache/cuda/run_context.cuh"  // launched
#include "flashcache/error.hpp"
#include "flashcache/query_tail.hpp"
#include "flashcache/cuda/kernels/query_tails.cuh"
#include "flashcache/view.hpp"

namespace flashcache::gpu {

// Everything checkable on the host: the CPU accumulator's checks (check_tail_chunk) and the kernel's limits.
template <class T>
Status can_implement_query_tails(KVView<const T> q, std::int64_t first, KVView<const T> k, const float* lse,
                                 TailView<float> tails, const QueryTailOptions& opt) {
  static_assert(detail::is_element_v<T>, "flashcache::gpu: elements are float, half_t or bfloat16_t");
  FLASHCACHE_RETURN_IF_ERROR(check_tail_options(opt));
  FLASHCACHE_RETURN_IF_ERROR(check_tail_chunk(q, first, k, tails, "query tails"));
  if (q.empty()) return Status::success();
  // The kernel's own limits.
  if (q.heads > 65535) return make_error(Errc::unsupported, "query tails: ", q.heads, " query heads (at most 65535)");
  if (q.head_dim > kernels::kTailMaxHeadDim)
    return make_error(Errc::unsupported, "query tails: head_dim ", q.head_dim, " (the kernel takes up to ",
                      kernels::kTailMaxHeadDim, ")");
  if (first + q.tokens > std::int64_t{2147483647} - kernels::kTailKeys)
    return make_error(Errc::unsupported, "query tails: ", first + q.tokens,
                      " positions (the kernel indexes them in 2^31)");
  if (lse == nullptr)
    return make_error(Errc::invalid_option, "query tails on the GPU need the queries' lse (FlashAttention's "
                                            "softmax_lse, [query heads][chunk] floats)");
  return Status::success();
}

template <class T>
Status query_tails_async(KVView<const T> q, std::int64_t first, KVView<const T> k, const float* lse,
                         TailView<float> tails, const QueryTailOptions& opt, cudaStream_t stream) {
  FLASHCACHE_RETURN_IF_ERROR(can_implement_query_tails(q, first, k, lse, tails, opt));
  const std::int64_t end = first + q.tokens, reach = end - opt.min_distance;  // keys some fed query may count
  if (q.empty() || reach <= 0) return Status::success();
  kernels::QueryTailsParams<T> p;
  p.q = q.data;
  p.q_head_stride = q.head_stride;
  p.q_token_stride = q.token_stride;
  p.chunk = q.tokens;
  p.first = first;
  p.k = k.data;
  p.k_head_stride = k.head_stride;
  p.k_token_stride = k.token_stride;
  p.head_dim = static_cast<int>(q.head_dim);
  p.group = static_cast<int>(q.heads / k.heads);
  p.lse = lse;
  p.tails = tails.data;
  p.tail_stride = tails.tokens;
  p.stride = opt.stride;
  p.from_position = opt.from_position;
  p.min_distance = opt.min_distance;
  p.scale = static_cast<float>(opt.scale > 0 ? opt.scale : 1.0 / std::sqrt(static_cast<double>(q.head_dim)));
  const dim3 grid(static_cast<unsigned>(kernels::ceil_div(reach, kernels::kTailKeys)), static_cast<unsigned>(q.heads));
  const auto smem = static_cast<std::size_t>(kernels::query_tails_smem_bytes(p.head_dim));
  kernels::query_tails_kernel<T><<<grid, kernels::kTailThreads, smem, stream>>>(p);
  return detail::launched("query_tails_kernel");
}

}  // namespace flashcache::gpu
