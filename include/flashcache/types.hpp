#pragma once
// Element types of the KV cache on the host: float, IEEE half and bfloat16.
//
// half_t and bfloat16_t are 16-bit storage types with the same bit layout as
// CUDA's __half and __nv_bfloat16, so device buffers can be viewed as either.
// All arithmetic happens in float (or double); conversions round to nearest even.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "config.hpp"

namespace flashcache {

namespace detail {
inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
}  // namespace detail

struct half_t {
  std::uint16_t bits = 0;

  half_t() = default;
  explicit half_t(float f) : bits(from_float(f)) {}
  explicit operator float() const { return to_float(bits); }
  static half_t from_bits(std::uint16_t b) {
    half_t h;
    h.bits = b;
    return h;
  }

  static std::uint16_t from_float(float f) {
    const std::uint32_t x = detail::float_bits(f);
    const std::uint32_t sign = (x >> 16) & 0x8000u;
    std::uint32_t a = x & 0x7fffffffu;
    if (a >= 0x7f800000u)  // inf stays inf, NaN stays a (quiet) NaN
      return static_cast<std::uint16_t>(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u | ((a >> 13) & 0x3ffu) : 0u));
    if (a >= 0x477ff000u)  // at or above 65520: rounds to infinity
      return static_cast<std::uint16_t>(sign | 0x7c00u);
    if (a < 0x38800000u) {  // below 2^-14: half subnormal or zero
      // Adding 0.5f puts the half subnormal's ulp (2^-24) at float's ulp, so the
      // FPU's own round-to-nearest-even does the rounding.
      const float aligned = detail::bits_float(a) + 0.5f;
      return static_cast<std::uint16_t>(sign | (detail::float_bits(aligned) - 0x3f000000u));
    }
    const std::uint32_t odd = (a >> 13) & 1u;
    a += 0xc8000fffu + odd;  // rebias exponent (127 -> 15) and round to nearest even
    return static_cast<std::uint16_t>(sign | (a >> 13));
  }

  static float to_float(std::uint16_t h) {
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    const std::uint32_t exp = (h >> 10) & 0x1fu;
    const std::uint32_t mant = h & 0x3ffu;
    if (exp == 0) {  // zero or subnormal: mant * 2^-24
      const float mag = static_cast<float>(mant) * 5.9604644775390625e-8f;
      return detail::bits_float(sign | detail::float_bits(mag));
    }
    if (exp == 31) return detail::bits_float(sign | 0x7f800000u | (mant << 13));
    return detail::bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
  }
};

struct bfloat16_t {
  std::uint16_t bits = 0;

  bfloat16_t() = default;
  explicit bfloat16_t(float f) : bits(from_float(f)) {}
  explicit operator float() const { return to_float(bits); }
  static bfloat16_t from_bits(std::uint16_t b) {
    bfloat16_t h;
    h.bits = b;
    return h;
  }

  static std::uint16_t from_float(float f) {
    const std::uint32_t x = detail::float_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);  // quiet NaN
    const std::uint32_t odd = (x >> 16) & 1u;
    return static_cast<std::uint16_t>((x + 0x7fffu + odd) >> 16);
  }
  static float to_float(std::uint16_t b) { return detail::bits_float(static_cast<std::uint32_t>(b) << 16); }
};

static_assert(sizeof(half_t) == 2 && sizeof(bfloat16_t) == 2, "16-bit storage types");

// Runtime tag of an element type, for dispatch at the edges (CLI, .npy, GPU API).
enum class DType { f32, f16, bf16 };

inline const char* to_string(DType t) {
  switch (t) {
    case DType::f32:
      return "float32";
    case DType::f16:
      return "float16";
    case DType::bf16:
      return "bfloat16";
  }
  return "unknown";
}

inline int size_of(DType t) { return t == DType::f32 ? 4 : 2; }

template <class T>
struct dtype_of;
template <>
struct dtype_of<float> : std::integral_constant<DType, DType::f32> {};
template <>
struct dtype_of<half_t> : std::integral_constant<DType, DType::f16> {};
template <>
struct dtype_of<bfloat16_t> : std::integral_constant<DType, DType::bf16> {};
template <class T>
struct dtype_of<const T> : dtype_of<T> {};

// Element <-> float conversions used by the CPU kernels.
inline float to_float(float x) { return x; }
inline float to_float(double x) { return static_cast<float>(x); }
inline float to_float(half_t x) { return static_cast<float>(x); }
inline float to_float(bfloat16_t x) { return static_cast<float>(x); }

// One row of d elements as floats.
template <class T>
inline void row_to_float(const T* row, std::int64_t d, float* out) {
  for (std::int64_t c = 0; c < d; ++c) out[c] = to_float(row[c]);
}

// llama.cpp's q8_0 (ggml's block_q8_0): rows in blocks of 32 elements, each
// block an IEEE half scale then 32 int8 values; element i is scale x value i.
inline constexpr std::int64_t kQ8Block = 32;       // elements per block
inline constexpr std::int64_t kQ8BlockBytes = 34;  // the scale's 2 bytes and 32 int8

// Elements [first, first + n) of a q8_0 row as floats.
inline void q8_0_to_float(const unsigned char* row, std::int64_t first, std::int64_t n, float* out) {
  for (std::int64_t e = first; e < first + n;) {
    const unsigned char* block = row + e / kQ8Block * kQ8BlockBytes;
    std::uint16_t bits;
    std::memcpy(&bits, block, 2);
    const float scale = half_t::to_float(bits);
    const std::int64_t end = std::min(first + n, (e / kQ8Block + 1) * kQ8Block);
    for (; e < end; ++e) *out++ = scale * static_cast<float>(static_cast<std::int8_t>(block[2 + e % kQ8Block]));
  }
}

template <class T>
T from_float(float x) {
  if constexpr (std::is_same_v<T, float>)
    return x;
  else
    return T(x);
}

}  // namespace flashcache
