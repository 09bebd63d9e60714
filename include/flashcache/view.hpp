#pragma once
// Non-owning views of one layer's K or V: heads x tokens x head_dim.
//
// Like Eigen's Map with a Stride, a view never owns memory: it is a pointer,
// three extents and two strides (in elements). The head dim is contiguous;
// the head and token strides are free, so the two usual cache layouts are
// the same type:
//   HND  [heads][tokens][head_dim]  -> hnd(ptr, Heads(h), Tokens(n), HeadDim(d))
//   NHD  [tokens][heads][head_dim]  -> nhd(ptr, Tokens(n), Heads(h), HeadDim(d))
#include <cstdint>
#include <limits>
#include <type_traits>

#include "config.hpp"
#include "error.hpp"

namespace flashcache {

template <class T>
struct KVView {
  T* data = nullptr;
  std::int64_t heads = 0;
  std::int64_t tokens = 0;
  std::int64_t head_dim = 0;
  std::int64_t head_stride = 0;   // elements between heads
  std::int64_t token_stride = 0;  // elements between tokens

  FLASHCACHE_INLINE T* row(std::int64_t h, std::int64_t n) const { return data + h * head_stride + n * token_stride; }
  FLASHCACHE_INLINE T& operator()(std::int64_t h, std::int64_t n, std::int64_t c) const { return row(h, n)[c]; }
  FLASHCACHE_INLINE bool empty() const { return heads == 0 || tokens == 0 || head_dim == 0; }

  // A view of T converts to a view of const T, never the other way.
  template <class U, class = std::enable_if_t<std::is_same_v<const U, T> && !std::is_same_v<U, T>>>
  FLASHCACHE_INLINE KVView(const KVView<U>& o)  // NOLINT(google-explicit-constructor)
      : data(o.data),
        heads(o.heads),
        tokens(o.tokens),
        head_dim(o.head_dim),
        head_stride(o.head_stride),
        token_stride(o.token_stride) {}
  KVView() = default;
  FLASHCACHE_INLINE KVView(T* d, std::int64_t h, std::int64_t n, std::int64_t c, std::int64_t hs, std::int64_t ns)
      : data(d), heads(h), tokens(n), head_dim(c), head_stride(hs), token_stride(ns) {}
};

// Extents by name, for the dense layouts below: hnd and nhd take the same
// three counts in different orders, so plain integers could be swapped
// silently; these cannot (explicit, and distinct types).
struct Heads {
  constexpr explicit Heads(std::int64_t n) : value(n) {}
  std::int64_t value;
};
struct Tokens {
  constexpr explicit Tokens(std::int64_t n) : value(n) {}
  std::int64_t value;
};
struct HeadDim {
  constexpr explicit HeadDim(std::int64_t n) : value(n) {}
  std::int64_t value;
};

// [heads][tokens][head_dim], densely packed.
template <class T>
KVView<T> hnd(T* data, Heads heads, Tokens tokens, HeadDim head_dim) {
  return {data, heads.value, tokens.value, head_dim.value, tokens.value * head_dim.value, head_dim.value};
}

// [tokens][heads][head_dim], densely packed.
template <class T>
KVView<T> nhd(T* data, Tokens tokens, Heads heads, HeadDim head_dim) {
  return {data, heads.value, tokens.value, head_dim.value, head_dim.value, heads.value * head_dim.value};
}

// Tokens [first, first + count) of a view: one sequence of a packed batch.
template <class T>
KVView<T> token_range(const KVView<T>& v, std::int64_t first, std::int64_t count) {
  KVView<T> r = v;
  if (v.data != nullptr && count > 0) r.data = v.row(0, first);
  r.tokens = count;
  return r;
}

// Checks one view: non-negative extents, a non-null pointer when not empty,
// and strides under which no two (head, token) rows overlap.
template <class T>
Status check_view(const KVView<T>& v, const char* name) {
  if (v.heads < 0 || v.tokens < 0 || v.head_dim < 0)
    return make_error(Errc::invalid_shape, name, ": negative extent (heads ", v.heads, ", tokens ", v.tokens,
                      ", head_dim ", v.head_dim, ")");
  if (v.head_dim == 0 && v.heads > 0 && v.tokens > 0) return make_error(Errc::invalid_shape, name, ": head_dim is 0");
  if (v.empty()) return Status::success();
  if (v.data == nullptr) return make_error(Errc::invalid_shape, name, ": null data pointer for a non-empty view");
  // Strides only matter along extents larger than one.
  const bool many_heads = v.heads > 1, many_tokens = v.tokens > 1;
  if ((many_heads && v.head_stride <= 0) || (many_tokens && v.token_stride <= 0))
    return make_error(Errc::invalid_stride, name, ": strides must be positive (head_stride ", v.head_stride,
                      ", token_stride ", v.token_stride, ")");
  // The elements spanned, (heads - 1) head_stride + (tokens - 1) token_stride +
  // head_dim, must fit in int64 before any product below is formed.
  std::int64_t span = v.head_dim;
  const auto add_span = [&span](std::int64_t count, std::int64_t stride) {
    if (count > 0 && stride > (std::numeric_limits<std::int64_t>::max() - span) / count) return false;
    span += count * stride;
    return true;
  };
  if (!add_span(many_heads ? v.heads - 1 : 0, v.head_stride) ||
      !add_span(many_tokens ? v.tokens - 1 : 0, v.token_stride))
    return make_error(Errc::invalid_shape, name, ": ", v.heads, " heads x stride ", v.head_stride, " and ", v.tokens,
                      " tokens x stride ", v.token_stride, " span more than 2^63 elements");
  // Rows of head_dim contiguous elements must not overlap: the inner stride
  // spans a row, the outer stride spans all rows of the inner extent.
  std::int64_t inner_stride = v.token_stride, inner_n = v.tokens, outer_stride = v.head_stride;
  bool has_inner = many_tokens, has_outer = many_heads;
  if (many_heads && (!many_tokens || v.head_stride < v.token_stride)) {
    inner_stride = v.head_stride;
    inner_n = v.heads;
    outer_stride = v.token_stride;
    has_inner = true;
    has_outer = many_tokens;
  }
  if (has_inner && inner_stride < v.head_dim)
    return make_error(Errc::invalid_stride, name, ": stride ", inner_stride, " < head_dim ", v.head_dim,
                      " makes rows overlap");
  if (has_outer && outer_stride < inner_n * inner_stride)
    return make_error(Errc::invalid_stride, name, ": stride ", outer_stride, " < ", inner_n, " x ", inner_stride,
                      " makes rows overlap");
  return Status::success();
}

// K and V of one layer must agree on heads, tokens and head_dim.
template <class T, class U>
Status check_pair(const KVView<T>& k, const KVView<U>& v) {
  FLASHCACHE_RETURN_IF_ERROR(check_view(k, "K"));
  FLASHCACHE_RETURN_IF_ERROR(check_view(v, "V"));
  if (k.heads != v.heads || k.tokens != v.tokens || k.head_dim != v.head_dim)
    return make_error(Errc::invalid_shape, "K is ", k.heads, "x", k.tokens, "x", k.head_dim, " but V is ", v.heads, "x",
                      v.tokens, "x", v.head_dim, " (heads x tokens x head_dim)");
  return Status::success();
}

}  // namespace flashcache
