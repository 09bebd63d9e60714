#pragma once
// A straightforward CPU decode-attention step, the consumer of a compressed
// cache: one query token per sequence and query head over a dense cache,
//   out = softmax(q K^T / sqrt(d)) V,
// split over the sequence in chunks (as FlashDecoding does on a GPU) with an
// online softmax, so each cache row is read exactly once. GQA: query head j
// reads KV head j / (query_heads / kv_heads).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "flashcache/types.hpp"
#include "flashcache/view.hpp"

namespace flashcache::bench {

// q: [batch][query_heads][d] float; k, v: one view per sequence (kv_heads x tokens x d);
// out: [batch][query_heads][d].
template <class T>
void decode_attention(const float* q, const std::vector<KVView<const T>>& k, const std::vector<KVView<const T>>& v,
                      std::int64_t query_heads, float* out) {
  for (std::size_t b = 0; b < k.size(); ++b) {
    const std::int64_t kv_heads = k[b].heads, n = k[b].tokens, d = k[b].head_dim, group = query_heads / kv_heads;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    std::vector<float> kf(static_cast<std::size_t>(d)), logits(static_cast<std::size_t>(group));
    std::vector<float> acc(static_cast<std::size_t>(group * d)), run_max(static_cast<std::size_t>(group)),
        run_sum(static_cast<std::size_t>(group));
    for (std::int64_t h = 0; h < kv_heads; ++h) {
      // The query heads of a group share every K/V row they read.
      const float* qh = q + (static_cast<std::int64_t>(b) * query_heads + h * group) * d;
      std::fill(acc.begin(), acc.end(), 0.0f);
      std::fill(run_max.begin(), run_max.end(), -INFINITY);
      std::fill(run_sum.begin(), run_sum.end(), 0.0f);
      for (std::int64_t t = 0; t < n; ++t) {
        const T* kr = k[b].row(h, t);
        const T* vr = v[b].row(h, t);
        for (std::int64_t c = 0; c < d; ++c) kf[c] = to_float(kr[c]);
        for (std::int64_t g = 0; g < group; ++g) {
          float dot = 0;
          for (std::int64_t c = 0; c < d; ++c) dot += qh[g * d + c] * kf[c];
          dot *= scale;
          // Online softmax: rescale what was accumulated when the max grows.
          const float new_max = std::max(run_max[g], dot);
          const float correction = std::exp(run_max[g] - new_max), p = std::exp(dot - new_max);
          run_sum[g] = run_sum[g] * correction + p;
          float* a = acc.data() + g * d;
          for (std::int64_t c = 0; c < d; ++c) a[c] = a[c] * correction + p * to_float(vr[c]);
          run_max[g] = new_max;
        }
      }
      for (std::int64_t g = 0; g < group; ++g)
        for (std::int64_t c = 0; c < d; ++c)
          out[(static_cast<std::int64_t>(b) * query_heads + h * group + g) * d + c] =
              run_sum[g] > 0 ? acc[g * d + c] / run_sum[g] : 0.0f;
    }
  }
}

}  // namespace flashcache::bench
