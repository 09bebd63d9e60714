#pragma once
// The element types every typed GPU suite runs over, named as the CLI names them
// (f32, f16, bf16), so that a filter such as '*/bf16.*' picks one.
#include <gtest/gtest.h>

#include <string>
#include <type_traits>

#include "flashcache/types.hpp"

namespace flashcache::gpu_testing {

using ElementTypes = ::testing::Types<float, half_t, bfloat16_t>;

struct ElementTypeNames {
  template <class T>
  static std::string GetName(int) {
    if (std::is_same_v<T, float>) return "f32";
    if (std::is_same_v<T, half_t>) return "f16";
    return "bf16";
  }
};

}  // namespace flashcache::gpu_testing

// A typed test suite over ElementTypes, its tests written TYPED_TEST(Suite, Name).
#define FLASHCACHE_ELEMENT_TYPED_SUITE(Suite) \
  template <class T>                          \
  class Suite : public ::testing::Test {};    \
  TYPED_TEST_SUITE(Suite, ::flashcache::gpu_testing::ElementTypes, ::flashcache::gpu_testing::ElementTypeNames)
