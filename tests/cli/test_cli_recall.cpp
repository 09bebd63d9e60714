// `flashcache recall`: the blocks it brings back per head and with --shared, against a
// naive double-precision attention over the kept, evicted and question keys.
#include "cli_harness.hpp"

namespace flashcache {
namespace {

using namespace cli_test;  // the tests' own harness
using test::lines_of;
using test::TempDir;

// recall's reference: for one (layer, KV head), its evicted tokens and each one's
// largest attention probability from the head's query group, by a naive
// double-precision attention over the kept, evicted and question keys (causal).
struct NaiveHeadRecall {
  std::vector<std::int64_t> evicted;
  std::vector<double> best;
};

NaiveHeadRecall naive_head_recall(const float* head, std::vector<std::int64_t> kept, const std::vector<float>& q,
                                  const std::vector<float>& qk, std::int64_t l, std::int64_t h, std::int64_t H,
                                  std::int64_t Hq, std::int64_t N, std::int64_t m, std::int64_t d) {
  NaiveHeadRecall r;
  for (std::int64_t t = 0; t < N; ++t)
    if (!std::binary_search(kept.begin(), kept.end(), t)) r.evicted.push_back(t);
  r.best.assign(r.evicted.size(), 0.0);
  for (std::int64_t g = h * (Hq / H); g < (h + 1) * (Hq / H); ++g)
    for (std::int64_t i = 0; i < m; ++i) {
      const float* qi = q.data() + ((l * Hq + g) * m + i) * d;
      auto logit = [&](const float* key) {
        double x = 0;
        for (std::int64_t c = 0; c < d; ++c) x += static_cast<double>(qi[c]) * key[c];
        return x / std::sqrt(static_cast<double>(d));
      };
      std::vector<double> all;
      for (const std::int64_t t : kept) all.push_back(logit(head + t * d));
      for (const std::int64_t t : r.evicted) all.push_back(logit(head + t * d));
      for (std::int64_t j = 0; j <= i; ++j) all.push_back(logit(qk.data() + ((l * H + h) * m + j) * d));
      double sum = 0;
      for (const double x : all) sum += std::exp(x);
      for (std::size_t e = 0; e < r.evicted.size(); ++e)
        r.best[e] = std::max(r.best[e], std::exp(all[kept.size() + e]) / sum);
    }
  return r;
}

// The best whole blocks of `block` consecutive entries of `items` (scored by `score`)
// that fit `budget`, ascending, padded with -1 to `budget`.
std::vector<std::int64_t> naive_best_blocks(const std::vector<std::int64_t>& items, const std::vector<double>& score,
                                            std::int64_t block, std::int64_t budget) {
  const auto n = static_cast<std::int64_t>(items.size());
  std::vector<std::pair<double, std::int64_t>> ranked;
  for (std::int64_t b = 0; b * block < n; ++b) {
    double top = 0;
    for (std::int64_t e = b * block; e < std::min(n, (b + 1) * block); ++e) top = std::max(top, score[e]);
    ranked.push_back({-top, b});
  }
  std::sort(ranked.begin(), ranked.end());
  std::vector<std::int64_t> want;
  std::int64_t used = 0;
  for (const auto& [neg, b] : ranked) {
    const std::int64_t size = std::min(block, n - b * block);
    if (neg == 0 || used + size > budget) continue;
    used += size;
    for (std::int64_t e = b * block; e < b * block + size; ++e) want.push_back(items[static_cast<std::size_t>(e)]);
  }
  std::sort(want.begin(), want.end());
  want.resize(static_cast<std::size_t>(budget), -1);
  return want;
}

class CliRecallTest : public CliTest {
 protected:
  static constexpr std::int64_t L = 2, H = 2, N = 37, d = 8, Hq = 4, m = 3, keep = 12;
  std::vector<float> q, qk;
  std::string q_path, qk_path;

  void SetUp() override {
    CliTest::SetUp();
    ASSERT_EQ(run_cli(compress({"--keep", std::to_string(keep)})).code, 0);
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    q.resize(static_cast<std::size_t>(L * Hq * m * d));
    qk.resize(static_cast<std::size_t>(L * H * m * d));
    for (auto& x : q) x = 3 * normal(rng);
    for (auto& x : qk) x = normal(rng);
    q_path = dir / "q.npy";
    qk_path = dir / "qk.npy";
    npy::write(q_path, {L, Hq, m, d}, q.data());
    npy::write(qk_path, {L, H, m, d}, qk.data());
  }

  NaiveHeadRecall naive(std::int64_t l, std::int64_t h) const {
    const npy::Array keys = npy::read(k);
    const npy::Array kept = npy::read(out + "/kept_" + std::to_string(l) + ".npy");
    return naive_head_recall(keys.data<float>() + (l * H + h) * N * d,
                             {kept.data<std::int32_t>() + h * keep, kept.data<std::int32_t>() + (h + 1) * keep}, q, qk,
                             l, h, H, Hq, N, m, d);
  }

  static std::vector<std::int64_t> row(const npy::Array& got, std::int64_t h, std::int64_t budget) {
    return {got.data<std::int64_t>() + h * budget, got.data<std::int64_t>() + (h + 1) * budget};
  }
};

// Per head: each (layer, KV head)'s recalled tokens are the best whole blocks of its
// evicted tokens.
TEST_F(CliRecallTest, BringsBackTheBlocksANaiveAttentionRanksFirst) {
  const std::int64_t budget = 16, block = 8;
  const std::string rec = dir / "rec";
  const Result r = run_cli({"recall", "--k", k, "--kept", out, "--q", q_path, "--question-k", qk_path, "--out", rec,
                            "--recall", std::to_string(budget), "--block", std::to_string(block)});
  ASSERT_EQ(r.code, 0) << r.err;
  for (std::int64_t l = 0; l < L; ++l) {
    const npy::Array got = npy::read(rec + "/recalled_" + std::to_string(l) + ".npy");
    ASSERT_EQ(got.shape, (std::vector<std::int64_t>{H, budget}));
    for (std::int64_t h = 0; h < H; ++h) {
      const NaiveHeadRecall ref = naive(l, h);
      EXPECT_EQ(row(got, h, budget), naive_best_blocks(ref.evicted, ref.best, block, budget))
          << "layer " << l << ", head " << h;
    }
  }
  const auto summary = nlohmann::json::parse(test::read_bytes(rec + "/summary.json"));
  EXPECT_EQ(summary["recall"], budget);
  EXPECT_EQ(summary["scope"], "per_head");
  EXPECT_EQ(summary["recalled"].size(), static_cast<std::size_t>(L * H));
  // Query heads that are no multiple of the KV heads: refused by name, no output folder.
  const std::string bad_q = dir / "bad_q.npy";
  npy::write(bad_q, {L, 3, m, d}, q.data());
  const Result bad = run_cli({"recall", "--k", k, "--kept", out, "--q", bad_q, "--question-k", qk_path, "--out",
                              dir / "rec2", "--recall", "8"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--q " + bad_q + " has shape [2, 3, 3, 8]"), std::string::npos) << bad.err;
  EXPECT_FALSE(fs::exists(dir / "rec2"));
}

// --shared: one ranking of positions, a position scoring the best any (layer, KV head)
// that evicted it gives it, blocks of neighbouring evicted-anywhere positions; each
// head gets the chosen positions it evicted.
TEST_F(CliRecallTest, SharedRanksPositionsOnceForEveryHead) {
  const std::int64_t budget = 10, block = 5;
  const std::string rec = dir / "rec";
  const Result r = run_cli({"recall", "--k", k, "--kept", out, "--q", q_path, "--question-k", qk_path, "--out", rec,
                            "--recall", std::to_string(budget), "--block", std::to_string(block), "--shared"});
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<double> best(N, -1.0);
  std::vector<std::vector<NaiveHeadRecall>> heads(L);
  for (std::int64_t l = 0; l < L; ++l)
    for (std::int64_t h = 0; h < H; ++h) {
      heads[l].push_back(naive(l, h));
      const NaiveHeadRecall& ref = heads[l].back();
      for (std::size_t e = 0; e < ref.evicted.size(); ++e)
        best[ref.evicted[e]] = std::max(best[ref.evicted[e]], ref.best[e]);
    }
  std::vector<std::int64_t> positions;
  std::vector<double> scores;
  for (std::int64_t t = 0; t < N; ++t)
    if (best[t] >= 0) positions.push_back(t), scores.push_back(best[t]);
  std::vector<std::int64_t> chosen = naive_best_blocks(positions, scores, block, budget);
  chosen.erase(std::remove(chosen.begin(), chosen.end(), -1), chosen.end());
  ASSERT_FALSE(chosen.empty());
  for (std::int64_t l = 0; l < L; ++l) {
    const npy::Array got = npy::read(rec + "/recalled_" + std::to_string(l) + ".npy");
    for (std::int64_t h = 0; h < H; ++h) {
      const auto& ev = heads[l][h].evicted;
      std::vector<std::int64_t> want;
      for (const std::int64_t t : chosen)
        if (std::binary_search(ev.begin(), ev.end(), t)) want.push_back(t);
      want.resize(static_cast<std::size_t>(budget), -1);
      EXPECT_EQ(row(got, h, budget), want) << "layer " << l << ", head " << h;
    }
  }
  EXPECT_EQ(nlohmann::json::parse(test::read_bytes(rec + "/summary.json"))["scope"], "shared");
  // A digest bounds one head's block: with --shared it is refused by name.
  const Result bad = run_cli({"recall", "--k", k, "--kept", out, "--q", q_path, "--question-k", qk_path, "--out",
                              dir / "rec2", "--shared", "--score", "digest"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--score digest with --shared"), std::string::npos) << bad.err;
  EXPECT_FALSE(fs::exists(dir / "rec2"));
}

}  // namespace
}  // namespace flashcache
