#pragma once
// K and V rows of a parsed llama.cpp sequence-state blob (format.hpp) as
// float, for scoring: f32, f16, bf16 and q8_0.
#include <cstdint>
#include <cstring>

#include "flashcache/llama/format.hpp"
#include "flashcache/types.hpp"

namespace flashcache {
namespace llama {

// Converts `n` elements of type t at src to float.
inline void to_float_row(GgmlType t, const std::uint8_t* src, std::uint64_t n, float* dst) {
  switch (t) {
    case GgmlType::f32:
      std::memcpy(dst, src, static_cast<std::size_t>(n) * 4);
      return;
    case GgmlType::f16:
      for (std::uint64_t i = 0; i < n; ++i) {
        std::uint16_t b;
        std::memcpy(&b, src + 2 * i, 2);
        dst[i] = half_t::to_float(b);
      }
      return;
    case GgmlType::bf16:
      for (std::uint64_t i = 0; i < n; ++i) {
        std::uint16_t b;
        std::memcpy(&b, src + 2 * i, 2);
        dst[i] = bfloat16_t::to_float(b);
      }
      return;
    case GgmlType::q8_0:
      for (std::uint64_t blk = 0; blk < n / kQ8Block; ++blk) {
        const std::uint8_t* p = src + blk * kQ8BlockBytes;
        std::uint16_t b;
        std::memcpy(&b, p, 2);
        const float d = half_t::to_float(b);
        for (std::int64_t i = 0; i < kQ8Block; ++i)
          dst[blk * kQ8Block + static_cast<std::uint64_t>(i)] = d * static_cast<float>(static_cast<std::int8_t>(p[2 + i]));
      }
      return;
    default:  // the parser refuses every other type
      return;
  }
}

// Which of a layer's two caches.
enum class Part { k, v };

// Layer l's K (or V) as float, one row of embd elements per cell, the cells
// in the order of `cells` (count of them): out[i * embd + c].
inline void layer_to_float(const std::uint8_t* blob, const SeqState& s, std::size_t l, Part part,
                           const std::int32_t* cells, std::uint32_t count, float* out) {
  const LayerState& L = s.layers[l];
  if (part == Part::k) {
    for (std::uint32_t i = 0; i < count; ++i)
      to_float_row(L.k_type, blob + L.k_offset + static_cast<std::size_t>(cells[i]) * L.k_row_bytes, L.k_embd,
                   out + static_cast<std::size_t>(i) * L.k_embd);
    return;
  }
  if (!s.v_trans) {
    for (std::uint32_t i = 0; i < count; ++i)
      to_float_row(L.v_type, blob + L.v_offset + static_cast<std::size_t>(cells[i]) * L.v_row_bytes, L.v_embd,
                   out + static_cast<std::size_t>(i) * L.v_embd);
    return;
  }
  // Transposed: row j holds element j of every cell.
  const std::size_t row = static_cast<std::size_t>(s.cell_count) * L.v_elem_bytes;
  for (std::uint64_t j = 0; j < L.v_embd; ++j)
    for (std::uint32_t i = 0; i < count; ++i)
      to_float_row(L.v_type, blob + L.v_offset + j * row + static_cast<std::size_t>(cells[i]) * L.v_elem_bytes, 1,
                   out + static_cast<std::size_t>(i) * L.v_embd + j);
}

}  // namespace llama
}  // namespace flashcache
