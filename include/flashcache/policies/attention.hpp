#pragma once
// Causal softmax attention probabilities, row by row (CPU), for the baselines
// that score tokens by attention (SnapKV, H2O). Query i sees keys 0..i.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "../error.hpp"
#include "../types.hpp"
#include "../view.hpp"

namespace flashcache::policies {

// Queries and keys must agree on tokens and head dim, and the query heads
// must be a multiple of the KV heads (GQA: query head j uses KV head j / group).
template <class T>
Status check_queries(KVView<const T> q, KVView<const T> k) {
  FLASHCACHE_RETURN_IF_ERROR(check_view(q, "Q"));
  if (q.tokens != k.tokens || q.head_dim != k.head_dim)
    return make_error(Errc::invalid_shape, "Q is ", q.heads, "x", q.tokens, "x", q.head_dim, " but K is ", k.heads, "x",
                      k.tokens, "x", k.head_dim, " (tokens and head_dim must match)");
  if (k.heads == 0 || q.heads % k.heads != 0)
    return make_error(Errc::invalid_shape, q.heads, " query heads are not a multiple of ", k.heads, " KV heads");
  return Status::success();
}

// probs[j] = softmax_j(q_i . k_j / sqrt(d)) for j <= i, for query row i of
// query head qh against KV head kh; `probs` gets i + 1 entries.
template <class T>
void causal_attention_row(KVView<const T> q, KVView<const T> k, std::int64_t qh, std::int64_t kh, std::int64_t i,
                          std::vector<double>* probs) {
  const std::int64_t d = k.head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  probs->resize(static_cast<std::size_t>(i + 1));
  const T* qi = q.row(qh, i);
  double top = -INFINITY;
  for (std::int64_t j = 0; j <= i; ++j) {
    const T* kj = k.row(kh, j);
    double dot = 0;
    for (std::int64_t c = 0; c < d; ++c) dot += static_cast<double>(to_float(qi[c])) * to_float(kj[c]);
    (*probs)[static_cast<std::size_t>(j)] = dot * scale;
    top = std::max(top, dot * scale);
  }
  double sum = 0;
  for (auto& p : *probs) sum += (p = std::exp(p - top));
  for (auto& p : *probs) p /= sum;
}

}  // namespace flashcache::policies
