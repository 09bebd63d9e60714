#pragma once
// Causal softmax attention, summed over query rows, for the baselines that
// score tokens by attention (SnapKV, H2O). Query i sees keys 0..i.
//
// Queries are taken in tiles: the logits of a tile are one float matrix
// product (Eigen), the softmax and the sums run in double. A long prompt
// (thousands of tokens) then costs seconds, not minutes.
#include <Eigen/Core>

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

namespace detail {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Rows [first, first + count) of one head as a float matrix.
template <class T>
void load_rows(KVView<const T> x, std::int64_t head, std::int64_t first, std::int64_t count, RowMatrix* out) {
  out->resize(count, x.head_dim);
  for (std::int64_t r = 0; r < count; ++r) {
    const T* row = x.row(head, first + r);
    for (std::int64_t c = 0; c < x.head_dim; ++c) (*out)(r, c) = to_float(row[c]);
  }
}

}  // namespace detail

// column_sums[j] += sum over query rows i in [first, last) of
// softmax_j(q_i . k_j / sqrt(d)), j <= i, for query head qh against KV head kh.
// column_sums must hold k.tokens entries.
template <class T>
void add_causal_attention(KVView<const T> q, KVView<const T> k, std::int64_t qh, std::int64_t kh, std::int64_t first,
                          std::int64_t last, double* column_sums) {
  constexpr std::int64_t kTile = 128;
  const double scale = 1.0 / std::sqrt(static_cast<double>(k.head_dim));
  detail::RowMatrix keys, queries, logits;
  detail::load_rows(k, kh, 0, last, &keys);  // only keys before `last` are ever visible
  std::vector<double> row;
  for (std::int64_t i0 = first; i0 < last; i0 += kTile) {
    const std::int64_t rows = std::min(kTile, last - i0), visible = i0 + rows;
    detail::load_rows(q, qh, i0, rows, &queries);
    logits.noalias() = queries * keys.topRows(visible).transpose();
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t i = i0 + r;  // sees keys 0..i
      row.resize(static_cast<std::size_t>(i + 1));
      double top = -INFINITY;
      for (std::int64_t j = 0; j <= i; ++j) top = std::max(top, row[static_cast<std::size_t>(j)] = logits(r, j) * scale);
      double sum = 0;
      for (std::int64_t j = 0; j <= i; ++j) sum += (row[static_cast<std::size_t>(j)] = std::exp(row[static_cast<std::size_t>(j)] - top));
      for (std::int64_t j = 0; j <= i; ++j) column_sums[j] += row[static_cast<std::size_t>(j)] / sum;
    }
  }
}

}  // namespace flashcache::policies
