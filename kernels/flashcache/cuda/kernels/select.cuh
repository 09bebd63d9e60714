#pragma once
// Stage 3, select: which tokens each (layer, sequence, head) keeps.
//
// One CTA of 256 threads per segment. The guarantees of select.hpp hold:
//   - always-kept tokens (protected: sink, window, mask; and score +inf or NaN) are kept,
//     and a budget below them is reported through the status word;
//   - then the recent window, then the base sample (base_share, and grid_base_share
//     inside image spans), exactly as select.hpp's keep_recent / keep_base_sample;
//   - the rest are the highest scores, ties to the lower token index;
//   - the output is ascending.
// The threshold comes from a radix select over the order-preserving bits of
// the float scores (radix_select.cuh), so the cost is O(N) per segment
// whatever the budget. A final pass in token
// order decides each token (key above the threshold, or equal to it and among
// the first `take_equal` such tokens) and writes it at its prefix-sum position.
// The window and the base sample enter the radix select as keys above every
// finite score (the window's newest first, only its newest `rest` free tokens
// when it holds more, see window_pick; then the sample), so its top takes
// them before any outlier, as the CPU does. The sample's picks depend on ranks
// among the free tokens, so base_sample_kernel (below) marks them first, in
// token order, one byte per token in the workspace.
#include <cub/block/block_scan.cuh>

#include "flashcache/cuda/kernels/common.cuh"
#include "flashcache/cuda/kernels/radix_select.cuh"

namespace flashcache::gpu::kernels {

// ---- the base sample: select.hpp's rules, host and device ---------------------------
using flashcache::rules::base_share_of;
using flashcache::rules::evenly_spaced_pick;
using flashcache::rules::grid_sample_shape;
using flashcache::rules::grid_sample_token;
using flashcache::rules::GridSampleShape;

// Keys of the tokens the top of the radix select takes first (finite scores
// stay below 0xFF800000): the recent window's, newest highest, then the sample's.
inline constexpr std::uint32_t kBaseSampleKey = 0xFF800000u;
inline constexpr long long kMaxWindowAge = 0x7FFFFE;  // window keys stay above kBaseSampleKey

// ---- the recent window: select.hpp's keep_recent, host and device ----------------------
// The window is the run of text tokens from rules::recent_window_start() to the
// end; keep_recent takes its newest free (not forced) tokens, at most the room
// left after the forced ones. 2^23 keys cannot order a window of up to 2^31
// tokens, so select_kernel first finds where the picks start: with `skip` =
// window_free - room > 0, at the free window token of rank `skip` in token
// order (the oldest `skip` stay out); else at the window's start. Only the picks
// get window keys (newest highest, the oldest ones tied, all taken either way).

// Whether token t is one of the window's picks, which start at `picks_from`.
FLASHCACHE_INLINE bool window_pick(std::int64_t t, std::int64_t picks_from, const GridSpans& grids) {
  return t >= picks_from && !grids.contains(t);
}

// The key of a window pick at `age` = n - 1 - t: above kBaseSampleKey, newest highest.
FLASHCACHE_INLINE std::uint32_t window_key(std::int64_t age) {
  return 0xFFFFFFFFu - static_cast<std::uint32_t>(age < kMaxWindowAge ? age : kMaxWindowAge);
}

// Whether a token, free in the window (`free_in_window`) with `rank` free window
// tokens before it, is where the picks start when the room leaves out the oldest `skip`.
FLASHCACHE_INLINE bool window_picks_start(bool free_in_window, long long rank, long long skip) {
  return free_in_window && rank == skip;
}

struct SelectParams {
  int sequences = 0;
  std::int64_t capacity = 0;
  SeqTable seq;
  ProtectRule protect;
  double window_share = 0;  // SelectOptions::window_share
  // The base sample (SelectOptions::base_share, grid_base_share inside `grids`);
  // base_mark null: none. [L][H][capacity] bytes, packed tokens: 1 = picked.
  double base_share = 0;
  double grid_base_share = 0;
  GridSpans grids;
  std::uint8_t* base_mark = nullptr;
  const float* scores = nullptr;              // [L][H][capacity]
  const std::int32_t* budget = nullptr;       // [L][B]
  const std::int32_t* kept_indptr = nullptr;  // [L][B+1]
  std::int32_t* kept = nullptr;               // [L][H][capacity]
  int* status = nullptr;
};

inline constexpr int kSelectThreads = kRadixThreads;

// A template (never instantiated with another argument) so that the kernel has
// vague linkage: any number of translation units may include this header.
template <int kOneDefinition = 0>
__global__ void __launch_bounds__(kSelectThreads) select_kernel(SelectParams p) {
  using Scan = RadixScan;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ RadixShared radix;
  __shared__ int forced_total;
  __shared__ long long picks_start;
  const int tid = static_cast<int>(threadIdx.x);
  if (stop_requested(p.status)) return;

  const int b = static_cast<int>(blockIdx.x), head = static_cast<int>(blockIdx.y), layer = static_cast<int>(blockIdx.z);
  const int heads = static_cast<int>(gridDim.y);
  const std::int64_t n = p.seq.len[b], packed = p.seq.offset[b];
  const std::int64_t lb = std::int64_t{layer} * p.sequences + b;
  const int budget = p.budget[lb];
  const float* score = p.scores + (std::int64_t{layer} * heads + head) * p.capacity + packed;
  std::int32_t* out = p.kept + (std::int64_t{layer} * heads + head) * p.capacity +
                      p.kept_indptr[std::int64_t{layer} * (p.sequences + 1) + b];
  auto forced = [&](std::int64_t t) {
    return flashcache::rules::always_kept_score(score[t]) || p.protect(t, n, packed + t);
  };
  // The recent window that scales with the budget (select.hpp's keep_recent):
  // its picks (all its free tokens, or the newest `rest` of them when it has
  // more: window_pick from picks_from) outrank every finite score, so the top of
  // the radix select takes them before any outlier, as the CPU does. The keys sit
  // in the +inf/NaN band of ordered_key, which forced tokens never enter.
  // It holds the newest text tokens: image spans' tokens are never part of it.
  const std::int64_t recent = flashcache::rules::recent_window(p.protect.window, p.window_share, budget);
  const std::int64_t window_start = flashcache::rules::recent_window_start(n, recent, p.grids);
  std::uint8_t* mark =
      p.base_mark != nullptr ? p.base_mark + (std::int64_t{layer} * heads + head) * p.capacity + packed : nullptr;
  std::int64_t picks_from = window_start;  // set below when the room is short of the window
  auto key_of = [&](std::int64_t t) -> std::uint32_t {
    if (window_pick(t, picks_from, p.grids)) return window_key(n - 1 - t);
    if (mark != nullptr && mark[t]) return kBaseSampleKey;
    return ordered_key(score[t]);
  };

  // 1. The protected set, and how many of the rest to take.
  if (tid == 0) forced_total = 0;
  __syncthreads();
  int mine = 0;
  for (std::int64_t t = tid; t < n; t += kSelectThreads) mine += forced(t) ? 1 : 0;
  if (mine) atomicAdd(&forced_total, mine);
  __syncthreads();
  const int forced_count = forced_total;
  const std::int64_t candidates = n - forced_count;
  const std::int64_t rest = std::int64_t{budget} - forced_count;
  if (rest < 0 || budget > n) {
    if (tid == 0) raise(p.status, DeviceErrc::budget_below_always_kept, layer, b, head, budget, forced_count);
    return;
  }

  // 2. Radix select: the key of the rest-th largest candidate, and how many
  // candidates with exactly that key are taken (the lowest-indexed ones).
  enum { kNone, kAll, kThreshold };
  const int mode = rest == 0 ? kNone : (rest >= candidates ? kAll : kThreshold);
  RadixThreshold top;
  if (mode == kThreshold) {
    // The window's picks: its newest `rest` free tokens when it has more (keep_recent).
    auto free_in_window = [&](std::int64_t t) { return t < n && window_pick(t, window_start, p.grids) && !forced(t); };
    int mine_free = 0;
    for (std::int64_t t = window_start + tid; t < n; t += kSelectThreads) mine_free += free_in_window(t) ? 1 : 0;
    int before = 0, window_free = 0;
    Scan(scan_storage).ExclusiveSum(mine_free, before, window_free);
    if (tid == 0) picks_start = n;
    __syncthreads();
    const long long skip = static_cast<long long>(window_free) - rest;
    if (skip > 0) {
      long long carry = 0;
      for (std::int64_t base = window_start; base < n && carry <= skip; base += kSelectThreads) {  // uniform
        const std::int64_t t = base + tid;
        const bool e = free_in_window(t);
        int rank = 0, chunk = 0;
        Scan(scan_storage).ExclusiveSum(e ? 1 : 0, rank, chunk);
        __syncthreads();
        if (window_picks_start(e, carry + rank, skip)) picks_start = t;
        carry += chunk;
      }
      __syncthreads();
      picks_from = picks_start;
    }
    auto candidate = [&](std::int64_t t, std::uint32_t* key) {
      if (forced(t)) return false;
      *key = key_of(t);
      return true;
    };
    top = block_radix_select(0, n, static_cast<int>(rest), candidate, radix, scan_storage);
  }
  const std::uint32_t threshold = top.key;
  const int take_equal = top.take_equal;

  // 3. Emit in token order: ascending indices by construction.
  int written = 0, equal_seen = 0;
  for (std::int64_t base = 0; base < n; base += kSelectThreads) {
    const std::int64_t t = base + tid;
    const bool valid = t < n;
    const bool f = valid && forced(t);
    const std::uint32_t key = (valid && !f) ? key_of(t) : 0u;
    const bool equal = valid && !f && mode == kThreshold && key == threshold;
    int equal_rank = 0, equal_here = 0;
    Scan(scan_storage).ExclusiveSum(equal ? 1 : 0, equal_rank, equal_here);
    __syncthreads();
    const bool keep =
        f || (valid && mode == kAll) ||
        (valid && !f && mode == kThreshold && (key > threshold || (equal && equal_seen + equal_rank < take_equal)));
    int position = 0, kept_here = 0;
    Scan(scan_storage).ExclusiveSum(keep ? 1 : 0, position, kept_here);
    __syncthreads();
    if (keep && written + position < budget) out[written + position] = static_cast<std::int32_t>(t);
    written += kept_here;
    equal_seen += equal_here;
  }
}

// ---- the base sample ------------------------------------------------------------------
// select.hpp's keep_base_sample, for select_kernel: one CTA per (sequence, head,
// layer) marks the picks in token order (block scans carried over chunks), one
// byte per token of base_mark; select_kernel then ranks them above every finite
// score. Launched only when a sample is taken. A budget below the protected set
// is select_kernel's to report: this kernel only leaves that segment unmarked.
template <int kOneDefinition = 0>
__global__ void __launch_bounds__(kSelectThreads) base_sample_kernel(SelectParams p) {
  using Scan = cub::BlockScan<int, kSelectThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int forced_total;
  const int tid = static_cast<int>(threadIdx.x);
  if (stop_requested(p.status)) return;

  const int b = static_cast<int>(blockIdx.x), head = static_cast<int>(blockIdx.y), layer = static_cast<int>(blockIdx.z);
  const int heads = static_cast<int>(gridDim.y);
  const std::int64_t n = p.seq.len[b], packed = p.seq.offset[b];
  const int budget = p.budget[std::int64_t{layer} * p.sequences + b];
  const float* score = p.scores + (std::int64_t{layer} * heads + head) * p.capacity + packed;
  std::uint8_t* mark = p.base_mark + (std::int64_t{layer} * heads + head) * p.capacity + packed;
  auto forced = [&](std::int64_t t) {
    return flashcache::rules::always_kept_score(score[t]) || p.protect(t, n, packed + t);
  };
  const std::int64_t recent = flashcache::rules::recent_window(p.protect.window, p.window_share, budget);

  if (tid == 0) forced_total = 0;
  for (std::int64_t t = tid; t < n; t += kSelectThreads) mark[t] = 0;
  __syncthreads();
  int mine = 0;
  for (std::int64_t t = tid; t < n; t += kSelectThreads) mine += forced(t) ? 1 : 0;
  if (mine) atomicAdd(&forced_total, mine);
  __syncthreads();
  const long long forced_count = forced_total;
  const long long rest = static_cast<long long>(budget) - forced_count;
  if (rest < 0 || budget > n) return;  // select_kernel reports it; uniform

  // Block-wide count of the tokens in [lo, hi) that satisfy `pred`; every thread gets it.
  auto count_if = [&](std::int64_t lo, std::int64_t hi, auto pred) -> long long {
    int mine = 0;
    for (std::int64_t t = lo + tid; t < hi; t += kSelectThreads) mine += pred(t) ? 1 : 0;
    int before = 0, total = 0;
    Scan(scan_storage).ExclusiveSum(mine, before, total);
    __syncthreads();
    return total;
  };
  const std::int64_t window_start = flashcache::rules::recent_window_start(n, recent, p.grids);
  auto in_window = [&](std::int64_t t) { return t >= window_start && !p.grids.contains(t); };
  const long long window_free = count_if(window_start, n, [&](std::int64_t t) { return in_window(t) && !forced(t); });
  const long long room = rest;  // budget - forced_count
  const long long window_taken = window_free < room ? window_free : room;
  const long long room_left = room - window_taken;
  const long long free = n - forced_count - window_taken;
  // Taken before the sample: forced, or the window (which took all its free tokens when room is left).
  auto taken = [&](std::int64_t t) { return in_window(t) || forced(t); };
  // Marks `count` picks spread evenly over the free tokens that `eligible` admits (`pool` of them).
  auto mark_evenly = [&](long long count, long long pool, auto eligible) {
    count = count < pool ? count : pool;
    if (count <= 0) return;
    long long carry = 0;
    for (std::int64_t base = 0; base < n; base += kSelectThreads) {  // one trip count for the CTA
      const std::int64_t t = base + tid;
      const bool e = t < n && eligible(t);
      int rank = 0, chunk = 0;
      Scan(scan_storage).ExclusiveSum(e ? 1 : 0, rank, chunk);
      __syncthreads();
      if (e && evenly_spaced_pick(carry + rank, count, pool)) mark[t] = 1;
      carry += chunk;
    }
  };
  if (room_left > 0 && free > 0) {
    if (p.grids.count == 0) {
      const long long want = flashcache::rules::base_sample_tokens(p.base_share, budget);
      mark_evenly(want < room_left ? want : room_left, free, [&](std::int64_t t) { return !taken(t); });
    } else {
      long long marked = 0, free_in_spans = 0;
      for (int g = 0; g < p.grids.count; ++g) {
        const long long first = p.grids.first[g], rows = p.grids.rows[g], cols = p.grids.cols[g];
        const long long part = count_if(first, first + rows * cols, [&](std::int64_t t) { return !taken(t); });
        free_in_spans += part;
        long long count = base_share_of(p.grid_base_share, budget, part, free);
        if (count > room_left - marked) count = room_left - marked;
        if (count > rows * cols) count = rows * cols;
        if (count <= 0) continue;
        // keep_grid_sample: the first `count` free cells of the sub-grid, row-major.
        const GridSampleShape shape = grid_sample_shape(count, rows, cols);
        long long carry = 0;
        for (long long base = 0; base < shape.r * shape.c; base += kSelectThreads) {
          const long long cell = base + tid;
          const long long t = cell < shape.r * shape.c ? grid_sample_token(first, rows, cols, shape, cell) : 0;
          const bool e = cell < shape.r * shape.c && !taken(t);
          int rank = 0, chunk = 0;
          Scan(scan_storage).ExclusiveSum(e ? 1 : 0, rank, chunk);
          __syncthreads();
          if (e && carry + rank < count) mark[t] = 1;
          carry += chunk;
        }
        marked += carry < count ? carry : count;
      }
      const long long outside = base_share_of(p.base_share, budget, free - free_in_spans, free);
      mark_evenly(outside < room_left - marked ? outside : room_left - marked, free - free_in_spans,
                  [&](std::int64_t t) { return !taken(t) && !p.grids.contains(t); });
    }
  }
}

}  // namespace flashcache::gpu::kernels
