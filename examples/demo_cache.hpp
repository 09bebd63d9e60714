#pragma once
// A synthetic multimodal KV cache with the structure FlashCache relies on, for
// the demo (its built-in input, no downloads):
//   - visual tokens from a G x G patch grid in raster order, smooth in both
//     directions (neighbouring patches look alike), so most energy sits in
//     low frequencies along the token axis;
//   - a few planted outlier tokens per head that deviate strongly;
//   - text tokens at the end, uncorrelated;
//   - deeper layers noisier, so their high-frequency energy ratios differ.
// Deterministic for a given seed.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace flashcache::synthetic {

struct CacheShape {
  std::int64_t layers = 28, heads = 4, head_dim = 128;
  std::int64_t grid = 32;         // visual tokens: grid x grid patches
  std::int64_t text_tokens = 64;  // appended after the visual tokens
  std::int64_t outliers_per_head = 8;
  std::int64_t tokens() const { return grid * grid + text_tokens; }
};

struct SyntheticLayer {
  std::vector<float> k, v;             // [heads][tokens][head_dim]
  std::vector<std::int64_t> outliers;  // [heads][outliers_per_head] planted token indices
};

inline SyntheticLayer make_layer(const CacheShape& s, std::int64_t layer, std::uint64_t seed = 2511) {
  const std::int64_t n = s.tokens(), d = s.head_dim;
  std::mt19937_64 rng(seed * 1000003u + static_cast<std::uint64_t>(layer));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uni(0.0f, 6.2831853f);
  const float noise = 0.05f + 0.25f * static_cast<float>(layer) / static_cast<float>(s.layers > 1 ? s.layers - 1 : 1);
  SyntheticLayer out;
  out.k.resize(static_cast<std::size_t>(s.heads * n * d));
  out.v.resize(out.k.size());
  for (std::int64_t h = 0; h < s.heads; ++h) {
    // Per (head, dim): a random low spatial frequency and phase.
    std::vector<float> fx(d), fy(d), phase(d), amp(d);
    for (std::int64_t c = 0; c < d; ++c) {
      fx[c] = 0.05f + 0.25f * std::abs(normal(rng)) / 3.0f;
      fy[c] = 0.05f + 0.25f * std::abs(normal(rng)) / 3.0f;
      phase[c] = uni(rng);
      amp[c] = 0.5f + std::abs(normal(rng));
    }
    for (std::int64_t t = 0; t < n; ++t) {
      float* kr = out.k.data() + (h * n + t) * d;
      float* vr = out.v.data() + (h * n + t) * d;
      const bool visual = t < s.grid * s.grid;
      const float row = static_cast<float>(t / s.grid), col = static_cast<float>(t % s.grid);
      for (std::int64_t c = 0; c < d; ++c) {
        if (visual) {
          const float base = amp[c] * std::sin(fx[c] * col + fy[c] * row + phase[c]);
          kr[c] = base + noise * normal(rng);
          vr[c] = 0.7f * std::cos(fy[c] * col - fx[c] * row + phase[c]) + noise * normal(rng);
        } else {
          kr[c] = normal(rng);
          vr[c] = 0.7f * normal(rng);
        }
      }
    }
    // Outliers: visual tokens replaced by a strong, unrelated vector.
    std::uniform_int_distribution<std::int64_t> pick(0, s.grid * s.grid - 1);
    for (std::int64_t i = 0; i < s.outliers_per_head; ++i) {
      const std::int64_t t = pick(rng);
      out.outliers.push_back(t);
      for (std::int64_t c = 0; c < d; ++c) {
        out.k[static_cast<std::size_t>((h * n + t) * d + c)] += 3.0f * normal(rng);
        out.v[static_cast<std::size_t>((h * n + t) * d + c)] += 2.0f * normal(rng);
      }
    }
  }
  return out;
}

}  // namespace flashcache::synthetic
