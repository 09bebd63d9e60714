#pragma once
// Stage 4b, compact: move the kept rows forward inside a paged cache.
//
// One CTA per (layer, sequence, head). Kept token i (ascending, so kept[i] >= i)
// moves to slot i of the same sequence. The moves go in chunks: the CTA reads
// a chunk's source rows into shared memory, waits, then writes them. A chunk
// writes slots [c, c + R) and later chunks read only slots >= c + R, so nothing
// is overwritten before it is read, in place and without a second buffer.
// Each (layer, sequence) reports its new length and the pages it frees
// (the trailing ones); the caller owns the page table and updates it.
//
// Supported layouts: one page table for all layers (FlashInfer's CSR
// indptr / indices / last_page_len; vLLM's block table rewritten as CSR), each
// page owned by one sequence. Refused by name: a page id that appears twice
// (prefix sharing, beam search: compacting would overwrite another sequence's
// rows; checked on the device by page_owner_kernel, before any move) and, on
// the host, dynamic allocation over several layers (each layer would keep its
// own length, which one shared table cannot describe).
#include "flashcache/cuda/kernels/common.cuh"
#include "flashcache/cuda/kernels/gather.cuh"

namespace flashcache::gpu::kernels {

struct CompactParams : KeptRows {
  int stage_rows = 0;                         // rows (K and V) per chunk in shared memory
  const std::int32_t* budget = nullptr;       // [L][B]
  const std::int32_t* page_indptr = nullptr;  // [B+1]
  std::int64_t page_size = 0;
  std::int32_t* new_len = nullptr;      // [L][B]
  std::int32_t* pages_freed = nullptr;  // [L][B]
};

inline constexpr int kCompactThreads = 256;
inline constexpr int kCompactStageBytes = 32 * 1024;

template <int kElemBytes>
__global__ void __launch_bounds__(kCompactThreads) compact_paged_kernel(CompactParams p) {
  using E = typename Element<kElemBytes>::type;
  extern __shared__ __align__(16) unsigned char stage[];
  const int tid = static_cast<int>(threadIdx.x);
  if (stop_requested(p.status)) return;
  const int b = static_cast<int>(blockIdx.x), head = static_cast<int>(blockIdx.y), layer = static_cast<int>(blockIdx.z);
  const int heads = static_cast<int>(gridDim.y);
  const std::int64_t lb = std::int64_t{layer} * p.sequences + b;
  const int budget = p.budget[lb];
  const std::int32_t* kept = p.kept + (std::int64_t{layer} * heads + head) * p.capacity +
                             p.kept_indptr[std::int64_t{layer} * (p.sequences + 1) + b];
  E* k = static_cast<E*>(p.k[layer]);
  E* v = static_cast<E*>(p.v[layer]);
  E* stage_k = reinterpret_cast<E*>(stage);
  E* stage_v = stage_k + std::int64_t{p.stage_rows} * p.head_dim;

  if (head == 0 && tid == 0) {
    const std::int64_t pages = p.page_indptr[b + 1] - p.page_indptr[b];
    p.new_len[lb] = budget;
    p.pages_freed[lb] = static_cast<std::int32_t>(pages - ceil_div(budget, p.page_size));
  }

  constexpr int kPerVec = 16 / kElemBytes;
  const int d = p.head_dim;
  for (int c0 = 0; c0 < budget; c0 += p.stage_rows) {
    const int rows = budget - c0 < p.stage_rows ? budget - c0 : p.stage_rows;
    if (p.vector_ok) {
      const int vecs = d / kPerVec;
      for (int i = tid; i < rows * vecs; i += kCompactThreads) {
        const int r = i / vecs, q = i % vecs;
        const std::int64_t from = p.rows.offset(b, head, kept[c0 + r]) + std::int64_t{q} * kPerVec;
        reinterpret_cast<uint4*>(stage_k)[i] = *reinterpret_cast<const uint4*>(k + from);
        reinterpret_cast<uint4*>(stage_v)[i] = *reinterpret_cast<const uint4*>(v + from);
      }
    } else {
      for (int i = tid; i < rows * d; i += kCompactThreads) {
        const std::int64_t from = p.rows.offset(b, head, kept[c0 + i / d]) + i % d;
        stage_k[i] = k[from];
        stage_v[i] = v[from];
      }
    }
    __syncthreads();  // every source row of the chunk is read before any slot is written
    if (p.vector_ok) {
      const int vecs = d / kPerVec;
      for (int i = tid; i < rows * vecs; i += kCompactThreads) {
        const int r = i / vecs, q = i % vecs;
        const std::int64_t to = p.rows.offset(b, head, c0 + r) + std::int64_t{q} * kPerVec;
        *reinterpret_cast<uint4*>(k + to) = reinterpret_cast<const uint4*>(stage_k)[i];
        *reinterpret_cast<uint4*>(v + to) = reinterpret_cast<const uint4*>(stage_v)[i];
      }
    } else {
      for (int i = tid; i < rows * d; i += kCompactThreads) {
        const std::int64_t to = p.rows.offset(b, head, c0 + i / d) + i % d;
        k[to] = stage_k[i];
        v[to] = stage_v[i];
      }
    }
    __syncthreads();  // the stage is refilled next chunk
  }
}

// ---- every page owned once ---------------------------------------------------
struct PageOwnerParams {
  int sequences = 0;
  const std::int32_t* page_indptr = nullptr;   // [B+1], validated by the sequence-table kernel
  const std::int32_t* page_indices = nullptr;  // ids validated in [0, num_pages) by the sequence-table kernel
  std::uint32_t* owners = nullptr;             // ceil(num_pages / 32) words, zeroed before the launch
  int* status = nullptr;
};

inline constexpr int kPageOwnerThreads = 256;
inline constexpr int kPageOwnerCtas = 64;

// Marks each page's bit; a bit already set is a page listed twice.
template <int kOneDefinition = 0>
__global__ void __launch_bounds__(kPageOwnerThreads) page_owner_kernel(PageOwnerParams p) {
  if (failed(p.status)) return;  // no barrier in this kernel
  const long long total = p.page_indptr[p.sequences];
  for (long long i = std::int64_t{blockIdx.x} * kPageOwnerThreads + threadIdx.x; i < total;
       i += std::int64_t{kPageOwnerCtas} * kPageOwnerThreads) {
    const int page = p.page_indices[i];
    const std::uint32_t bit = 1u << (page & 31);
    if (atomicOr(&p.owners[page >> 5], bit) & bit) raise(p.status, DeviceErrc::shared_page, page, i);
  }
}

}  // namespace flashcache::gpu::kernels
