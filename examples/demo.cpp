// flashcache demo: compresses a whole model's KV cache on the CPU and reports
// what a user wants to know first.
//
//   flashcache_demo [keep_ratio] [transform: global|blocked]
//
// Default input: a synthetic multimodal cache of Qwen2.5-VL-7B's shape (28
// layers, 4 KV heads, head dim 128) with 1024 visual tokens (a 32 x 32 patch
// grid), 64 text tokens and planted outlier tokens; built in, no downloads.
#include <flashcache/flashcache.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "demo_cache.hpp"  // the built-in input

namespace fc = flashcache;

int main(int argc, char** argv) try {
  const double keep_ratio = argc > 1 ? std::atof(argv[1]) : 0.2;
  fc::Options opt;  // the library's defaults (docs/DEFAULTS.md)
  if (argc > 2) opt.score.transform = std::string(argv[2]) == "blocked" ? fc::Transform::blocked : fc::Transform::global;
  opt.select.window = 64;  // keep the text question at the end of the prompt

  const fc::synthetic::CacheShape shape;
  const std::int64_t n = shape.tokens(), h = shape.heads, d = shape.head_dim;
  std::vector<fc::synthetic::SyntheticLayer> layers;
  std::vector<fc::KVView<const float>> k, v;
  for (std::int64_t l = 0; l < shape.layers; ++l) layers.push_back(fc::synthetic::make_layer(shape, l));
  for (const auto& layer : layers) {
    k.push_back(fc::hnd(layer.k.data(), fc::Heads(h), fc::Tokens(n), fc::HeadDim(d)));
    v.push_back(fc::hnd(layer.v.data(), fc::Heads(h), fc::Tokens(n), fc::HeadDim(d)));
  }

  std::printf("flashcache %s demo: synthetic multimodal cache, %lld layers x %lld KV heads x %lld tokens x %lld dims\n",
              fc::version_string(), static_cast<long long>(shape.layers), static_cast<long long>(h),
              static_cast<long long>(n), static_cast<long long>(d));
  std::printf(
      "  %lld visual tokens (%lldx%lld patches), %lld text tokens kept as a window, %lld planted outliers/head\n",
      static_cast<long long>(shape.grid * shape.grid), static_cast<long long>(shape.grid),
      static_cast<long long>(shape.grid), static_cast<long long>(shape.text_tokens),
      static_cast<long long>(shape.outliers_per_head));
  std::printf("  keep ratio %.2f, gamma %.2f, %s base, %s transform, %s allocation\n\n", keep_ratio, opt.score.gamma,
              fc::to_string(opt.score.base), fc::to_string(opt.score.transform), fc::to_string(opt.allocate.mode));

  const auto start = std::chrono::steady_clock::now();
  const auto model = fc::compress_model(k, v, fc::Budget::ratio(keep_ratio), opt);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();

  std::printf("layer     base energy K      base energy V   R_l    budget  outliers kept\n");
  std::int64_t found = 0, planted = 0;
  for (std::int64_t l = 0; l < shape.layers; ++l) {
    const auto& out = model.layers[l];
    const auto e = out.scores.layer_energy();
    std::int64_t kept_here = 0;
    for (std::int64_t head = 0; head < h; ++head)
      for (std::int64_t i = 0; i < shape.outliers_per_head; ++i) {
        const auto t = static_cast<std::int32_t>(layers[l].outliers[head * shape.outliers_per_head + i]);
        kept_here += std::binary_search(out.kept_head(head), out.kept_head(head) + out.budget, t);
      }
    found += kept_here;
    planted += h * shape.outliers_per_head;
    std::printf("%5lld  %16.1f%%  %16.1f%%  %5.3f  %6lld  %6lld/%lld\n", static_cast<long long>(l),
                100.0 * (1 - fc::high_share(e.k_high, e.k_total)), 100.0 * (1 - fc::high_share(e.v_high, e.v_total)),
                model.energy_ratio[l], static_cast<long long>(model.budgets[l]), static_cast<long long>(kept_here),
                static_cast<long long>(h * shape.outliers_per_head));
  }
  const auto bytes = [&](std::int64_t tokens) { return tokens * h * d * 2 * static_cast<std::int64_t>(sizeof(float)); };
  const std::int64_t before = model.tokens_before(), after = model.tokens_after();
  std::printf("\ntokens per head, all layers: %lld -> %lld (%.1f%% kept)\n", static_cast<long long>(before),
              static_cast<long long>(after), 100.0 * static_cast<double>(after) / static_cast<double>(before));
  std::printf("KV bytes (float32):          %.1f MiB -> %.1f MiB, %.1f MiB saved\n", bytes(before) / 1048576.0,
              bytes(after) / 1048576.0, (bytes(before) - bytes(after)) / 1048576.0);
  std::printf("planted outliers kept:       %lld of %lld\n", static_cast<long long>(found),
              static_cast<long long>(planted));
  std::printf("non-finite tokens:           %lld\n", static_cast<long long>(model.nonfinite));
  std::printf("compression time (CPU):      %.1f ms\n", ms);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
