#pragma once
// What an Archive (archive.hpp) holds and how it is bounded: the stored row
// types, the rows' shape, the order tokens are kept in, the options and their
// checks. Apart so that option parsers and bindings need not see the Archive.
#include <cstdint>

#include "enum_names.hpp"
#include "error.hpp"
#include "types.hpp"

namespace flashcache {

// How a row's elements are stored. q8_0 is llama.cpp's (types.hpp): blocks of
// 32 elements, so its rows hold a multiple of 32.
enum class RowType { f32, f16, bf16, q8_0 };

// Bytes of `elements` elements of type t (q8_0: whole blocks).
inline std::int64_t row_bytes(RowType t, std::int64_t elements) {
  switch (t) {
    case RowType::f32:
      return 4 * elements;
    case RowType::f16:
    case RowType::bf16:
      return 2 * elements;
    case RowType::q8_0:
      return elements / kQ8Block * kQ8BlockBytes;
  }
  return 0;
}

template <>
struct EnumNames<RowType> {
  static constexpr EnumName<RowType> table[] = {
      {RowType::f32, "f32"}, {RowType::f16, "f16"}, {RowType::bf16, "bf16"}, {RowType::q8_0, "q8_0"}};
};
inline const char* to_string(RowType e) { return enum_name(e); }

// The rows an archive holds: every layer's K row of a token is kv_heads x
// head_dim elements of k_type, its V row as many of v_type.
struct ArchiveShape {
  int layers = 0;
  std::int64_t kv_heads = 0;
  std::int64_t head_dim = 0;
  RowType k_type = RowType::f16;
  RowType v_type = RowType::f16;

  std::int64_t k_row_bytes() const { return row_bytes(k_type, kv_heads * head_dim); }
  std::int64_t v_row_bytes() const { return row_bytes(v_type, kv_heads * head_dim); }
  // One token's bytes: its position and a K and a V row per layer.
  std::int64_t token_bytes() const {
    return static_cast<std::int64_t>(sizeof(std::int32_t)) + layers * (k_row_bytes() + v_row_bytes());
  }
};

// The order an archive keeps its tokens in, which decides what a block holds.
enum class ArchiveOrder {
  eviction,  // as appended: a block is tokens evicted together
  position,  // by position: a block is neighbouring archived positions, whichever eviction they came from
};
template <>
struct EnumNames<ArchiveOrder> {
  static constexpr EnumName<ArchiveOrder> table[] = {{ArchiveOrder::eviction, "eviction"},
                                                     {ArchiveOrder::position, "position"}};
};
inline const char* to_string(ArchiveOrder e) { return enum_name(e); }

struct ArchiveOptions {
  // Archive tokens per block: the unit a recall scores and brings back.
  std::int64_t block_size = 16;
  // At most this many bytes of positions and rows; 0: no cap.
  std::int64_t byte_cap = 0;
  ArchiveOrder order = ArchiveOrder::eviction;
};

// The options' own checks, which need no shape.
inline Status check_archive_options(const ArchiveOptions& o) {
  if (o.block_size < 1) return make_error(Errc::invalid_option, "archive block_size ", o.block_size, " (at least 1)");
  if (o.byte_cap < 0) return make_error(Errc::invalid_option, "archive byte_cap ", o.byte_cap, " is negative");
  if (!is_known(o.order)) return make_error(Errc::invalid_option, "archive: unknown order");
  return Status::success();
}

inline Status check_archive(const ArchiveShape& s, const ArchiveOptions& o) {
  FLASHCACHE_RETURN_IF_ERROR(check_archive_options(o));
  if (s.layers < 1) return make_error(Errc::invalid_shape, "archive: ", s.layers, " layers (at least 1)");
  if (s.kv_heads < 1 || s.head_dim < 1)
    return make_error(Errc::invalid_shape, "archive: ", s.kv_heads, " KV heads x head dim ", s.head_dim,
                      " (both at least 1)");
  for (const RowType t : {s.k_type, s.v_type}) {
    if (t != RowType::f32 && t != RowType::f16 && t != RowType::bf16 && t != RowType::q8_0)
      return make_error(Errc::invalid_option, "archive: unknown row type");
    if (t == RowType::q8_0 && s.kv_heads * s.head_dim % kQ8Block != 0)
      return make_error(Errc::invalid_shape, "archive: q8_0 rows of ", s.kv_heads * s.head_dim,
                        " elements (whole blocks of ", kQ8Block, ")");
  }
  if (o.byte_cap > 0 && o.byte_cap < o.block_size * s.token_bytes())
    return make_error(Errc::invalid_option, "archive byte_cap ", o.byte_cap, " holds less than one block (",
                      o.block_size * s.token_bytes(), " bytes)");
  return Status::success();
}

}  // namespace flashcache
