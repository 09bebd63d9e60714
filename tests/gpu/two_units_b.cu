// Unit B of the two-unit link test, with the test itself (see two_units.hpp).
#include <gtest/gtest.h>

#include "flashcache/cuda/compress.cuh"
#include "two_units.hpp"

namespace flashcache::two_units {

std::string run_without_workspace_b() {
  alignas(16) static bfloat16_t storage[2][64 * 2 * 64];
  bfloat16_t* k[1] = {storage[0]};
  bfloat16_t* v[1] = {storage[1]};
  gpu::Cache<bfloat16_t> cache;
  cache.k = k;
  cache.v = v;
  cache.heads = 2;
  cache.head_dim = 64;
  cache.head_stride = 64;
  cache.token_stride = 2 * 64;
  cache.capacity = 64;
  Options opt;
  opt.score.transform = Transform::blocked;
  opt.score.base = Base::lowpass;  // the blocked kernel builds the low-pass base
  const Status s = gpu::compress_async(cache, Budget::ratio(0.5), opt, gpu::Outputs<bfloat16_t>{}, nullptr, 0, nullptr);
  // Instantiate the float path here too, so both units hold the same template instances.
  float* fk[1] = {nullptr};
  gpu::Cache<float> unused;
  unused.k = fk;
  unused.v = fk;
  (void)gpu::compress_async(unused, Budget::ratio(0.5), opt, gpu::Outputs<float>{}, nullptr, 0, nullptr);
  return s.ok() ? std::string("ok") : s.message();
}

namespace {

TEST(TwoUnits, BothUnitsLinkAndRefuseAMissingWorkspace) {
  const std::string a = run_without_workspace_a(), b = run_without_workspace_b();
  EXPECT_NE(a.find("workspace"), std::string::npos) << a;
  EXPECT_NE(b.find("workspace"), std::string::npos) << b;
}

}  // namespace
}  // namespace flashcache::two_units
