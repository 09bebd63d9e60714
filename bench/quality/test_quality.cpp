// The quality evaluations' measures on tiny inputs: the attention error, both
// ways attention_error.hpp computes it (attention_error() for quality_eval,
// LayerAttention's GEMMs for grid_eval), against a direct dense reference
// (masked score matrix, explicit compressed K' and V') and each other; and the
// energy controls.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <utility>
#include <vector>

#include "attention_error.hpp"
#include "energy.hpp"

namespace fq = flashcache::quality;

namespace {

std::vector<float> random_vec(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& e : x) e = nd(rng);
  return x;
}

// softmax(q K^T * scale) V for one query against explicit rows (rows[j] visible when mask[j]).
std::vector<double> dense_attention(const float* q, const std::vector<std::vector<double>>& keys,
                                    const std::vector<std::vector<double>>& values, const std::vector<bool>& mask,
                                    double scale) {
  const std::size_t d = values.empty() ? 0 : values[0].size();
  std::vector<double> logit(keys.size(), -INFINITY);
  double top = -INFINITY;
  for (std::size_t j = 0; j < keys.size(); ++j) {
    if (!mask[j]) continue;
    double dot = 0;
    for (std::size_t c = 0; c < d; ++c) dot += q[c] * keys[j][c];
    logit[j] = dot * scale;
    top = std::max(top, logit[j]);
  }
  double sum = 0;
  for (std::size_t j = 0; j < keys.size(); ++j) sum += mask[j] ? std::exp(logit[j] - top) : 0.0;
  std::vector<double> out(d, 0.0);
  for (std::size_t j = 0; j < keys.size(); ++j)
    if (mask[j])
      for (std::size_t c = 0; c < d; ++c) out[c] += std::exp(logit[j] - top) / sum * values[j][c];
  return out;
}

// The reference: for each KV head, the full cache and an explicit compressed
// cache (kept prompt rows, then every token from `prompt` on), each with its
// own visibility mask per query.
double reference_error(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                       const fq::AttentionSetup& s, const std::vector<std::int32_t>& kept, std::int64_t budget) {
  const std::int64_t n = s.tokens, d = s.head_dim, group = s.q_heads / s.kv_heads;
  auto row = [&](const std::vector<float>& x, std::int64_t h, std::int64_t t) {
    return std::vector<double>(x.begin() + (h * n + t) * d, x.begin() + (h * n + t + 1) * d);
  };
  double diff = 0, ref = 0;
  for (std::int64_t qh = 0; qh < s.q_heads; ++qh) {
    const std::int64_t h = qh / group;
    std::vector<std::vector<double>> kf, vf, kc, vc;
    std::vector<std::int64_t> pos_c;  // original position of each compressed row
    for (std::int64_t t = 0; t < n; ++t) kf.push_back(row(k, h, t)), vf.push_back(row(v, h, t));
    for (std::int64_t b = 0; b < budget; ++b) {
      const std::int64_t t = kept[static_cast<std::size_t>(h * budget + b)];
      kc.push_back(row(k, h, t)), vc.push_back(row(v, h, t)), pos_c.push_back(t);
    }
    for (std::int64_t t = s.prompt; t < n; ++t)
      kc.push_back(row(k, h, t)), vc.push_back(row(v, h, t)), pos_c.push_back(t);
    for (std::int64_t i = s.query_begin; i < s.query_end; ++i) {
      std::vector<bool> mf(static_cast<std::size_t>(n)), mc(pos_c.size());
      for (std::int64_t j = 0; j < n; ++j) mf[static_cast<std::size_t>(j)] = !s.causal || j <= i;
      for (std::size_t j = 0; j < pos_c.size(); ++j) mc[j] = !s.causal || pos_c[j] <= i;
      const float* qi = q.data() + (qh * n + i) * d;
      const auto of = dense_attention(qi, kf, vf, mf, s.scale);
      const auto oc = dense_attention(qi, kc, vc, mc, s.scale);
      for (std::int64_t c = 0; c < d; ++c) {
        diff += (oc[static_cast<std::size_t>(c)] - of[static_cast<std::size_t>(c)]) *
                (oc[static_cast<std::size_t>(c)] - of[static_cast<std::size_t>(c)]);
        ref += of[static_cast<std::size_t>(c)] * of[static_cast<std::size_t>(c)];
      }
    }
  }
  return std::sqrt(diff / ref);
}

struct Tiny {
  fq::AttentionSetup s;
  std::vector<float> q, k, v;
  Tiny(std::int64_t hq, std::int64_t h, std::int64_t n, std::int64_t d, std::int64_t prompt, bool causal) {
    s.q_heads = hq;
    s.kv_heads = h;
    s.tokens = n;
    s.head_dim = d;
    s.prompt = prompt;
    s.query_begin = causal ? prompt : 0;
    s.query_end = n;
    s.causal = causal;
    s.scale = 1.0 / std::sqrt(static_cast<double>(d));
    q = random_vec(static_cast<std::size_t>(hq * n * d), 1);
    k = random_vec(static_cast<std::size_t>(h * n * d), 2);
    v = random_vec(static_cast<std::size_t>(h * n * d), 3);
  }
  double error(const std::vector<std::int32_t>& kept, std::int64_t budget) const {
    return fq::attention_error(q.data(), k.data(), v.data(), s, kept.data(), budget).relative();
  }
};

TEST(AttentionError, CausalHeldOutQueriesMatchTheDenseReference) {
  // 4 query heads over 2 KV heads (GQA), 6 prompt tokens, 3 held-out queries.
  const Tiny t(4, 2, 9, 5, 6, true);
  const std::vector<std::int32_t> kept = {1, 4, 0, 5};  // head 0 keeps 1, 4; head 1 keeps 0, 5
  const double e = t.error(kept, 2);
  EXPECT_GT(e, 0.01);
  EXPECT_NEAR(e, reference_error(t.q, t.k, t.v, t.s, kept, 2), 1e-12);
  const fq::ErrorSums sums = fq::attention_error(t.q.data(), t.k.data(), t.v.data(), t.s, kept.data(), 2);
  EXPECT_EQ(sums.rows, 4 * 3);
}

TEST(AttentionError, NonCausalAllQueriesMatchTheDenseReference) {
  const Tiny t(3, 3, 11, 4, 11, false);
  const std::vector<std::int32_t> kept = {0, 3, 10, 2, 5, 7, 1, 8, 9};  // 3 per head
  EXPECT_NEAR(t.error(kept, 3), reference_error(t.q, t.k, t.v, t.s, kept, 3), 1e-12);
}

TEST(AttentionError, KeepingEveryPromptTokenIsExact) {
  const Tiny t(2, 1, 8, 4, 5, true);
  EXPECT_EQ(t.error({0, 1, 2, 3, 4}, 5), 0.0);
  const Tiny u(2, 2, 6, 3, 6, false);
  EXPECT_EQ(u.error({0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5}, 6), 0.0);
}

TEST(AttentionError, OneKeptTokenGivesItsValue) {
  // Non-causal, one KV head keeping token 2: every compressed output is v[2].
  const Tiny t(1, 1, 5, 3, 5, false);
  double diff = 0, ref = 0;
  for (std::int64_t i = 0; i < 5; ++i) {
    std::vector<std::vector<double>> ks, vs;
    for (std::int64_t j = 0; j < 5; ++j) {
      ks.emplace_back(t.k.begin() + j * 3, t.k.begin() + j * 3 + 3);
      vs.emplace_back(t.v.begin() + j * 3, t.v.begin() + j * 3 + 3);
    }
    const auto o = dense_attention(t.q.data() + i * 3, ks, vs, std::vector<bool>(5, true), t.s.scale);
    for (int c = 0; c < 3; ++c) {
      diff += (t.v[static_cast<std::size_t>(2 * 3 + c)] - o[static_cast<std::size_t>(c)]) *
              (t.v[static_cast<std::size_t>(2 * 3 + c)] - o[static_cast<std::size_t>(c)]);
      ref += o[static_cast<std::size_t>(c)] * o[static_cast<std::size_t>(c)];
    }
  }
  EXPECT_NEAR(t.error({2}, 1), std::sqrt(diff / ref), 1e-12);
}

TEST(AttentionError, RefusesBadInput) {
  const Tiny t(2, 1, 8, 4, 5, true);
  EXPECT_THROW(t.error({5}, 1), std::invalid_argument);                 // not a prompt token
  EXPECT_THROW(t.error({0, 1, 2, 3, 4, 0}, 6), std::invalid_argument);  // budget > prompt
  fq::AttentionSetup bad = t.s;
  bad.query_begin = 2;  // causal queries inside the compressed prompt
  EXPECT_THROW(fq::attention_error(t.q.data(), t.k.data(), t.v.data(), bad, nullptr, 0), std::invalid_argument);
  bad = t.s;
  bad.q_heads = 3;
  bad.kv_heads = 2;
  EXPECT_THROW(fq::attention_error(t.q.data(), t.k.data(), t.v.data(), bad, nullptr, 0), std::invalid_argument);
}

// LayerAttention (grid_eval's form) on awkward sizes: 7 tokens, head dim 3, 6 query
// heads over 2 KV heads; several kept sets of different budgets through one object
// (its workspaces reused), each against the dense reference and attention_error().
TEST(LayerAttention, MatchesTheDenseReferenceAndTheDirectForm) {
  const Tiny t(6, 2, 7, 3, 7, false);
  fq::LayerAttention att(t.q.data(), t.k.data(), t.v.data(), t.s);
  const std::vector<std::pair<std::vector<std::int32_t>, std::int64_t>> sets = {
      {{3, 0, 6, 2, 5, 1}, 3},           // 3 per head, any order
      {{4, 6}, 1},                       // one token per head
      {{0, 1, 2, 3, 4, 5, 6, 6, 5, 4, 3, 2, 1, 0}, 7},  // every token: exact
      {{1, 2, 3, 5, 0, 4, 6, 2, 3, 1}, 5},
      {{5, 2}, 1},  // a smaller budget after a larger one
  };
  for (const auto& [kept, budget] : sets) {
    const double e = att.relative_error(kept, budget);
    EXPECT_NEAR(e, reference_error(t.q, t.k, t.v, t.s, kept, budget), 1e-12) << "budget " << budget;
    EXPECT_NEAR(e, t.error(kept, budget), 1e-12) << "budget " << budget;
  }
  EXPECT_NEAR(att.relative_error(sets[2].first, 7), 0.0, 1e-12);
  // Nothing kept: a zero output, so the error is exactly 1 both ways.
  EXPECT_NEAR(att.relative_error(std::vector<std::int32_t>{}, 0), 1.0, 1e-15);
  EXPECT_NEAR(t.error({}, 0), 1.0, 1e-15);
}

// Rows whose kept keys all lie far below the row's best key (numerators under
// 1e-250, exp(-900) here) are recomputed from the logits; the other rows go
// through the GEMM. Both agree with the reference, which normalises over the kept keys.
TEST(LayerAttention, RowsFarBelowTheirBestKeyFallBackToTheLogits) {
  Tiny t(1, 1, 4, 1, 4, false);
  t.s.scale = 1.0;
  t.q = {30.0f, 30.0f, 0.1f, -0.1f};  // rows 0, 1: key 0's logit 900, the kept keys' at most 15
  t.k = {30.0f, 0.0f, 0.5f, -0.2f};
  t.v = {1.0f, -2.0f, 3.0f, 0.5f};
  fq::LayerAttention att(t.q.data(), t.k.data(), t.v.data(), t.s);
  const std::vector<std::int32_t> kept = {1, 2};
  const double e = att.relative_error(kept, 2);
  EXPECT_GT(e, 0.1);
  EXPECT_NEAR(e, reference_error(t.q, t.k, t.v, t.s, kept, 2), 1e-12);
  EXPECT_NEAR(e, t.error(kept, 2), 1e-12);
}

TEST(LayerAttention, RefusesOtherSetupsAndBadKeptSets) {
  const Tiny causal(2, 1, 8, 4, 5, true);
  EXPECT_THROW(fq::LayerAttention(causal.q.data(), causal.k.data(), causal.v.data(), causal.s), std::invalid_argument);
  Tiny t(2, 2, 6, 3, 6, false);
  fq::AttentionSetup part = t.s;
  part.query_begin = 1;  // not every token a query
  EXPECT_THROW(fq::LayerAttention(t.q.data(), t.k.data(), t.v.data(), part), std::invalid_argument);
  fq::LayerAttention att(t.q.data(), t.k.data(), t.v.data(), t.s);
  EXPECT_THROW(att.relative_error(std::vector<std::int32_t>{0, 6}, 1), std::invalid_argument);  // not a token
  EXPECT_THROW(att.relative_error(std::vector<std::int32_t>(14, 0), 7), std::invalid_argument);  // budget > N
}

TEST(Energy, ConstantTokensSitBelowTheCutoffAndCenteringRemovesThem) {
  const std::int64_t h = 2, n = 20, d = 3;
  std::vector<float> x(static_cast<std::size_t>(h * n * d));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(1 + i % d);  // the same row at every token
  auto e = fq::layer_energy(x.data(), x.data(), h, n, d, 0.2);
  EXPECT_NEAR(fq::low_share(e[0].k_high, e[0].k_total), 1.0, 1e-9);
  const auto c = fq::energy_variant(x.data(), h, n, d, fq::EnergyVariant::centered);
  for (float y : c) EXPECT_NEAR(y, 0.0f, 1e-6f);
}

TEST(Energy, ShufflingKeepsTheEnergyAndBreaksSmoothness) {
  const std::int64_t h = 1, n = 64, d = 2;
  std::vector<float> x(static_cast<std::size_t>(n * d));
  for (std::int64_t t = 0; t < n; ++t) {
    x[static_cast<std::size_t>(t * d)] = std::sin(0.05f * static_cast<float>(t));
    x[static_cast<std::size_t>(t * d + 1)] = std::cos(0.07f * static_cast<float>(t));
  }
  const auto s = fq::energy_variant(x.data(), h, n, d, fq::EnergyVariant::centered_shuffled, 3);
  const auto c = fq::energy_variant(x.data(), h, n, d, fq::EnergyVariant::centered);
  const auto es = fq::layer_energy(s.data(), s.data(), h, n, d, 0.2)[0];
  const auto ec = fq::layer_energy(c.data(), c.data(), h, n, d, 0.2)[0];
  EXPECT_NEAR(es.k_total, ec.k_total, 1e-6 * ec.k_total);  // a permutation keeps the energy
  EXPECT_GT(fq::low_share(ec.k_high, ec.k_total), 0.95);   // smooth: almost all low
  EXPECT_LT(fq::low_share(es.k_high, es.k_total), 0.6);    // shuffled: spread out
}

}  // namespace
