#pragma once
// Stage 4a, gather: copy the kept rows into a dense compact cache.
//
// One warp per kept row of one (layer, head); the lanes share the row's K and
// V bytes in 16-byte pieces when pointers and strides allow, else element by
// element. Only the element size matters, so the kernel is instantiated per
// size (2 or 4 bytes), not per type. Kept rows of a layer are packed over the
// batch: row i belongs to the sequence b with kept_indptr[b] <= i < kept_indptr[b+1]
// and goes to row i of the output.
#include "flashcache/cuda/kernels/common.cuh"

namespace flashcache::gpu::kernels {

template <int kElemBytes>
struct Element;
template <>
struct Element<2> {
  using type = unsigned short;
};
template <>
struct Element<4> {
  using type = unsigned int;
};

// What both stage-4 kernels read: every layer's K and V rows (gather reads
// them, compact_paged moves them in place), the row map and the kept lists.
struct KeptRows {
  void* k[kMaxLayers];
  void* v[kMaxLayers];
  RowMap rows;
  int sequences = 0;
  int head_dim = 0;
  std::int64_t capacity = 0;
  bool vector_ok = false;                     // 16-byte pieces: pointers and strides allow them
  const std::int32_t* kept = nullptr;         // [L][H][capacity]
  const std::int32_t* kept_indptr = nullptr;  // [L][B+1]
  int* status = nullptr;
};

struct GatherParams : KeptRows {
  void* k_out[kMaxLayers];
  void* v_out[kMaxLayers];
  std::int64_t out_head_stride = 0, out_token_stride = 0, out_capacity = 0;
};

inline constexpr int kGatherThreads = 256;
inline constexpr int kGatherRowsPerWarp = 4;
inline constexpr int kGatherRowsPerCta = kGatherThreads / 32 * kGatherRowsPerWarp;

template <int kElemBytes>
__global__ void __launch_bounds__(kGatherThreads) gather_kernel(GatherParams p) {
  using E = typename Element<kElemBytes>::type;
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  if (stop_requested(p.status)) return;
  const int head = static_cast<int>(blockIdx.y), layer = static_cast<int>(blockIdx.z);
  const int heads = static_cast<int>(gridDim.y);
  const std::int32_t* indptr = p.kept_indptr + std::int64_t{layer} * (p.sequences + 1);
  const std::int64_t rows_here = indptr[p.sequences];
  if (rows_here > p.out_capacity) {  // every CTA sees it; one reports it
    if (blockIdx.x == 0 && head == 0 && tid == 0)
      raise(p.status, DeviceErrc::output_capacity, layer, rows_here, p.out_capacity);
    return;
  }
  const std::int32_t* kept = p.kept + (std::int64_t{layer} * heads + head) * p.capacity;
  const E* k = static_cast<const E*>(p.k[layer]);
  const E* v = static_cast<const E*>(p.v[layer]);
  E* k_out = static_cast<E*>(p.k_out[layer]);
  E* v_out = static_cast<E*>(p.v_out[layer]);

  const std::int64_t first = std::int64_t{blockIdx.x} * kGatherRowsPerCta;
  // The warp's kept indices first: each row's copy then waits on its own load
  // only, not on the index load before it as well.
  std::int32_t source[kGatherRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kGatherRowsPerWarp; ++r) {
    const std::int64_t i = first + r * (kGatherThreads / 32) + warp;
    source[r] = i < rows_here ? kept[i] : 0;
  }
#pragma unroll
  for (int r = 0; r < kGatherRowsPerWarp; ++r) {
    const std::int64_t i = first + r * (kGatherThreads / 32) + warp;
    if (i >= rows_here) break;  // per warp: no barrier follows
    const int b = owner_of(indptr, p.sequences, i);
    const std::int64_t from = p.rows.offset(b, head, source[r]);
    const std::int64_t to = head * p.out_head_stride + i * p.out_token_stride;
    if (p.vector_ok) {
      constexpr int kPerVec = 16 / kElemBytes;
      const int vecs = p.head_dim / kPerVec;
      for (int q = lane; q < 2 * vecs; q += 32) {  // K's pieces, then V's
        const bool is_v = q >= vecs;
        const int piece = is_v ? q - vecs : q;
        const uint4 value = *reinterpret_cast<const uint4*>((is_v ? v : k) + from + std::int64_t{piece} * kPerVec);
        *reinterpret_cast<uint4*>((is_v ? v_out : k_out) + to + std::int64_t{piece} * kPerVec) = value;
      }
    } else {
      for (int c = lane; c < p.head_dim; c += 32) {
        k_out[to + c] = k[from + c];
        v_out[to + c] = v[from + c];
      }
    }
  }
}

}  // namespace flashcache::gpu::kernels
