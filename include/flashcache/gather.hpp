#pragma once
// Stage 4, gather: copy the kept tokens into a dense compact cache (CPU).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "view.hpp"

namespace flashcache {

// dst(h, i, :) = src(h, kept[h * budget + i], :) for i < budget, where budget
// is dst.tokens. Indices must lie in [0, src.tokens).
template <class T>
Status gather(KVView<T> src, const std::int32_t* kept, KVView<std::remove_const_t<T>> dst) {
  FLASHCACHE_RETURN_IF_ERROR(check_view(src, "gather source"));
  FLASHCACHE_RETURN_IF_ERROR(check_view(dst, "gather destination"));
  if (dst.heads != src.heads || dst.head_dim != src.head_dim)
    return make_error(Errc::invalid_shape, "gather: destination is ", dst.heads, " heads x ", dst.head_dim,
                      " dims but source is ", src.heads, " x ", src.head_dim);
  const std::int64_t budget = dst.tokens;
  for (std::int64_t i = 0; i < src.heads * budget; ++i)
    if (kept[i] < 0 || kept[i] >= src.tokens)
      return make_error(Errc::invalid_shape, "gather: kept index ", kept[i], " outside [0, ", src.tokens, ")");
  for (std::int64_t h = 0; h < src.heads; ++h)
    for (std::int64_t i = 0; i < budget; ++i) {
      const std::remove_const_t<T>* from = src.row(h, kept[h * budget + i]);
      std::copy(from, from + src.head_dim, dst.row(h, i));
    }
  return Status::success();
}

}  // namespace flashcache
