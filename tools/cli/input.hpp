#pragma once
// Loading the CLI's inputs: K and V as [L, H, N, d] (or [H, N, d]) arrays and
// an optional protect mask, each checked with a message naming the file.
#include <cstdint>
#include <string>
#include <vector>

#include "flashcache/types.hpp"
#include "flashcache/view.hpp"
#include "npy/npy.hpp"

namespace flashcache::cli {

struct KVCache {
  npy::Array k, v;
  DType dtype = DType::f32;              // f32 or f16
  std::vector<std::int64_t> file_shape;  // as stored: 3-D or 4-D
  std::int64_t layers = 0, heads = 0, tokens = 0, head_dim = 0;

  std::int64_t layer_elements() const { return heads * tokens * head_dim; }
  std::int64_t bytes() const { return 2 * layers * layer_elements() * size_of(dtype); }

  // One [H][N][d] view per layer of `a` (k or v), with T matching dtype.
  template <class T>
  std::vector<KVView<const T>> views(const npy::Array& a) const {
    std::vector<KVView<const T>> out;
    const T* base = a.data<T>();
    for (std::int64_t l = 0; l < layers; ++l)
      out.push_back(hnd(base + l * layer_elements(), Heads(heads), Tokens(tokens), HeadDim(head_dim)));
    return out;
  }
};

// Queries for the attention-based policies: [L, Hq, N, d] (or [Hq, N, d]),
// with K's dtype, layers, tokens and head dim, Hq a multiple of K's heads.
struct Queries {
  npy::Array q;
  std::int64_t heads = 0;
  std::vector<std::int64_t> file_shape;

  // One [Hq][N][d] view per layer of the cache.
  template <class T>
  std::vector<KVView<const T>> views(const KVCache& c) const {
    std::vector<KVView<const T>> out;
    const T* base = q.data<T>();
    const std::int64_t layer = heads * c.tokens * c.head_dim;
    for (std::int64_t l = 0; l < c.layers; ++l)
      out.push_back(hnd(base + l * layer, Heads(heads), Tokens(c.tokens), HeadDim(c.head_dim)));
    return out;
  }
};

// Reads the queries and checks them against the loaded cache (paths name both files).
Queries load_queries(const std::string& q_path, const std::string& k_path, const KVCache& cache);

// Reads and checks K and V: same shape and dtype, float32 or float16, 3-D or 4-D, no empty extent.
KVCache load_cache(const std::string& k_path, const std::string& v_path);

// Reads a bool or uint8 mask of exactly `tokens` entries; nonzero = always kept.
std::vector<std::uint8_t> load_mask(const std::string& path, std::int64_t tokens);

}  // namespace flashcache::cli
