#pragma once
// Stage 4a (flashcache/cuda/kernels/gather.cuh): the kept rows into the caller's
// dense K', V'.
#include "flashcache/cuda/run_context.cuh"
#include "flashcache/cuda/kernels/gather.cuh"

namespace flashcache::gpu::detail {

// The cache's rows and the kept lists, as both stage-4 launches pass them.
template <class T>
kernels::KeptRows kept_rows(const RunContext<T>& run, const std::int32_t* kept, const std::int32_t* kept_indptr) {
  const Cache<T>& c = run.cache;
  kernels::KeptRows r{};
  for (int l = 0; l < c.layers; ++l) {
    r.k[l] = c.k[l];
    r.v[l] = c.v[l];
  }
  r.rows = run.layers.rows;
  r.sequences = c.sequences;
  r.head_dim = static_cast<int>(c.head_dim);
  r.capacity = c.capacity;
  r.vector_ok = run.vector_ok;
  r.kept = kept;
  r.kept_indptr = kept_indptr;
  r.status = run.status;
  return r;
}

template <class T>
Status gather_kept(const RunContext<T>& run, const Outputs<T>& out, const std::int32_t* kept,
                   const std::int32_t* kept_indptr, cudaStream_t stream) {
  const Cache<T>& c = run.cache;
  kernels::GatherParams p{};
  static_cast<kernels::KeptRows&>(p) = kept_rows(run, kept, kept_indptr);
  const auto e = static_cast<std::int64_t>(sizeof(T));
  p.vector_ok = p.vector_ok && (out.out_head_stride * e) % 16 == 0 && (out.out_token_stride * e) % 16 == 0;
  for (int l = 0; l < c.layers; ++l) {
    p.k_out[l] = out.k_out[l];
    p.v_out[l] = out.v_out[l];
    p.vector_ok = p.vector_ok && aligned16(out.k_out[l]) && aligned16(out.v_out[l]);
  }
  p.out_head_stride = out.out_head_stride;
  p.out_token_stride = out.out_token_stride;
  p.out_capacity = out.out_capacity;
  const dim3 grid(static_cast<unsigned>(kernels::ceil_div(c.capacity, kernels::kGatherRowsPerCta)),
                  static_cast<unsigned>(c.heads), static_cast<unsigned>(c.layers));
  if constexpr (sizeof(T) == 2)
    kernels::gather_kernel<2><<<grid, kernels::kGatherThreads, 0, stream>>>(p);
  else
    kernels::gather_kernel<4><<<grid, kernels::kGatherThreads, 0, stream>>>(p);
  return launched("gather_kernel");
}

}  // namespace flashcache::gpu::detail
