#pragma once
// The integration a user copies: after prefill, hand the engine's KV cache to
// flashcache and replace it with the compact one it returns. Decoding then goes
// on over the kept tokens (with their original RoPE positions) plus new tokens.
#include <flashcache/flashcache.hpp>
#include <flashcache/policies/baselines.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "model.hpp"

namespace engine {

struct CompressSettings {
  double keep_ratio = 0.2;  // of the model's prompt tokens, split over layers by the policy
  std::string policy = "flashcache";
  std::int64_t sink = -1, window = -1;  // always-kept first / last tokens; -1: the library's default
  std::int64_t room = 0;               // new tokens each layer must still have room for
  bool uniform = false;                // same budget in every layer instead of flashcache's dynamic split
};

// Per-layer budgets (tokens kept per KV head). Throws flashcache::Error on bad settings.
inline std::vector<std::int64_t> compress_cache(KVCache& cache, const CompressSettings& s) {
  namespace fc = flashcache;
  namespace fp = flashcache::policies;
  fp::Policy policy = fp::Policy::flashcache;
  fc::throw_if_error(fp::parse_policy(s.policy, &policy));
  if (fp::needs_queries(policy))
    throw fc::Error(fc::Errc::unsupported, "policy " + s.policy + " needs the prompt's queries, which this engine does not keep");

  // The cache as one flashcache view per layer: [kv_heads][capacity][head_dim], `length` tokens in use.
  const int layers = cache.layers();
  const std::int64_t heads = cache.kv_heads(), dim = cache.head_dim();
  std::vector<fc::KVView<const float>> k, v;
  for (int l = 0; l < layers; ++l) {
    k.emplace_back(cache.k(l, 0, 0), heads, cache.length(l), dim, cache.capacity(l) * dim, dim);
    v.emplace_back(cache.v(l, 0, 0), heads, cache.length(l), dim, cache.capacity(l) * dim, dim);
  }
  fc::Options opt;  // the library's defaults, but for what the caller set
  if (s.sink >= 0) opt.sink = s.sink;
  if (s.window >= 0) opt.window = s.window;
  opt.allocation = s.uniform ? fc::Allocation::uniform : fc::Allocation::dynamic;
  const auto budget = fc::Budget::ratio(s.keep_ratio);
  const auto out = policy == fp::Policy::flashcache ? fc::compress_model(k, v, budget, opt)
                                                    : fp::compress_model(policy, {}, k, v, budget, opt);

  // A new, smaller cache: layer l holds budgets[l] tokens per head, plus room for new ones.
  std::vector<std::int64_t> capacity(static_cast<std::size_t>(layers));
  for (int l = 0; l < layers; ++l) capacity[l] = out.budgets[l] + s.room;
  KVCache small(cache.config(), capacity);
  for (int l = 0; l < layers; ++l) {
    const auto& layer = out.layers[static_cast<std::size_t>(l)];
    for (int h = 0; h < heads; ++h) {
      const std::int64_t src = h * layer.budget * dim;
      std::copy_n(layer.k.data() + src, layer.budget * dim, small.k(l, h, 0));
      std::copy_n(layer.v.data() + src, layer.budget * dim, small.v(l, h, 0));
      for (std::int64_t j = 0; j < layer.budget; ++j) small.position(l, h, j) = cache.position(l, h, layer.kept_head(h)[j]);
    }
    small.set_length(l, layer.budget);
  }
  small.next_position = cache.next_position;  // new tokens continue the uncompressed sequence
  cache = std::move(small);
  return out.budgets;
}

}  // namespace engine
