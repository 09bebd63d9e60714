#pragma once
// A block-wide radix select: the threshold of the top `need` keys among a
// CTA's candidates, in O(candidates) whatever `need`. select_kernel ranks
// token scores with it, base_choose_kernel frequency energies.
//
// Keys are unsigned and compared as such (ordered_key / energy_key turn floats
// into them). Four passes of 8 bits each build a 256-bin shared histogram of
// the candidates that still match the prefix found so far; the lanes of a warp
// that share a bin add once, through their leader, since keys crowd into few
// bins (the top byte of a float key is mostly its exponent). Counting from the
// top bin down, the bin where the count reaches `need` fixes the next 8 bits.
// The result: every candidate with a key above `key` is in the top `need`, and
// `take_equal` of those with exactly `key` are (the caller takes the
// lowest-indexed ones, in a pass of its own, so ties go to the lower index).
#include <cub/block/block_scan.cuh>

#include <cstdint>

namespace flashcache::gpu::kernels {

inline constexpr int kRadixThreads = 256;  // one histogram bin per thread
using RadixScan = cub::BlockScan<int, kRadixThreads>;

struct RadixShared {
  int hist[256];
  int chosen_bin, still_needed;
};

struct RadixThreshold {
  std::uint32_t key = 0;
  int take_equal = 0;
};

// Every thread of a CTA of kRadixThreads calls it alike, with 1 <= need <= the
// number of candidates. `candidate(i, &key)` says whether item i of [first, end)
// takes part and gives its key. `scan` may be the caller's own scan storage:
// the function ends after a barrier.
template <class Candidate>
__device__ __forceinline__ RadixThreshold block_radix_select(std::int64_t first, std::int64_t end, int need,
                                                             Candidate candidate, RadixShared& shared,
                                                             RadixScan::TempStorage& scan) {
  const int tid = static_cast<int>(threadIdx.x);
  std::uint32_t prefix = 0, prefix_mask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    shared.hist[tid] = 0;
    __syncthreads();
    for (std::int64_t base = first; base < end; base += kRadixThreads) {  // one trip count for the warp
      const std::int64_t i = base + tid;
      std::uint32_t key = 0;
      bool counted = i < end && candidate(i, &key);
      counted = counted && (key & prefix_mask) == prefix;
      const unsigned voters = __ballot_sync(0xffffffffu, counted);
      if (counted) {
        const unsigned bin = (key >> shift) & 255u;
        const unsigned peers = __match_any_sync(voters, bin);
        if ((tid & 31) == __ffs(peers) - 1) atomicAdd(&shared.hist[bin], __popc(peers));
      }
    }
    __syncthreads();
    const int bin = 255 - tid;  // counts from the top bin down
    const int here = shared.hist[bin];
    int above = 0;  // candidates in bins above `bin`
    RadixScan(scan).ExclusiveSum(here, above);
    if (above < need && above + here >= need) {
      shared.chosen_bin = bin;
      shared.still_needed = need - above;
    }
    __syncthreads();
    prefix |= static_cast<std::uint32_t>(shared.chosen_bin) << shift;
    prefix_mask |= 255u << shift;
    need = shared.still_needed;
    __syncthreads();  // chosen_bin / still_needed are rewritten next pass
  }
  return RadixThreshold{prefix, need};
}

}  // namespace flashcache::gpu::kernels
