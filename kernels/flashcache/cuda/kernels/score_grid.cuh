#pragma once
// Stage 1, score (image spans): the tokens of Cache::spans scored again, by
// a 2D DCT low-pass over their patch grid, after the 1D pass (score_blocked.cuh
// or score_global.cuh) has scored every token. As score.hpp does on the CPU:
//     residual = X - B^T (B X),   B: the 2D DCT-II rows (u, v) in the tile's low-pass zone
// over one tile: the whole span (Transform::global) or grid_tile x grid_tile
// patches of it (Transform::blocked; edge tiles at their own size).
//
// One CTA of kGridThreads per (sequence x tile, head, layer). The zone of a
// tile is a staircase: row u of frequencies holds v < V(u), V non-increasing
// (rules::in_grid_zone, both zones), so the projection is separable in passes:
//     A[u][j] = sum_i Cr[u][i] X[i][j]          down the columns   (u < U)
//     Y[u][v] = sum_j A[u][j] Cc[v][j]          along the rows     (v < V(u))
//     D[u][j] = sum_v Y[u][v] Cc[v][j]          back along the rows
//     base[i][j] = sum_u Cr[u][i] D[u][j]       back down the columns
// for K and V, `width` head-dim columns at a time (the host picks the width
// so that shared memory stays small), each pass one barrier apart. Per-token
// squared residuals build up in shared memory over the column chunks; every
// token has one owning thread, and the tile's energies are reduced in a fixed
// order, so results do not change from run to run.
//
// The row each token's transform reads (itself, or for a non-finite token the
// stand-in of score.hpp's rule) comes from the 1D pass: the global path's
// substitutes, or the blocked kernel's `grid_source`. Span tokens added no
// E_high and no unrankable-score count in the 1D pass; this pass writes both
// per tile (grid_energy, grid_protected) and energy.cuh adds them in.
//
// The arithmetic lives in GridTileMath, host and device alike, one item per
// call: the kernel strides its threads over the items, and a host test runs the
// same items in a loop against the CPU scorer (tests/gpu/test_grid.cu).
#include <cmath>
#include <cstdint>

#include "flashcache/cuda/kernels/common.cuh"
#include "flashcache/cuda/kernels/smem_layout.cuh"
#include "flashcache/grid.hpp"

namespace flashcache::gpu::kernels {

// C[k][i] = a_k cos(pi (2i + 1) k / (2n)) of the orthonormal
// DCT-II of length n, the angle reduced mod 2 pi exactly (as dct_basis()).
FLASHCACHE_INLINE float grid_dct_entry(int n, int k, int i) {
  const std::int64_t r = ((2 * std::int64_t{i} + 1) * k) % (4 * std::int64_t{n});
  const float a = k == 0 ? sqrtf(1.0f / static_cast<float>(n)) : sqrtf(2.0f / static_cast<float>(n));
  const float angle = static_cast<float>(r) / static_cast<float>(2 * n);  // in units of pi
#ifdef __CUDA_ARCH__
  return a * cospif(angle);
#else
  return a * static_cast<float>(std::cos(3.14159265358979323846 * static_cast<double>(angle)));
#endif
}

// The passes over one tile. Shapes: tr x tc patches (tokens i * tc + j), U
// zone rows, V(0) = n_v; `width` columns per chunk. Every function handles one
// item; items of one pass are independent, passes are separated by a barrier.
struct GridTileMath {
  int tr = 0, tc = 0;
  int n_u = 0, n_v = 0;
  int width = 1, xs = 1;
  float* cr = nullptr;
  float* cc = nullptr;
  int* vlen = nullptr;
  float* x = nullptr;
  float* a = nullptr;
  float* y = nullptr;
  float* acc = nullptr;

  // The tile's views into a shared-memory block laid out as `lay` (the kernel's
  // and the host replay's in tests/gpu use this one carve-up).
  FLASHCACHE_INLINE GridTileMath(const GridSmem& lay, unsigned char* base, int tile_rows, int tile_cols, int chunk)
      : tr(tile_rows),
        tc(tile_cols),
        width(chunk),
        xs(lay.x_stride),
        cr(reinterpret_cast<float*>(base + lay.cr)),
        cc(reinterpret_cast<float*>(base + lay.cc)),
        vlen(reinterpret_cast<int*>(base + lay.vlen)),
        x(reinterpret_cast<float*>(base + lay.x)),
        a(reinterpret_cast<float*>(base + lay.a)),
        y(reinterpret_cast<float*>(base + lay.y)),
        acc(reinterpret_cast<float*>(base + lay.acc)) {}

  FLASHCACHE_INLINE int tokens() const { return tr * tc; }

  // Zone row u (u < tr): V(u), the frequencies v of row u in the zone, a prefix.
  FLASHCACHE_INLINE void zone_row(int u, GridZone zone, double gamma) const {
    int v = 0;
    while (v < tc && flashcache::rules::in_grid_zone(zone, u, v, tr, tc, gamma)) ++v;
    vlen[u] = v;
  }
  // After the zone rows: U (the rows with a frequency in the zone, a prefix) and V(0).
  FLASHCACHE_INLINE void zone_extent() {
    n_v = vlen[0];
    n_u = 0;
    while (n_u < tr && vlen[n_u] > 0) ++n_u;
  }

  // Basis tables: Cr rows u < U, then Cc rows v < V(0).
  FLASHCACHE_INLINE int table_items() const { return n_u * tr + n_v * tc; }
  FLASHCACHE_INLINE void table(int i) const {
    if (i < n_u * tr) {
      cr[i] = grid_dct_entry(tr, i / tr, i % tr);
    } else {
      i -= n_u * tr;
      cc[i] = grid_dct_entry(tc, i / tc, i % tc);
    }
  }

  // Where column w of token t of K (kv 0) or V (kv 1) sits in x.
  FLASHCACHE_INLINE float* x_at(int kv, int t, int w) const {
    return x + (static_cast<std::int64_t>(kv) * tokens() + t) * xs + w;
  }

  // A[kv][u][j][w] = sum_i Cr[u][i] X[kv][i * tc + j][w]; item i is A's index.
  FLASHCACHE_INLINE int column_items() const { return 2 * n_u * tc * width; }
  FLASHCACHE_INLINE void columns_forward(int i) const {
    const int w = i % width;
    int rest = i / width;
    const int j = rest % tc;
    rest /= tc;
    const int u = rest % n_u, kv = rest / n_u;
    const float* xc = x_at(kv, j, w);
    const std::int64_t step = static_cast<std::int64_t>(tc) * xs;  // one patch row down
    const float* c = cr + u * tr;
    float s = 0.0f;
    for (int r = 0; r < tr; ++r) s = fmaf(c[r], xc[r * step], s);
    a[i] = s;
  }

  // Y[kv][u][v][w] = sum_j A[kv][u][j][w] Cc[v][j] for v < V(u); item i is Y's index.
  FLASHCACHE_INLINE int row_items() const { return 2 * n_u * n_v * width; }
  FLASHCACHE_INLINE void rows_forward(int i) const {
    const int w = i % width;
    int rest = i / width;
    const int v = rest % n_v;
    rest /= n_v;
    const int u = rest % n_u, kv = rest / n_u;
    if (v >= vlen[u]) return;  // outside the zone: never read
    const float* ar = a + (static_cast<std::int64_t>(kv) * n_u + u) * tc * width + w;
    const float* c = cc + v * tc;
    float s = 0.0f;
    for (int j = 0; j < tc; ++j) s = fmaf(c[j], ar[j * width], s);
    y[i] = s;
  }

  // D[kv][u][j][w] = sum_{v < V(u)} Y[kv][u][v][w] Cc[v][j], over A (item i is its index).
  FLASHCACHE_INLINE void rows_inverse(int i) const {
    const int w = i % width;
    int rest = i / width;
    const int j = rest % tc;
    rest /= tc;
    const int u = rest % n_u, kv = rest / n_u;
    const float* yr = y + (static_cast<std::int64_t>(kv) * n_u + u) * n_v * width + w;
    float s = 0.0f;
    for (int v = 0; v < vlen[u]; ++v) s = fmaf(cc[v * tc + j], yr[v * width], s);
    a[i] = s;
  }

  // base = sum_u Cr[u][i] D[kv][u][j][w]; x becomes (x - base)^2. Items (kv, t, w).
  FLASHCACHE_INLINE int residual_items() const { return 2 * tokens() * width; }
  FLASHCACHE_INLINE void residual(int i) const {
    const int w = i % width;
    const int rest = i / width;
    const int t = rest % tokens(), kv = rest / tokens();
    const int r = t / tc, j = t % tc;
    const float* dc = a + (static_cast<std::int64_t>(kv) * n_u * tc + j) * width + w;
    const std::int64_t step = static_cast<std::int64_t>(tc) * width;  // one frequency row of D
    float base = 0.0f;
    for (int u = 0; u < n_u; ++u) base = fmaf(cr[u * tr + r], dc[u * step], base);
    float* xe = x_at(kv, t, w);
    const float e = *xe - base;
    *xe = e * e;
  }

  // Token t's squared residuals of this chunk, added to its running sums.
  FLASHCACHE_INLINE void accumulate(int t) const {
    for (int kv = 0; kv < 2; ++kv) {
      const float* xe = x_at(kv, t, 0);
      float s = 0.0f;
      for (int w = 0; w < width; ++w) s += xe[w];
      acc[kv * tokens() + t] += s;
    }
  }
};

template <class T>
struct GridParams : LayerRows<T> {
  GridSpans grids;
  GridZone zone = GridZone::rectangle;
  double gamma = 0.2;
  ProtectRule protect;
  // The carve-up (GridSmem): the largest tile of the call and its zone, and
  // the head-dim columns per chunk.
  int max_rows = 0, max_cols = 0, max_tokens = 0, max_u = 0, max_v = 0;
  int width = 1;
  std::int64_t capacity = 0;
  const std::int32_t* source = nullptr;  // [L][H][capacity]: the token each transform row reads, -1 zeros
  float* scores = nullptr;               // [L][H][capacity]
  float2* grid_energy = nullptr;         // [L][H][B][tiles]: K high, V high
  int* grid_protected = nullptr;         // [L][H][B][tiles]: finite span tokens with an unrankable 2D score
  int* status = nullptr;
};

template <class T>
__global__ void __launch_bounds__(kGridThreads) score_grid_kernel(GridParams<T> p) {
  const int tid = static_cast<int>(threadIdx.x);
  if (stop_requested(p.status)) return;
  const int tiles = p.grids.tiles();
  const int b = static_cast<int>(blockIdx.x / static_cast<unsigned>(tiles));
  const int q = static_cast<int>(blockIdx.x % static_cast<unsigned>(tiles));
  const int head = static_cast<int>(blockIdx.y), layer = static_cast<int>(blockIdx.z);
  const int heads = static_cast<int>(gridDim.y);
  const GridTile tile = grid_tile_at(p.grids, q);
  const int n_tok = tile.tr * tile.tc;
  const std::int64_t n_seq = p.seq.len[b];
  // A sequence the spans do not fit was reported by the sequence-table kernel (and the
  // run stopped above); never read past it. The tile's last token is its largest.
  if (tile.token(p.grids, n_tok - 1) >= n_seq) return;  // uniform
  const std::int64_t packed = p.seq.offset[b];
  const std::int64_t row = (std::int64_t{layer} * heads + head) * p.capacity + packed;
  const T* kbase = p.k[layer];
  const T* vbase = p.v[layer];
  const int d = p.head_dim;

  extern __shared__ __align__(16) unsigned char smem[];
  const GridSmem lay(p.max_rows, p.max_cols, p.max_tokens, p.max_u, p.max_v, p.width);
  GridTileMath m(lay, smem, tile.tr, tile.tc, p.width);
  int* src = reinterpret_cast<int*>(smem + lay.src);
  float* red = reinterpret_cast<float*>(smem + lay.red);
  int* misc = reinterpret_cast<int*>(smem + lay.misc);

  // 1. The zone's rows, each token's source row, clean sums.
  for (int u = tid; u < m.tr; u += kGridThreads) m.zone_row(u, p.zone, p.gamma);
  for (int t = tid; t < n_tok; t += kGridThreads) {
    src[t] = p.source[row + tile.token(p.grids, t)];
    m.acc[t] = 0.0f;
    m.acc[n_tok + t] = 0.0f;
  }
  if (tid == 0) misc[0] = 0;
  __syncthreads();
  m.zone_extent();  // the same for every thread: read after the barrier

  // 2. The basis tables (first read after the first chunk's barrier).
  for (int i = tid; i < m.table_items(); i += kGridThreads) m.table(i);

  // 3. Chunks of `width` head-dim columns: load, four passes, per-token sums.
  for (int c0 = 0; c0 < d; c0 += p.width) {
    for (int i = tid; i < n_tok * p.width; i += kGridThreads) {
      const int t = i / p.width, w = i % p.width, c = c0 + w;
      const int s = src[t];
      float kx = 0.0f, vx = 0.0f;  // zero past the head dim: adds nothing
      if (c < d && s >= 0) {
        const std::int64_t off = p.rows.offset(b, head, s) + c;
        kx = load_float(kbase[off]);
        vx = load_float(vbase[off]);
      }
      *m.x_at(0, t, w) = kx;
      *m.x_at(1, t, w) = vx;
    }
    __syncthreads();
    for (int i = tid; i < m.column_items(); i += kGridThreads) m.columns_forward(i);
    __syncthreads();
    for (int i = tid; i < m.row_items(); i += kGridThreads) m.rows_forward(i);
    __syncthreads();
    for (int i = tid; i < m.column_items(); i += kGridThreads) m.rows_inverse(i);
    __syncthreads();
    for (int i = tid; i < m.residual_items(); i += kGridThreads) m.residual(i);
    __syncthreads();
    for (int t = tid; t < n_tok; t += kGridThreads) m.accumulate(t);
    __syncthreads();  // the next chunk overwrites x
  }

  // 4. Scores, the tile's E_high and its unrankable finite tokens.
  const float inv_d = 1.0f / static_cast<float>(d);
  float k_high = 0.0f, v_high = 0.0f;
  int unranked = 0;
  for (int t = tid; t < n_tok; t += kGridThreads) {
    const std::int64_t token = tile.token(p.grids, t);
    const bool good = src[t] == token;
    const float rk = m.acc[t], rv = m.acc[n_tok + t];
    const float score = good ? rk * inv_d + rv * inv_d : __int_as_float(0x7f800000);
    p.scores[row + token] = score;
    if (good) {
      k_high += rk;
      v_high += rv;
      if (flashcache::rules::always_kept_score(score) && !p.protect(token, n_seq, packed + token)) ++unranked;
    }
  }
  red[tid] = k_high;
  red[kGridThreads + tid] = v_high;
  if (unranked) atomicAdd(&misc[0], unranked);  // integer sum: order does not matter
  __syncthreads();
  const std::int64_t slot = (std::int64_t{layer} * heads + head) * (std::int64_t{p.sequences} * tiles) + blockIdx.x;
  if (tid < 2) {
    float s = 0.0f;
    for (int i = 0; i < kGridThreads; ++i) s += red[tid * kGridThreads + i];
    reinterpret_cast<float*>(&p.grid_energy[slot])[tid] = s;
  }
  if (tid == 0) p.grid_protected[slot] = misc[0];
}

}  // namespace flashcache::gpu::kernels
