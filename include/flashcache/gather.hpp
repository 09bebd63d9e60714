#pragma once
// Stage 4, gather: copy the kept tokens into a dense compact cache (CPU).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "view.hpp"

namespace flashcache {

// dst(h, i, :) = src(h, kept[h * kept_head_stride + i], :) for i < budget,
// where budget is dst.tokens. Indices must lie in [0, src.tokens). Writes
// only into the caller's view; allocates nothing.
template <class T>
Status gather(KVView<T> src, const std::int32_t* kept, std::int64_t kept_head_stride,
              KVView<std::remove_const_t<T>> dst) {
  FLASHCACHE_RETURN_IF_ERROR(check_view(src, "gather source"));
  FLASHCACHE_RETURN_IF_ERROR(check_view(dst, "gather destination"));
  if (dst.heads != src.heads || dst.head_dim != src.head_dim)
    return make_error(Errc::invalid_shape, "gather: destination is ", dst.heads, " heads x ", dst.head_dim,
                      " dims but source is ", src.heads, " x ", src.head_dim);
  const std::int64_t budget = dst.tokens;
  if (src.heads * budget > 0 && kept == nullptr) return make_error(Errc::invalid_shape, "gather: null kept indices");
  if (src.heads > 1 && kept_head_stride < budget)
    return make_error(Errc::invalid_stride, "gather: kept head stride ", kept_head_stride, " < budget ", budget);
  for (std::int64_t h = 0; h < src.heads; ++h)
    for (std::int64_t i = 0; i < budget; ++i) {
      const std::int32_t t = kept[h * kept_head_stride + i];
      if (t < 0 || t >= src.tokens)
        return make_error(Errc::invalid_shape, "gather: kept index ", t, " outside [0, ", src.tokens, ")");
    }
  for (std::int64_t h = 0; h < src.heads; ++h)
    for (std::int64_t i = 0; i < budget; ++i) {
      const std::remove_const_t<T>* from = src.row(h, kept[h * kept_head_stride + i]);
      std::copy(from, from + src.head_dim, dst.row(h, i));
    }
  return Status::success();
}

// Kept indices packed per head: kept[h * budget + i].
template <class T>
Status gather(KVView<T> src, const std::int32_t* kept, KVView<std::remove_const_t<T>> dst) {
  return gather(src, kept, dst.tokens, dst);
}

}  // namespace flashcache
