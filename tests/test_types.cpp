// half_t and bfloat16_t conversions: exact round trips and round-to-nearest-even.
#include <gtest/gtest.h>
#include <flashcache/types.hpp>

#include <cmath>
#include <limits>
#include <random>

namespace fc = flashcache;

namespace {

TEST(Half, EveryFiniteBitPatternRoundTrips) {
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float f = fc::half_t::to_float(bits);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(fc::half_t::to_float(fc::half_t::from_float(f))));
      continue;
    }
    EXPECT_EQ(fc::half_t::from_float(f), bits) << std::hex << b;
  }
}

// The nearest half to f, by brute force over all finite halves near it.
float nearest_half_value(float f) {
  float best = 0;
  double best_err = std::numeric_limits<double>::infinity();
  for (std::uint32_t b = 0; b < 0x7c00u; ++b) {
    for (float s : {1.0f, -1.0f}) {
      const float h = s * fc::half_t::to_float(static_cast<std::uint16_t>(b));
      const double err = std::abs(static_cast<double>(h) - f);
      // Ties go to the even mantissa.
      if (err < best_err || (err == best_err && (b & 1u) == 0)) {
        best_err = err;
        best = h;
      }
    }
  }
  return best;
}

TEST(Half, RoundsToNearestEven) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> mag(-16.0f, 16.0f);
  for (int i = 0; i < 60; ++i) {
    const float f = std::ldexp(std::uniform_real_distribution<float>(-1, 1)(rng), static_cast<int>(mag(rng)));
    EXPECT_EQ(static_cast<float>(fc::half_t(f)), nearest_half_value(f)) << f;
  }
  // Exact ties: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10, and goes to 1 (even).
  EXPECT_EQ(static_cast<float>(fc::half_t(1.0f + std::ldexp(1.0f, -11))), 1.0f);
  EXPECT_EQ(static_cast<float>(fc::half_t(1.0f + 3 * std::ldexp(1.0f, -11))), 1.0f + std::ldexp(1.0f, -9));
  // Subnormals and the edges of the range.
  EXPECT_EQ(static_cast<float>(fc::half_t(std::ldexp(1.0f, -24))), std::ldexp(1.0f, -24));
  EXPECT_EQ(static_cast<float>(fc::half_t(std::ldexp(1.0f, -26))), 0.0f);
  EXPECT_EQ(static_cast<float>(fc::half_t(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(static_cast<float>(fc::half_t(65520.0f))));
  EXPECT_TRUE(std::isnan(static_cast<float>(fc::half_t(std::nanf("")))));
}

TEST(Bfloat16, RoundTripsAndRoundsToNearestEven) {
  for (std::uint32_t b = 0; b < 0x10000u; b += 7) {
    const float f = fc::bfloat16_t::to_float(static_cast<std::uint16_t>(b));
    if (!std::isnan(f)) {
      EXPECT_EQ(fc::bfloat16_t::from_float(f), b);
    }
  }
  EXPECT_EQ(static_cast<float>(fc::bfloat16_t(1.0f + std::ldexp(1.0f, -8))), 1.0f);  // tie to even
  EXPECT_EQ(static_cast<float>(fc::bfloat16_t(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(static_cast<float>(fc::bfloat16_t(std::nanf("")))));
  EXPECT_TRUE(std::isinf(static_cast<float>(fc::bfloat16_t(std::numeric_limits<float>::infinity()))));
}

TEST(DType, TagsAndSizes) {
  EXPECT_EQ(fc::dtype_of<float>::value, fc::DType::f32);
  EXPECT_EQ(fc::dtype_of<const fc::half_t>::value, fc::DType::f16);
  EXPECT_EQ(fc::size_of(fc::DType::bf16), 2);
  EXPECT_STREQ(fc::to_string(fc::DType::f16), "float16");
}

}  // namespace
