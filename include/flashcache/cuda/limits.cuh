#pragma once
// What one GPU call takes: its limits and the head dims with their own kernels.
#include <array>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "flashcache/cuda/kernels/common.cuh"  // kMaxLayers, kMaxGridSpans
#include "flashcache/error.hpp"
#include "flashcache/rules.hpp"

namespace flashcache::gpu {

inline constexpr int kMaxLayers = kernels::kMaxLayers;
// Image spans one call takes (Cache::spans): they travel in kernel parameters.
inline constexpr int kMaxGridSpans = kernels::kMaxGridSpans;
// Shared memory a CTA may use after opting in, when no device can be asked:
// sm_90's (H100/H200). With a device, can_implement() asks it.
inline constexpr std::int64_t kMaxSharedBytes = 227 * 1024;
// Dynamic shared memory a kernel may take without opting in (flashcache/cuda/kernels/common.cuh).
inline constexpr std::int64_t kDefaultDynamicSmemBytes = kernels::kDefaultDynamicSmemBytes;

// Head dims with a kernel of their own; any other head dim takes the generic
// one (head dim 0 in the kernels' template arguments). The one list.
template <int... Dims>
struct HeadDimList {};
using CompiledHeadDims = HeadDimList<64, 96, 128, 256>;

template <int... Dims>
constexpr std::array<int, sizeof...(Dims)> head_dim_values(HeadDimList<Dims...>) {
  return {Dims...};
}
inline constexpr auto kCompiledHeadDims = head_dim_values(CompiledHeadDims{});

namespace detail {

// f(std::integral_constant<int, D>{}) for the compiled head dim D equal to
// head_dim, else f(std::integral_constant<int, 0>{}): a bounded dispatch.
template <class F>
Status dispatch_head_dim(std::int64_t, HeadDimList<>, F&& f) {
  return f(std::integral_constant<int, 0>{});
}
template <class F, int Dim, int... Rest>
Status dispatch_head_dim(std::int64_t head_dim, HeadDimList<Dim, Rest...>, F&& f) {
  if (head_dim == Dim) return f(std::integral_constant<int, Dim>{});
  return dispatch_head_dim(head_dim, HeadDimList<Rest...>{}, std::forward<F>(f));
}

}  // namespace detail
}  // namespace flashcache::gpu
