#pragma once
// Stage 4b (flashcache/cuda/kernels/compact_paged.cuh): the kept rows moved forward
// in place in a paged cache, once every page is known to belong to one sequence.
#include "flashcache/cuda/kernels/compact_paged.cuh"
#include "flashcache/cuda/launch/gather.cuh"  // kept_rows
#include "flashcache/cuda/run_context.cuh"

namespace flashcache::gpu::detail {

template <class T>
Status compact_in_place(const RunContext<T>& run, const Outputs<T>& out, const std::int32_t* kept,
                        const std::int32_t* kept_indptr, cudaStream_t stream) {
  const Cache<T>& c = run.cache;
  const Workspace& ws = run.ws;
  const std::size_t owner_bytes = (static_cast<std::size_t>(c.pages.num_pages) + 31) / 32 * 4;
  FLASHCACHE_RETURN_IF_ERROR(
      cuda_status(cudaMemsetAsync(ws.page_owners(), 0, owner_bytes, stream), "clearing the page bitmap"));
  kernels::PageOwnerParams owners;
  owners.sequences = c.sequences;
  owners.page_indptr = c.pages.indptr;
  owners.page_indices = c.pages.indices;
  owners.owners = ws.page_owners();
  owners.status = run.status;
  kernels::page_owner_kernel<><<<kernels::kPageOwnerCtas, kernels::kPageOwnerThreads, 0, stream>>>(owners);
  FLASHCACHE_RETURN_IF_ERROR(launched("page_owner_kernel"));
  kernels::CompactParams p{};
  static_cast<kernels::KeptRows&>(p) = kept_rows(run, kept, kept_indptr);
  p.stage_rows = static_cast<int>(kernels::kCompactStageBytes / (2 * c.head_dim * static_cast<std::int64_t>(sizeof(T))));
  p.budget = ws.budget();
  p.page_indptr = c.pages.indptr;
  p.page_size = c.pages.page_size;
  p.new_len = out.new_len;
  p.pages_freed = out.pages_freed;
  const dim3 grid(static_cast<unsigned>(c.sequences), static_cast<unsigned>(c.heads),
                  static_cast<unsigned>(c.layers));
  if constexpr (sizeof(T) == 2)
    kernels::compact_paged_kernel<2><<<grid, kernels::kCompactThreads, kernels::kCompactStageBytes, stream>>>(p);
  else
    kernels::compact_paged_kernel<4><<<grid, kernels::kCompactThreads, kernels::kCompactStageBytes, stream>>>(p);
  return launched("compact_paged_kernel");
}

}  // namespace flashcache::gpu::detail
