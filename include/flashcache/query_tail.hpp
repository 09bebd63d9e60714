#pragma once
// What the prompt's queries say about each key: its tail, gathered during prefill (CPU).
//
// The model reads a key only through its queries, and one query that needs a key
// badly is what must keep it: an average over thousands of queries dilutes that one
// (docs/ALGORITHM.md, "The tail"). The tail of key j in KV head h is
//
//   tail[h][j] = max over the query heads g that read h and the fed query positions
//                i >= j + min_distance of exp(q_gi . k_hj * scale - lse_gi),
//   lse_gi     = log sum over j' <= i of exp(q_gi . k_hj' * scale),
//
// the largest causal attention probability any fed query gives the key (scale is
// 1/sqrt(d) unless set; lse is what FlashAttention returns per query, or computed here).
//
// An engine feeds its prompt in chunks, as it prefills: add() takes the queries of
// positions [first, first + chunk) with the keys of positions [0, first + chunk) and
// raises the tails it sees; tails of keys no query has seen yet stay as they were
// (zero when the caller starts from zeros). Chunks merge by the maximum, in any
// order: merge_tails() does it for two accumulations of the same layer (chunks
// scored apart, or tensor-parallel ranks holding the same heads). Chunked and
// one-pass tails agree to float rounding (the products are tiled differently);
// the same chunks give the same bits.
//
// Cheaper forms: QueryTailOptions::stride feeds every stride-th query position only,
// from_position only the later ones (last_queries(N): the prompt's last 256, the
// chosen form); an engine may also pass only the queries it wants fed.
//
// The tails live in caller memory (TailView); the accumulator keeps its buffers
// between calls and allocates nothing once it has seen the layer's shape.
// A non-finite query adds nothing; a non-finite key gets probability 0 and
// changes no other key's (the scorer keeps non-finite keys in any case). Keys
// within min_distance of the last fed query get no tail: the recent window
// (SelectOptions::window_share) is what keeps them.
#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "error.hpp"
#include "types.hpp"
#include "view.hpp"

namespace flashcache {

// Per-key tails of one layer in caller memory: data[h * tokens + j].
template <class T>
struct TailView {
  T* data = nullptr;
  std::int64_t heads = 0;
  std::int64_t tokens = 0;

  T& operator()(std::int64_t h, std::int64_t j) const { return data[h * tokens + j]; }
  bool empty() const { return heads == 0 || tokens == 0; }
  // A view of float converts to a view of const float, never the other way.
  template <class U = T, class = std::enable_if_t<!std::is_const_v<U>>>
  operator TailView<const U>() const {  // NOLINT(google-explicit-constructor)
    return {data, heads, tokens};
  }
};

// The query study's choice on dev data (bench/quality/study/QUERY_RULE.md,
// bench/RESULTS.md): the prompt's last 256 queries, each counting for keys at
// least 32 tokens before it.
inline constexpr std::int64_t kTailLastQueries = 256;
inline constexpr std::int64_t kTailMinDistance = 32;

struct QueryTailOptions {
  // Feed only query positions i with i % stride == 0 (1: every query).
  std::int64_t stride = 1;
  // Feed only query positions i >= from_position (0: all; last_queries() below
  // sets it for the chosen form, the prompt's last kTailLastQueries).
  std::int64_t from_position = 0;
  // Count only queries at least this far after the key (i - j >= min_distance).
  // Many heads give the previous few tokens most of their attention, so every
  // key's nearest queries raise its tail; the queries that will read a kept key
  // after compression are far from it. 0 gives the exact tail of the definition.
  std::int64_t min_distance = kTailMinDistance;
  // Logit scale; 0 means 1/sqrt(head_dim).
  double scale = 0.0;
};

// The chosen feed for a prompt of `prompt_tokens`: its last `count` queries.
inline QueryTailOptions last_queries(std::int64_t prompt_tokens, std::int64_t count = kTailLastQueries) {
  QueryTailOptions o;
  o.from_position = prompt_tokens > count ? prompt_tokens - count : 0;
  return o;
}

inline Status check_tail_options(const QueryTailOptions& o) {
  if (o.stride < 1) return make_error(Errc::invalid_option, "tail stride ", o.stride, " must be at least 1");
  if (o.from_position < 0)
    return make_error(Errc::invalid_option, "tail from_position ", o.from_position, " is negative");
  if (o.min_distance < 0) return make_error(Errc::invalid_option, "tail min_distance ", o.min_distance, " is negative");
  if (!(o.scale >= 0.0 && std::isfinite(o.scale)))
    return make_error(Errc::invalid_option, "tail scale ", o.scale, " must be finite and >= 0 (0: 1/sqrt(d))");
  return Status::success();
}

// A tail view for k: one row of k.tokens tails per KV head.
template <class T>
Status check_tails(TailView<T> tails, std::int64_t heads, std::int64_t tokens, const char* who) {
  if (tails.heads != heads || tails.tokens < tokens || (heads * tokens > 0 && tails.data == nullptr))
    return make_error(Errc::invalid_shape, who, ": tails are ", tails.heads, "x", tails.tokens,
                      tails.data == nullptr ? " (null)" : "", " but the keys need ", heads, "x", tokens,
                      " (KV heads x tokens)");
  return Status::success();
}

// One chunk of queries, positions [first, first + q.tokens), against its keys and
// tails: what TailAccumulator::add and the GPU's query_tails_async both check
// (`who` opens the messages). An empty chunk passes.
template <class TQ, class TK>
Status check_tail_chunk(KVView<const TQ> q, std::int64_t first, KVView<const TK> k, TailView<float> tails,
                        const char* who) {
  FLASHCACHE_RETURN_IF_ERROR(check_view(q, "Q"));
  FLASHCACHE_RETURN_IF_ERROR(check_view(k, "K"));
  if (first < 0) return make_error(Errc::invalid_shape, who, ": first position ", first, " is negative");
  if (q.empty()) return Status::success();
  const std::int64_t end = first + q.tokens;
  if (k.heads == 0 || q.heads % k.heads != 0)
    return make_error(Errc::invalid_shape, who, ": ", q.heads, " query heads are not a multiple of ", k.heads,
                      " KV heads");
  if (k.head_dim != q.head_dim)
    return make_error(Errc::invalid_shape, who, ": Q head_dim ", q.head_dim, " but K head_dim ", k.head_dim);
  if (k.tokens < end)
    return make_error(Errc::invalid_shape, who, ": queries reach position ", end - 1, " but K holds ", k.tokens,
                      " tokens (a query sees the keys up to its own position)");
  return check_tails(tails, k.heads, end, who);
}

// into[h][j] = max(into[h][j], from[h][j]): two accumulations of the same layer.
inline Status merge_tails(TailView<const float> from, TailView<float> into) {
  if (from.heads != into.heads || from.tokens != into.tokens || (!from.empty() && (!from.data || !into.data)))
    return make_error(Errc::invalid_shape, "merge_tails: ", from.heads, "x", from.tokens, " into ", into.heads, "x",
                      into.tokens);
  for (std::int64_t i = 0; i < from.heads * from.tokens; ++i)
    into.data[i] = from.data[i] > into.data[i] ? from.data[i] : into.data[i];
  return Status::success();
}

class TailAccumulator {
 public:
  // Query rows multiplied together, and keys per product: Eigen keeps the
  // product's packed blocks on the stack at these sizes (no heap, head dim <= 256).
  static constexpr std::int64_t kQueryTile = 64;
  static constexpr std::int64_t kKeyTile = 128;

  // Raises tails from the queries q [Hq][chunk][d] of positions [first, first + chunk).
  // k: the layer's keys [Hkv][>= first + chunk][d] (query head g reads KV head g / (Hq / Hkv));
  // lse: null, or the queries' log-sum-exp [Hq][chunk] (row g * chunk + r), natural log
  // of the scaled logits over keys 0..first + r, as FlashAttention returns it. Queries and
  // keys may differ in element type (recall reads f16 queries against keys gathered as floats):
  // both become floats tile by tile.
  template <class TQ, class TK>
  Status add(KVView<const TQ> q, std::int64_t first, KVView<const TK> k, const float* lse, TailView<float> tails,
             const QueryTailOptions& opt = {}) {
    FLASHCACHE_RETURN_IF_ERROR(check_tail_options(opt));
    FLASHCACHE_RETURN_IF_ERROR(check_tail_chunk(q, first, k, tails, "tail"));
    if (q.empty()) return Status::success();
    const std::int64_t end = first + q.tokens, d = q.head_dim;
    if (lse != nullptr)  // the fed rows' only: a row left out may hold anything
      for (std::int64_t i = 0; i < q.heads * q.tokens; ++i)
        if (fed(first + i % q.tokens, opt) && !std::isfinite(lse[i]))
          return make_error(Errc::invalid_shape, "tail: lse of query head ", i / q.tokens, ", row ", i % q.tokens,
                            " is ", lse[i], " (must be finite)");
    const float scale = static_cast<float>(opt.scale > 0 ? opt.scale : 1.0 / std::sqrt(static_cast<double>(d)));
    const std::int64_t group = q.heads / k.heads;
    std::int64_t sampled = 0;  // fed rows of the chunk
    for (std::int64_t r = 0; r < q.tokens; ++r) sampled += fed(first + r, opt);
    if (sampled == 0) return Status::success();

    grow(&queries_, kQueryTile * d);
    grow(&logits_, kQueryTile * end);
    grow(&exp_, end);
    grow(&rows_, kQueryTile);
    for (std::int64_t h = 0; h < k.heads; ++h) {
      const float* keys = head_keys(k, h, end);
      for (std::int64_t g = h * group; g < (h + 1) * group; ++g) {
        std::int64_t r = 0;
        while (r < q.tokens) {
          std::int64_t count = 0;  // the next tile of fed rows
          for (; r < q.tokens && count < kQueryTile; ++r)
            if (fed(first + r, opt)) {
              rows_[static_cast<std::size_t>(count)] = r;
              row_to_float(q.row(g, r), d, queries_.data() + count * d);
              ++count;
            }
          if (count > 0)
            add_tile(keys, count, first, d, scale, opt.min_distance, lse ? lse + g * q.tokens : nullptr,
                     tails.data + h * tails.tokens);
        }
      }
    }
    return Status::success();
  }

 private:
  using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Map = Eigen::Map<Matrix>;
  using ConstMap = Eigen::Map<const Matrix>;

  static bool fed(std::int64_t position, const QueryTailOptions& opt) {
    return position >= opt.from_position && position % opt.stride == 0;
  }
  template <class V>
  static void grow(std::vector<V>* buf, std::int64_t n) {
    if (static_cast<std::int64_t>(buf->size()) < n) buf->resize(static_cast<std::size_t>(n));
  }

  // KV head h's keys 0..end as float rows [end][d]: read where they are when they
  // already are such rows, else copied into keys_.
  template <class T>
  const float* head_keys(KVView<const T> k, std::int64_t h, std::int64_t end) {
    const std::int64_t d = k.head_dim;
    if constexpr (std::is_same_v<std::remove_const_t<T>, float>) {
      if (k.token_stride == d) return k.row(h, 0);
    }
    grow(&keys_, end * d);
    for (std::int64_t t = 0; t < end; ++t) row_to_float(k.row(h, t), d, keys_.data() + t * d);
    return keys_.data();
  }

  // `count` fed rows (rows_, their queries in queries_) of one query head: their
  // scaled logits against the keys they see, their lse, then the tails.
  void add_tile(const float* keys_of_head, std::int64_t count, std::int64_t first, std::int64_t d, float scale,
                std::int64_t min_distance, const float* lse, float* tail) {
    const std::int64_t visible = first + rows_[static_cast<std::size_t>(count - 1)] + 1;  // the last row sees most
    const ConstMap queries(queries_.data(), count, d);
    Map logits(logits_.data(), count, visible);
    for (std::int64_t j0 = 0; j0 < visible; j0 += kKeyTile) {
      const std::int64_t width = std::min(kKeyTile, visible - j0);
      const ConstMap keys(keys_of_head + j0 * d, width, d);
      logits.middleCols(j0, width).noalias() = queries * keys.transpose();
    }
    // Per row: scale, lse, then the tails, as whole-row array expressions (SIMD exponentials).
    for (std::int64_t i = 0; i < count; ++i) {
      const std::int64_t r = rows_[static_cast<std::size_t>(i)], seen = first + r + 1;
      Eigen::Map<Eigen::ArrayXf> row(logits_.data() + i * visible, seen);
      if (!queries.row(i).array().isFinite().all()) continue;  // a non-finite query adds nothing
      // A non-finite key's logit counts as -inf: it adds nothing to the lse and cannot erase the row.
      row *= scale;
      row = row.isFinite().select(row, -INFINITY);
      double log_sum;
      if (lse != nullptr) {
        log_sum = lse[r];
      } else {
        const float top = row.maxCoeff();
        if (!(top > -INFINITY)) continue;  // every key it sees is non-finite
        Eigen::Map<Eigen::ArrayXf> terms(exp_.data(), seen);
        terms = (row - top).exp();
        double sum = 0;  // float terms, a double sum
        for (std::int64_t j = 0; j < seen; ++j) sum += static_cast<double>(terms[j]);
        log_sum = static_cast<double>(top) + std::log(sum);
      }
      const std::int64_t reach = seen - min_distance;  // keys at least min_distance back
      if (reach <= 0) continue;
      const float shift = static_cast<float>(log_sum);
      Eigen::Map<Eigen::ArrayXf> t(tail, reach);
      t = t.max((row.head(reach) - shift).exp().min(1.0f));  // a given lse may round below the max logit
    }
  }

  std::vector<float> keys_;     // one KV head's keys [end][d], when they are not read in place
  std::vector<float> queries_;  // a tile of fed query rows [kQueryTile][d]
  std::vector<float> logits_;   // their logits [kQueryTile][visible]
  std::vector<float> exp_;      // one row's exponentials [visible]
  std::vector<std::int64_t> rows_;
};

}  // namespace flashcache
