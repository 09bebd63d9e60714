#pragma once
// Synthetic layers for the core, plan and batch tests: smooth sinusoids along
// tokens plus noise and a few spikes, per layer a different seed.
#include <flashcache/flashcache.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace flashcache::testing {

namespace fc = flashcache;

// Smooth sinusoids along tokens plus noise and a few spikes, [heads][n][d].
inline std::vector<float> layer_data(std::int64_t heads, std::int64_t n, std::int64_t d, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> noise(0, 0.1 * static_cast<double>(1 + seed / 10));  // layers differ
  std::vector<float> x(static_cast<std::size_t>(heads * n * d));
  for (std::int64_t h = 0; h < heads; ++h)
    for (std::int64_t t = 0; t < n; ++t)
      for (std::int64_t c = 0; c < d; ++c)
        x[static_cast<std::size_t>((h * n + t) * d + c)] = static_cast<float>(
            std::sin(0.03 * static_cast<double>(t * (c % 4 + 1)) + static_cast<double>(h) * (1.0 + 0.1 * seed)) +
            noise(rng) + ((t * 7 + h * 3 + static_cast<std::int64_t>(seed)) % 19 == 0 ? 1.5 : 0.0));
  return x;
}

struct Model {
  std::int64_t heads, d;
  std::vector<std::int64_t> tokens;
  std::vector<std::vector<float>> k, v;
  std::vector<fc::KVView<const float>> kv, vv;

  Model(std::int64_t h, std::int64_t dim, std::vector<std::int64_t> n) : heads(h), d(dim), tokens(std::move(n)) {
    for (std::size_t l = 0; l < tokens.size(); ++l) {
      k.push_back(layer_data(heads, tokens[l], d, 10 * l + 1));
      v.push_back(layer_data(heads, tokens[l], d, 10 * l + 2));
    }
    for (std::size_t l = 0; l < tokens.size(); ++l) {
      kv.push_back(fc::hnd<const float>(k[l].data(), fc::Heads(heads), fc::Tokens(tokens[l]), fc::HeadDim(d)));
      vv.push_back(fc::hnd<const float>(v[l].data(), fc::Heads(heads), fc::Tokens(tokens[l]), fc::HeadDim(d)));
    }
  }
};

// A mask of n tokens with every step-th one set, from offset.
inline std::vector<std::uint8_t> every(std::int64_t n, std::int64_t step, std::int64_t offset) {
  std::vector<std::uint8_t> m(static_cast<std::size_t>(n), 0);
  for (std::int64_t t = offset; t < n; t += step) m[static_cast<std::size_t>(t)] = 1;
  return m;
}

}  // namespace flashcache::testing
