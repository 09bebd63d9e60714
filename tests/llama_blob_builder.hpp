#pragma once
// Synthetic llama.cpp sequence-state blobs for the parser's tests and seeds,
// laid out as flashcache/llama/state/format.hpp describes (the format of llama-cpp-python 0.3.36).
#include <cstdint>
#include <cstring>
#include <vector>

namespace blob_builder {

struct Spec {
  std::int32_t seq_id = 0;
  std::uint32_t n_stream = 1, stream = 0;
  std::vector<std::int32_t> pos = {0, 1, 2, 3};
  std::uint32_t layers = 2;
  std::int32_t k_type = 1, v_type = 1;  // ggml f16
  std::uint32_t embd = 8;               // elements per row (heads x head_dim)
  bool v_trans = false;
};

inline void put(std::vector<std::uint8_t>& b, const void* p, std::size_t n) {
  const auto* c = static_cast<const std::uint8_t*>(p);
  b.insert(b.end(), c, c + n);
}
template <class T>
void put(std::vector<std::uint8_t>& b, T v) {
  put(b, &v, sizeof v);
}

inline std::uint32_t elem_bytes(std::int32_t t) { return t == 0 ? 4 : 2; }

// Element (layer, kv 0/1, cell, c) as a recognisable f16 / f32 pattern.
inline float value(std::uint32_t l, int kv, std::size_t cell, std::uint32_t c) {
  return static_cast<float>(l * 1000 + static_cast<std::uint32_t>(kv) * 500 + cell * 10 + c) * 0.01f;
}

inline void put_elem(std::vector<std::uint8_t>& b, std::int32_t type, float x) {
  if (type == 0) {
    put(b, x);
  } else {  // f16 / bf16 stand-in: the top bits of the float (bf16), also fine as opaque f16 bits
    std::uint32_t u;
    std::memcpy(&u, &x, 4);
    put(b, static_cast<std::uint16_t>(u >> 16));
  }
}

inline std::vector<std::uint8_t> build(const Spec& s) {
  std::vector<std::uint8_t> b;
  put(b, std::uint32_t{0xaf143cd8u});
  put(b, s.seq_id);
  put(b, s.n_stream);
  const auto cells = static_cast<std::uint32_t>(s.pos.size());
  for (std::uint32_t st = 0; st < s.n_stream; ++st) {
    if (st != s.stream || cells == 0) {
      put(b, std::uint32_t{0});
      continue;
    }
    put(b, cells);
    for (std::int32_t p : s.pos) {
      put(b, p);
      put(b, std::uint32_t{1});
      put(b, s.seq_id);
    }
    put(b, std::uint32_t{s.v_trans ? 1u : 0u});
    put(b, s.layers);
    for (std::uint32_t l = 0; l < s.layers; ++l) {
      put(b, s.k_type);
      put(b, std::uint64_t{s.embd} * elem_bytes(s.k_type));
      for (std::size_t i = 0; i < cells; ++i)
        for (std::uint32_t c = 0; c < s.embd; ++c) put_elem(b, s.k_type, value(l, 0, i, c));
    }
    for (std::uint32_t l = 0; l < s.layers; ++l) {
      put(b, s.v_type);
      if (!s.v_trans) {
        put(b, std::uint64_t{s.embd} * elem_bytes(s.v_type));
        for (std::size_t i = 0; i < cells; ++i)
          for (std::uint32_t c = 0; c < s.embd; ++c) put_elem(b, s.v_type, value(l, 1, i, c));
      } else {
        put(b, elem_bytes(s.v_type));
        put(b, s.embd);
        for (std::uint32_t c = 0; c < s.embd; ++c)
          for (std::size_t i = 0; i < cells; ++i) put_elem(b, s.v_type, value(l, 1, i, c));
      }
    }
  }
  return b;
}

// A sliding-window model's blob: the global layers' cache, then the sliding
// layers' (its section without the magic and sequence id, which come once).
inline std::vector<std::uint8_t> build_two(const Spec& global, const Spec& sliding) {
  std::vector<std::uint8_t> b = build(global);
  const std::vector<std::uint8_t> second = build(sliding);
  b.insert(b.end(), second.begin() + 8, second.end());
  return b;
}

}  // namespace blob_builder
