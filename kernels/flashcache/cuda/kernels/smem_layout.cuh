#pragma once
// The shared-memory carve-ups of the kernels that size theirs at launch, and
// the thread counts they depend on: computed the same way on the host (sizing,
// can_implement's checks, which include this header without any kernel body)
// and on the device (each kernel's own offsets).
#include <cstdint>

#include "flashcache/cuda/kernels/common.cuh"

namespace flashcache::gpu::kernels {

// ---- score_blocked.cuh ------------------------------------------------------------------
// Threads per CTA: one per column for the compiled head dims, kBlockedGenericThreads
// for the generic kernel (head dim 0).
inline constexpr int kBlockedGenericThreads = 128;
template <int kHeadDim>
inline constexpr int blocked_threads() {
  return kHeadDim > 0 ? kHeadDim : kBlockedGenericThreads;
}

// Shared-memory carve-up, computed the same way on host (sizing, checks) and device.
struct BlockedSmem {
  std::int64_t tile_bytes, ext_bytes, basis, partk, partv, bad, src, energy, misc, total;

  __host__ __device__ static std::int64_t align16(std::int64_t x) { return (x + 15) / 16 * 16; }
  __host__ __device__ BlockedSmem(std::int64_t head_dim, std::int64_t elem_bytes, int tile, std::int64_t max_m,
                                  int threads) {
    const int warps = threads / 32;
    tile_bytes = align16(tile * head_dim * elem_bytes);  // one of K, V
    ext_bytes = align16(head_dim * elem_bytes);          // one of K, V
    std::int64_t at = 2 * tile_bytes + 2 * ext_bytes;
    basis = at;
    at += align16(max_m * tile * 4);
    partk = at;
    at += align16(std::int64_t{warps} * tile * 4);
    partv = at;
    at += align16(std::int64_t{warps} * tile * 4);
    bad = at;
    at += align16(tile * 4);
    src = at;
    at += align16(tile * 4);
    energy = at;
    at += align16(std::int64_t{threads} * 4 * 4);
    misc = at;
    at += 16 * 4;
    total = at;
  }
};

// ---- score_grid.cuh ---------------------------------------------------------------------
inline constexpr int kGridThreads = 256;
// The host picks the widest column chunk (at most kGridMaxWidth) whose shared
// memory stays under this, so that several CTAs share an SM without opting in.
inline constexpr std::int64_t kGridPreferredSmem = kDefaultDynamicSmemBytes;
inline constexpr int kGridMaxWidth = 64;

// Shared-memory carve-up for the largest tile of a call, computed the same way
// on host (sizing, checks) and device. Byte offsets, 16-byte aligned.
struct GridSmem {
  std::int64_t cr, cc, vlen, src, x, a, y, acc, red, misc, total;
  int x_stride;  // floats from one token's row of x to the next: odd, so per-token reads miss no bank

  FLASHCACHE_INLINE static std::int64_t align16(std::int64_t n) { return (n + 15) / 16 * 16; }
  FLASHCACHE_INLINE GridSmem(std::int64_t max_rows, std::int64_t max_cols, std::int64_t max_tokens, std::int64_t max_u,
                             std::int64_t max_v, int width) {
    x_stride = width % 2 != 0 ? width : width + 1;
    std::int64_t at = 0;
    cr = at;  // [U][tr]: rows of the DCT-II down the columns
    at += align16(max_u * max_rows * 4);
    cc = at;  // [V(0)][tc]: rows of the DCT-II along the rows
    at += align16(max_v * max_cols * 4);
    vlen = at;  // [tr] ints: V(u)
    at += align16(max_rows * 4);
    src = at;  // [tokens] ints: the token each transform row reads, -1 zeros
    at += align16(max_tokens * 4);
    x = at;  // [2][tokens][x_stride]: K, V chunk; then squared residuals
    at += align16(2 * max_tokens * x_stride * 4);
    a = at;  // [2][U][tc][width]: A, then D
    at += align16(2 * max_u * max_cols * width * 4);
    y = at;  // [2][U][V(0)][width]
    at += align16(2 * max_u * max_v * width * 4);
    acc = at;  // [2][tokens]: per-token squared residuals of K, V over the chunks
    at += align16(2 * max_tokens * 4);
    red = at;  // [2][threads]: energy partials
    at += align16(2 * kGridThreads * 4);
    misc = at;  // [0]: unrankable count
    at += 16 * 4;
    total = at;
  }
};

}  // namespace flashcache::gpu::kernels
