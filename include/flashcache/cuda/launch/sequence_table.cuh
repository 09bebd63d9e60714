#pragma once
// Stage 0 (flashcache/cuda/kernels/sequence_table.cuh): each sequence's length, packed
// offset and energy slots, from the cache's indptr or page table.
#include "flashcache/cuda/run_context.cuh"
#include "flashcache/cuda/kernels/sequence_table.cuh"

namespace flashcache::gpu::detail {

template <class T>
Status build_sequence_table(const RunContext<T>& run, cudaStream_t stream) {
  const Cache<T>& c = run.cache;
  kernels::SequenceTableParams p;
  p.sequences = c.sequences;
  p.capacity = c.capacity;
  p.tile = run.ws.layout().tile;
  p.indptr = c.sequence_indptr();
  if (c.paged()) {
    p.page_indices = c.pages.indices;
    p.last_page_len = c.pages.last_page_len;
    p.page_size = c.pages.page_size;
    p.num_pages = c.pages.num_pages;
  }
  const ImageSpans spans = c.spans;
  for (std::size_t i = 0; i < spans.size(); ++i)  // the span that ends last
    if (spans[i].end() > p.grid_end) {
      p.grid_end = spans[i].end();
      p.grid_first = spans[i].first;
      p.grid_span = static_cast<int>(i);
    }
  p.len = run.ws.seq_len();
  p.offset = run.ws.seq_offset();
  p.slots = run.ws.seq_slots();
  p.status = run.status;
  kernels::sequence_table_kernel<><<<1, kernels::kSequenceTableThreads, 0, stream>>>(p);
  return launched("sequence_table_kernel");
}

}  // namespace flashcache::gpu::detail
