#pragma once
// The quality evaluation's measure: how much a compressed KV cache changes the
// attention output of queries the compression policy did not see.
//
// One layer, head-major float arrays: q [Hq][N][d], k and v [H][N][d] (query
// head j uses KV head j / (Hq / H), as in grouped-query attention). Tokens
// [0, prompt) are the compressed part: KV head h keeps only kept[h][0..budget).
// Tokens [prompt, N) are never compressed (for an LLM: the held-out
// continuation, decoded after compression).
//
// For every query head and every query i in [query_begin, query_end):
//   full:        o_i  = softmax(q_i . k_j * scale) v_j over the keys j visible to i
//   compressed:  o'_i = the same over the visible keys that are kept
// where "visible" is j <= i when causal, every j < N otherwise. The layer's
// error is the relative Frobenius norm over all those (head, query) rows:
//   sqrt(sum ||o'_i - o_i||^2 / sum ||o_i||^2).
// Everything is computed in double.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace flashcache::quality {

struct AttentionSetup {
  std::int64_t q_heads = 0, kv_heads = 0, tokens = 0, head_dim = 0;
  std::int64_t prompt = 0;                      // tokens [0, prompt) are compressed
  std::int64_t query_begin = 0, query_end = 0;  // the held-out queries
  bool causal = true;
  double scale = 0;  // softmax scale, usually 1/sqrt(head_dim)
};

struct ErrorSums {
  double diff_sq = 0;  // sum over rows of ||o' - o||^2
  double ref_sq = 0;   // sum over rows of ||o||^2
  std::int64_t rows = 0;
  double relative() const { return ref_sq > 0 ? std::sqrt(diff_sq / ref_sq) : 0.0; }
};

namespace detail {

// out = softmax(q . k_j * scale) v_j over the keys listed in `keys`.
inline void attend(const float* q, const float* k, const float* v, std::int64_t d, double scale,
                   const std::vector<std::int64_t>& keys, std::vector<double>* logits, std::vector<double>* out) {
  logits->resize(keys.size());
  double top = -INFINITY;
  for (std::size_t a = 0; a < keys.size(); ++a) {
    const float* kj = k + keys[a] * d;
    double dot = 0;
    for (std::int64_t c = 0; c < d; ++c) dot += static_cast<double>(q[c]) * kj[c];
    (*logits)[a] = dot * scale;
    top = std::max(top, (*logits)[a]);
  }
  double sum = 0;
  for (auto& x : *logits) sum += (x = std::exp(x - top));
  out->assign(static_cast<std::size_t>(d), 0.0);
  for (std::size_t a = 0; a < keys.size(); ++a) {
    const double p = (*logits)[a] / sum;
    const float* vj = v + keys[a] * d;
    for (std::int64_t c = 0; c < d; ++c) (*out)[static_cast<std::size_t>(c)] += p * vj[c];
  }
}

}  // namespace detail

inline void check_setup(const AttentionSetup& s, std::int64_t budget) {
  auto fail = [](const std::string& m) { throw std::invalid_argument("attention_error: " + m); };
  if (s.q_heads < 1 || s.kv_heads < 1 || s.q_heads % s.kv_heads != 0)
    fail("query heads must be a multiple of KV heads");
  if (s.tokens < 1 || s.head_dim < 1) fail("empty cache");
  if (s.prompt < 0 || s.prompt > s.tokens) fail("prompt outside [0, tokens]");
  if (s.query_begin < 0 || s.query_end > s.tokens || s.query_begin > s.query_end) fail("bad query range");
  if (s.causal && s.query_begin < s.prompt) fail("causal queries must come after the compressed prompt");
  if (budget < 0 || budget > s.prompt) fail("budget outside [0, prompt]");
}

// kept: [kv_heads][budget] token indices in [0, prompt) (any order, no repeats).
inline ErrorSums attention_error(const float* q, const float* k, const float* v, const AttentionSetup& s,
                                 const std::int32_t* kept, std::int64_t budget) {
  check_setup(s, budget);
  const std::int64_t n = s.tokens, d = s.head_dim, group = s.q_heads / s.kv_heads;
  ErrorSums sums;
  std::vector<std::int64_t> full, small;
  std::vector<double> logits, o, o_small;
  for (std::int64_t qh = 0; qh < s.q_heads; ++qh) {
    const std::int64_t h = qh / group;
    const float* kh = k + h * n * d;
    const float* vh = v + h * n * d;
    for (std::int64_t i = s.query_begin; i < s.query_end; ++i) {
      const std::int64_t last = s.causal ? i + 1 : n;  // keys [0, last) are visible
      full.clear();
      small.clear();
      for (std::int64_t j = 0; j < last; ++j) full.push_back(j);
      for (std::int64_t b = 0; b < budget; ++b) {
        const std::int64_t j = kept[h * budget + b];
        if (j < 0 || j >= s.prompt) throw std::invalid_argument("attention_error: kept index outside the prompt");
        if (j < last) small.push_back(j);
      }
      for (std::int64_t j = s.prompt; j < last; ++j) small.push_back(j);
      const float* qi = q + (qh * n + i) * d;
      detail::attend(qi, kh, vh, d, s.scale, full, &logits, &o);
      if (small.empty()) {
        o_small.assign(static_cast<std::size_t>(d), 0.0);  // nothing to attend to: a zero output
      } else {
        detail::attend(qi, kh, vh, d, s.scale, small, &logits, &o_small);
      }
      for (std::int64_t c = 0; c < d; ++c) {
        const double diff = o_small[static_cast<std::size_t>(c)] - o[static_cast<std::size_t>(c)];
        sums.diff_sq += diff * diff;
        sums.ref_sq += o[static_cast<std::size_t>(c)] * o[static_cast<std::size_t>(c)];
      }
      ++sums.rows;
    }
  }
  return sums;
}

}  // namespace flashcache::quality
