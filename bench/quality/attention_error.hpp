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
//
// Two ways to compute it, checked against each other and a dense reference in
// test_quality.cpp:
//   attention_error(): directly, query by query (any setup; quality_eval);
//   LayerAttention:    the non-causal case with every token compressed and every
//     token a query (grid_eval's ViT protocol), for many kept sets of one layer:
//     the N x N softmax numerators are computed once, each kept set then costs
//     one gather and one GEMM per query head.
#include <Eigen/Core>

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

// One layer's exact attention, kept for every kept set: per query head the
// softmax numerators E(i, j) = exp(s_ij - max_j s_ij) of all N x N logits
// (s = q . k * scale, in double), and the full outputs. A kept set's output
// is then E(:, kept) V(kept) / rowsum(E(:, kept)): one gather and one GEMM
// (a ones column of V gives the row sums). When every kept key of a row lies
// so far below the row's best that its numerators vanish, that row is
// recomputed from the logits.
//
// The setup must be non-causal with prompt = tokens and the queries [0, tokens).
class LayerAttention {
 public:
  using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic>;  // column-major

  LayerAttention(const float* q, const float* k, const float* v, const AttentionSetup& s)
      : n_(s.tokens), d_(s.head_dim), group_(0), prompt_(s.prompt), scale_(s.scale) {
    check_setup(s, 0);
    if (s.causal || s.prompt != s.tokens || s.query_begin != 0 || s.query_end != s.tokens)
      throw std::invalid_argument(
          "LayerAttention: needs a non-causal setup with every token compressed and every token a query");
    group_ = s.q_heads / s.kv_heads;
    const auto to_mat = [&](const float* x) {
      Mat m(n_, d_);
      for (std::int64_t t = 0; t < n_; ++t)
        for (std::int64_t c = 0; c < d_; ++c) m(t, c) = x[t * d_ + c];
      return m;
    };
    for (std::int64_t h = 0; h < s.kv_heads; ++h) {
      k_.push_back(to_mat(k + h * n_ * d_));
      Mat v1(n_, d_ + 1);
      v1.leftCols(d_) = to_mat(v + h * n_ * d_);
      v1.col(d_).setOnes();
      v1_.push_back(std::move(v1));
    }
    for (std::int64_t qh = 0; qh < s.q_heads; ++qh) {
      q_.push_back(to_mat(q + qh * n_ * d_));
      const std::int64_t h = qh / group_;
      Mat sc = (q_.back() * k_[static_cast<std::size_t>(h)].transpose()) * scale_;
      const Eigen::VectorXd top = sc.rowwise().maxCoeff();
      sc.colwise() -= top;
      Mat numer = sc.array().exp().matrix();
      Mat r = numer * v1_[static_cast<std::size_t>(h)];
      Mat o = r.leftCols(d_).array().colwise() / r.col(d_).array();
      ref_sq_ += o.squaredNorm();
      numer_.push_back(std::move(numer));
      out_.push_back(std::move(o));
    }
  }

  // The relative error with KV head h keeping kept[h * budget .. (h + 1) * budget),
  // as attention_error(...).relative() defines it.
  double relative_error(const std::int32_t* kept, std::int64_t budget) {
    if (budget < 0 || budget > prompt_) throw std::invalid_argument("attention_error: budget outside [0, prompt]");
    const std::int64_t kv_heads = static_cast<std::int64_t>(k_.size());
    for (std::int64_t a = 0; a < kv_heads * budget; ++a)
      if (kept[a] < 0 || kept[a] >= prompt_)
        throw std::invalid_argument("attention_error: kept index outside the prompt");
    double diff_sq = 0;
    for (std::size_t qh = 0; qh < numer_.size(); ++qh) {
      const std::int64_t h = static_cast<std::int64_t>(qh) / group_;
      const Mat& o = out_[qh];
      if (budget == 0) {  // nothing to attend to: a zero output
        diff_sq += o.squaredNorm();
        continue;
      }
      const std::int32_t* idx = kept + h * budget;
      ek_.resize(n_, budget);
      vk_.resize(budget, d_ + 1);
      for (std::int64_t a = 0; a < budget; ++a) {
        ek_.col(a) = numer_[qh].col(idx[a]);
        vk_.row(a) = v1_[static_cast<std::size_t>(h)].row(idx[a]);
      }
      r_.noalias() = ek_ * vk_;
      for (std::int64_t i = 0; i < n_; ++i) {
        const double denom = r_(i, d_);
        if (denom > 1e-250) {
          for (std::int64_t c = 0; c < d_; ++c) {
            const double x = r_(i, c) / denom - o(i, c);
            diff_sq += x * x;
          }
        } else {  // every kept key far below the row's best: recompute from the logits
          diff_sq += direct_row_error(qh, h, i, idx, budget);
        }
      }
    }
    return ref_sq_ > 0 ? std::sqrt(diff_sq / ref_sq_) : 0.0;
  }
  double relative_error(const std::vector<std::int32_t>& kept, std::int64_t budget) {
    return relative_error(kept.data(), budget);
  }

 private:
  double direct_row_error(std::size_t qh, std::int64_t h, std::int64_t i, const std::int32_t* idx,
                          std::int64_t budget) const {
    std::vector<double> logit(static_cast<std::size_t>(budget));
    double top = -INFINITY;
    for (std::int64_t a = 0; a < budget; ++a) {
      logit[static_cast<std::size_t>(a)] = q_[qh].row(i).dot(k_[static_cast<std::size_t>(h)].row(idx[a])) * scale_;
      top = std::max(top, logit[static_cast<std::size_t>(a)]);
    }
    double sum = 0;
    for (double& x : logit) sum += (x = std::exp(x - top));
    Eigen::RowVectorXd acc = Eigen::RowVectorXd::Zero(d_);
    for (std::int64_t a = 0; a < budget; ++a)
      acc += (logit[static_cast<std::size_t>(a)] / sum) * v1_[static_cast<std::size_t>(h)].row(idx[a]).head(d_);
    return (acc - out_[qh].row(i)).squaredNorm();
  }

  std::int64_t n_, d_, group_, prompt_;
  double scale_ = 0, ref_sq_ = 0;
  std::vector<Mat> q_, k_, v1_, numer_, out_;
  Mat ek_, vk_, r_;
};

}  // namespace flashcache::quality
