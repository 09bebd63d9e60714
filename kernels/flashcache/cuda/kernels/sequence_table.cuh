#pragma once
// Stage 0, the sequence table: per-sequence lengths and offsets from the caller's CSR
// metadata, checked on the device (the host never reads indptr).
//
// One CTA walks the batch in chunks: lengths from indptr (dense) or from the
// page table (paged), exclusive scans for the packed token offsets and for
// the energy-partial slots (one per tile of `tile` tokens), and every
// inconsistency reported through the status word, as is a sequence shorter
// than the image spans (Cache::spans) reach.
#include <cub/block/block_scan.cuh>

#include "flashcache/cuda/kernels/common.cuh"

namespace flashcache::gpu::kernels {

struct SequenceTableParams {
  int sequences = 0;
  std::int64_t capacity = 0;                   // bound on the packed tokens over the batch
  std::int64_t tile = 1;                       // tokens per energy-partial slot
  const std::int32_t* indptr = nullptr;        // null: one dense sequence of `capacity` tokens
  const std::int32_t* page_indices = nullptr;  // non-null: paged
  const std::int32_t* last_page_len = nullptr;
  std::int64_t page_size = 0;
  std::int64_t num_pages = 0;
  // Image spans (Cache::spans): every sequence must hold the span that ends
  // last, span `grid_span` = [grid_first, grid_end); grid_end 0: no spans.
  std::int64_t grid_end = 0;
  std::int64_t grid_first = 0;
  int grid_span = 0;
  std::int32_t* len = nullptr;     // [B]
  std::int32_t* offset = nullptr;  // [B+1]
  std::int32_t* slots = nullptr;   // [B+1]
  int* status = nullptr;
};

inline constexpr int kSequenceTableThreads = 256;

// A template (never instantiated with another argument) so that the kernel has
// vague linkage: any number of translation units may include this header.
template <int kOneDefinition = 0>
__global__ void __launch_bounds__(kSequenceTableThreads) sequence_table_kernel(SequenceTableParams p) {
  using Scan = cub::BlockScan<long long, kSequenceTableThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  const int tid = static_cast<int>(threadIdx.x);
  // The status word starts clean for this run; every later kernel reads it.
  if (tid == 0)
    for (int i = 0; i < kStatusWords; ++i) p.status[i] = 0;
  __syncthreads();

  const bool paged = p.page_indices != nullptr;
  // Paged: indptr starts at 0 (FlashInfer's convention), and no sequence has
  // more pages than the capacity could fill; with the capacity check on the
  // total below, this bounds every page-id read that follows.
  const long long max_pages = paged ? ceil_div(p.capacity, p.page_size) : 0;
  if (paged && tid == 0 && p.indptr[0] != 0) raise(p.status, DeviceErrc::bad_indptr, 0, p.indptr[0], p.indptr[1]);

  long long token_carry = 0, slot_carry = 0;
  for (int base = 0; base < p.sequences; base += kSequenceTableThreads) {
    const int b = base + tid;
    long long len = 0;
    if (b < p.sequences) {
      if (p.indptr == nullptr) {
        len = p.capacity;
      } else {
        const long long lo = p.indptr[b], hi = p.indptr[b + 1];
        if (lo < 0 || hi < lo) {
          raise(p.status, DeviceErrc::bad_indptr, b, lo, hi);
        } else if (!paged) {
          if (hi > p.capacity) raise(p.status, DeviceErrc::capacity_exceeded, hi, p.capacity);
          len = hi - lo;
        } else if (hi - lo > max_pages) {
          raise(p.status, DeviceErrc::bad_indptr, b, lo, hi);
        } else if (hi > lo) {
          const long long last = p.last_page_len[b];
          if (last < 1 || last > p.page_size)
            raise(p.status, DeviceErrc::bad_page, b, last, p.page_size);
          else
            len = (hi - lo - 1) * p.page_size + last;
        }
      }
    }
    long long tokens_before = 0, tokens_total = 0, slots_before = 0, slots_total = 0;
    Scan(scan_storage).ExclusiveSum(len, tokens_before, tokens_total);
    __syncthreads();
    Scan(scan_storage).ExclusiveSum(ceil_div(len, p.tile), slots_before, slots_total);
    __syncthreads();
    if (b < p.sequences) {
      if (p.grid_end > 0 && len < p.grid_end)
        raise(p.status, DeviceErrc::grid_past_sequence, b, len, p.grid_span, p.grid_first, p.grid_end);
      p.len[b] = static_cast<std::int32_t>(len > 2147483647LL ? 0 : len);
      // Offsets are clamped so that a failed run never indexes past the buffers.
      const long long off = token_carry + tokens_before;
      p.offset[b] = static_cast<std::int32_t>(off > p.capacity ? p.capacity : off);
      p.slots[b] = static_cast<std::int32_t>(slot_carry + slots_before);
    }
    token_carry += tokens_total;
    slot_carry += slots_total;
  }
  if (tid == 0) {
    if (token_carry > p.capacity) raise(p.status, DeviceErrc::capacity_exceeded, token_carry, p.capacity);
    p.offset[p.sequences] = static_cast<std::int32_t>(token_carry > p.capacity ? p.capacity : token_carry);
    p.slots[p.sequences] = static_cast<std::int32_t>(slot_carry);
  }
  // Page ids are read only through an indptr found valid above (every thread
  // sees the status after the barrier), so a garbage indptr is reported, not
  // an illegal address.
  __syncthreads();
  if (paged && !failed(p.status)) {  // page ids must name pages of the pool
    const long long last = p.indptr[p.sequences];
    for (long long i = tid; i < last; i += kSequenceTableThreads) {
      const int page = p.page_indices[i];
      if (page < 0 || page >= p.num_pages) raise(p.status, DeviceErrc::bad_page, -1, page, p.num_pages);
    }
  }
}

}  // namespace flashcache::gpu::kernels
