#pragma once
// Prefill, greedy decoding and teacher-forced NLL on top of engine::Model.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "model.hpp"

namespace engine {

// Runs the prompt in chunks of `chunk` tokens (each a GEMM pass over the cache so
// far), calling progress(done, total) after each; returns the last token's logits.
// An observer sees every chunk's queries (Model::forward).
inline std::vector<float> prefill(const Model& m, const std::vector<int>& ids, KVCache& cache, Workspace& ws,
                                  int threads, std::int64_t chunk = 512,
                                  const std::function<void(std::int64_t, std::int64_t)>& progress = {},
                                  QueryObserver* observer = nullptr) {
  std::vector<float> logits(static_cast<std::size_t>(m.config().vocab));
  const auto n = static_cast<std::int64_t>(ids.size());
  for (std::int64_t at = 0; at < n; at += chunk) {
    const std::int64_t len = std::min(chunk, n - at);
    m.forward(ids.data() + at, len, cache, ws, threads, logits.data(), false, observer);
    if (progress) progress(at + len, n);
  }
  return logits;
}

inline int argmax(const std::vector<float>& x) {
  return static_cast<int>(std::max_element(x.begin(), x.end()) - x.begin());
}

// Greedy tokens: the first from `logits` (the prefill's), each next one from a
// decode step over the cache. Stops after a token for which stop(id) is true.
inline std::vector<int> greedy(const Model& m, std::vector<float> logits, int max_new, KVCache& cache, Workspace& ws,
                               int threads, const std::function<bool(int)>& stop = {},
                               std::vector<std::vector<float>>* chosen_by = nullptr) {
  std::vector<int> out;
  for (int step = 0; step < max_new; ++step) {
    if (chosen_by != nullptr) chosen_by->push_back(logits);
    const int next = argmax(logits);
    out.push_back(next);
    if ((stop && stop(next)) || step + 1 == max_new) break;
    m.forward(&next, 1, cache, ws, threads, logits.data());
  }
  return out;
}

// Per-token NLL (nats) of `cont` as a continuation: its first token from the
// prefill's `logits`, the rest teacher-forced over the cache in one pass.
inline std::vector<double> continuation_nll(const Model& m, const std::vector<float>& logits,
                                            const std::vector<int>& cont, KVCache& cache, Workspace& ws, int threads) {
  const auto V = static_cast<std::size_t>(m.config().vocab);
  std::vector<float> all(V * std::max<std::size_t>(cont.size(), 1));
  std::copy(logits.begin(), logits.end(), all.begin());
  if (cont.size() > 1)
    m.forward(cont.data(), static_cast<std::int64_t>(cont.size()) - 1, cache, ws, threads, all.data() + V, true);
  std::vector<double> nll;
  for (std::size_t i = 0; i < cont.size(); ++i) {
    const float* row = all.data() + i * V;
    const float mx = *std::max_element(row, row + V);
    double sum = 0;
    for (std::size_t j = 0; j < V; ++j) sum += std::exp(static_cast<double>(row[j] - mx));
    nll.push_back(std::log(sum) - static_cast<double>(row[static_cast<std::size_t>(cont[i])] - mx));
  }
  return nll;
}

}  // namespace engine
