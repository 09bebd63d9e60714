#pragma once
// Host-side fixtures of the GPU tests: caches at fake device addresses, which
// the checks and the workspace sizing never dereference, and the error check
// every suite uses. No kernel is launched with them.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "flashcache/cuda/compress.cuh"

namespace flashcache::gpu_testing::host {

// A fake device address: validation never dereferences it.
template <class T>
T* fake(std::uintptr_t at) {
  return reinterpret_cast<T*>(at);
}

// A dense NHD bf16 cache of `layers` layers with fake, aligned pointers.
struct DenseFixture {
  std::vector<bfloat16_t*> k, v;
  gpu::Cache<bfloat16_t> cache;
  DenseFixture(int layers, std::int64_t heads, std::int64_t tokens, std::int64_t d) {
    for (int l = 0; l < layers; ++l) {
      k.push_back(fake<bfloat16_t>(0x10000000u + 0x1000000u * static_cast<unsigned>(l)));
      v.push_back(fake<bfloat16_t>(0x80000000u + 0x1000000u * static_cast<unsigned>(l)));
    }
    cache.layers = layers;
    cache.k = k.data();
    cache.v = v.data();
    cache.heads = heads;
    cache.head_dim = d;
    cache.head_stride = d;
    cache.token_stride = heads * d;
    cache.capacity = tokens;
  }
};

// The library's defaults on the blocked transform, with the low-pass base: the
// GPU's blocked kernel takes no other, whatever the default.
inline Options blocked(std::int64_t block = 64) {
  Options o;
  o.score.transform = Transform::blocked;
  o.score.block_size = block;
  o.score.base = Base::lowpass;
  return o;
}

inline void expect_error(const Status& s, Errc code, const std::string& words) {
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), code) << s.message();
  EXPECT_NE(s.message().find(words), std::string::npos) << "message: " << s.message();
}

}  // namespace flashcache::gpu_testing::host
