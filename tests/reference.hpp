#pragma once
// Independent references for the tests: the textbook O(N^2) orthonormal DCT in
// double precision and a direct per-token score, written from the definitions
// in docs/ALGORITHM.md without any of the library's transforms.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace flashcache::testing {

// X[k] = a_k sum_n x[n] cos(pi (2n+1) k / (2N)).
inline std::vector<double> naive_dct2(const std::vector<double>& x) {
  const auto n = static_cast<std::int64_t>(x.size());
  std::vector<double> out(x.size(), 0.0);
  for (std::int64_t k = 0; k < n; ++k) {
    const double a = std::sqrt((k == 0 ? 1.0 : 2.0) / static_cast<double>(n));
    long double s = 0;
    for (std::int64_t j = 0; j < n; ++j) s += x[j] * std::cos(M_PI * static_cast<double>((2 * j + 1) * k) / (2.0 * n));
    out[k] = a * static_cast<double>(s);
  }
  return out;
}

// x[n] = sum_k a_k X[k] cos(pi (2n+1) k / (2N)).
inline std::vector<double> naive_dct3(const std::vector<double>& c) {
  const auto n = static_cast<std::int64_t>(c.size());
  std::vector<double> out(c.size(), 0.0);
  for (std::int64_t j = 0; j < n; ++j) {
    long double s = 0;
    for (std::int64_t k = 0; k < n; ++k)
      s += std::sqrt((k == 0 ? 1.0 : 2.0) / static_cast<double>(n)) * c[k] *
           std::cos(M_PI * static_cast<double>((2 * j + 1) * k) / (2.0 * n));
    out[j] = static_cast<double>(s);
  }
  return out;
}

inline std::vector<double> naive_lowpass(const std::vector<double>& x, std::int64_t m) {
  std::vector<double> c = naive_dct2(x);
  for (std::size_t k = static_cast<std::size_t>(m); k < c.size(); ++k) c[k] = 0;
  return naive_dct3(c);
}

// Direct score of one head, K and V as [tokens][d] row-major doubles; the
// blocked variant lowpasses each block of `block` tokens on its own.
struct NaiveHead {
  std::vector<double> score;
  double k_total = 0, k_high = 0, v_total = 0, v_high = 0;
};

inline NaiveHead naive_score(const std::vector<double>& k, const std::vector<double>& v, std::int64_t n, std::int64_t d,
                             double gamma, std::int64_t block /* 0 = global */) {
  NaiveHead out;
  out.score.assign(static_cast<std::size_t>(n), 0.0);
  const std::int64_t step = block > 0 ? block : n;
  for (std::int64_t b0 = 0; b0 < n; b0 += step) {
    const std::int64_t len = std::min(step, n - b0);
    const auto m = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(gamma * len - 1e-9)));
    for (std::int64_t c = 0; c < d; ++c) {
      for (int which = 0; which < 2; ++which) {
        const std::vector<double>& src = which == 0 ? k : v;
        std::vector<double> col(static_cast<std::size_t>(len));
        for (std::int64_t t = 0; t < len; ++t) col[t] = src[(b0 + t) * d + c];
        const std::vector<double> base = naive_lowpass(col, std::min(m, len));
        for (std::int64_t t = 0; t < len; ++t) {
          const double r = col[t] - base[t];
          out.score[b0 + t] += r * r / static_cast<double>(d);
          (which == 0 ? out.k_high : out.v_high) += r * r;
          (which == 0 ? out.k_total : out.v_total) += col[t] * col[t];
        }
      }
    }
  }
  return out;
}

// 2D low-pass of a rows x cols grid (row-major): the 1D DCT down every column
// and along every row, coefficients (u, v) outside `keep(u, v)` zeroed, then
// the inverse the same way.
template <class Keep>
std::vector<double> naive_lowpass_2d(const std::vector<double>& x, std::int64_t rows, std::int64_t cols, Keep keep) {
  auto along = [&](std::vector<double> g, bool inverse) {
    for (std::int64_t c = 0; c < cols; ++c) {  // down the columns
      std::vector<double> col(static_cast<std::size_t>(rows));
      for (std::int64_t r = 0; r < rows; ++r) col[r] = g[r * cols + c];
      col = inverse ? naive_dct3(col) : naive_dct2(col);
      for (std::int64_t r = 0; r < rows; ++r) g[r * cols + c] = col[r];
    }
    for (std::int64_t r = 0; r < rows; ++r) {  // along the rows
      std::vector<double> row(g.begin() + r * cols, g.begin() + (r + 1) * cols);
      row = inverse ? naive_dct3(row) : naive_dct2(row);
      std::copy(row.begin(), row.end(), g.begin() + r * cols);
    }
    return g;
  };
  std::vector<double> c = along(x, false);
  for (std::int64_t u = 0; u < rows; ++u)
    for (std::int64_t v = 0; v < cols; ++v)
      if (!keep(u, v)) c[u * cols + v] = 0;
  return along(c, true);
}

// KeyDiff's distance (ScoreOptions::mean_distance = key_cosine) of every row of
// one head's keys k, [n][d] row-major floats: 1 - cos(key, a), a the mean of the
// unit keys of the rows in_anchor marks; a zero key adds nothing to a and has
// cosine 0, as does every key against a zero a; 0 below 8 float epsilons.
inline std::vector<double> naive_key_cosine(const float* k, std::int64_t n, std::int64_t d,
                                            const std::vector<bool>& in_anchor) {
  const auto norm = [&](std::int64_t t) {
    double sq = 0;
    for (std::int64_t c = 0; c < d; ++c) sq += static_cast<double>(k[t * d + c]) * k[t * d + c];
    return std::sqrt(sq);
  };
  std::vector<double> anchor(static_cast<std::size_t>(d), 0.0), dist(static_cast<std::size_t>(n));
  std::int64_t counted = 0;
  for (std::int64_t t = 0; t < n; ++t) {
    if (!in_anchor[static_cast<std::size_t>(t)]) continue;
    ++counted;
    for (std::int64_t c = 0; c < d && norm(t) > 0; ++c) anchor[static_cast<std::size_t>(c)] += k[t * d + c] / norm(t);
  }
  double anchor_norm = 0;
  for (double& a : anchor) {
    a /= static_cast<double>(counted);
    anchor_norm += a * a;
  }
  anchor_norm = std::sqrt(anchor_norm);
  for (std::int64_t t = 0; t < n; ++t) {
    double dot = 0;
    for (std::int64_t c = 0; c < d; ++c) dot += static_cast<double>(k[t * d + c]) * anchor[static_cast<std::size_t>(c)];
    const double cosine = norm(t) > 0 && anchor_norm > 0 ? dot / (norm(t) * anchor_norm) : 0.0;
    const double distance = 1.0 - cosine;
    dist[static_cast<std::size_t>(t)] = distance < 8.0 * std::numeric_limits<float>::epsilon() ? 0.0 : distance;
  }
  return dist;
}

inline std::vector<double> random_normal(std::size_t n, std::mt19937_64& rng, double scale = 1.0) {
  std::normal_distribution<double> dist(0.0, scale);
  std::vector<double> x(n);
  for (auto& e : x) e = dist(rng);
  return x;
}

}  // namespace flashcache::testing
