#pragma once
// Stage 1, score (blocked transform): blocked_edges_kernel, the scan between
// score_blocked_kernel's two passes that finds the row standing in for each
// deferred block's leading non-finite rows (score_blocked.cuh says why).
#include <cub/block/block_scan.cuh>

#include <cstdint>

#include "flashcache/cuda/kernels/common.cuh"
#include "flashcache/cuda/kernels/score_blocked.cuh"

namespace flashcache::gpu::kernels {

// ---- stand-ins for deferred blocks ---------------------------------------------
struct EdgeParams {
  int sequences = 0;
  int block_size = 0;
  std::int64_t slot_count = 0;
  const std::int32_t* slots = nullptr;       // [B+1]
  const std::int32_t* first_good = nullptr;  // [L][H][slot_count], from pass 0
  const std::int32_t* last_good = nullptr;
  std::int32_t* source = nullptr;  // [L][H][slot_count]: a token, or kSourceNone / FirstInBlock / Zeros
  int* status = nullptr;
};

inline constexpr int kEdgeThreads = 256;

// One CTA per (sequence, head, layer): an exclusive max-scan of the blocks'
// last finite tokens (the nearest finite row before each block), then an
// exclusive min-scan from the right of their first finite tokens (the first
// after it), in chunks of kEdgeThreads blocks with a carry.
template <int kOneDefinition = 0>
__global__ void __launch_bounds__(kEdgeThreads) blocked_edges_kernel(EdgeParams p) {
  using Scan = cub::BlockScan<int, kEdgeThreads>;
  __shared__ typename Scan::TempStorage storage;
  const int tid = static_cast<int>(threadIdx.x);
  if (stop_requested(p.status)) return;
  const int b = static_cast<int>(blockIdx.x), head = static_cast<int>(blockIdx.y), layer = static_cast<int>(blockIdx.z);
  const std::int64_t base = (std::int64_t{layer} * gridDim.y + head) * p.slot_count;
  const std::int64_t s0 = p.slots[b], s1 = p.slots[b + 1];
  constexpr int kNone = 0x7fffffff;

  // Forward: the last finite token before each block, parked in `source`.
  int carry = -1;
  for (std::int64_t c = s0; c < s1; c += kEdgeThreads) {
    const std::int64_t s = c + tid;
    const int last = s < s1 ? p.last_good[base + s] : -1;
    int before = -1, chunk = -1;
    Scan(storage).ExclusiveScan(last, before, -1, MaxOf{}, chunk);
    __syncthreads();  // the scan storage is reused next chunk
    if (s < s1) p.source[base + s] = before > carry ? before : carry;
    if (chunk > carry) carry = chunk;
  }
  __syncthreads();  // the forward results are read by other threads below

  // Backward: the first finite token after each block, and the decision.
  int after_carry = kNone;
  for (std::int64_t c = s1 - 1; c >= s0; c -= kEdgeThreads) {
    const std::int64_t s = c - tid;  // thread 0 takes the last block of the chunk
    const int first = s >= s0 ? p.first_good[base + s] : -1;
    int after = kNone, chunk = kNone;
    Scan(storage).ExclusiveScan(first >= 0 ? first : kNone, after, kNone, MinOf{}, chunk);
    __syncthreads();
    if (s >= s0) {
      if (after_carry < after) after = after_carry;
      const std::int32_t before = p.source[base + s];
      const std::int64_t t0 = (s - s0) * p.block_size;
      std::int32_t decision;
      if (first == t0)
        decision = kSourceNone;
      else if (before >= 0)
        decision = before;
      else if (first >= 0)
        decision = kSourceFirstInBlock;
      else
        decision = after != kNone ? after : kSourceZeros;
      p.source[base + s] = decision;
    }
    if (chunk < after_carry) after_carry = chunk;
  }
}

}  // namespace flashcache::gpu::kernels
