#pragma once
// can_implement: everything about a call that can be checked on the host,
// before anything is enqueued, as named checks in the order they run.
#include <cstdint>

#include "flashcache/cuda/cache.cuh"
#include "flashcache/cuda/checked_call.cuh"
#include "flashcache/cuda/global_transform.cuh"
#include "flashcache/cuda/kernels/compact_paged.cuh"  // kernels::kCompactStageBytes
#include "flashcache/cuda/kernels/mean_distance.cuh"  // kernels::kMeanDistanceMaxHeadDim
#include "flashcache/cuda/limits.cuh"
#include "flashcache/cuda/workspace.cuh"
#include "flashcache/error.hpp"
#include "flashcache/grid.hpp"
#include "flashcache/options.hpp"
#include "flashcache/view.hpp"

namespace flashcache::gpu {
namespace checks {

// Options these kernels take: the CPU's check_options, less what only the CPU has.
inline Status options(const Options& opt) {
  FLASHCACHE_RETURN_IF_ERROR(check_options(opt));
  // Options the CPU has and these kernels do not yet; the defaults never need them.
  if (opt.score.normalize_terms)
    return make_error(Errc::unsupported, "normalize_terms: the GPU scores K and V unweighted only (CPU only)");
  if (opt.score.bridge > 0)
    return make_error(Errc::unsupported, "bridge: the GPU ranks each token's own score only (CPU only)");
  if (opt.score.rope.derotate)
    return make_error(Errc::unsupported, "rope.derotate: the GPU scores keys as cached only (CPU only)");
  // A base chosen by energy needs a block's whole spectrum; the blocked kernel
  // keeps only the m low rows of its DCT basis in shared memory.
  if (opt.score.base != Base::lowpass && opt.score.transform == Transform::blocked)
    return make_error(Errc::unsupported, "base ", to_string(opt.score.base),
                      " with Transform::blocked: the GPU blocked kernel holds only the m low rows of the DCT basis, "
                      "and a base chosen by energy needs every frequency of the block (CPU only); use "
                      "Transform::global, or Base::lowpass");
  return Status::success();
}

// The cache: counts, pointers, and rows that do not overlap (dense or paged).
template <class T>
Status cache(const Cache<T>& c) {
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
  if (!c.paged()) {
    if (c.indptr == nullptr && c.sequences != 1)
      return make_error(Errc::invalid_shape, c.sequences, " sequences need an indptr");
    const KVView<const T> view(c.capacity > 0 ? c.k[0] : nullptr, c.heads, c.capacity, c.head_dim, c.head_stride,
                               c.token_stride);
    return check_view(view, "K");
  }
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
  return Status::success();
}

// The budget's range: the CPU's rule (Budget::resolve) against the capacity;
// what each sequence can keep only the device knows.
inline Status budget(const Budget& b, std::int64_t capacity) {
  std::int64_t tokens = 0;
  const Status s = b.resolve(capacity, &tokens);
  if (s.ok() || b.is_ratio() || b.token_count() < 0) return s;
  return make_error(s.code(), s.message(), " of the cache's capacity");
}

// The transform: the blocked kernel's block size and shared memory, or the
// global transform's global against the cache.
template <class T>
Status transform(const Cache<T>& c, const Options& opt, const GlobalTransform* global, std::int64_t limit) {
  if (opt.score.transform == Transform::blocked) {
    if (!rules::block_size_ok(opt.score.block_size, true))
      return make_error(Errc::unsupported, "block_size ", opt.score.block_size, ": the GPU blocked transform takes ",
                        rules::kMinBlockSize, " to ", rules::kMaxGpuBlockSize);
    const std::int64_t smem = detail::blocked_smem_bytes(c.head_dim, sizeof(T), opt.score);
    if (smem > limit)
      return make_error(Errc::unsupported, "block_size ", opt.score.block_size, " with head_dim ", c.head_dim, " ",
                        to_string(dtype_of<T>::value), " needs ", smem, " bytes of shared memory > ", limit,
                        " this device allows; use a smaller block_size");
    return Status::success();
  }
  if (global == nullptr) return make_error(Errc::invalid_option, "the global transform needs a GlobalTransform");
  if (global->heads() != c.heads || global->head_dim() != c.head_dim ||
      static_cast<std::int64_t>(global->lengths().size()) != c.sequences)
    return make_error(Errc::invalid_option, "GlobalTransform is for ", global->lengths().size(), " sequences x ",
                      global->heads(), " heads x ", global->head_dim(), " dims, the cache has ", c.sequences, " x ",
                      c.heads, " x ", c.head_dim);
  if (c.heads * c.head_dim > 65535)
    return make_error(Errc::unsupported, "global transform: heads x head_dim ", c.heads * c.head_dim,
                      " > 65535 columns");
  std::int64_t total = 0;
  for (auto n : global->lengths()) total += n;
  if (total > c.capacity)
    return make_error(Errc::invalid_shape, "GlobalTransform lengths add up to ", total, " > capacity ", c.capacity);
  return Status::success();
}

// Image spans: inside the capacity (and, with the global transform, whose global
// knows the lengths, inside every sequence; with Transform::blocked the device
// checks the lengths: grid_past_sequence), a tile count that fits an int, and
// a 2D pass that fits the device's shared memory (`limit` bytes), sized into *launch.
template <class T>
Status grids(const Cache<T>& c, const Options& opt, const GlobalTransform* global, std::int64_t limit,
             detail::GridLaunch* launch) {
  const ImageSpans spans = c.spans;
  if (spans.empty()) return Status::success();
  if (spans.size() > static_cast<std::size_t>(kMaxGridSpans))
    return make_error(Errc::unsupported, spans.size(), " grid spans: the GPU takes at most ", kMaxGridSpans,
                      " per call (they travel in kernel parameters)");
  FLASHCACHE_RETURN_IF_ERROR(check_grid_spans(spans));
  for (std::size_t i = 0; i < spans.size(); ++i)
    if (spans[i].end() > c.capacity)
      return make_error(Errc::invalid_shape, "grid span ", i, " [", spans[i].first, ", ", spans[i].end(),
                        ") reaches past the capacity of ", c.capacity, " tokens");
  if (opt.score.transform == Transform::global)
    for (std::size_t b = 0; b < global->lengths().size(); ++b) {
      const Status fits = check_grids_fit(spans, global->lengths()[b]);
      if (!fits.ok()) return make_error(fits.code(), "sequence ", b, ": ", fits.message());
    }
  const std::int64_t tiles = grid_tile_count(spans, opt.score);
  if (static_cast<std::int64_t>(c.sequences) * tiles > std::int64_t{2147483647})
    return make_error(Errc::unsupported, c.sequences, " sequences x ", tiles,
                      " grid tiles: more than 2^31 - 1 tiles in one call; use a larger grid_tile");
  return detail::size_grid_launch(c.head_dim, spans, opt.score, limit, launch);
}

// Query tails: given exactly when ScoreOptions::query asks for them, 4-byte aligned.
template <class T>
Status queries(const Cache<T>& c, const Options& opt) {
  if (opt.score.query == QueryInput::none) {
    if (c.tails != nullptr)
      return make_error(Errc::invalid_option, "Cache::tails given but ScoreOptions::query is none");
    return Status::success();
  }
  if (c.tails == nullptr && c.capacity > 0)
    return make_error(Errc::invalid_option, "ScoreOptions::query is ", to_string(opt.score.query),
                      " but Cache::tails is null (the keys' tails, [layers][heads][capacity] floats)");
  if (reinterpret_cast<std::uintptr_t>(c.tails) % alignof(float) != 0)
    return make_error(Errc::invalid_shape, "Cache::tails must be 4-byte aligned");
  return Status::success();
}

// ScoreOptions::mean_weight: the mean K and V row sits in shared memory (kernels/mean_distance.cuh),
// within what any device gives a kernel without opting in.
inline constexpr std::int64_t kMeanDistanceMaxHeadDim = kernels::kMeanDistanceMaxHeadDim;

inline Status mean_distance(std::int64_t head_dim, const Options& opt) {
  if (opt.score.mean_weight > 0 && head_dim > kMeanDistanceMaxHeadDim)
    return make_error(Errc::unsupported, "mean_weight with head_dim ", head_dim, ": the GPU takes at most ",
                      kMeanDistanceMaxHeadDim);
  return Status::success();
}

// Where the results go: a dense output, in-place compaction, the kept indices.
template <class T>
Status outputs(const Cache<T>& c, const Options& opt, const Outputs<T>& out) {
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
    if (c.layers > 1 && opt.allocate.mode == Allocation::dynamic)
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

}  // namespace checks

namespace detail {

// The checks in can_implement's order, with what they work out that a run
// needs again: the device's shared-memory limit (asked once per call) and the
// 2D pass's launch.
template <class T>
Status check_call(const Cache<T>& c, const Budget& budget, const Options& opt, const Outputs<T>& out,
                  const GlobalTransform* global, CheckedCall* call) {
  static_assert(is_element_v<T>, "flashcache::gpu: elements are float, half_t or bfloat16_t");
  FLASHCACHE_RETURN_IF_ERROR(checks::options(opt));
  FLASHCACHE_RETURN_IF_ERROR(checks::cache(c));
  FLASHCACHE_RETURN_IF_ERROR(checks::budget(budget, c.capacity));
  FLASHCACHE_RETURN_IF_ERROR(checks::mean_distance(c.head_dim, opt));
  call->smem_limit = max_shared_bytes();
  FLASHCACHE_RETURN_IF_ERROR(checks::transform(c, opt, global, call->smem_limit));
  FLASHCACHE_RETURN_IF_ERROR(checks::grids(c, opt, global, call->smem_limit, &call->grid));
  FLASHCACHE_RETURN_IF_ERROR(checks::queries(c, opt));
  return checks::outputs(c, opt, out);
}

}  // namespace detail

// Everything that can be checked without running: options, the cache, the
// budget's range, the transform (and its global), the image spans, the query
// tails and the outputs, in that order.
template <class T>
Status can_implement(const Cache<T>& c, const Budget& budget, const Options& opt, const Outputs<T>& out = {},
                     const GlobalTransform* global = nullptr) {
  detail::CheckedCall call;
  return detail::check_call(c, budget, opt, out, global, &call);
}

}  // namespace flashcache::gpu
