// Unit A of the two-unit link test (see two_units.hpp).
#include "flashcache/cuda/compress.cuh"
#include "two_units.hpp"

namespace flashcache::two_units {

std::string run_without_workspace_a() {
  // A dense one-sequence cache; the pointers are never dereferenced on this path.
  alignas(16) static float storage[2][64 * 2 * 64];
  float* k[1] = {storage[0]};
  float* v[1] = {storage[1]};
  gpu::Cache<float> cache;
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
  const Status s = gpu::compress_async(cache, Budget::ratio(0.5), opt, gpu::Outputs<float>{}, nullptr, 0, nullptr);
  return s.ok() ? std::string("ok") : s.message();
}

}  // namespace flashcache::two_units
