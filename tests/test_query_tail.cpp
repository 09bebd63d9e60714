// Query tails (query_tail.hpp) against a naive double-precision reference written
// from the definition, and the score that mixes them with the residual (score.hpp).
#include <gtest/gtest.h>
#include <flashcache/flashcache.hpp>
#include <flashcache/policies/baselines.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <utility>
#include <vector>

namespace fc = flashcache;

namespace {

// Dense [heads][tokens][d] of uniform values in [-spread, spread].
std::vector<float> random_rows(std::int64_t heads, std::int64_t tokens, std::int64_t d, double spread,
                               std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-spread, spread);
  std::vector<float> x(static_cast<std::size_t>(heads * tokens * d));
  for (float& e : x) e = static_cast<float>(u(rng));
  return x;
}

// tail[h][j] = max over g in h's group and fed i >= j + min_distance of exp(q_gi . k_hj s - lse_gi),
// in double, from the definition: no tiles, no shared code with the library.
std::vector<double> naive_tails(const std::vector<float>& q, std::int64_t hq, const std::vector<float>& k,
                                std::int64_t hk, std::int64_t n, std::int64_t d, std::int64_t stride,
                                std::int64_t first_query, std::int64_t min_distance = 0) {
  std::vector<double> tail(static_cast<std::size_t>(hk * n), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const std::int64_t group = hq / hk;
  for (std::int64_t g = 0; g < hq; ++g) {
    const std::int64_t h = g / group;
    for (std::int64_t i = first_query; i < n; ++i) {
      if (i % stride != 0) continue;
      bool finite_query = true;  // a non-finite query counts for nothing
      for (std::int64_t c = 0; c < d; ++c)
        finite_query &= std::isfinite(q[static_cast<std::size_t>((g * n + i) * d + c)]);
      if (!finite_query) continue;
      std::vector<double> logit(static_cast<std::size_t>(i + 1));
      double sum = 0;
      for (std::int64_t j = 0; j <= i; ++j) {
        double dot = 0;
        for (std::int64_t c = 0; c < d; ++c)
          dot += static_cast<double>(q[static_cast<std::size_t>((g * n + i) * d + c)]) *
                 static_cast<double>(k[static_cast<std::size_t>((h * n + j) * d + c)]);
        logit[static_cast<std::size_t>(j)] = std::isfinite(dot) ? dot * scale : -INFINITY;  // a non-finite key: 0
        sum += std::exp(logit[static_cast<std::size_t>(j)]);
      }
      for (std::int64_t j = 0; j + min_distance <= i; ++j) {
        double& t = tail[static_cast<std::size_t>(h * n + j)];
        t = std::max(t, std::exp(logit[static_cast<std::size_t>(j)]) / sum);
      }
    }
  }
  return tail;
}

struct Prompt {
  std::int64_t hq, hk, n, d;
  std::vector<float> q, k;
  Prompt(std::int64_t hq_, std::int64_t hk_, std::int64_t n_, std::int64_t d_, std::uint32_t seed)
      : hq(hq_), hk(hk_), n(n_), d(d_), q(random_rows(hq, n, d, 1.5, seed)), k(random_rows(hk, n, d, 1.5, seed + 1)) {}
  fc::KVView<const float> qv() const { return fc::hnd(q.data(), fc::Heads(hq), fc::Tokens(n), fc::HeadDim(d)); }
  fc::KVView<const float> kv() const { return fc::hnd(k.data(), fc::Heads(hk), fc::Tokens(n), fc::HeadDim(d)); }
};

// The definition's exact tail: every query, no minimum distance.
fc::QueryTailOptions exact() {
  fc::QueryTailOptions o;
  o.min_distance = 0;
  return o;
}

void expect_near_tails(const std::vector<float>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 2e-6 + 2e-5 * want[i]) << "tail " << i;
}

// Odd sizes, GQA 6 over 2, fed in uneven chunks (as a prefill does): the same as one pass
// and as the naive reference, with and without a sample stride and a minimum distance
// (200: longer than the prompt, no query counts).
TEST(QueryTail, ChunksMatchNaiveReference) {
  for (const auto& [stride, distance] : {std::pair<std::int64_t, std::int64_t>{1, 0}, {3, 0}, {1, 9}, {2, 200}}) {
    const Prompt p(6, 2, 157, 7, 11u + static_cast<std::uint32_t>(stride + distance));
    const std::vector<double> want = naive_tails(p.q, p.hq, p.k, p.hk, p.n, p.d, stride, 0, distance);
    fc::TailAccumulator acc;
    fc::QueryTailOptions opt;
    opt.stride = stride;
    opt.min_distance = distance;
    std::vector<float> one(static_cast<std::size_t>(p.hk * p.n), 0.0f), chunked = one;
    ASSERT_TRUE(acc.add(p.qv(), 0, p.kv(), nullptr, fc::TailView<float>{one.data(), p.hk, p.n}, opt).ok());
    expect_near_tails(one, want);
    std::int64_t first = 0;
    for (std::int64_t chunk : {5, 64, 1, 70, 17}) {
      const auto q = fc::token_range(p.qv(), first, chunk);
      const auto k = fc::token_range(p.kv(), 0, first + chunk);  // only the keys seen so far
      ASSERT_TRUE(acc.add(q, first, k, nullptr, fc::TailView<float>{chunked.data(), p.hk, p.n}, opt).ok());
      first += chunk;
    }
    ASSERT_EQ(first, p.n);
    expect_near_tails(chunked, want);
  }
}

// Tiles of 64 queries and 128 keys: a prompt longer than both, queries of only its end.
TEST(QueryTail, LastQueriesAcrossTilesMatchNaiveReference) {
  const Prompt p(4, 4, 301, 16, 5u);
  const std::int64_t first = 301 - 133;
  const std::vector<double> want = naive_tails(p.q, p.hq, p.k, p.hk, p.n, p.d, 1, first);
  std::vector<float> got(static_cast<std::size_t>(p.hk * p.n), 0.0f);
  fc::TailAccumulator acc;
  ASSERT_TRUE(
      acc.add(fc::token_range(p.qv(), first, p.n - first), first, p.kv(), nullptr, {got.data(), p.hk, p.n}, exact())
          .ok());
  // The same queries fed from position `first` on (QueryTailOptions::from_position), and the
  // chosen form: the last 256 queries of the prompt, each for keys 32 tokens before it or more.
  std::vector<float> from(got.size(), 0.0f), chosen(got.size(), 0.0f);
  fc::QueryTailOptions later = exact();
  later.from_position = first;
  ASSERT_TRUE(acc.add(p.qv(), 0, p.kv(), nullptr, {from.data(), p.hk, p.n}, later).ok());
  expect_near_tails(from, want);
  ASSERT_TRUE(acc.add(p.qv(), 0, p.kv(), nullptr, {chosen.data(), p.hk, p.n}, fc::last_queries(p.n)).ok());
  expect_near_tails(chosen, naive_tails(p.q, p.hq, p.k, p.hk, p.n, p.d, 1, p.n - 256, 32));
  expect_near_tails(got, want);
  for (std::int64_t j = 0; j < p.hk * p.n; ++j) EXPECT_LE(got[static_cast<std::size_t>(j)], 1.0f);
}

// A given lse (what FlashAttention returns) gives the tails computed without it; a wrong
// one moves them; a non-finite one is refused.
TEST(QueryTail, GivenLseIsUsed) {
  const Prompt p(3, 1, 40, 5, 23u);
  std::vector<float> lse(static_cast<std::size_t>(p.hq * p.n));
  const double scale = 1.0 / std::sqrt(5.0);
  for (std::int64_t g = 0; g < p.hq; ++g)
    for (std::int64_t i = 0; i < p.n; ++i) {
      double sum = 0;
      for (std::int64_t j = 0; j <= i; ++j) {
        double dot = 0;
        for (std::int64_t c = 0; c < p.d; ++c)
          dot += static_cast<double>(p.q[static_cast<std::size_t>((g * p.n + i) * p.d + c)]) *
                 p.k[static_cast<std::size_t>(j * p.d + c)];
        sum += std::exp(dot * scale);
      }
      lse[static_cast<std::size_t>(g * p.n + i)] = static_cast<float>(std::log(sum));
    }
  fc::TailAccumulator acc;
  std::vector<float> own(static_cast<std::size_t>(p.n), 0.0f), given = own, shifted = own;
  ASSERT_TRUE(acc.add(p.qv(), 0, p.kv(), nullptr, {own.data(), 1, p.n}).ok());
  ASSERT_TRUE(acc.add(p.qv(), 0, p.kv(), lse.data(), {given.data(), 1, p.n}).ok());
  for (std::int64_t j = 0; j < p.n; ++j)
    EXPECT_NEAR(given[static_cast<std::size_t>(j)], own[static_cast<std::size_t>(j)], 1e-5);
  for (float& x : lse) x += 1.0f;  // every probability / e
  ASSERT_TRUE(acc.add(p.qv(), 0, p.kv(), lse.data(), {shifted.data(), 1, p.n}).ok());
  for (std::int64_t j = 0; j < p.n; ++j)
    EXPECT_NEAR(shifted[static_cast<std::size_t>(j)], own[static_cast<std::size_t>(j)] / std::exp(1.0f), 1e-5);
  lse[7] = std::numeric_limits<float>::quiet_NaN();
  const fc::Status s = acc.add(p.qv(), 0, p.kv(), lse.data(), {shifted.data(), 1, p.n});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("lse of query head 0, row 7"), std::string::npos) << s.message();
}

// Two accumulations merge by the maximum: first and second halves of the queries, apart
// (to rounding: the products are tiled differently).
TEST(QueryTail, MergeOfHalvesIsTheWhole) {
  const Prompt p(2, 2, 90, 8, 31u);
  fc::TailAccumulator acc;
  std::vector<float> whole(static_cast<std::size_t>(2 * 90), 0.0f), a = whole, b = whole;
  ASSERT_TRUE(acc.add(p.qv(), 0, p.kv(), nullptr, {whole.data(), 2, 90}).ok());
  ASSERT_TRUE(acc.add(fc::token_range(p.qv(), 0, 45), 0, p.kv(), nullptr, {a.data(), 2, 90}).ok());
  ASSERT_TRUE(acc.add(fc::token_range(p.qv(), 45, 45), 45, p.kv(), nullptr, {b.data(), 2, 90}).ok());
  ASSERT_TRUE(fc::merge_tails(fc::TailView<const float>{b.data(), 2, 90}, fc::TailView<float>{a.data(), 2, 90}).ok());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], whole[i], 1e-6 + 1e-5 * whole[i]) << i;
  EXPECT_FALSE(fc::merge_tails(fc::TailView<const float>{b.data(), 2, 89}, fc::TailView<float>{a.data(), 2, 90}).ok());
}

// A NaN in a key gives it probability 0 (to 1e-30) and leaves every other key's tail as without it; a NaN
// in a query drops that query; a NaN lse of a row the stride leaves out is not read; a layer
// of no tokens scores.
TEST(QueryTail, NonFiniteRowsAddNothing) {
  Prompt p(2, 1, 60, 5, 61u);
  p.k[static_cast<std::size_t>(10 * 5 + 2)] = std::numeric_limits<float>::quiet_NaN();        // key 10
  p.q[static_cast<std::size_t>((1 * 60 + 40) * 5)] = std::numeric_limits<float>::infinity();  // head 1, query 40
  const std::vector<double> want = naive_tails(p.q, 2, p.k, 1, 60, 5, 1, 0, 0);
  fc::TailAccumulator acc;
  std::vector<float> got(60, 0.0f);
  ASSERT_TRUE(acc.add(p.qv(), 0, p.kv(), nullptr, {got.data(), 1, 60}, exact()).ok());
  expect_near_tails(got, want);
  EXPECT_LT(got[10], 1e-30f);  // Eigen's exp(-inf) is 3e-39, not 0
  EXPECT_GT(got[11], 0.0f);
  std::vector<float> lse(2 * 60, 0.0f), t2(60, 0.0f);
  lse[1] = std::numeric_limits<float>::quiet_NaN();  // head 0, row 1: not fed with stride 2
  fc::QueryTailOptions even = exact();
  even.stride = 2;
  EXPECT_TRUE(acc.add(p.qv(), 0, p.kv(), lse.data(), {t2.data(), 1, 60}, even).ok());
  lse[2] = std::numeric_limits<float>::quiet_NaN();  // row 2 is fed
  EXPECT_FALSE(acc.add(p.qv(), 0, p.kv(), lse.data(), {t2.data(), 1, 60}, even).ok());
  fc::Scorer<float> scorer;
  fc::LayerScores empty;
  const auto none = fc::hnd<const float>(p.k.data(), fc::Heads(1), fc::Tokens(0), fc::HeadDim(5));
  EXPECT_TRUE(scorer.score(none, none, fc::Options::with_query_tail().score, &empty, fc::ScoreInputs{{}, fc::TailView<const float>{}}).ok());
}

// half-precision rows convert as the float ones do.
TEST(QueryTail, HalfInputs) {
  const Prompt p(2, 1, 33, 6, 41u);
  std::vector<fc::half_t> qh(p.q.size()), kh(p.k.size());
  std::vector<float> qr(p.q.size()), kr(p.k.size());
  for (std::size_t i = 0; i < qh.size(); ++i) qr[i] = static_cast<float>(qh[i] = fc::half_t(p.q[i]));
  for (std::size_t i = 0; i < kh.size(); ++i) kr[i] = static_cast<float>(kh[i] = fc::half_t(p.k[i]));
  const std::vector<double> want = naive_tails(qr, 2, kr, 1, 33, 6, 1, 0);
  std::vector<float> got(33, 0.0f);
  fc::TailAccumulator acc;
  ASSERT_TRUE(acc.add(fc::hnd<const fc::half_t>(qh.data(), fc::Heads(2), fc::Tokens(33), fc::HeadDim(6)), 0,
                      fc::hnd<const fc::half_t>(kh.data(), fc::Heads(1), fc::Tokens(33), fc::HeadDim(6)), nullptr,
                      {got.data(), 1, 33}, exact())
                  .ok());
  expect_near_tails(got, want);
}

TEST(QueryTail, BadInputsNameTheProblem) {
  const Prompt p(6, 4, 20, 4, 3u);
  fc::TailAccumulator acc;
  std::vector<float> t(static_cast<std::size_t>(4 * 20), 0.0f);
  const auto message = [&](fc::KVView<const float> q, std::int64_t first, fc::KVView<const float> k,
                           fc::TailView<float> tails, fc::QueryTailOptions o = {}) {
    const fc::Status s = acc.add(q, first, k, nullptr, tails, o);
    return s.ok() ? std::string("ok") : s.message();
  };
  EXPECT_NE(message(p.qv(), 0, p.kv(), {t.data(), 4, 20}).find("not a multiple of 4 KV heads"), std::string::npos);
  const Prompt g(4, 2, 20, 4, 3u);
  EXPECT_NE(message(g.qv(), 3, g.kv(), {t.data(), 2, 20}).find("K holds 20 tokens"), std::string::npos);
  EXPECT_NE(message(g.qv(), 0, g.kv(), {t.data(), 2, 19}).find("tails are 2x19"), std::string::npos);
  EXPECT_NE(message(g.qv(), -1, g.kv(), {t.data(), 2, 20}).find("negative"), std::string::npos);
  fc::QueryTailOptions zero;
  zero.stride = 0;
  EXPECT_NE(message(g.qv(), 0, g.kv(), {t.data(), 2, 20}, zero).find("stride 0"), std::string::npos);
}

struct Layer {
  std::int64_t h = 2, n = 61, d = 8;
  std::vector<float> k = random_rows(2, 61, 8, 1.0, 7u), v = random_rows(2, 61, 8, 1.0, 8u);
  std::vector<float> tails = std::vector<float>(static_cast<std::size_t>(2 * 61));
  Layer() {
    std::mt19937 rng(9);
    std::uniform_real_distribution<float> u(0.0f, 0.2f);
    for (float& t : tails) t = u(rng);
  }
  fc::KVView<const float> kv() const { return fc::hnd(k.data(), fc::Heads(h), fc::Tokens(n), fc::HeadDim(d)); }
  fc::KVView<const float> vv() const { return fc::hnd(v.data(), fc::Heads(h), fc::Tokens(n), fc::HeadDim(d)); }
  fc::TailView<const float> tv() const { return {tails.data(), h, n}; }
};

// The mix is (1 - w) r / mean r + w t / mean t per head (or the larger term), over the
// residual the scorer gives without tails; w = 0 keeps the residual's order, w = 1 the tails'.
TEST(QueryTailScore, MixesResidualAndTail) {
  const Layer L;
  fc::Scorer<double> scorer;
  fc::LayerScores plain, mixed;
  ASSERT_TRUE(scorer.score(L.kv(), L.vv(), fc::Options{}.score, &plain).ok());
  for (const fc::TailMix mix : {fc::TailMix::sum, fc::TailMix::max})
    for (double w : {0.0, 0.3, 1.0}) {
      fc::Options opt;
      opt.score.query = fc::QueryInput::tail;
      opt.score.tail_weight = w;
      opt.score.tail_mix = mix;
      ASSERT_TRUE(scorer.score(L.kv(), L.vv(), opt.score, &mixed, fc::ScoreInputs{{}, L.tv()}).ok());
      for (std::int64_t h = 0; h < L.h; ++h) {
        double mr = 0, mt = 0;
        for (std::int64_t t = 0; t < L.n; ++t) {
          mr += plain(h, t) / static_cast<double>(L.n);
          mt += L.tails[static_cast<std::size_t>(h * L.n + t)] / static_cast<double>(L.n);
        }
        for (std::int64_t t = 0; t < L.n; ++t) {
          const double r = (1 - w) * plain(h, t) / mr, q = w * L.tails[static_cast<std::size_t>(h * L.n + t)] / mt;
          const double want = mix == fc::TailMix::sum ? r + q : std::max(r, q);
          EXPECT_NEAR(mixed(h, t), want, 1e-5 * want + 1e-7) << "w " << w << " head " << h << " token " << t;
        }
      }
      for (std::int64_t h = 0; h < L.h; ++h) EXPECT_EQ(mixed.energy[h].k_high, plain.energy[h].k_high);
    }
}

// A non-finite token keeps +inf whatever its tail; the others are mixed over the finite ones.
TEST(QueryTailScore, NonFiniteTokenStaysInfinite) {
  Layer L;
  L.k[static_cast<std::size_t>(5 * L.d)] = std::numeric_limits<float>::quiet_NaN();  // head 0, token 5
  fc::Scorer<float> scorer;
  fc::LayerScores out;
  fc::Options opt;
  opt.score.query = fc::QueryInput::tail;
  ASSERT_TRUE(scorer.score(L.kv(), L.vv(), opt.score, &out, fc::ScoreInputs{{}, L.tv()}).ok());
  EXPECT_TRUE(std::isinf(out(0, 5)));
  for (std::int64_t t = 0; t < L.n; ++t)
    if (t != 5) {
      EXPECT_TRUE(std::isfinite(out(0, t)));
    }
}

// Tails go with QueryInput::tail only, one per key, each a probability.
TEST(QueryTailScore, RefusesMismatchedInput) {
  Layer L;
  fc::Scorer<float> scorer;
  fc::LayerScores out;
  const auto message = [&](fc::TailView<const float> t, const fc::Options& o) {
    const fc::Status s = scorer.score(L.kv(), L.vv(), o.score, &out, fc::ScoreInputs{{}, t});
    return s.ok() ? std::string("ok") : s.message();
  };
  fc::Options tail;
  tail.score.query = fc::QueryInput::tail;
  EXPECT_NE(message(L.tv(), fc::Options{}).find("ScoreOptions::query is none"), std::string::npos);
  EXPECT_NE(message({}, tail).find("no tails were given"), std::string::npos);
  EXPECT_NE(message({L.tails.data(), 1, L.n}, tail).find("tails are 1x61"), std::string::npos);
  L.tails[3] = 1.5f;
  EXPECT_NE(message(L.tv(), tail).find("tail of head 0, token 3 is 1.5"), std::string::npos);
  tail.score.tail_weight = 1.1;
  EXPECT_NE(message(L.tv(), tail).find("tail_weight 1.1"), std::string::npos);
}

// The policy front door: flashcache with QueryInput::tail reads Q like H2O does, and a key
// that one late query looks at hard is kept where the residual alone drops it.
TEST(QueryTailScore, PolicyKeepsTheKeyOneQueryNeeds) {
  const std::int64_t n = 200, d = 8;
  const std::vector<float> k = random_rows(1, n, d, 1.0, 51u), v = random_rows(1, n, d, 1.0, 52u);
  std::vector<float> q(k.size(), 0.0f);
  // Query 190 points at key 70, a key like any other: a large dot product with it alone.
  for (std::int64_t c = 0; c < d; ++c)
    q[static_cast<std::size_t>(190 * d + c)] = 12.0f * k[static_cast<std::size_t>(70 * d + c)];
  const auto kv = fc::hnd<const float>(k.data(), fc::Heads(1), fc::Tokens(n), fc::HeadDim(d));
  const auto vv = fc::hnd<const float>(v.data(), fc::Heads(1), fc::Tokens(n), fc::HeadDim(d));
  const auto qv = fc::hnd<const float>(q.data(), fc::Heads(1), fc::Tokens(n), fc::HeadDim(d));
  fc::Options opt;
  opt.score.query = fc::QueryInput::tail;
  opt.score.tail_weight = 1.0;
  fc::LayerScores tail_scores, plain;
  ASSERT_TRUE(
      fc::policies::score_with_policy<float>(fc::policies::Policy::flashcache, qv, kv, vv, opt.score, {}, &tail_scores).ok());
  ASSERT_TRUE(
      fc::policies::score_with_policy<float>(fc::policies::Policy::flashcache, {}, kv, vv, fc::Options{}.score, {}, &plain)
          .ok());
  std::int64_t above_tail = 0, above_plain = 0;  // tokens outranking key 70
  for (std::int64_t t = 0; t < n; ++t) {
    above_tail += tail_scores(0, t) > tail_scores(0, 70);
    above_plain += plain(0, t) > plain(0, 70);
  }
  EXPECT_LT(above_tail, 5);
  EXPECT_GT(above_plain, 20);
  EXPECT_FALSE(
      fc::policies::score_with_policy<float>(fc::policies::Policy::flashcache, {}, kv, vv, opt.score, {}, &plain).ok());
}

}  // namespace

// The last queries of a running sequence (query_window.hpp): rows pushed from an origin
// through several wraps of the ring come back as at most two runs of consecutive
// positions, the newest `capacity` in order, and their tails are the naive ones of
// exactly those queries.
TEST(QueryWindow, KeepsTheLastRowsAsRunsOfPositions) {
  const Prompt p(6, 2, 157, 7, 29u);
  for (const std::int64_t capacity : {45, 1, 137, 300}) {
    fc::QueryWindow w;
    const std::int64_t origin = 20;
    w.reset(origin, capacity);
    for (std::int64_t pos = origin; pos < p.n; ++pos) {
      ASSERT_TRUE(w.shape(p.hq, p.d));
      float* row = w.append();
      ASSERT_NE(row, nullptr);
      for (std::int64_t g = 0; g < p.hq; ++g)
        for (std::int64_t c = 0; c < p.d; ++c) row[g * p.d + c] = p.q[static_cast<std::size_t>((g * p.n + pos) * p.d + c)];
    }
    const std::int64_t kept = std::min(capacity, p.n - origin);
    ASSERT_EQ(w.end_position(), p.n);
    ASSERT_EQ(w.kept(), kept);
    ASSERT_EQ(w.first_kept(), p.n - kept);
    ASSERT_LE(w.pieces(), 2);
    std::int64_t next = p.n - kept;
    std::vector<float> tails(static_cast<std::size_t>(p.hk * p.n), 0.0f);
    fc::TailAccumulator acc;
    for (int i = 0; i < w.pieces(); ++i) {
      const fc::QueryPiece piece = w.piece(i);
      ASSERT_EQ(piece.first, next) << "capacity " << capacity << " piece " << i;
      for (std::int64_t r = 0; r < piece.q.tokens; ++r)
        for (std::int64_t g = 0; g < p.hq; ++g)
          for (std::int64_t c = 0; c < p.d; ++c)
            ASSERT_EQ(piece.q(g, r, c), p.q[static_cast<std::size_t>((g * p.n + piece.first + r) * p.d + c)]);
      ASSERT_TRUE(acc.add(piece.q, piece.first, p.kv(), nullptr, {tails.data(), p.hk, p.n}, exact()).ok());
      next += piece.q.tokens;
    }
    ASSERT_EQ(next, p.n);
    expect_near_tails(tails, naive_tails(p.q, p.hq, p.k, p.hk, p.n, p.d, 1, p.n - kept));
  }
}

// A window of no rows counts positions and keeps none; reset forgets; another shape is
// refused while rows of the first are kept, taken after a reset.
TEST(QueryWindow, EmptyResetAndShape) {
  fc::QueryWindow w;
  w.reset(5, 0);
  ASSERT_TRUE(w.shape(2, 4));
  EXPECT_EQ(w.append(), nullptr);
  EXPECT_EQ(w.end_position(), 6);
  EXPECT_EQ(w.kept(), 0);
  EXPECT_EQ(w.pieces(), 0);
  w.reset(0, 3);
  ASSERT_TRUE(w.shape(2, 4));
  ASSERT_NE(w.append(), nullptr);
  EXPECT_FALSE(w.shape(3, 4));
  EXPECT_TRUE(w.shape(2, 4));
  w.reset(9, 3);
  EXPECT_EQ(w.kept(), 0);
  EXPECT_EQ(w.first_kept(), 9);
  EXPECT_TRUE(w.shape(3, 4));
  EXPECT_EQ(w.pieces(), 0);
}
