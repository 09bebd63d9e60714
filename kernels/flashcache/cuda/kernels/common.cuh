#pragma once
// Device helpers shared by every stage: element conversion, where a token's
// row lives (dense ragged or paged), the status word, and small maths that
// must agree bit for bit with the host.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "flashcache/grid.hpp"
#include "flashcache/options.hpp"
#include "flashcache/rules.hpp"

#include "flashcache/types.hpp"

namespace flashcache::gpu::kernels {

// Most layers one call handles: per-layer pointers travel as kernel parameters,
// whose limit is 32 KB from CUDA 12.1 on and 4 KB before (gather's K, V, K out
// and V out pointers of 128 layers take 4 KB alone).
#if CUDART_VERSION >= 12010
inline constexpr int kMaxLayers = 128;
#else
inline constexpr int kMaxLayers = 64;
#endif
// Dynamic shared memory a kernel may take without opting in
// (cudaFuncAttributeMaxDynamicSharedMemorySize): CUDA's default on every device.
inline constexpr std::int64_t kDefaultDynamicSmemBytes = 48 * 1024;

__host__ __device__ constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// ---- elements -------------------------------------------------------------
// half_t / bfloat16_t share the bit layout of __half / __nv_bfloat16; reading
// the bits keeps device code free of the host types' constructors.
__device__ __forceinline__ float load_float(float x) { return x; }
__device__ __forceinline__ float load_float(flashcache::half_t x) { return __half2float(__ushort_as_half(x.bits)); }
__device__ __forceinline__ float load_float(flashcache::bfloat16_t x) {
  return __uint_as_float(static_cast<std::uint32_t>(x.bits) << 16);
}

// ---- status word ------------------------------------------------------------
// Device-side failures (bad page tables, budgets below the protected set ...)
// land in a few ints of the workspace: the first failure wins, later stages
// see it and stop, and the host reads it back when it chooses to.
enum class DeviceErrc : int {
  ok = 0,
  bad_indptr,              // info: sequence, indptr[b], indptr[b+1]
  bad_page,                // info: sequence (-1: page id check), value, bound
  capacity_exceeded,       // info: total tokens, capacity
  budget_exceeds_tokens,   // info: sequence, budget, tokens
  budget_below_always_kept,  // info: layer, sequence, head, budget, protected
  total_below_floors,      // info: sequence, total, sum of floors
  bad_energy_ratio,        // info: layer, sequence
  output_capacity,         // info: layer, kept rows, output capacity
  length_mismatch,         // info: sequence, device length, GlobalTransform length
  shared_page,             // info: page id, position in the page table
  grid_past_sequence,      // info: sequence, its tokens, span index, span first, span end
};

inline constexpr int kStatusWords = 8;

__device__ __forceinline__ bool failed(const int* status) { return *static_cast<const volatile int*>(status) != 0; }

// The same answer for every thread of the CTA (a barrier), so a kernel that
// returns on it never leaves threads waiting at a later __syncthreads.
__device__ __forceinline__ bool stop_requested(const int* status) {
  return __syncthreads_or(threadIdx.x == 0 && failed(status)) != 0;
}

__device__ inline void raise(int* status, DeviceErrc code, long long a = 0, long long b = 0, long long c = 0,
                             long long d = 0, long long e = 0) {
  if (atomicCAS(status, 0, static_cast<int>(code)) != 0) return;  // an earlier failure stays
  // Info words are clamped to int; they only feed a message.
  auto clamp = [](long long x) {
    return static_cast<int>(x > 2147483647LL ? 2147483647LL : (x < -2147483647LL ? -2147483647LL : x));
  };
  status[1] = clamp(a);
  status[2] = clamp(b);
  status[3] = clamp(c);
  status[4] = clamp(d);
  status[5] = clamp(e);
}

// ---- where rows live --------------------------------------------------------
// Element offset of (sequence b, head h, token t) from a layer's base pointer.
// Dense ragged: token rows indptr[b] + t. Paged (FlashInfer CSR): page
// indices[indptr[b] + t / page_size], slot t % page_size inside it.
struct RowMap {
  std::int64_t head_stride = 0;
  std::int64_t token_stride = 0;
  const std::int32_t* indptr = nullptr;  // dense: token offsets; paged: page offsets; may be null (dense, one sequence)
  const std::int32_t* page_indices = nullptr;  // non-null: paged
  std::int64_t page_size = 0;
  std::int64_t page_stride = 0;

  __device__ __forceinline__ std::int64_t offset(int b, std::int64_t h, std::int64_t t) const {
    if (page_indices != nullptr) {
      const std::int64_t page = page_indices[indptr[b] + t / page_size];
      return page * page_stride + (t % page_size) * token_stride + h * head_stride;
    }
    const std::int64_t start = indptr != nullptr ? indptr[b] : 0;
    return (start + t) * token_stride + h * head_stride;
  }
};

// Per-sequence bookkeeping the sequence-table kernel writes into the workspace.
struct SeqTable {
  const std::int32_t* len = nullptr;     // [B] tokens
  const std::int32_t* offset = nullptr;  // [B+1] packed token offsets (scores, masks, kept)
  const std::int32_t* slots = nullptr;   // [B+1] offsets of per-tile energy partials
};

// The cache as every per-layer pass reads it (the first fields of their
// Params, in this order): each layer's K and V base, where rows live, the
// sequence table. The host fills it once per call (RunContext).
template <class T>
struct LayerRows {
  const T* k[kMaxLayers];
  const T* v[kMaxLayers];
  RowMap rows;
  SeqTable seq;
  int sequences = 0;
  int head_dim = 0;
};

// ---- maths that must match the host ------------------------------------------
// Float bits mapped to an unsigned key with the float order: larger float,
// larger key. -0 folds onto +0 (they compare equal) and NaN sorts lowest.
__device__ __forceinline__ std::uint32_t ordered_key(float s) {
  if (s == 0.0f) s = 0.0f;
  if (s != s) return 0u;
  const std::uint32_t u = __float_as_uint(s);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Is token t of a sequence of n tokens in the caller's always-kept set?
struct ProtectRule {
  std::int64_t sink = 0;
  std::int64_t window = 0;
  const std::uint8_t* mask = nullptr;  // packed token order, may be null

  __device__ __forceinline__ bool operator()(std::int64_t t, std::int64_t n, std::int64_t packed) const {
    return flashcache::rules::is_protected(t, n, sink, window, mask != nullptr && mask[packed] != 0);
  }
};

// ---- image spans (Cache::spans) ---------------------------------------------
// At most this many spans per call: they travel by value in kernel parameters.
inline constexpr int kMaxGridSpans = 16;

// The spans of Cache::spans (the same positions in every sequence of the
// batch) and how they are cut into tiles: `tile` x `tile` patches with
// Transform::blocked (edge tiles at their own size, rules::tile_extent), or
// one tile per span (tile 0, Transform::global). Tiles are numbered span by
// span, row-major inside a span: span g owns tiles [tile_start[g], tile_start[g + 1]).
struct GridSpans {
  int count = 0;
  std::int32_t tile = 0;
  std::int32_t first[kMaxGridSpans] = {};
  std::int32_t rows[kMaxGridSpans] = {};
  std::int32_t cols[kMaxGridSpans] = {};
  std::int32_t tile_start[kMaxGridSpans + 1] = {};

  FLASHCACHE_INLINE std::int32_t tiles() const { return tile_start[count]; }
  // As rules::recent_window_start() reads spans.
  FLASHCACHE_INLINE int span_count() const { return count; }
  FLASHCACHE_INLINE std::int64_t span_first(int g) const { return first[g]; }
  FLASHCACHE_INLINE std::int64_t span_end(int g) const { return first[g] + std::int64_t{rows[g]} * cols[g]; }
  // Whether token t of a sequence lies in a span.
  FLASHCACHE_INLINE bool contains(std::int64_t t) const {
    for (int g = 0; g < count; ++g)
      if (t >= first[g] && t < first[g] + std::int64_t{rows[g]} * cols[g]) return true;
    return false;
  }
};

// One tile of a span: patches [r0, r0 + tr) x [c0, c0 + tc) of span g's grid.
struct GridTile {
  int span = 0;
  std::int32_t r0 = 0, c0 = 0, tr = 0, tc = 0;

  // Token (within the sequence) of patch t of the tile, t = i * tc + j.
  FLASHCACHE_INLINE std::int64_t token(const GridSpans& s, int t) const {
    return s.first[span] + std::int64_t{r0 + t / tc} * s.cols[span] + c0 + t % tc;
  }
};

// Tile q (0 <= q < s.tiles()).
FLASHCACHE_INLINE GridTile grid_tile_at(const GridSpans& s, int q) {
  GridTile t;
  int g = 0;
  while (g + 1 < s.count && s.tile_start[g + 1] <= q) ++g;
  const int local = q - s.tile_start[g];
  // The host's tiling, in its 64 bits (cols + tile - 1 passes 2^31 for a span
  // over 2^30 patches wide cut into tiles over 2^30); each field of a tile
  // lies inside its span, so int32 holds it.
  const flashcache::SpanTile st = flashcache::span_tiling(s.rows[g], s.cols[g], s.tile).at(local);
  t.span = g;
  t.r0 = static_cast<std::int32_t>(st.r0);
  t.c0 = static_cast<std::int32_t>(st.c0);
  t.tr = static_cast<std::int32_t>(st.tr);
  t.tc = static_cast<std::int32_t>(st.tc);
  return t;
}

// Index of the sequence that owns item i, given ascending offsets[0..count]:
// the last b with offsets[b] <= i. Requires offsets[0] <= i < offsets[count].
__device__ __forceinline__ int owner_of(const std::int32_t* offsets, int count, std::int64_t i) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (offsets[mid] <= i)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// Scan operators for cub.
struct MaxOf {
  __device__ int operator()(int a, int b) const { return a > b ? a : b; }
};
struct MinOf {
  __device__ int operator()(int a, int b) const { return a < b ? a : b; }
};

}  // namespace flashcache::gpu::kernels
