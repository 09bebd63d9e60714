#pragma once
// K and V rows of a parsed llama.cpp sequence-state blob (format.hpp) as
// float, for scoring: f32, f16, bf16 and q8_0.
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "flashcache/llama/state/format.hpp"
#include "flashcache/types.hpp"

namespace flashcache {
namespace llama {

namespace detail {

#if defined(__SSE2__)
// Four halves (zero-extended to 32 bits) as floats, bit for bit half_t::to_float
// without its branches: a normal half's exponent and mantissa shifted into place
// and rebiased; infinities and NaNs rebiased further to 255, payload kept;
// subnormals (and zero) as mantissa x 2^-24, which is exact.
inline __m128 four_halves(__m128i h) {
  const __m128i sign = _mm_slli_epi32(_mm_and_si128(h, _mm_set1_epi32(0x8000)), 16);
  const __m128i em = _mm_and_si128(h, _mm_set1_epi32(0x7fff));
  __m128i normal = _mm_add_epi32(_mm_slli_epi32(em, 13), _mm_set1_epi32(112 << 23));
  const __m128i special = _mm_cmpgt_epi32(em, _mm_set1_epi32(0x7bff));  // exponent 31
  normal = _mm_add_epi32(normal, _mm_and_si128(special, _mm_set1_epi32(112 << 23)));
  const __m128i sub = _mm_castps_si128(_mm_mul_ps(_mm_cvtepi32_ps(em), _mm_set1_ps(5.9604644775390625e-8f)));
  const __m128i is_sub = _mm_cmplt_epi32(em, _mm_set1_epi32(0x400));  // exponent 0
  return _mm_castsi128_ps(
      _mm_or_si128(_mm_or_si128(_mm_and_si128(is_sub, sub), _mm_andnot_si128(is_sub, normal)), sign));
}
#endif

// n 16-bit floats at src (any alignment) to float: eight at a time where SSE2 is
// there, the rest (and every element without it) by the scalar conversion.
template <class Half>
inline void halves_to_float(const std::uint8_t* src, std::uint64_t n, float* dst) {
  std::uint64_t i = 0;
#if defined(__SSE2__)
  const __m128i zero = _mm_setzero_si128();
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
    if constexpr (std::is_same<Half, bfloat16_t>::value) {  // the bits are the float's high half
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm_unpacklo_epi16(zero, h));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i + 4), _mm_unpackhi_epi16(zero, h));
    } else {
      _mm_storeu_ps(dst + i, four_halves(_mm_unpacklo_epi16(h, zero)));
      _mm_storeu_ps(dst + i + 4, four_halves(_mm_unpackhi_epi16(h, zero)));
    }
  }
#endif
  for (; i < n; ++i) {
    std::uint16_t b;
    std::memcpy(&b, src + 2 * i, 2);
    dst[i] = Half::to_float(b);
  }
}

}  // namespace detail

// Converts `n` elements of type t at src to float.
inline void to_float_row(GgmlType t, const std::uint8_t* src, std::uint64_t n, float* dst) {
  switch (t) {
    case GgmlType::f32:
      std::memcpy(dst, src, static_cast<std::size_t>(n) * 4);
      return;
    case GgmlType::f16:
      detail::halves_to_float<half_t>(src, n, dst);
      return;
    case GgmlType::bf16:
      detail::halves_to_float<bfloat16_t>(src, n, dst);
      return;
    case GgmlType::q8_0:
      q8_0_to_float(src, 0, static_cast<std::int64_t>(n), dst);
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
