#pragma once
// flashcache on the GPU: the front door.
//
//   score     blocked: one fused kernel; global: cuFFT (Makhoul) per sequence;
//             then image spans (Options::grids) again, by a 2D low-pass per tile
//   energy    per-(layer, sequence) energy ratio R_l, protected counts
//   allocate  per-layer budgets on the device (no host round trip)
//   select    per (layer, sequence, head): protected, window, base sample, top scores, ascending
//   gather    dense compact K', V'   and/or   compact   in place in a paged cache
//
// Two phases, as in CUB / CUTLASS:
//   can_implement(cache, budget, opt, out, plan)  everything checkable on the host
//   workspace_size(cache, opt, &bytes, plan)      bytes of scratch a run needs
//   compress_async(cache, budget, opt, out, ws, bytes, stream, plan)
// The run allocates nothing, never synchronises the host and never throws, so
// an engine can capture it in a CUDA graph. What only the device can see (a
// bad page id, a budget below the protected set of one sequence) is recorded
// in the workspace; device_status() waits for the stream and reports it.
// compress() is the convenience wrapper: allocate, run, wait, report.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "flashcache/allocate.cuh"
#include "flashcache/compact_paged.cuh"
#include "flashcache/cuda/cache.cuh"
#include "flashcache/cuda/global_plan.cuh"
#include "flashcache/cuda/status.cuh"
#include "flashcache/cuda/workspace.cuh"
#include "flashcache/energy.cuh"
#include "flashcache/error.hpp"
#include "flashcache/gather.cuh"
#include "flashcache/options.hpp"
#include "flashcache/plan.cuh"
#include "flashcache/rules.hpp"
#include "flashcache/score_blocked.cuh"
#include "flashcache/score_global.cuh"
#include "flashcache/score_grid.cuh"
#include "flashcache/select.cuh"
#include "flashcache/types.hpp"
#include "flashcache/view.hpp"

namespace flashcache::gpu {

inline constexpr int kMaxLayers = kernels::kMaxLayers;
inline constexpr int kMaxBlockSize = static_cast<int>(rules::kMaxGpuBlockSize);
// Image spans one call takes (Options::grids): they travel in kernel parameters.
inline constexpr int kMaxGridSpans = kernels::kMaxGridSpans;
// Shared memory a CTA may use after opting in, when no device can be asked:
// sm_90's (H100/H200). With a device, can_implement() asks it.
inline constexpr std::int64_t kMaxSharedBytes = 227 * 1024;
static_assert(kGlobalSlotTokens == kernels::kGlobalTile, "the workspace's global slots are the residual pass's tiles");
// Head dims with a compiled kernel; any other head dim takes the generic one.
inline constexpr int kCompiledHeadDims[] = {64, 96, 128, 256};

namespace detail {

template <class T>
constexpr bool is_element_v = std::is_same_v<T, float> || std::is_same_v<T, half_t> || std::is_same_v<T, bfloat16_t>;

inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// Tile width of the blocked kernel for a block size.
inline int blocked_tile(std::int64_t block_size) { return block_size <= 64 ? 64 : 128; }

inline int blocked_thread_count(std::int64_t head_dim) {
  for (int d : kCompiledHeadDims)
    if (d == head_dim) return d;
  return 128;
}

inline std::int64_t blocked_smem_bytes(std::int64_t head_dim, std::int64_t elem_bytes, const Options& opt) {
  const int tile = blocked_tile(opt.block_size);
  const kernels::BlockedSmem s(head_dim, elem_bytes, tile, lowpass_cutoff(opt.block_size, opt.gamma),
                               blocked_thread_count(head_dim));
  return s.total;
}

inline Shape shape_of(int layers, std::int64_t heads, std::int64_t head_dim, int sequences, std::int64_t capacity,
                      std::int64_t num_pages) {
  Shape s;
  s.num_pages = num_pages;
  s.layers = layers;
  s.heads = heads;
  s.head_dim = head_dim;
  s.sequences = sequences;
  s.capacity = capacity;
  return s;
}

// Can every row be moved with 16-byte accesses?
template <class T>
bool rows_vectorizable(const Cache<T>& c) {
  const auto e = static_cast<std::int64_t>(sizeof(T));
  if ((c.head_dim * e) % 16 || (c.head_stride * e) % 16 || (c.token_stride * e) % 16) return false;
  if (c.paged() && (c.pages.page_stride * e) % 16) return false;
  for (int l = 0; l < c.layers; ++l)
    if (!aligned16(c.k[l]) || !aligned16(c.v[l])) return false;
  return true;
}

inline kernels::RowMap row_map(std::int64_t head_stride, std::int64_t token_stride, const std::int32_t* indptr,
                               const PageTable& pages, bool paged) {
  kernels::RowMap r;
  r.head_stride = head_stride;
  r.token_stride = token_stride;
  r.indptr = paged ? pages.indptr : indptr;
  if (paged) {
    r.page_indices = pages.indices;
    r.page_size = pages.page_size;
    r.page_stride = pages.page_stride;
  }
  return r;
}

inline Status launched(const char* kernel) { return cuda_status(cudaGetLastError(), kernel); }

// The shared memory one CTA may opt in to on the current device, or
// kMaxSharedBytes (sm_90) when there is no device to ask (host-only checks).
inline std::int64_t max_shared_bytes() {
  int device = 0, bytes = 0;
  if (cudaGetDevice(&device) == cudaSuccess &&
      cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) == cudaSuccess && bytes > 0)
    return bytes;
  (void)cudaGetLastError();  // the failed query's error is not the caller's
  return kMaxSharedBytes;
}

// ---- image spans --------------------------------------------------------------
// opt.grids as kernel parameters (at most kMaxGridSpans, checked by
// can_implement), cut into the tiles of the 2D pass: grid_tile x grid_tile
// with Transform::blocked, whole spans with Transform::global. The tile count
// is workspace.cuh's grid_tile_count().
inline kernels::GridSpans grid_spans(const Options& opt) {
  kernels::GridSpans g;
  const bool whole = opt.transform == Transform::global;
  std::int64_t longest = 1;
  for (const GridSpan& s : opt.grids) longest = std::max({longest, s.rows, s.cols});
  // A tile wider than every span cuts nothing: the same tiles, and an int.
  const std::int64_t tile = whole ? 0 : std::min(std::max<std::int64_t>(opt.grid_tile, 1), longest);
  g.count = static_cast<int>(std::min<std::size_t>(opt.grids.size(), kernels::kMaxGridSpans));
  g.tile = static_cast<std::int32_t>(tile);
  for (int i = 0; i < g.count; ++i) {
    const GridSpan& s = opt.grids[static_cast<std::size_t>(i)];
    g.first[i] = static_cast<std::int32_t>(s.first);
    g.rows[i] = static_cast<std::int32_t>(s.rows);
    g.cols[i] = static_cast<std::int32_t>(s.cols);
    g.tile_start[i + 1] = static_cast<std::int32_t>(g.tile_start[i] + span_tiling(s.rows, s.cols, tile).count());
  }
  return g;
}

// The zone of a tr x tc tile: U rows of frequencies, V(0) columns (both prefixes, see score_grid.cuh).
inline void grid_zone_extent(std::int64_t tr, std::int64_t tc, const Options& opt, std::int64_t* u, std::int64_t* v) {
  *u = 0;
  while (*u < tr && rules::in_grid_zone(opt.grid_zone, *u, 0, tr, tc, opt.gamma)) ++*u;
  *v = 0;
  while (*v < tc && rules::in_grid_zone(opt.grid_zone, 0, *v, tr, tc, opt.gamma)) ++*v;
}

// How the 2D pass runs: the spans, the largest tile and zone (the shared-memory
// carve-up, kernels::GridSmem), the head-dim columns per chunk and the bytes.
struct GridLaunch {
  kernels::GridSpans spans;
  std::int64_t max_rows = 0, max_cols = 0, max_tokens = 0, max_u = 0, max_v = 0;
  std::int64_t widest_rows = 0, widest_cols = 0;  // the tile with the most tokens
  int width = 1;
  std::int64_t smem = 0;

  std::int64_t smem_for(int w) const {
    return kernels::GridSmem(max_rows, max_cols, max_tokens, max_u, max_v, w).total;
  }
};

// The widest column chunk (at most kGridMaxWidth) under kGridPreferredSmem,
// evened out over the head dim; refused when one column at a time still needs
// more than `smem_limit` bytes.
inline Status plan_grid_launch(std::int64_t head_dim, const Options& opt, std::int64_t smem_limit, GridLaunch* out) {
  GridLaunch g;
  g.spans = grid_spans(opt);
  const bool whole = opt.transform == Transform::global;
  for (int i = 0; i < g.spans.count; ++i) {
    const SpanTiling tiling = span_tiling(g.spans.rows[i], g.spans.cols[i], g.spans.tile);
    // The first and the last tile: between them every shape a tile of this span takes.
    const SpanTile first = tiling.at(0), last = tiling.at(tiling.count() - 1);
    const std::int64_t row_extents[2] = {first.tr, last.tr};
    const std::int64_t col_extents[2] = {first.tc, last.tc};
    for (const std::int64_t tr : row_extents)
      for (const std::int64_t tc : col_extents) {
        std::int64_t u = 0, v = 0;
        grid_zone_extent(tr, tc, opt, &u, &v);
        g.max_rows = std::max(g.max_rows, tr);
        g.max_cols = std::max(g.max_cols, tc);
        g.max_u = std::max(g.max_u, u);
        g.max_v = std::max(g.max_v, v);
        if (tr * tc > g.max_tokens) {
          g.max_tokens = tr * tc;
          g.widest_rows = tr;
          g.widest_cols = tc;
        }
      }
  }
  int width = static_cast<int>(std::min<std::int64_t>(kernels::kGridMaxWidth, std::max<std::int64_t>(head_dim, 1)));
  while (width > 1 && g.smem_for(width) > kernels::kGridPreferredSmem) width /= 2;
  const std::int64_t chunks = kernels::ceil_div(std::max<std::int64_t>(head_dim, 1), width);
  g.width = static_cast<int>(kernels::ceil_div(std::max<std::int64_t>(head_dim, 1), chunks));
  g.smem = g.smem_for(g.width);
  if (g.smem > smem_limit) {
    if (whole)
      return make_error(Errc::unsupported, "grid span of ", g.widest_rows, " x ", g.widest_cols,
                        " patches with Transform::global: its 2D pass needs ", g.smem,
                        " bytes of shared memory (one head-dim column at a time) > ", smem_limit,
                        " this device allows; use Transform::blocked (grid_tile x grid_tile tiles)");
    return make_error(Errc::unsupported, "grid_tile ", opt.grid_tile, ": a tile of ", g.widest_rows, " x ",
                      g.widest_cols, " patches needs ", g.smem, " bytes of shared memory > ", smem_limit,
                      " this device allows; use a smaller grid_tile");
  }
  *out = g;
  return Status::success();
}

}  // namespace detail

// Everything that can be checked without running: shapes, strides, options,
// the budget's range, the output description, the head dim / block size /
// shared-memory combination and, for the global transform, the plan.
template <class T>
Status can_implement(const Cache<T>& c, const Budget& budget, const Options& opt, const Outputs<T>& out = {},
                     const GlobalPlan* plan = nullptr) {
  static_assert(detail::is_element_v<T>, "flashcache::gpu: elements are float, half_t or bfloat16_t");
  FLASHCACHE_RETURN_IF_ERROR(check_options(opt));
  // Options the CPU has and these kernels do not yet; the defaults never need them.
  if (opt.normalize_terms)
    return make_error(Errc::unsupported, "normalize_terms: the GPU scores K and V unweighted only (CPU only)");
  if (opt.rope.derotate)
    return make_error(Errc::unsupported, "rope.derotate: the GPU scores keys as cached only (CPU only)");
  // A base chosen by energy needs a block's whole spectrum; the blocked kernel
  // keeps only the m low rows of its DCT basis in shared memory.
  if (opt.base != Base::lowpass && opt.transform == Transform::blocked)
    return make_error(Errc::unsupported, "base ", to_string(opt.base),
                      " with Transform::blocked: the GPU blocked kernel holds only the m low rows of the DCT basis, "
                      "and a base chosen by energy needs every frequency of the block (CPU only); use "
                      "Transform::global, or Base::lowpass");
  if (opt.grids.size() > static_cast<std::size_t>(kMaxGridSpans))
    return make_error(Errc::unsupported, opt.grids.size(), " grid spans: the GPU takes at most ", kMaxGridSpans,
                      " per call (they travel in kernel parameters)");
  if (c.layers < 1 || c.layers > kMaxLayers)
    return make_error(Errc::unsupported, c.layers, " layers: one call takes 1 to ", kMaxLayers);
  if (c.k == nullptr || c.v == nullptr) return make_error(Errc::invalid_shape, "null K or V layer array");
  if (c.heads < 1 || c.head_dim < 1)
    return make_error(Errc::invalid_shape, "heads ", c.heads, " and head_dim ", c.head_dim, " must be >= 1");
  if (c.heads > 65535) return make_error(Errc::unsupported, c.heads, " KV heads: at most 65535");
  if (c.sequences < 1) return make_error(Errc::invalid_shape, "sequences ", c.sequences, " must be >= 1");
  if (c.capacity < 0 || c.capacity > std::int64_t{2147483647} - 1024)
    return make_error(Errc::unsupported, "capacity ", c.capacity, " tokens: must lie in [0, 2^31 - 1024)");
  for (int l = 0; l < c.layers; ++l)
    if (c.capacity > 0 && (c.k[l] == nullptr || c.v[l] == nullptr))
      return make_error(Errc::invalid_shape, "layer ", l, ": null K or V pointer");

  if (c.paged()) {
    const PageTable& p = c.pages;
    if (p.indptr == nullptr || p.last_page_len == nullptr)
      return make_error(Errc::invalid_shape, "paged cache: indptr and last_page_len are required");
    if (p.page_size < 1) return make_error(Errc::invalid_shape, "page_size ", p.page_size, " must be >= 1");
    if (p.num_pages < 1) return make_error(Errc::invalid_shape, "num_pages ", p.num_pages, " must be >= 1");
    // Rows of one page must not overlap, nor may pages.
    const KVView<const T> page(c.k[0], c.heads, p.page_size, c.head_dim, c.head_stride, c.token_stride);
    FLASHCACHE_RETURN_IF_ERROR(check_view(page, "page of K"));
    const std::int64_t span = (c.heads - 1) * c.head_stride + (p.page_size - 1) * c.token_stride + c.head_dim;
    if (p.num_pages > 1 && p.page_stride < span)
      return make_error(Errc::invalid_stride, "page_stride ", p.page_stride, " < ", span,
                        " elements spanned by one page's rows");
  } else {
    if (c.indptr == nullptr && c.sequences != 1)
      return make_error(Errc::invalid_shape, c.sequences, " sequences need an indptr");
    const KVView<const T> view(c.capacity > 0 ? c.k[0] : nullptr, c.heads, c.capacity, c.head_dim, c.head_stride,
                               c.token_stride);
    FLASHCACHE_RETURN_IF_ERROR(check_view(view, "K"));
  }

  if (budget.is_ratio()) {
    if (!(budget.ratio_value() >= 0.0 && budget.ratio_value() <= 1.0))
      return make_error(Errc::invalid_budget, "keep ratio ", budget.ratio_value(), " is outside [0, 1]");
  } else if (budget.token_count() < 0) {
    return make_error(Errc::invalid_budget, "keep budget ", budget.token_count(), " is negative");
  } else if (budget.token_count() > c.capacity) {
    return make_error(Errc::invalid_budget, "keep budget ", budget.token_count(), " > capacity ", c.capacity,
                      " tokens");
  }

  if (opt.transform == Transform::blocked) {
    if (!rules::block_size_ok(opt.block_size, true))
      return make_error(Errc::unsupported, "block_size ", opt.block_size, ": the GPU blocked transform takes ",
                        rules::kMinBlockSize, " to ", rules::kMaxGpuBlockSize);
    const std::int64_t smem = detail::blocked_smem_bytes(c.head_dim, sizeof(T), opt);
    const std::int64_t limit = detail::max_shared_bytes();
    if (smem > limit)
      return make_error(Errc::unsupported, "block_size ", opt.block_size, " with head_dim ", c.head_dim, " ",
                        to_string(dtype_of<T>::value), " needs ", smem, " bytes of shared memory > ", limit,
                        " this device allows; use a smaller block_size");
  } else {
    if (plan == nullptr) return make_error(Errc::invalid_option, "the global transform needs a GlobalPlan");
    if (plan->heads() != c.heads || plan->head_dim() != c.head_dim ||
        static_cast<std::int64_t>(plan->lengths().size()) != c.sequences)
      return make_error(Errc::invalid_option, "GlobalPlan is for ", plan->lengths().size(), " sequences x ",
                        plan->heads(), " heads x ", plan->head_dim(), " dims, the cache has ", c.sequences, " x ",
                        c.heads, " x ", c.head_dim);
    if (c.heads * c.head_dim > 65535)
      return make_error(Errc::unsupported, "global transform: heads x head_dim ", c.heads * c.head_dim,
                        " > 65535 columns");
    std::int64_t total = 0;
    for (auto n : plan->lengths()) total += n;
    if (total > c.capacity)
      return make_error(Errc::invalid_shape, "GlobalPlan lengths add up to ", total, " > capacity ", c.capacity);
  }

  if (!opt.grids.empty()) {
    // Spans are positions in every sequence: none may reach past the capacity,
    // nor (global, whose plan knows the lengths) past any sequence. With
    // Transform::blocked the device checks the lengths (grid_past_sequence).
    for (std::size_t i = 0; i < opt.grids.size(); ++i)
      if (opt.grids[i].end() > c.capacity)
        return make_error(Errc::invalid_shape, "grid span ", i, " [", opt.grids[i].first, ", ", opt.grids[i].end(),
                          ") reaches past the capacity of ", c.capacity, " tokens");
    if (opt.transform == Transform::global)
      for (std::size_t b = 0; b < plan->lengths().size(); ++b) {
        const Status fits = check_grids_fit(opt.grids, plan->lengths()[b]);
        if (!fits.ok()) return make_error(fits.code(), "sequence ", b, ": ", fits.message());
      }
    if (static_cast<std::int64_t>(c.sequences) * grid_tile_count(opt) > std::int64_t{2147483647})
      return make_error(Errc::unsupported, c.sequences, " sequences x ", grid_tile_count(opt),
                        " grid tiles: more than 2^31 - 1 tiles in one call; use a larger grid_tile");
    detail::GridLaunch launch;
    FLASHCACHE_RETURN_IF_ERROR(detail::plan_grid_launch(c.head_dim, opt, detail::max_shared_bytes(), &launch));
  }

  if (out.k_out != nullptr || out.v_out != nullptr) {
    if (out.k_out == nullptr || out.v_out == nullptr)
      return make_error(Errc::invalid_shape, "dense output: give both k_out and v_out");
    if (out.out_capacity < 0) return make_error(Errc::invalid_shape, "out_capacity ", out.out_capacity, " < 0");
    for (int l = 0; l < c.layers; ++l) {
      if (out.out_capacity > 0 && (out.k_out[l] == nullptr || out.v_out[l] == nullptr))
        return make_error(Errc::invalid_shape, "layer ", l, ": null output pointer");
      const KVView<T> view(out.out_capacity > 0 ? out.k_out[l] : nullptr, c.heads, out.out_capacity, c.head_dim,
                           out.out_head_stride, out.out_token_stride);
      FLASHCACHE_RETURN_IF_ERROR(check_view(view, "dense output"));
    }
  }
  if (out.compact_in_place) {
    if (!c.paged()) return make_error(Errc::invalid_option, "compact_in_place needs a paged cache");
    if (out.new_len == nullptr || out.pages_freed == nullptr)
      return make_error(Errc::invalid_shape, "compact_in_place: new_len and pages_freed are required");
    if (c.layers > 1 && opt.allocation == Allocation::dynamic)
      return make_error(Errc::unsupported,
                        "compact_in_place with Allocation::dynamic: each layer would keep its own number of tokens, "
                        "which one page table shared by all layers (FlashInfer, vLLM) cannot describe; use "
                        "Allocation::uniform, or a dense output (k_out / v_out)");
    if (2 * c.head_dim * static_cast<std::int64_t>(sizeof(T)) > kernels::kCompactStageBytes)
      return make_error(Errc::unsupported, "compact_in_place: head_dim ", c.head_dim, " rows exceed the ",
                        kernels::kCompactStageBytes, "-byte staging buffer");
  }
  if ((out.kept == nullptr) != (out.kept_indptr == nullptr))
    return make_error(Errc::invalid_shape, "give both kept and kept_indptr, or neither");
  return Status::success();
}

template <class T>
Status workspace_layout(const Cache<T>& c, const Options& opt, const GlobalPlan* plan, WorkspaceLayout* layout) {
  const Shape shape =
      detail::shape_of(c.layers, c.heads, c.head_dim, c.sequences, c.capacity, c.paged() ? c.pages.num_pages : 0);
  if (opt.transform == Transform::global) {
    if (plan == nullptr) return make_error(Errc::invalid_option, "the global transform needs a GlobalPlan");
    return make_layout(shape, opt, plan->max_length(), plan->work_bytes(), layout);
  }
  return make_layout(shape, opt, 0, 0, layout);
}

// Bytes of workspace compress_async() needs for this cache and options.
template <class T>
Status workspace_size(const Cache<T>& c, const Options& opt, std::size_t* bytes, const GlobalPlan* plan = nullptr) {
  WorkspaceLayout layout;
  FLASHCACHE_RETURN_IF_ERROR(workspace_layout(c, opt, plan, &layout));
  *bytes = layout.total;
  return Status::success();
}

namespace detail {

template <class T, int kHeadDim, int kTile>
Status launch_blocked_for(const kernels::BlockedParams<T>& p, dim3 grid, std::int64_t smem, cudaStream_t stream) {
  auto kernel = kernels::score_blocked_kernel<T, kHeadDim, kTile>;
  if (smem > 48 * 1024)
    FLASHCACHE_RETURN_IF_ERROR(
        cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
                    "raising the blocked kernel's shared memory"));
  kernel<<<grid, kernels::blocked_threads<kHeadDim>(), static_cast<std::size_t>(smem), stream>>>(p);
  return launched(p.resolve ? "score_blocked_kernel (resolve)" : "score_blocked_kernel");
}

template <class T, int kTile>
Status launch_blocked_tile(const kernels::BlockedParams<T>& p, dim3 grid, std::int64_t smem, cudaStream_t stream) {
  switch (p.head_dim) {  // bounded dispatch: the compiled head dims, else the generic kernel
    case 64:
      return launch_blocked_for<T, 64, kTile>(p, grid, smem, stream);
    case 96:
      return launch_blocked_for<T, 96, kTile>(p, grid, smem, stream);
    case 128:
      return launch_blocked_for<T, 128, kTile>(p, grid, smem, stream);
    case 256:
      return launch_blocked_for<T, 256, kTile>(p, grid, smem, stream);
    default:
      return launch_blocked_for<T, 0, kTile>(p, grid, smem, stream);
  }
}

template <class T>
void fill_layer_pointers(const Cache<T>& c, const T** k, const T** v) {
  for (int l = 0; l < c.layers; ++l) {
    k[l] = c.k[l];
    v[l] = c.v[l];
  }
}

template <class T>
Status score_blocked(const Cache<T>& c, const Options& opt, const Workspace& ws, const kernels::SeqTable& seq,
                     cudaStream_t stream) {
  kernels::BlockedParams<T> p{};
  fill_layer_pointers(c, p.k, p.v);
  p.rows = row_map(c.head_stride, c.token_stride, c.indptr, c.pages, c.paged());
  p.seq = seq;
  p.sequences = c.sequences;
  p.head_dim = static_cast<int>(c.head_dim);
  p.block_size = static_cast<int>(opt.block_size);
  p.gamma = opt.gamma;
  p.protect = {opt.sink, opt.window, c.protect};
  p.grids = grid_spans(opt);
  p.grid_source = ws.grid_source();
  p.vector_ok = rows_vectorizable(c);
  p.capacity = c.capacity;
  p.slot_count = ws.layout().slot_count;
  p.first_good = ws.first_good();
  p.last_good = ws.last_good();
  p.source = ws.source();
  p.scores = ws.scores();
  p.energy_part = static_cast<float4*>(ws.energy_part());
  p.protected_part = ws.protected_part();
  p.status = ws.status();
  const dim3 grid(static_cast<unsigned>(ws.layout().slot_count), static_cast<unsigned>(c.heads),
                  static_cast<unsigned>(c.layers));
  const std::int64_t smem = blocked_smem_bytes(c.head_dim, sizeof(T), opt);
  auto pass = [&](bool resolve) {
    p.resolve = resolve;
    if (blocked_tile(opt.block_size) == 64) return launch_blocked_tile<T, 64>(p, grid, smem, stream);
    return launch_blocked_tile<T, 128>(p, grid, smem, stream);
  };
  // Pass 0 scores the blocks that start with a finite row; the scan finds the
  // stand-in row of the others; pass 1 scores those (see score_blocked.cuh).
  FLASHCACHE_RETURN_IF_ERROR(pass(false));
  kernels::EdgeParams e;
  e.sequences = c.sequences;
  e.block_size = static_cast<int>(opt.block_size);
  e.slot_count = ws.layout().slot_count;
  e.slots = seq.slots;
  e.first_good = ws.first_good();
  e.last_good = ws.last_good();
  e.source = ws.source();
  e.status = ws.status();
  kernels::blocked_edges_kernel<>
      <<<dim3(static_cast<unsigned>(c.sequences), static_cast<unsigned>(c.heads), static_cast<unsigned>(c.layers)),
         kernels::kEdgeThreads, 0, stream>>>(e);
  FLASHCACHE_RETURN_IF_ERROR(launched("blocked_edges_kernel"));
  return pass(true);
}

// A base chosen by energy (Options::base peak, mixed) for the spectra of one
// (layer, sequence) of n > 1 tokens, after the forward FFT: energies, the
// choice per (head, K | V), the base's coefficients kept in place.
template <class T>
Status choose_base(const Cache<T>& c, const Options& opt, const Workspace& ws, std::int64_t n, cudaStream_t stream) {
  auto* z = static_cast<float2*>(ws.spectrum());
  const unsigned pair_ctas = static_cast<unsigned>(kernels::ceil_div(n / 2 + 1, 256));
  kernels::BaseEnergyParams e;
  e.z = z;
  e.n = n;
  e.head_dim = static_cast<int>(c.head_dim);
  e.energy = ws.base_energy();
  e.status = ws.status();
  kernels::base_energy_kernel<>
      <<<dim3(pair_ctas, static_cast<unsigned>(c.heads)), kernels::kBaseEnergyThreads, 0, stream>>>(e);
  FLASHCACHE_RETURN_IF_ERROR(launched("base_energy_kernel"));
  kernels::BaseChooseParams choose;
  choose.energy = ws.base_energy();
  choose.chosen = ws.base_chosen();
  choose.n = n;
  choose.m = lowpass_cutoff(n, opt.gamma);
  choose.kind = opt.base;
  choose.status = ws.status();
  kernels::base_choose_kernel<><<<dim3(static_cast<unsigned>(c.heads), 2), kernels::kBaseChooseThreads, 0, stream>>>(
      choose);
  FLASHCACHE_RETURN_IF_ERROR(launched("base_choose_kernel"));
  kernels::ChosenBaseParams keep;
  keep.z = z;
  keep.n = n;
  keep.heads = static_cast<int>(c.heads);
  keep.head_dim = static_cast<int>(c.head_dim);
  keep.chosen = ws.base_chosen();
  keep.status = ws.status();
  kernels::chosen_base_kernel<>
      <<<dim3(pair_ctas, static_cast<unsigned>(c.heads * c.head_dim)), 256, 0, stream>>>(keep);
  return launched("chosen_base_kernel");
}

template <class T>
Status score_global(const Cache<T>& c, const Options& opt, const Workspace& ws, const kernels::SeqTable& seq,
                    const GlobalPlan& plan, cudaStream_t stream) {
  const kernels::RowMap rows = row_map(c.head_stride, c.token_stride, c.indptr, c.pages, c.paged());
  // The plan's lengths against the device's, every sequence, before anything uses them.
  for (int first = 0; first < c.sequences; first += kernels::kLengthsPerCheck) {
    kernels::LengthCheckParams check{};
    check.seq_len = seq.len;
    check.first = first;
    check.count = c.sequences - first < kernels::kLengthsPerCheck ? c.sequences - first : kernels::kLengthsPerCheck;
    for (int i = 0; i < check.count; ++i)
      check.expected[i] = static_cast<std::int32_t>(plan.lengths()[static_cast<std::size_t>(first + i)]);
    check.status = ws.status();
    kernels::check_lengths_kernel<><<<1, kernels::kLengthsPerCheck, 0, stream>>>(check);
    FLASHCACHE_RETURN_IF_ERROR(launched("check_lengths_kernel"));
  }
  {
    kernels::SubstituteParams<T> p{};
    fill_layer_pointers(c, p.k, p.v);
    p.rows = rows;
    p.seq = seq;
    p.sequences = c.sequences;
    p.head_dim = static_cast<int>(c.head_dim);
    p.vector_ok = rows_vectorizable(c);
    p.capacity = c.capacity;
    p.sub = ws.substitutes();
    p.status = ws.status();
    if (c.capacity > 0) {
      kernels::finite_kernel<T><<<dim3(static_cast<unsigned>(kernels::ceil_div(c.capacity, kernels::kFiniteRowsPerCta)),
                                       static_cast<unsigned>(c.heads), static_cast<unsigned>(c.layers)),
                                  kernels::kFiniteThreads, 0, stream>>>(p);
      FLASHCACHE_RETURN_IF_ERROR(launched("finite_kernel"));
    }
    kernels::substitute_kernel<T>
        <<<dim3(static_cast<unsigned>(c.sequences), static_cast<unsigned>(c.heads), static_cast<unsigned>(c.layers)),
           kernels::kSubstituteThreads, 0, stream>>>(p);
    FLASHCACHE_RETURN_IF_ERROR(launched("substitute_kernel"));
  }
  const std::int64_t columns = c.heads * c.head_dim;
  auto* z = static_cast<float2*>(ws.spectrum());
  auto* zc = static_cast<cufftComplex*>(ws.spectrum());
  // Packed offsets come from the device (seq.offset), never from the plan:
  // the plan only says how long each transform is, and the check above stops
  // the run if that differs from what the device found.
  for (int b = 0; b < c.sequences; ++b) {
    const std::int64_t n = plan.lengths()[static_cast<std::size_t>(b)];
    if (n == 0) continue;  // compared on the device above; nothing to transform
    // One token: the DCT, the low-pass (m = 1) and the inverse are the identity,
    // so pack feeds the residual pass directly and cuFFT is not involved.
    const bool transform = n > 1;
    const cufftHandle fft = transform ? plan.handle(n) : cufftHandle{};
    for (int l = 0; l < c.layers; ++l) {
      const std::int32_t* sub = ws.substitutes() + static_cast<std::int64_t>(l) * c.heads * c.capacity;
      kernels::PackParams<T> pack{};
      pack.k = c.k[l];
      pack.v = c.v[l];
      pack.rows = rows;
      pack.sequence = b;
      pack.heads = static_cast<int>(c.heads);
      pack.head_dim = static_cast<int>(c.head_dim);
      pack.n = n;
      pack.sub = sub;
      pack.capacity = c.capacity;
      pack.seq = seq;
      pack.z = z;
      pack.status = ws.status();
      kernels::pack_kernel<T><<<dim3(static_cast<unsigned>(kernels::ceil_div(n, 32)),
                                     static_cast<unsigned>(kernels::ceil_div(columns, 32))),
                                dim3(32, 8), 0, stream>>>(pack);
      FLASHCACHE_RETURN_IF_ERROR(launched("pack_kernel"));
      if (transform) {
        FLASHCACHE_RETURN_IF_ERROR(cufft_status(cufftExecC2C(fft, zc, zc, CUFFT_FORWARD), "cufftExecC2C forward"));
        const unsigned pair_ctas = static_cast<unsigned>(kernels::ceil_div(n / 2 + 1, 256));
        if (opt.base == Base::lowpass) {  // the paper's: frequencies k < m
          kernels::LowpassParams lp;
          lp.z = z;
          lp.n = n;
          lp.m = lowpass_cutoff(n, opt.gamma);
          lp.status = ws.status();
          kernels::lowpass_kernel<><<<dim3(pair_ctas, static_cast<unsigned>(columns)), 256, 0, stream>>>(lp);
          FLASHCACHE_RETURN_IF_ERROR(launched("lowpass_kernel"));
        } else {  // chosen by energy, per head, K and V each their own (score_global.cuh)
          FLASHCACHE_RETURN_IF_ERROR(choose_base(c, opt, ws, n, stream));
        }
        FLASHCACHE_RETURN_IF_ERROR(cufft_status(cufftExecC2C(fft, zc, zc, CUFFT_INVERSE), "cufftExecC2C inverse"));
      }
      kernels::ResidualParams<T> rp{};
      rp.k = c.k[l];
      rp.v = c.v[l];
      rp.rows = rows;
      rp.seq = seq;
      rp.sequence = b;
      rp.layer = l;
      rp.heads = static_cast<int>(c.heads);
      rp.head_dim = static_cast<int>(c.head_dim);
      rp.n = n;
      rp.capacity = c.capacity;
      rp.slot_count = ws.layout().slot_count;
      rp.protect = {opt.sink, opt.window, c.protect};
      rp.grids = grid_spans(opt);
      rp.sub = sub;
      rp.z = z;
      rp.scores = ws.scores();
      rp.energy_part = static_cast<float4*>(ws.energy_part());
      rp.protected_part = ws.protected_part();
      rp.status = ws.status();
      kernels::residual_kernel<T>
          <<<dim3(static_cast<unsigned>(kernels::ceil_div(n, kernels::kGlobalTile)), static_cast<unsigned>(c.heads)),
             256, 0, stream>>>(rp);
      FLASHCACHE_RETURN_IF_ERROR(launched("residual_kernel"));
    }
  }
  return Status::success();
}

// The 2D pass over the image spans, after either 1D pass (score_grid.cuh).
template <class T>
Status score_grids(const Cache<T>& c, const Options& opt, const Workspace& ws, const kernels::SeqTable& seq,
                   cudaStream_t stream) {
  GridLaunch g;
  FLASHCACHE_RETURN_IF_ERROR(plan_grid_launch(c.head_dim, opt, max_shared_bytes(), &g));
  kernels::GridParams<T> p{};
  fill_layer_pointers(c, p.k, p.v);
  p.rows = row_map(c.head_stride, c.token_stride, c.indptr, c.pages, c.paged());
  p.seq = seq;
  p.sequences = c.sequences;
  p.head_dim = static_cast<int>(c.head_dim);
  p.grids = g.spans;
  p.zone = opt.grid_zone;
  p.gamma = opt.gamma;
  p.protect = {opt.sink, opt.window, c.protect};
  p.max_rows = static_cast<int>(g.max_rows);
  p.max_cols = static_cast<int>(g.max_cols);
  p.max_tokens = static_cast<int>(g.max_tokens);
  p.max_u = static_cast<int>(g.max_u);
  p.max_v = static_cast<int>(g.max_v);
  p.width = g.width;
  p.capacity = c.capacity;
  p.source = opt.transform == Transform::global ? ws.substitutes() : ws.grid_source();
  p.scores = ws.scores();
  p.grid_energy = static_cast<float2*>(ws.grid_energy());
  p.grid_protected = ws.grid_protected();
  p.status = ws.status();
  auto kernel = kernels::score_grid_kernel<T>;
  if (g.smem > 48 * 1024)
    FLASHCACHE_RETURN_IF_ERROR(
        cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(g.smem)),
                    "raising the grid kernel's shared memory"));
  const dim3 grid(static_cast<unsigned>(static_cast<std::int64_t>(c.sequences) * g.spans.tiles()),
                  static_cast<unsigned>(c.heads), static_cast<unsigned>(c.layers));
  kernel<<<grid, kernels::kGridThreads, static_cast<std::size_t>(g.smem), stream>>>(p);
  return launched("score_grid_kernel");
}

}  // namespace detail

namespace detail {

// can_implement, the layout, and the caller's workspace: what every run path checks first.
template <class T>
Status checked_layout(const Cache<T>& c, const Budget& budget, const Options& opt, const Outputs<T>& out,
                      const void* workspace, std::size_t workspace_bytes, const GlobalPlan* plan,
                      WorkspaceLayout* layout) {
  FLASHCACHE_RETURN_IF_ERROR(can_implement(c, budget, opt, out, plan));
  FLASHCACHE_RETURN_IF_ERROR(workspace_layout(c, opt, plan, layout));
  if (workspace == nullptr || workspace_bytes < layout->total)
    return make_error(Errc::invalid_shape, "workspace of ", workspace_bytes, " bytes < ", layout->total, " needed");
  if (!aligned16(workspace)) return make_error(Errc::invalid_shape, "workspace must be 16-byte aligned");
  return Status::success();
}

// Stages 0-1b: plan, score, per-(layer, sequence) energy sums and protected counts.
template <class T>
Status enqueue_scores(const Cache<T>& c, const Options& opt, const Outputs<T>& out, const Workspace& ws,
                      cudaStream_t stream, const GlobalPlan* plan) {
  const WorkspaceLayout& layout = ws.layout();
  const unsigned L = static_cast<unsigned>(c.layers), B = static_cast<unsigned>(c.sequences);
  // Before anything is enqueued: the plan serves one stream and workspace (global_plan.cuh).
  if (opt.transform == Transform::global) FLASHCACHE_RETURN_IF_ERROR(plan->bind(stream, ws.fft_work()));
  {  // 0. plan
    kernels::PlanParams p;
    p.sequences = c.sequences;
    p.capacity = c.capacity;
    p.tile = layout.tile;
    p.indptr = c.paged() ? c.pages.indptr : c.indptr;
    if (c.paged()) {
      p.page_indices = c.pages.indices;
      p.last_page_len = c.pages.last_page_len;
      p.page_size = c.pages.page_size;
      p.num_pages = c.pages.num_pages;
    }
    for (std::size_t i = 0; i < opt.grids.size(); ++i)  // the span that ends last
      if (opt.grids[i].end() > p.grid_end) {
        p.grid_end = opt.grids[i].end();
        p.grid_first = opt.grids[i].first;
        p.grid_span = static_cast<int>(i);
      }
    p.len = ws.seq_len();
    p.offset = ws.seq_offset();
    p.slots = ws.seq_slots();
    p.status = ws.status();
    kernels::plan_kernel<><<<1, kernels::kPlanThreads, 0, stream>>>(p);
    FLASHCACHE_RETURN_IF_ERROR(launched("plan_kernel"));
  }
  const kernels::SeqTable seq{ws.seq_len(), ws.seq_offset(), ws.seq_slots()};

  // 1. score
  if (opt.transform == Transform::blocked)
    FLASHCACHE_RETURN_IF_ERROR(score_blocked(c, opt, ws, seq, stream));
  else
    FLASHCACHE_RETURN_IF_ERROR(score_global(c, opt, ws, seq, *plan, stream));
  if (!opt.grids.empty()) FLASHCACHE_RETURN_IF_ERROR(score_grids(c, opt, ws, seq, stream));

  {  // 1b. energy
    kernels::EnergyParams p;
    p.sequences = c.sequences;
    p.heads = static_cast<int>(c.heads);
    p.slot_count = layout.slot_count;
    p.slots = ws.seq_slots();
    p.energy_part = static_cast<const float4*>(ws.energy_part());
    p.protected_part = ws.protected_part();
    p.grid_tiles = static_cast<int>(layout.grid_tiles);
    p.grid_energy = static_cast<const float2*>(ws.grid_energy());
    p.grid_protected = ws.grid_protected();
    p.energy = ws.energy();
    p.ratio = ws.ratio();
    p.protected_max = ws.protected_max();
    p.ratio_out = out.energy_ratio;
    p.status = ws.status();
    kernels::energy_kernel<><<<dim3(B, L), kernels::kEnergyThreads, 0, stream>>>(p);
    FLASHCACHE_RETURN_IF_ERROR(launched("energy_kernel"));
  }
  return Status::success();
}

// Stages 2-4: budgets from the energy sums, selection, gather / compaction.
template <class T>
Status enqueue_selection(const Cache<T>& c, const Budget& budget, const Options& opt, const Outputs<T>& out,
                         const Workspace& ws, cudaStream_t stream) {
  const unsigned L = static_cast<unsigned>(c.layers), H = static_cast<unsigned>(c.heads),
                 B = static_cast<unsigned>(c.sequences);
  const kernels::SeqTable seq{ws.seq_len(), ws.seq_offset(), ws.seq_slots()};
  std::int32_t* kept = out.kept != nullptr ? out.kept : ws.kept();
  std::int32_t* kept_indptr = out.kept_indptr != nullptr ? out.kept_indptr : ws.kept_indptr();
  {  // 2. allocate
    kernels::AllocateParams p;
    p.layers = c.layers;
    p.sequences = c.sequences;
    p.is_ratio = budget.is_ratio();
    p.ratio = budget.ratio_value();
    p.count = budget.token_count();
    p.dynamic = opt.allocation == Allocation::dynamic;
    p.min_layer_ratio = opt.min_layer_ratio;
    p.len = ws.seq_len();
    p.energy_ratio = ws.ratio();
    p.protected_max = ws.protected_max();
    p.scratch_ratio = ws.scratch_ratio();
    p.scratch_tokens = ws.scratch_tokens();
    p.scratch_floor = ws.scratch_floor();
    p.scratch_out = ws.scratch_out();
    p.budget = ws.budget();
    p.kept_indptr = kept_indptr;
    p.status = ws.status();
    kernels::allocate_kernel<><<<1, kernels::kAllocateThreads, 0, stream>>>(p);
    FLASHCACHE_RETURN_IF_ERROR(launched("allocate_kernel"));
  }
  {  // 3. select
    kernels::SelectParams p;
    p.sequences = c.sequences;
    p.capacity = c.capacity;
    p.seq = seq;
    p.protect = {opt.sink, opt.window, c.protect};
    p.window_share = opt.window_share;
    p.base_share = opt.base_share;
    p.grid_base_share = opt.grid_base_share;
    p.grids = grid_spans(opt);
    p.base_mark = samples_base(opt) ? ws.base_mark() : nullptr;
    p.scores = ws.scores();
    p.budget = ws.budget();
    p.kept_indptr = kept_indptr;
    p.kept = kept;
    p.status = ws.status();
    if (p.base_mark != nullptr) {  // the base sample's picks, marked before the selection ranks them
      kernels::base_sample_kernel<><<<dim3(B, H, L), kernels::kSelectThreads, 0, stream>>>(p);
      FLASHCACHE_RETURN_IF_ERROR(launched("base_sample_kernel"));
    }
    kernels::select_kernel<><<<dim3(B, H, L), kernels::kSelectThreads, 0, stream>>>(p);
    FLASHCACHE_RETURN_IF_ERROR(launched("select_kernel"));
  }
  const kernels::RowMap rows = row_map(c.head_stride, c.token_stride, c.indptr, c.pages, c.paged());
  if (out.k_out != nullptr && c.capacity > 0) {  // 4a. gather
    kernels::GatherParams p{};
    bool vector_ok = rows_vectorizable(c);
    const auto e = static_cast<std::int64_t>(sizeof(T));
    vector_ok = vector_ok && (out.out_head_stride * e) % 16 == 0 && (out.out_token_stride * e) % 16 == 0;
    for (int l = 0; l < c.layers; ++l) {
      p.k[l] = c.k[l];
      p.v[l] = c.v[l];
      p.k_out[l] = out.k_out[l];
      p.v_out[l] = out.v_out[l];
      vector_ok = vector_ok && aligned16(out.k_out[l]) && aligned16(out.v_out[l]);
    }
    p.rows = rows;
    p.sequences = c.sequences;
    p.head_dim = static_cast<int>(c.head_dim);
    p.capacity = c.capacity;
    p.out_head_stride = out.out_head_stride;
    p.out_token_stride = out.out_token_stride;
    p.out_capacity = out.out_capacity;
    p.vector_ok = vector_ok;
    p.kept = kept;
    p.kept_indptr = kept_indptr;
    p.status = ws.status();
    const dim3 grid(static_cast<unsigned>(kernels::ceil_div(c.capacity, kernels::kGatherRowsPerCta)), H, L);
    if constexpr (sizeof(T) == 2)
      kernels::gather_kernel<2><<<grid, kernels::kGatherThreads, 0, stream>>>(p);
    else
      kernels::gather_kernel<4><<<grid, kernels::kGatherThreads, 0, stream>>>(p);
    FLASHCACHE_RETURN_IF_ERROR(launched("gather_kernel"));
  }
  if (out.compact_in_place) {  // 4b. compact, once every page is known to belong to one sequence
    const std::size_t owner_bytes = (static_cast<std::size_t>(c.pages.num_pages) + 31) / 32 * 4;
    FLASHCACHE_RETURN_IF_ERROR(
        cuda_status(cudaMemsetAsync(ws.page_owners(), 0, owner_bytes, stream), "clearing the page bitmap"));
    kernels::PageOwnerParams owners;
    owners.sequences = c.sequences;
    owners.page_indptr = c.pages.indptr;
    owners.page_indices = c.pages.indices;
    owners.owners = ws.page_owners();
    owners.status = ws.status();
    kernels::page_owner_kernel<><<<kernels::kPageOwnerCtas, kernels::kPageOwnerThreads, 0, stream>>>(owners);
    FLASHCACHE_RETURN_IF_ERROR(launched("page_owner_kernel"));
    kernels::CompactParams p{};
    for (int l = 0; l < c.layers; ++l) {
      p.k[l] = c.k[l];
      p.v[l] = c.v[l];
    }
    p.rows = rows;
    p.sequences = c.sequences;
    p.head_dim = static_cast<int>(c.head_dim);
    p.capacity = c.capacity;
    p.vector_ok = rows_vectorizable(c);
    p.stage_rows =
        static_cast<int>(kernels::kCompactStageBytes / (2 * c.head_dim * static_cast<std::int64_t>(sizeof(T))));
    p.budget = ws.budget();
    p.kept = kept;
    p.kept_indptr = kept_indptr;
    p.page_indptr = c.pages.indptr;
    p.page_size = c.pages.page_size;
    p.new_len = out.new_len;
    p.pages_freed = out.pages_freed;
    p.status = ws.status();
    const dim3 grid(B, H, L);
    if constexpr (sizeof(T) == 2)
      kernels::compact_paged_kernel<2><<<grid, kernels::kCompactThreads, kernels::kCompactStageBytes, stream>>>(p);
    else
      kernels::compact_paged_kernel<4><<<grid, kernels::kCompactThreads, kernels::kCompactStageBytes, stream>>>(p);
    FLASHCACHE_RETURN_IF_ERROR(launched("compact_paged_kernel"));
  }
  return Status::success();
}

}  // namespace detail

// Scores, allocates, selects and (optionally) gathers / compacts, on `stream`.
// Never synchronises and never throws; a failed Status means nothing (or only
// part) was enqueued. Device-side failures: see device_status().
template <class T>
Status compress_async(const Cache<T>& c, const Budget& budget, const Options& opt, const Outputs<T>& out,
                      void* workspace, std::size_t workspace_bytes, cudaStream_t stream,
                      const GlobalPlan* plan = nullptr) {
  WorkspaceLayout layout;
  FLASHCACHE_RETURN_IF_ERROR(detail::checked_layout(c, budget, opt, out, workspace, workspace_bytes, plan, &layout));
  const Workspace ws(workspace, layout);
  FLASHCACHE_RETURN_IF_ERROR(detail::enqueue_scores(c, opt, out, ws, stream, plan));
  return detail::enqueue_selection(c, budget, opt, out, ws, stream);
}

// ---- tensor parallel: the heads of each layer split over ranks -------------------
// R_l and the layer floors need every rank's heads. Each rank runs
// score_async() on its heads, all-reduces the sums energy_sums() points at
// (energy: sum; protected_max: max; e.g. with NCCL on `stream`), then runs
// select_async(), which takes the ratios from the reduced sums. Every rank
// then computes the same budgets. One rank alone: compress_async().
struct EnergySums {
  double* energy = nullptr;         // [layers][sequences][4]: K total, K high, V total, V high; reduce with sum
  int* protected_max = nullptr;     // [layers][sequences]: largest protected count of a head; reduce with max
  std::size_t layer_sequences = 0;  // layers x sequences (energy holds 4 doubles per entry)
};

template <class T>
Status energy_sums(const Cache<T>& c, const Options& opt, void* workspace, const GlobalPlan* plan, EnergySums* sums) {
  WorkspaceLayout layout;
  FLASHCACHE_RETURN_IF_ERROR(workspace_layout(c, opt, plan, &layout));
  if (workspace == nullptr || sums == nullptr) return make_error(Errc::invalid_shape, "energy_sums: null argument");
  const Workspace ws(workspace, layout);
  sums->energy = ws.energy();
  sums->protected_max = ws.protected_max();
  sums->layer_sequences = static_cast<std::size_t>(c.layers) * static_cast<std::size_t>(c.sequences);
  return Status::success();
}

// Phase 1 of a tensor-parallel run: plan, scores and this rank's energy sums.
template <class T>
Status score_async(const Cache<T>& c, const Budget& budget, const Options& opt, const Outputs<T>& out, void* workspace,
                   std::size_t workspace_bytes, cudaStream_t stream, const GlobalPlan* plan = nullptr) {
  WorkspaceLayout layout;
  FLASHCACHE_RETURN_IF_ERROR(detail::checked_layout(c, budget, opt, out, workspace, workspace_bytes, plan, &layout));
  return detail::enqueue_scores(c, opt, out, Workspace(workspace, layout), stream, plan);
}

// Phase 2, after the sums were reduced over the ranks: R_l from the sums,
// budgets, selection, gather / compaction (the same workspace as phase 1).
template <class T>
Status select_async(const Cache<T>& c, const Budget& budget, const Options& opt, const Outputs<T>& out, void* workspace,
                    std::size_t workspace_bytes, cudaStream_t stream, const GlobalPlan* plan = nullptr) {
  WorkspaceLayout layout;
  FLASHCACHE_RETURN_IF_ERROR(detail::checked_layout(c, budget, opt, out, workspace, workspace_bytes, plan, &layout));
  const Workspace ws(workspace, layout);
  kernels::RatioParams p;
  p.count = c.layers * c.sequences;
  p.energy = ws.energy();
  p.ratio = ws.ratio();
  p.ratio_out = out.energy_ratio;
  p.status = ws.status();
  kernels::ratio_kernel<><<<static_cast<unsigned>(kernels::ceil_div(p.count, kernels::kRatioThreads)),
                            kernels::kRatioThreads, 0, stream>>>(p);
  FLASHCACHE_RETURN_IF_ERROR(detail::launched("ratio_kernel"));
  return detail::enqueue_selection(c, budget, opt, out, ws, stream);
}

// Waits for `stream` and reports what the last run on `workspace` found on the device.
template <class T>
Status device_status(const Cache<T>& c, const Options& opt, const void* workspace, cudaStream_t stream,
                     const GlobalPlan* plan = nullptr) {
  WorkspaceLayout layout;
  FLASHCACHE_RETURN_IF_ERROR(workspace_layout(c, opt, plan, &layout));
  return device_status(workspace, layout, stream);
}

// Convenience for simple callers: allocates the workspace, runs on `stream`,
// waits, frees, and reports host- and device-side failures alike.
template <class T>
Status compress(const Cache<T>& c, const Budget& budget, const Options& opt, const Outputs<T>& out,
                cudaStream_t stream = nullptr, const GlobalPlan* plan = nullptr) {
  FLASHCACHE_RETURN_IF_ERROR(can_implement(c, budget, opt, out, plan));
  WorkspaceLayout layout;
  FLASHCACHE_RETURN_IF_ERROR(workspace_layout(c, opt, plan, &layout));
  void* ws = nullptr;
  FLASHCACHE_RETURN_IF_ERROR(
      cuda_status(cudaMalloc(&ws, layout.total > 0 ? layout.total : 1), "allocating the workspace"));
  // The plan is bound to this workspace for this call only (refused if another caller holds it).
  const bool global = opt.transform == Transform::global;
  const Status bound = global ? plan->bind(stream, Workspace(ws, layout).fft_work()) : Status::success();
  const bool bound_here = global && bound.ok();
  const Status s = bound.ok() ? compress_async(c, budget, opt, out, ws, layout.total, stream, plan) : bound;
  const Status device =
      s.ok() ? device_status(ws, layout, stream) : cuda_status(cudaStreamSynchronize(stream), "waiting");
  if (bound_here) plan->release_binding();  // the run has finished: the workspace goes away
  const Status freed = cuda_status(cudaFree(ws), "freeing the workspace");
  if (!s.ok()) return s;
  if (!device.ok()) return device;
  return freed;
}

}  // namespace flashcache::gpu
