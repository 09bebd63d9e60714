// `flashcache compress --policy`: each baseline and FlashCache's options (window and base
// shares, image grids, the paper's algorithm, the query-informed score), their scores
// checked against direct computations from the files.
#include <flashcache/options.hpp>

#include <cmath>
#include <vector>

#include "../reference.hpp"
#include "cli_harness.hpp"

namespace flashcache {
namespace {

using namespace cli_test;  // the tests' own harness
using test::lines_of;
using test::TempDir;

// ----------------------------------------------------------------- policies

std::vector<std::int32_t> kept_row(const npy::Array& kept, std::int64_t h) {
  const std::int64_t b = kept.shape[1];
  const std::int32_t* row = kept.data<std::int32_t>() + h * b;
  return std::vector<std::int32_t>(row, row + b);
}

TEST_F(CliTest, PolicyStreamingKeepsTheMostRecentTokens) {
  const Result r = run_cli(compress({"--policy", "streaming", "--keep", "5", "--sink", "1"}));
  ASSERT_EQ(r.code, 0) << r.err;
  const Outputs o = check_outputs(out, k, v);
  for (std::size_t l = 0; l < 2; ++l)
    for (std::int64_t h = 0; h < 2; ++h)
      EXPECT_EQ(kept_row(o.kept[l], h), (std::vector<std::int32_t>{0, 33, 34, 35, 36})) << l << " " << h;
  EXPECT_EQ(o.summary["options"]["policy"], "streaming");
  // FlashCache's own options mean nothing here, and baselines have no energy ratios.
  EXPECT_TRUE(o.summary["options"]["gamma"].is_null());
  EXPECT_TRUE(o.summary["options"]["transform"].is_null());
  EXPECT_TRUE(o.summary["options"]["mean_weight"].is_null());
  EXPECT_EQ(o.energy_ratio, (std::vector<double>{0.0, 0.0}));
}

TEST_F(CliTest, WindowShareAndBaseShareAreRecorded) {
  const Result r = run_cli(compress({"--keep", "8", "--sink", "1", "--window-share", "0.25", "--base-share", "0.5"}));
  ASSERT_EQ(r.code, 0) << r.err;
  const Outputs o = check_outputs(out, k, v);
  for (std::size_t l = 0; l < 2; ++l)
    for (std::int64_t h = 0; h < 2; ++h) {
      const auto row = kept_row(o.kept[l], h);
      // sink 0, the newest round(0.25 * 8) = 2 tokens, then round(0.5 * 8) = 4 evenly spaced ones.
      EXPECT_EQ(row.front(), 0);
      EXPECT_EQ(std::vector<std::int32_t>(row.end() - 2, row.end()), (std::vector<std::int32_t>{35, 36}));
    }
  EXPECT_EQ(o.summary["options"]["window_share"], 0.25);
  EXPECT_EQ(o.summary["options"]["base_share"], 0.5);
  EXPECT_EQ(o.summary["options"]["paper"], false);
}

// 37 tokens: token 0, a 6 x 6 image. With every free token of the budget on
// the base sample, the image keeps a regular sub-grid; the spans are recorded.
TEST_F(CliTest, GridSpansAreScoredAndRecorded) {
  const Result r = run_cli(compress({"--keep", "5", "--sink", "1", "--window-share", "0", "--grid", "1:6:6",
                                     "--grid-base-share", "1", "--grid-zone", "triangle", "--grid-tile", "3"}));
  ASSERT_EQ(r.code, 0) << r.err;
  const Outputs o = check_outputs(out, k, v);
  // Token 0, then 4 of the 36 free image tokens: a 2 x 2 sub-grid at rows and columns 1 and 4.
  for (std::size_t l = 0; l < 2; ++l)
    for (std::int64_t h = 0; h < 2; ++h)
      EXPECT_EQ(kept_row(o.kept[l], h), (std::vector<std::int32_t>{0, 1 + 6 + 1, 1 + 6 + 4, 1 + 24 + 1, 1 + 24 + 4}));
  EXPECT_EQ(o.summary["options"]["grids"], nlohmann::json::parse("[[1, 6, 6]]"));
  EXPECT_EQ(o.summary["options"]["grid_zone"], "triangle");
  EXPECT_EQ(o.summary["options"]["grid_tile"], 3);
  EXPECT_EQ(o.summary["options"]["grid_base_share"], 1.0);
  // Without the base share the 2D scores choose, and differ from the 1D ones.
  ASSERT_EQ(run_cli(compress({"--keep", "9", "--force", "--sink", "0", "--window-share", "0", "--grid", "1:6:6",
                              "--grid", "0:1:1", "--grid-base-share", "0"}))
                .code,
            0);
  const Outputs two_d = check_outputs(out, k, v);
  ASSERT_EQ(run_cli(compress({"--keep", "9", "--force", "--sink", "0", "--window-share", "0"})).code, 0);
  const Outputs one_d = check_outputs(out, k, v);
  bool differ = false;
  for (std::size_t l = 0; l < 2; ++l)
    for (std::int64_t h = 0; h < 2; ++h) differ |= kept_row(two_d.kept[l], h) != kept_row(one_d.kept[l], h);
  EXPECT_TRUE(differ);
}

TEST_F(CliTest, PaperIsThePapersAlgorithm) {
  const Result r = run_cli(compress({"--paper", "--keep-ratio", "0.3"}));
  ASSERT_EQ(r.code, 0) << r.err;
  const Outputs o = check_outputs(out, k, v);
  const auto& opt = o.summary["options"];
  EXPECT_EQ(opt["paper"], true);
  EXPECT_EQ(opt["sink"], 0);
  EXPECT_EQ(opt["window"], 0);
  EXPECT_EQ(opt["window_share"], 0.0);
  EXPECT_EQ(opt["base_share"], 0.0);
  EXPECT_EQ(opt["normalize_terms"], false);
  EXPECT_EQ(opt["mean_distance"], "kv_squared");
  EXPECT_EQ(opt["mean_weight"], 0.0);
  EXPECT_EQ(opt["bridge"], 0);
  EXPECT_TRUE(opt["rope_theta"].is_null());
  EXPECT_EQ(opt["gamma"], 0.2);
  EXPECT_EQ(opt["transform"], "global");
  EXPECT_EQ(opt["allocation"], "dynamic");
}

// --mean-weight 1 --mean-distance kv_squared scores each token by its distance from its
// head's mean K and V alone (over that distance's mean: a naive double reference from the
// files) at a keep ratio where the default fade gives the weight in full; without the flags
// the library's defaults are used and recorded.
TEST_F(CliTest, MeanWeightScoresTheDistanceFromTheHeadMean) {
  const Result r = run_cli(
      compress({"--mean-weight", "1", "--mean-mix", "max", "--mean-distance", "kv_squared", "--keep-ratio", "0.6"}));
  ASSERT_EQ(r.code, 0) << r.err;
  const Outputs o = check_outputs(out, k, v);
  EXPECT_EQ(o.summary["options"]["mean_weight"], 1.0);
  EXPECT_EQ(o.summary["options"]["mean_mix"], "max");
  const npy::Array ka = npy::read(k), va = npy::read(v), scores = npy::read(out + "/scores.npy");
  const std::int64_t n = 37, d = 8;
  for (std::int64_t lh = 0; lh < 4; ++lh) {  // (layer, head) rows of [2, 2, 37, 8]
    const float* K = ka.data<float>() + lh * n * d;
    const float* V = va.data<float>() + lh * n * d;
    std::vector<double> mean(static_cast<std::size_t>(2 * d), 0.0), dist(static_cast<std::size_t>(n), 0.0);
    for (std::int64_t t = 0; t < n; ++t)
      for (std::int64_t c = 0; c < d; ++c) {
        mean[static_cast<std::size_t>(c)] += K[t * d + c] / static_cast<double>(n);
        mean[static_cast<std::size_t>(d + c)] += V[t * d + c] / static_cast<double>(n);
      }
    double total = 0;
    for (std::int64_t t = 0; t < n; ++t) {
      for (std::int64_t c = 0; c < d; ++c) {
        const double dk = K[t * d + c] - mean[static_cast<std::size_t>(c)];
        const double dv = V[t * d + c] - mean[static_cast<std::size_t>(d + c)];
        dist[static_cast<std::size_t>(t)] += (dk * dk + dv * dv) / static_cast<double>(d);
      }
      total += dist[static_cast<std::size_t>(t)];
    }
    for (std::int64_t t = 0; t < n; ++t)
      EXPECT_NEAR(scores.data<float>()[lh * n + t], dist[static_cast<std::size_t>(t)] / (total / n), 1e-4)
          << lh << " " << t;
  }
  const Result plain = run_cli(compress({"--keep-ratio", "0.2", "--force"}));
  ASSERT_EQ(plain.code, 0) << plain.err;
  const Outputs p = check_outputs(out, k, v);
  EXPECT_EQ(p.summary["options"]["mean_weight"], ScoreOptions{}.mean_weight);
  EXPECT_EQ(p.summary["options"]["mean_mix"], "sum");
  EXPECT_EQ(p.summary["options"]["mean_distance"], "key_cosine");
}

// --mean-distance key_cosine with --mean-weight 1: each token scores 1 - cos(key, mean of
// the unit keys) over that distance's mean (a naive double reference from the files).
TEST_F(CliTest, KeyCosineScoresEachKeysDirectionFromTheMean) {
  const Result r = run_cli(compress({"--mean-weight", "1", "--mean-distance", "key_cosine", "--keep-ratio", "0.6"}));
  ASSERT_EQ(r.code, 0) << r.err;
  const Outputs o = check_outputs(out, k, v);
  EXPECT_EQ(o.summary["options"]["mean_distance"], "key_cosine");
  const npy::Array ka = npy::read(k), scores = npy::read(out + "/scores.npy");
  const std::int64_t n = 37, d = 8;
  for (std::int64_t lh = 0; lh < 4; ++lh) {  // (layer, head) rows of [2, 2, 37, 8]
    const std::vector<double> dist = testing::naive_key_cosine(ka.data<float>() + lh * n * d, n, d,
                                                               std::vector<bool>(static_cast<std::size_t>(n), true));
    double total = 0;
    for (const double x : dist) total += x;
    for (std::int64_t t = 0; t < n; ++t)
      EXPECT_NEAR(scores.data<float>()[lh * n + t], dist[static_cast<std::size_t>(t)] / (total / n), 1e-4)
          << lh << " " << t;
  }
}

// --mean-full-keep / --mean-zero-keep: the weight follows the keep ratio. At keep 0.3,
// weight 1 fading from keep 0.5 to 0.1 is 0.5: the scores of a fixed --mean-weight 0.5 (both
// bounds 0), bit for bit.
TEST_F(CliTest, MeanWeightFollowsTheKeepRatio) {
  ASSERT_EQ(run_cli(compress({"--mean-weight", "0.5", "--mean-full-keep", "0", "--mean-zero-keep", "0", "--keep-ratio",
                              "0.3"}))
                .code,
            0);
  const npy::Array fixed = npy::read(out + "/scores.npy");
  const Result r = run_cli(compress(
      {"--mean-weight", "1", "--mean-full-keep", "0.5", "--mean-zero-keep", "0.1", "--keep-ratio", "0.3", "--force"}));
  ASSERT_EQ(r.code, 0) << r.err;
  const Outputs o = check_outputs(out, k, v);
  EXPECT_EQ(o.summary["options"]["mean_full_keep"], 0.5);
  EXPECT_EQ(o.summary["options"]["mean_zero_keep"], 0.1);
  const npy::Array faded = npy::read(out + "/scores.npy");
  EXPECT_EQ(faded.bytes, fixed.bytes);
  ASSERT_EQ(run_cli(compress({"--keep-ratio", "0.3", "--force"})).code, 0);
  const npy::Array plain = npy::read(out + "/scores.npy");
  EXPECT_NE(plain.bytes, faded.bytes);
  EXPECT_EQ(check_outputs(out, k, v).summary["options"]["mean_full_keep"], ScoreOptions{}.mean_full_keep);
}

// --bridge reaches the score: its JSON key says so and the scores differ from the defaults'.
TEST_F(CliTest, BridgeReachesTheScore) {
  ASSERT_EQ(run_cli(compress({"--keep-ratio", "0.5"})).code, 0);
  const npy::Array plain = npy::read(out + "/scores.npy");
  EXPECT_EQ(check_outputs(out, k, v).summary["options"]["bridge"], 0);
  const Result r = run_cli(compress({"--bridge", "2", "--keep-ratio", "0.5", "--force"}));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(check_outputs(out, k, v).summary["options"]["bridge"], 2);
  EXPECT_NE(npy::read(out + "/scores.npy").bytes, plain.bytes);
}

TEST_F(CliTest, PolicyKeydiffRuns) {
  const Result r = run_cli(compress({"--policy", "keydiff", "--keep", "6", "--sink", "2"}));
  ASSERT_EQ(r.code, 0) << r.err;
  const Outputs o = check_outputs(out, k, v);
  EXPECT_EQ(o.summary["options"]["policy"], "keydiff");
  for (std::size_t l = 0; l < 2; ++l) EXPECT_EQ(kept_row(o.kept[l], 0).front(), 0);
}

TEST_F(CliTest, PolicyKnormKeepsTheLowestKeyNorms) {
  const Result r = run_cli(compress({"--policy", "knorm", "--keep", "6", "--sink", "0", "--window-share", "0"}));
  ASSERT_EQ(r.code, 0) << r.err;
  const Outputs o = check_outputs(out, k, v);
  const npy::Array ka = npy::read(k);
  for (std::int64_t l = 0; l < 2; ++l)
    for (std::int64_t h = 0; h < 2; ++h) {
      std::vector<std::pair<double, std::int32_t>> norms;
      for (std::int32_t t = 0; t < 37; ++t) {
        double sq = 0;
        for (std::int64_t c = 0; c < 8; ++c) {
          const double x = ka.data<float>()[((l * 2 + h) * 37 + t) * 8 + c];
          sq += x * x;
        }
        norms.emplace_back(std::sqrt(sq), t);
      }
      std::sort(norms.begin(), norms.end());
      std::vector<std::int32_t> want;
      for (int i = 0; i < 6; ++i) want.push_back(norms[static_cast<std::size_t>(i)].second);
      std::sort(want.begin(), want.end());
      EXPECT_EQ(kept_row(o.kept[static_cast<std::size_t>(l)], h), want) << l << " " << h;
    }
  EXPECT_EQ(o.summary["options"]["policy"], "knorm");
}

TEST_F(CliTest, PolicyRandomDependsOnlyOnTheSeed) {
  auto kept_with = [&](const std::string& seed) {
    const Result r = run_cli(compress(
        {"--policy", "random", "--keep", "9", "--seed", seed, "--force", "--sink", "0", "--window-share", "0"}));
    EXPECT_EQ(r.code, 0) << r.err;
    const Outputs o = check_outputs(out, k, v);
    EXPECT_EQ(o.summary["options"]["seed"], std::stoull(seed));
    std::vector<std::int32_t> all;
    for (const auto& kept : o.kept) all.insert(all.end(), kept.data<std::int32_t>(), kept.data<std::int32_t>() + 18);
    return all;
  };
  const auto a = kept_with("1"), b = kept_with("1"), c = kept_with("2");
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

// Softmax over keys 0..i of query i of head qh against KV head kh, layer l, in double,
// from the files' arrays: Q [2][4][37][8], K [2][2][37][8].
std::vector<double> causal_attention(const float* Q, const float* K, std::int64_t l, std::int64_t qh, std::int64_t kh,
                                     std::int64_t i) {
  std::vector<double> p(static_cast<std::size_t>(i + 1));
  double top = -INFINITY, sum = 0;
  for (std::int64_t j = 0; j <= i; ++j) {
    double dot = 0;
    for (std::int64_t c = 0; c < 8; ++c)
      dot += double(Q[((l * 4 + qh) * 37 + i) * 8 + c]) * K[((l * 2 + kh) * 37 + j) * 8 + c];
    p[static_cast<std::size_t>(j)] = dot / std::sqrt(8.0);
    top = std::max(top, p[static_cast<std::size_t>(j)]);
  }
  for (auto& x : p) sum += (x = std::exp(x - top));
  for (auto& x : p) x /= sum;
  return p;
}

// Q with 4 heads over 2 KV heads (GQA, query head j uses KV head j / 2): the H2O
// scores the CLI writes match a direct computation from the files, so the
// queries' layout and head mapping are read as documented.
TEST_F(CliTest, PolicyH2oScoresComeFromTheQueries) {
  const std::string q = dir / "q.npy";
  write_cache<float>(q, dir / "unused.npy", {2, 4, 37, 8}, 7);
  const Result r = run_cli(compress({"--policy", "h2o", "--q", q, "--keep-ratio", "0.2"}));
  ASSERT_EQ(r.code, 0) << r.err;
  const Outputs o = check_outputs(out, k, v);
  EXPECT_EQ(o.budgets[0] + o.budgets[1], std::llround(0.2 * 2 * 37));  // split by tokens: no energy ratios
  EXPECT_EQ(o.summary["options"]["policy"], "h2o");
  EXPECT_EQ(o.summary["input"]["q"], q);
  EXPECT_EQ(o.summary["input"]["q_shape"].get<std::vector<std::int64_t>>(), (std::vector<std::int64_t>{2, 4, 37, 8}));
  const npy::Array qa = npy::read(q), ka = npy::read(k), scores = npy::read(out + "/scores.npy");
  const float* Q = qa.data<float>();
  const float* K = ka.data<float>();
  for (std::int64_t l = 0; l < 2; ++l)
    for (std::int64_t h = 0; h < 2; ++h) {
      std::vector<double> acc(37, 0.0);
      for (std::int64_t g = 0; g < 2; ++g)
        for (std::int64_t i = 0; i < 37; ++i) {
          const std::vector<double> p = causal_attention(Q, K, l, 2 * h + g, h, i);
          for (std::int64_t j = 0; j <= i; ++j) acc[static_cast<std::size_t>(j)] += p[static_cast<std::size_t>(j)] / 2;
        }
      for (std::int64_t t = 0; t < 37; ++t)
        EXPECT_NEAR(scores.data<float>()[(l * 2 + h) * 37 + t], acc[static_cast<std::size_t>(t)], 1e-4)
            << l << " " << h << " " << t;
    }
}

// flashcache with --q: the query-informed score. With --tail-weight 1 the scores are the
// tails, each key's largest causal attention probability from a query of its KV head's
// group at least --tail-min-distance tokens after it, over the head's mean: computed here
// from the files, directly. summary.json says which score ran, with the preset's fields.
TEST_F(CliTest, FlashcacheWithQueriesScoresByTheTail) {
  const std::string q = dir / "q.npy";
  write_cache<float>(q, dir / "unused.npy", {2, 4, 37, 8}, 7);
  const Result r =
      run_cli(compress({"--q", q, "--tail-weight", "1", "--tail-min-distance", "3", "--keep-ratio", "0.2"}));
  ASSERT_EQ(r.code, 0) << r.err;
  const Outputs o = check_outputs(out, k, v);
  EXPECT_EQ(o.summary["options"]["policy"], "flashcache");
  EXPECT_EQ(o.summary["options"]["query"], "tail");
  EXPECT_EQ(o.summary["options"]["tail_weight"], 1.0);
  EXPECT_EQ(o.summary["options"]["tail_mix"], "max");
  EXPECT_EQ(o.summary["options"]["tail_stride"], 1);
  EXPECT_EQ(o.summary["options"]["tail_min_distance"], 3);
  EXPECT_EQ(o.summary["options"]["tail_last"], 256);
  const npy::Array qa = npy::read(q), ka = npy::read(k), scores = npy::read(out + "/scores.npy");
  const float* Q = qa.data<float>();
  const float* K = ka.data<float>();
  for (std::int64_t l = 0; l < 2; ++l)
    for (std::int64_t h = 0; h < 2; ++h) {
      std::vector<double> tail(37, 0.0);
      for (std::int64_t g = 0; g < 2; ++g)
        for (std::int64_t i = 0; i < 37; ++i) {
          const std::vector<double> p = causal_attention(Q, K, l, 2 * h + g, h, i);
          for (std::int64_t j = 0; j + 3 <= i; ++j)
            tail[static_cast<std::size_t>(j)] =
                std::max(tail[static_cast<std::size_t>(j)], p[static_cast<std::size_t>(j)]);
        }
      double mean = 0;
      for (double t : tail) mean += t / 37;
      for (std::int64_t t = 0; t < 37; ++t)
        EXPECT_NEAR(scores.data<float>()[(l * 2 + h) * 37 + t], tail[static_cast<std::size_t>(t)] / mean, 1e-4)
            << l << " " << h << " " << t;
    }
  // Without --q the same call scores without queries, and says so.
  const Result plain = run_cli(compress({"--keep-ratio", "0.2", "--force"}));
  ASSERT_EQ(plain.code, 0) << plain.err;
  const Outputs p = check_outputs(out, k, v);
  EXPECT_EQ(p.summary["options"]["query"], "none");
  EXPECT_TRUE(p.summary["options"]["tail_weight"].is_null());
}

TEST_F(CliTest, PolicySnapkvKeepsItsObservationWindow) {
  const std::string q = dir / "q.npy";
  write_cache<float>(q, dir / "unused.npy", {2, 2, 37, 8}, 7);
  const Result r = run_cli(compress({"--policy", "snapkv", "--q", q, "--keep", "7", "--observation-window", "4",
                                     "--sink", "0", "--window-share", "0"}));
  ASSERT_EQ(r.code, 0) << r.err;
  const Outputs o = check_outputs(out, k, v);
  EXPECT_EQ(o.summary["options"]["policy"], "snapkv");
  EXPECT_EQ(o.summary["options"]["observation_window"], 4);
  for (std::size_t l = 0; l < 2; ++l)
    for (std::int64_t h = 0; h < 2; ++h) {
      const auto row = kept_row(o.kept[l], h);
      ASSERT_EQ(row.size(), 7u);
      EXPECT_EQ(std::vector<std::int32_t>(row.end() - 4, row.end()), (std::vector<std::int32_t>{33, 34, 35, 36}));
    }
  // float16 queries with a float16 cache work the same way.
  write_cache<half_t>(k, v, {2, 2, 37, 8});
  write_cache<half_t>(q, dir / "unused.npy", {2, 2, 37, 8}, 7);
  const Result r16 = run_cli(
      compress({"--policy", "snapkv", "--q", q, "--keep", "7", "--force", "--sink", "0", "--window-share", "0"}));
  ASSERT_EQ(r16.code, 0) << r16.err;
  EXPECT_EQ(check_outputs(out, k, v).summary["options"]["observation_window"], 32);  // the default
}

}  // namespace
}  // namespace flashcache
