// The `flashcache` binary, run as a user would: every output file checked
// against the inputs, and every bad input refused with one line on stderr,
// exit code 2 and no output folder.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "flashcache/version.hpp"
#include "npy/npy.hpp"
#include "test_util.hpp"

#ifndef FLASHCACHE_CLI_PATH
#error "FLASHCACHE_CLI_PATH must name the flashcache binary"
#endif

namespace flashcache {
namespace {

namespace fs = std::filesystem;
using test::lines_of;
using test::TempDir;

struct Result {
  int code = -1;
  std::string out, err;
};

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs the binary with `args`; stdout and stderr go to a folder of their own
// so that the work folder holds only what the test and the CLI put there.
Result run_cli(const std::vector<std::string>& args) {
  static TempDir logs;
  std::string cmd = quote(FLASHCACHE_CLI_PATH);
  for (const auto& a : args) cmd += " " + quote(a);
  cmd += " > " + quote(logs / "out") + " 2> " + quote(logs / "err");
  const int status = std::system(cmd.c_str());
  Result r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = test::read_bytes(logs / "out");
  r.err = test::read_bytes(logs / "err");
  return r;
}

// ------------------------------------------------------------- test caches

constexpr std::int64_t kOutlierToken = 17;

// A smooth cache (a few slow waves along the tokens plus a little noise),
// with one planted outlier token in layer 0 of every head.
template <class T>
void write_cache(const std::string& k_path, const std::string& v_path, const std::vector<std::int64_t>& shape,
                 unsigned seed = 1) {
  const std::int64_t n = npy::element_count(shape);
  const std::int64_t N = shape[shape.size() - 2], d = shape.back();
  const std::int64_t heads = shape.size() >= 3 ? shape[shape.size() - 3] : 1;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> noise(-0.05f, 0.05f), phase(0.0f, 6.28f);
  for (const std::string& path : {k_path, v_path}) {
    std::vector<T> data(static_cast<std::size_t>(n));
    float p = 0;  // one phase per (layer, head)
    for (std::int64_t row = 0; row < n / d; ++row) {
      const std::int64_t t = row % N, layer_head = row / N;
      if (t == 0) p = phase(rng);
      for (std::int64_t c = 0; c < d; ++c) {
        float x = std::sin(0.15f * static_cast<float>(t) + p + static_cast<float>(c)) + noise(rng);
        if (t == kOutlierToken && layer_head < heads) x += 6.0f;  // layer 0
        data[static_cast<std::size_t>(row * d + c)] = T(x);
      }
    }
    npy::write(path, shape, data.data());
  }
}

// ---------------------------------------------------------- output checks

struct Outputs {
  std::vector<std::int64_t> budgets;
  std::vector<double> energy_ratio;
  std::vector<npy::Array> kept;  // per layer, [H, B_l] int32
  nlohmann::json summary;
};

bool contains(const npy::Array& kept, std::int64_t h, std::int64_t token) {
  const std::int64_t b = kept.shape[1];
  const std::int32_t* row = kept.data<std::int32_t>() + h * b;
  return std::find(row, row + b, static_cast<std::int32_t>(token)) != row + b;
}

// Checks every file of a compress run against the inputs; returns what the
// tests check further.
Outputs check_outputs(const std::string& out, const std::string& k_path, const std::string& v_path) {
  const npy::Array k = npy::read(k_path), v = npy::read(v_path);
  const std::size_t o = k.shape.size() - 3;
  const std::int64_t L = o ? k.shape[0] : 1, H = k.shape[o], N = k.shape[o + 1], d = k.shape[o + 2];
  const std::size_t item = npy::itemsize(k.dtype), row_bytes = static_cast<std::size_t>(d) * item;

  Outputs r;
  const npy::Array scores = npy::read(out + "/scores.npy");
  EXPECT_EQ(scores.dtype, "<f4");
  EXPECT_EQ(scores.shape, (std::vector<std::int64_t>{L, H, N}));
  const npy::Array ratio = npy::read(out + "/energy_ratio.npy");
  EXPECT_EQ(ratio.dtype, "<f8");
  EXPECT_EQ(ratio.shape, (std::vector<std::int64_t>{L}));
  r.energy_ratio.assign(ratio.data<double>(), ratio.data<double>() + L);
  const npy::Array budgets = npy::read(out + "/budgets.npy");
  EXPECT_EQ(budgets.dtype, "<i8");
  EXPECT_EQ(budgets.shape, (std::vector<std::int64_t>{L}));
  r.budgets.assign(budgets.data<std::int64_t>(), budgets.data<std::int64_t>() + L);

  std::vector<std::string> expected_files = {"budgets.npy", "energy_ratio.npy", "scores.npy", "summary.json"};
  for (std::int64_t l = 0; l < L; ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    const std::string n = std::to_string(l);
    expected_files.insert(expected_files.end(), {"kept_" + n + ".npy", "k_" + n + ".npy", "v_" + n + ".npy"});
    const std::int64_t B = r.budgets[static_cast<std::size_t>(l)];
    npy::Array kept = npy::read(out + "/kept_" + n + ".npy");
    EXPECT_EQ(kept.dtype, "<i4");
    EXPECT_EQ(kept.shape, (std::vector<std::int64_t>{H, B}));
    const npy::Array kc = npy::read(out + "/k_" + n + ".npy"), vc = npy::read(out + "/v_" + n + ".npy");
    for (const npy::Array* c : {&kc, &vc}) {
      EXPECT_EQ(c->dtype, k.dtype);
      EXPECT_EQ(c->shape, (std::vector<std::int64_t>{H, B, d}));
    }
    if (kept.shape != std::vector<std::int64_t>{H, B} ||
        kc.bytes.size() != static_cast<std::size_t>(H * B) * row_bytes || vc.bytes.size() != kc.bytes.size())
      return r;
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < B; ++i) {
        const std::int32_t t = kept.data<std::int32_t>()[h * B + i];
        if (t < 0 || t >= N) {
          ADD_FAILURE() << "kept index " << t << " outside [0, " << N << ")";
          return r;
        }
        if (i > 0) {
          EXPECT_LT(kept.data<std::int32_t>()[h * B + i - 1], t) << "kept indices must ascend";
        }
        // K'[h, i] is K[l, h, t], byte for byte; likewise V.
        const std::size_t src = static_cast<std::size_t>((l * H + h) * N + t) * row_bytes;
        const std::size_t dst = static_cast<std::size_t>(h * B + i) * row_bytes;
        EXPECT_EQ(std::memcmp(kc.bytes.data() + dst, k.bytes.data() + src, row_bytes), 0)
            << "K row h" << h << " t" << t;
        EXPECT_EQ(std::memcmp(vc.bytes.data() + dst, v.bytes.data() + src, row_bytes), 0)
            << "V row h" << h << " t" << t;
      }
    r.kept.push_back(std::move(kept));
  }

  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(out)) files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  std::sort(expected_files.begin(), expected_files.end());
  EXPECT_EQ(files, expected_files);

  r.summary = nlohmann::json::parse(test::read_bytes(out + "/summary.json"));
  const auto& s = r.summary;
  std::int64_t kept_total = 0;
  for (auto b : r.budgets) kept_total += b;
  EXPECT_EQ(s["version"], FLASHCACHE_VERSION_STRING);
  EXPECT_EQ(s["input"]["shape"].get<std::vector<std::int64_t>>(), k.shape);
  EXPECT_EQ(s["input"]["dtype"], item == 2 ? "float16" : "float32");
  EXPECT_EQ(s["shape"]["layers"], L);
  EXPECT_EQ(s["shape"]["heads"], H);
  EXPECT_EQ(s["shape"]["tokens"], N);
  EXPECT_EQ(s["shape"]["head_dim"], d);
  EXPECT_EQ(s["budgets"].get<std::vector<std::int64_t>>(), r.budgets);
  EXPECT_EQ(s["energy_ratio"].get<std::vector<double>>(), r.energy_ratio);
  EXPECT_EQ(s["tokens_before"], L * N);
  EXPECT_EQ(s["tokens_after"], kept_total);
  EXPECT_EQ(s["bytes_before"].get<std::int64_t>(), static_cast<std::int64_t>(k.bytes.size() + v.bytes.size()));
  EXPECT_EQ(s["bytes_after"].get<std::int64_t>(), 2 * H * kept_total * d * static_cast<std::int64_t>(item));
  return r;
}

// Nothing but `keep` in `dir`: no output folder, no hidden staging leftovers.
void expect_only(const fs::path& dir, std::vector<std::string> keep) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  std::sort(keep.begin(), keep.end());
  EXPECT_EQ(names, keep);
}

class CliTest : public ::testing::Test {
 public:  // the bad-input cases edit the fixture's files
  void SetUp() override {
    k = dir / "k.npy";
    v = dir / "v.npy";
    out = dir / "out";
    write_cache<float>(k, v, {2, 2, 37, 8});
  }
  std::vector<std::string> compress(std::vector<std::string> extra) const {
    std::vector<std::string> args = {"compress", "--k", k, "--v", v, "--out", out};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  TempDir dir;
  std::string k, v, out;
};

// ---------------------------------------------------------------- success

TEST_F(CliTest, Version) {
  const Result r = run_cli({"--version"});
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out, std::string(FLASHCACHE_VERSION_STRING) + "\n");
}

TEST_F(CliTest, Help) {
  Result r = run_cli({"--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("compress"), std::string::npos);
  EXPECT_NE(r.out.find("inspect"), std::string::npos);
  r = run_cli({"compress", "--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("--keep-ratio"), std::string::npos);
  EXPECT_NE(r.out.find("--no-allocate"), std::string::npos);
  for (const char* opt : {"--policy", "--q", "--tail-weight", "--tail-stride", "--seed", "--observation-window"})
    EXPECT_NE(r.out.find(opt), std::string::npos) << opt;
}

TEST_F(CliTest, KeepRatioAllocatesTheTotalAcrossLayers) {
  const Result r = run_cli(compress({"--keep-ratio", "0.2"}));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  const Outputs o = check_outputs(out, k, v);
  ASSERT_EQ(o.budgets.size(), 2u);
  EXPECT_EQ(o.budgets[0] + o.budgets[1], std::llround(0.2 * 2 * 37));
  // The planted outlier has more high-frequency energy: layer 0 gets more.
  EXPECT_GT(o.energy_ratio[0], o.energy_ratio[1]);
  EXPECT_GT(o.budgets[0], o.budgets[1]);
  for (std::int64_t h = 0; h < 2; ++h) EXPECT_TRUE(contains(o.kept[0], h, kOutlierToken)) << "head " << h;
  EXPECT_EQ(o.summary["options"]["keep_ratio"], 0.2);
  EXPECT_TRUE(o.summary["options"]["keep"].is_null());
  EXPECT_EQ(o.summary["options"]["policy"], "flashcache");  // the default
  EXPECT_TRUE(o.summary["options"]["seed"].is_null());
  EXPECT_TRUE(o.summary["options"]["observation_window"].is_null());
  EXPECT_TRUE(o.summary["input"]["q"].is_null());
  EXPECT_EQ(o.summary["options"]["allocation"], "dynamic");
  EXPECT_EQ(o.summary["options"]["gamma"], 0.1);
  EXPECT_EQ(o.summary["options"]["base"], "peak");
  EXPECT_EQ(o.summary["options"]["transform"], "global");  // the library's defaults
  EXPECT_EQ(o.summary["options"]["sink"], 4);
  EXPECT_EQ(o.summary["options"]["window_share"], 0.5);
  EXPECT_EQ(o.summary["nonfinite"], 0);
  expect_only(dir.path(), {"k.npy", "v.npy", "out"});
}

TEST_F(CliTest, Float16StaysFloat16) {
  write_cache<half_t>(k, v, {2, 2, 37, 8});
  const Result r = run_cli(compress({"--keep-ratio", "0.2"}));
  ASSERT_EQ(r.code, 0) << r.err;
  const Outputs o = check_outputs(out, k, v);  // checks k_<l>.npy is '<f2' and bit-equal to the input rows
  EXPECT_EQ(o.budgets[0] + o.budgets[1], std::llround(0.2 * 2 * 37));
  EXPECT_EQ(o.summary["input"]["dtype"], "float16");
  for (std::int64_t h = 0; h < 2; ++h) EXPECT_TRUE(contains(o.kept[0], h, kOutlierToken));
}

TEST_F(CliTest, NoAllocateKeepsTheSameRatioInEveryLayer) {
  const Result r = run_cli(compress({"--keep-ratio", "0.2", "--no-allocate"}));
  ASSERT_EQ(r.code, 0) << r.err;
  const Outputs o = check_outputs(out, k, v);
  EXPECT_EQ(o.budgets, (std::vector<std::int64_t>{std::llround(0.2 * 37), std::llround(0.2 * 37)}));
  EXPECT_EQ(o.summary["options"]["allocation"], "uniform");
}

TEST_F(CliTest, KeepIsACountPerLayer) {
  const Result r = run_cli(compress({"--keep", "5", "--gamma", "0.1", "--transform", "blocked", "--block", "16"}));
  ASSERT_EQ(r.code, 0) << r.err;
  const Outputs o = check_outputs(out, k, v);
  EXPECT_EQ(o.budgets, (std::vector<std::int64_t>{5, 5}));
  EXPECT_TRUE(o.summary["options"]["keep_ratio"].is_null());
  EXPECT_EQ(o.summary["options"]["keep"], 5);
  EXPECT_EQ(o.summary["options"]["gamma"], 0.1);
  EXPECT_EQ(o.summary["options"]["transform"], "blocked");
  EXPECT_EQ(o.summary["options"]["block"], 16);
}

TEST_F(CliTest, DefaultIsKeepRatio02) {
  const Result r = run_cli(compress({}));
  ASSERT_EQ(r.code, 0) << r.err;
  const Outputs o = check_outputs(out, k, v);
  EXPECT_EQ(o.budgets[0] + o.budgets[1], std::llround(0.2 * 2 * 37));
  EXPECT_EQ(o.summary["options"]["keep_ratio"], 0.2);
}

TEST_F(CliTest, ThreeDimensionalInputIsOneLayer) {
  write_cache<float>(k, v, {2, 37, 8});
  const Result r = run_cli(compress({"--keep-ratio", "0.25"}));
  ASSERT_EQ(r.code, 0) << r.err;
  const Outputs o = check_outputs(out, k, v);
  EXPECT_EQ(o.budgets, (std::vector<std::int64_t>{std::llround(0.25 * 37)}));
  EXPECT_EQ(o.summary["shape"]["layers"], 1);
}

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

TEST_F(CliTest, ProtectedTokensAreAlwaysKept) {
  for (const char* dtype : {"bool", "uint8"}) {
    SCOPED_TRACE(dtype);
    const std::uint8_t mask[37] = {0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                   0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0};
    const std::string mask_path = dir / "mask.npy";
    if (std::string(dtype) == "bool") {
      bool b[37];
      for (int i = 0; i < 37; ++i) b[i] = mask[i] != 0;
      npy::write(mask_path, {37}, b);
    } else {
      npy::write(mask_path, {37}, mask);
    }
    const Result r =
        run_cli(compress({"--keep-ratio", "0.3", "--sink", "2", "--window", "2", "--protect", mask_path, "--force"}));
    ASSERT_EQ(r.code, 0) << r.err;
    const Outputs o = check_outputs(out, k, v);
    for (std::size_t l = 0; l < 2; ++l)
      for (std::int64_t h = 0; h < 2; ++h)
        for (std::int64_t t : {0, 1, 3, 30, 35, 36})
          EXPECT_TRUE(contains(o.kept[l], h, t)) << l << " " << h << " " << t;
    EXPECT_EQ(o.summary["options"]["sink"], 2);
    EXPECT_EQ(o.summary["options"]["window"], 2);
    EXPECT_EQ(o.summary["options"]["protected_by_mask"], 2);
    EXPECT_EQ(o.summary["input"]["protect"], mask_path);
  }
}

TEST_F(CliTest, NonFiniteTokensAreCountedAndKept) {
  npy::Array a = npy::read(k);
  // One NaN in layer 1, head 0, token 5.
  a.data<float>()[((1 * 2 + 0) * 37 + 5) * 8 + 3] = std::numeric_limits<float>::quiet_NaN();
  npy::write(k, a);
  const Result r = run_cli(compress({"--keep-ratio", "0.2"}));
  ASSERT_EQ(r.code, 0) << r.err;
  const Outputs o = check_outputs(out, k, v);
  EXPECT_EQ(o.summary["nonfinite"], 1);
  EXPECT_TRUE(contains(o.kept[1], 0, 5));
}

// The table's R_l column matches energy_ratio.npy of a compress run with the same transform.
TEST_F(CliTest, InspectPrintsATable) {
  for (const std::vector<std::string>& t :
       {std::vector<std::string>{},
        std::vector<std::string>{"--gamma", "0.3", "--transform", "blocked", "--block", "8"}}) {
    std::vector<std::string> args = compress({"--force"});
    args.insert(args.end(), t.begin(), t.end());
    ASSERT_EQ(run_cli(args).code, 0);
    const npy::Array ratio = npy::read(out + "/energy_ratio.npy");

    args = {"inspect", "--k", k, "--v", v};
    args.insert(args.end(), t.begin(), t.end());
    const Result r = run_cli(args);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.err, "");
    int rows = 0;
    bool header = false, total = false;
    for (const std::string& line : lines_of(r.out)) {
      std::istringstream in(line);
      std::string first;
      in >> first;
      if (first == "layer") header = line.find("K below cutoff") != std::string::npos;
      if (first == "total") total = true;
      if (first == "0" || first == "1") {
        double k_low = -1, v_low = -1, r_l = -1;
        in >> k_low >> v_low >> r_l;
        EXPECT_TRUE(k_low >= 0 && k_low <= 1 && v_low >= 0 && v_low <= 1) << line;
        EXPECT_NEAR(r_l, ratio.data<double>()[std::stoi(first)], 2e-6) << line;
        ++rows;
      }
    }
    EXPECT_TRUE(header) << r.out;
    EXPECT_TRUE(total) << r.out;
    EXPECT_EQ(rows, 2) << r.out;
  }
}

TEST_F(CliTest, ExistingFolder) {
  // An empty folder is simply filled.
  fs::create_directory(out);
  ASSERT_EQ(run_cli(compress({})).code, 0);
  check_outputs(out, k, v);

  // A non-empty one is refused, untouched, unless --force.
  fs::remove_all(out);
  fs::create_directory(out);
  test::write_bytes(out + "/mine.txt", "keep me");
  const Result refused = run_cli(compress({}));
  EXPECT_EQ(refused.code, 2);
  EXPECT_NE(refused.err.find("--force"), std::string::npos) << refused.err;
  EXPECT_EQ(test::read_bytes(out + "/mine.txt"), "keep me");

  const Result forced = run_cli(compress({"--force"}));
  ASSERT_EQ(forced.code, 0) << forced.err;
  EXPECT_FALSE(fs::exists(out + "/mine.txt"));
  check_outputs(out, k, v);
  expect_only(dir.path(), {"k.npy", "v.npy", "out"});

  // A file is never replaced, even with --force.
  fs::remove_all(out);
  test::write_bytes(out, "a file");
  EXPECT_EQ(run_cli(compress({"--force"})).code, 2);
  EXPECT_EQ(test::read_bytes(out), "a file");
}

TEST_F(CliTest, MissingParentsAreCreated) {
  out = dir / "a/b/out";
  ASSERT_EQ(run_cli(compress({})).code, 0);
  check_outputs(out, k, v);
}

TEST_F(CliTest, WriteFailureExitsOneAndLeavesNothing) {
  // A folder nobody may write into; root may write anywhere but /proc.
  const bool root = ::geteuid() == 0;
  const fs::path locked = root ? fs::path("/proc") : dir.path() / "locked";
  if (!root) {
    fs::create_directory(locked);
    fs::permissions(locked, fs::perms::owner_read | fs::perms::owner_exec);
  }
  out = (locked / "flashcache-test-out").string();
  const Result r = run_cli(compress({}));
  if (!root) fs::permissions(locked, fs::perms::owner_all);
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(lines_of(r.err).size(), 1u) << r.err;
  EXPECT_FALSE(fs::exists(out));
  if (!root) expect_only(locked, {});
}

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
  EXPECT_TRUE(opt["rope_theta"].is_null());
  EXPECT_EQ(opt["gamma"], 0.2);
  EXPECT_EQ(opt["transform"], "global");
  EXPECT_EQ(opt["allocation"], "dynamic");
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

// -------------------------------------------------------------- bad input

struct BadCase {
  const char* name;
  std::function<std::vector<std::string>(CliTest&)> setup;  // writes files, returns extra arguments
  const char* message;                                      // a part of the one error line
};

TEST_F(CliTest, BadInputIsOneLineExitTwoAndNoOutput) {
  const std::string mask = dir / "mask.npy";
  const std::vector<BadCase> cases = {
      {"truncated K",
       [](CliTest& t) {
         const std::string b = test::read_bytes(t.k);
         test::write_bytes(t.k, b.substr(0, b.size() - 5));
         return std::vector<std::string>{};
       },
       "k.npy: truncated data"},
      {"truncated V header",
       [](CliTest& t) {
         test::write_bytes(t.v, test::read_bytes(t.v).substr(0, 50));
         return std::vector<std::string>{};
       },
       "v.npy: truncated header"},
      {"wrong magic",
       [](CliTest& t) {
         std::string b = test::read_bytes(t.v);
         b[0] = 'X';
         test::write_bytes(t.v, b);
         return std::vector<std::string>{};
       },
       "v.npy: not a .npy file"},
      {"Fortran order",
       [](CliTest& t) {
         std::string b = test::read_bytes(t.k);
         const std::size_t at = b.find("False");
         test::write_bytes(t.k, b.replace(at, 5, "True "));
         return std::vector<std::string>{};
       },
       "k.npy: Fortran-order arrays are not supported"},
      {"big-endian",
       [](CliTest& t) {
         std::string b = test::read_bytes(t.k);
         b[b.find("<f4")] = '>';
         test::write_bytes(t.k, b);
         return std::vector<std::string>{};
       },
       "k.npy: big-endian dtype"},
      {"unsupported dtype",
       [](CliTest& t) {
         std::string b = test::read_bytes(t.k);
         b.replace(b.find("<f4"), 3, "<c8");
         test::write_bytes(t.k, b);
         return std::vector<std::string>{};
       },
       "k.npy: unsupported dtype '<c8'"},
      {"integer cache",
       [](CliTest& t) {
         const std::vector<std::int32_t> x(2 * 2 * 37 * 8, 1);
         npy::write(t.k, {2, 2, 37, 8}, x.data());
         npy::write(t.v, {2, 2, 37, 8}, x.data());
         return std::vector<std::string>{};
       },
       "k.npy: a KV cache must be float32 or float16, not int32"},
      {"float64 cache",
       [](CliTest& t) {
         const std::vector<double> x(2 * 2 * 37 * 8, 1);
         npy::write(t.v, {2, 2, 37, 8}, x.data());
         return std::vector<std::string>{};
       },
       "v.npy: a KV cache must be float32 or float16, not float64"},
      {"K/V dtypes differ",
       [](CliTest& t) {
         write_cache<half_t>(t.dir / "h.npy", t.v, {2, 2, 37, 8});  // V becomes float16
         return std::vector<std::string>{};
       },
       "k.npy is float32 but"},
      {"K/V shapes differ",
       [](CliTest& t) {
         write_cache<float>(t.dir / "x.npy", t.v, {2, 2, 36, 8});  // V loses a token
         return std::vector<std::string>{};
       },
       "k.npy has shape [2, 2, 37, 8] but"},
      {"2-D cache",
       [](CliTest& t) {
         write_cache<float>(t.k, t.v, {37, 8});
         return std::vector<std::string>{};
       },
       "expected shape [L, H, N, d] or [H, N, d], got [37, 8]"},
      {"empty dimension",
       [](CliTest& t) {
         npy::write(t.k, {2, 0, 37, 8}, static_cast<const float*>(nullptr));
         npy::write(t.v, {2, 0, 37, 8}, static_cast<const float*>(nullptr));
         return std::vector<std::string>{};
       },
       "has an empty dimension"},
      {"missing K file",
       [](CliTest& t) {
         std::filesystem::remove(t.k);
         return std::vector<std::string>{};
       },
       "k.npy: cannot open"},
      {"mask of wrong length",
       [&mask](CliTest&) {
         const std::vector<std::uint8_t> m(36, 0);
         npy::write(mask, {36}, m.data());
         return std::vector<std::string>{"--protect", mask};
       },
       "mask.npy: a protect mask must have shape [37]"},
      {"mask of wrong dtype",
       [&mask](CliTest&) {
         const std::vector<float> m(37, 0);
         npy::write(mask, {37}, m.data());
         return std::vector<std::string>{"--protect", mask};
       },
       "mask.npy: a protect mask must be bool or uint8, not float32"},
      {"2-D mask",
       [&mask](CliTest&) {
         const std::vector<std::uint8_t> m(37, 0);
         npy::write(mask, {1, 37}, m.data());
         return std::vector<std::string>{"--protect", mask};
       },
       "a protect mask must have shape [37]"},
      {"gamma 0",
       [](CliTest&) {
         return std::vector<std::string>{"--gamma", "0"};
       },
       "--gamma 0 is outside (0, 1]"},
      {"gamma 1.5",
       [](CliTest&) {
         return std::vector<std::string>{"--gamma", "1.5"};
       },
       "--gamma 1.5 is outside"},
      {"gamma text",
       [](CliTest&) {
         return std::vector<std::string>{"--gamma", "abc"};
       },
       "--gamma"},
      {"keep-ratio 1.5",
       [](CliTest&) {
         return std::vector<std::string>{"--keep-ratio", "1.5"};
       },
       "--keep-ratio 1.5 is outside [0, 1]"},
      {"keep -1",
       [](CliTest&) {
         return std::vector<std::string>{"--keep", "-1"};
       },
       "--keep -1 is negative"},
      {"keep > N",
       [](CliTest&) {
         return std::vector<std::string>{"--keep", "38"};
       },
       "--keep 38 is more than the 37 tokens per layer"},
      {"keep and keep-ratio",
       [](CliTest&) {
         return std::vector<std::string>{"--keep", "3", "--keep-ratio", "0.1"};
       },
       "excludes"},
      {"budget below protected",
       [](CliTest&) {
         return std::vector<std::string>{"--keep", "3", "--sink", "5"};
       },
       "always-kept tokens"},
      {"ratio below protected",
       [](CliTest&) {
         return std::vector<std::string>{"--keep-ratio", "0.05", "--window", "10"};
       },
       "always-kept tokens"},
      {"negative sink",
       [](CliTest&) {
         return std::vector<std::string>{"--sink", "-1"};
       },
       "--sink -1 is negative"},
      {"negative window",
       [](CliTest&) {
         return std::vector<std::string>{"--window", "-2"};
       },
       "--window -2 is negative"},
      {"unknown transform",
       [](CliTest&) {
         return std::vector<std::string>{"--transform", "wavelet"};
       },
       "--transform"},
      {"block 0",
       [](CliTest&) {
         return std::vector<std::string>{"--transform", "blocked", "--block", "0"};
       },
       "--block 0 must be at least 1"},
      {"unknown option", [](CliTest&) { return std::vector<std::string>{"--frobnicate"}; }, "frobnicate"},
      {"unknown policy",
       [](CliTest&) {
         return std::vector<std::string>{"--policy", "lru"};
       },
       "--policy: lru not in"},
      {"snapkv without Q",
       [](CliTest&) {
         return std::vector<std::string>{"--policy", "snapkv"};
       },
       "--policy snapkv needs --q"},
      {"h2o without Q",
       [](CliTest&) {
         return std::vector<std::string>{"--policy", "h2o"};
       },
       "--policy h2o needs --q"},
      {"Q for a policy without queries",
       [](CliTest& t) {
         write_cache<float>(t.dir / "q.npy", t.dir / "q2.npy", {2, 2, 37, 8});
         return std::vector<std::string>{"--policy", "knorm", "--q", t.dir / "q.npy"};
       },
       "--q is used only by --policy flashcache (query tails), snapkv and h2o, not knorm"},
      {"Q with the paper's algorithm",
       [](CliTest& t) {
         write_cache<float>(t.dir / "q.npy", t.dir / "q2.npy", {2, 2, 37, 8});
         return std::vector<std::string>{"--paper", "--q", t.dir / "q.npy"};
       },
       "--paper is the paper's algorithm, which reads no queries"},
      {"tail weight without Q",
       [](CliTest&) {
         return std::vector<std::string>{"--tail-weight", "0.3"};
       },
       "--tail-weight, --tail-mix, --tail-stride, --tail-min-distance and --tail-last are used only by --policy "
       "flashcache with --q"},
      {"tail stride 0",
       [](CliTest& t) {
         write_cache<float>(t.dir / "q.npy", t.dir / "q2.npy", {2, 2, 37, 8});
         return std::vector<std::string>{"--q", t.dir / "q.npy", "--tail-stride", "0"};
       },
       "--tail-stride 0 must be at least 1"},
      {"tail weight above 1",
       [](CliTest& t) {
         write_cache<float>(t.dir / "q.npy", t.dir / "q2.npy", {2, 2, 37, 8});
         return std::vector<std::string>{"--q", t.dir / "q.npy", "--tail-weight", "1.5"};
       },
       "--tail-weight 1.5 is outside [0, 1]"},
      {"Q with other tokens",
       [](CliTest& t) {
         write_cache<float>(t.dir / "q.npy", t.dir / "q2.npy", {2, 2, 36, 8});
         return std::vector<std::string>{"--policy", "h2o", "--q", t.dir / "q.npy"};
       },
       "q.npy has shape [2, 2, 36, 8] but"},
      {"Q with other layers",
       [](CliTest& t) {
         write_cache<float>(t.dir / "q.npy", t.dir / "q2.npy", {3, 2, 37, 8});
         return std::vector<std::string>{"--policy", "snapkv", "--q", t.dir / "q.npy"};
       },
       "(Q needs K's layers, tokens and head dim)"},
      {"Q heads not a multiple",
       [](CliTest& t) {
         write_cache<float>(t.dir / "q.npy", t.dir / "q2.npy", {2, 3, 37, 8});
         return std::vector<std::string>{"--policy", "h2o", "--q", t.dir / "q.npy"};
       },
       "q.npy has 3 query heads, not a multiple of the 2 KV heads"},
      {"Q of another dtype",
       [](CliTest& t) {
         write_cache<half_t>(t.dir / "q.npy", t.dir / "q2.npy", {2, 2, 37, 8});
         return std::vector<std::string>{"--policy", "h2o", "--q", t.dir / "q.npy"};
       },
       "q.npy is float16 but"},
      {"missing Q file",
       [](CliTest& t) {
         return std::vector<std::string>{"--policy", "h2o", "--q", t.dir / "nope.npy"};
       },
       "nope.npy: cannot open"},
      {"seed without random",
       [](CliTest&) {
         return std::vector<std::string>{"--policy", "knorm", "--seed", "3"};
       },
       "--seed is used only by --policy random"},
      {"seed text",
       [](CliTest&) {
         return std::vector<std::string>{"--policy", "random", "--seed", "x"};
       },
       "--seed"},
      {"observation window without snapkv",
       [](CliTest& t) {
         write_cache<float>(t.dir / "q.npy", t.dir / "q2.npy", {2, 2, 37, 8});
         return std::vector<std::string>{"--policy", "h2o", "--q", t.dir / "q.npy", "--observation-window", "8"};
       },
       "--observation-window is used only by --policy snapkv"},
      {"observation window 0",
       [](CliTest& t) {
         write_cache<float>(t.dir / "q.npy", t.dir / "q2.npy", {2, 2, 37, 8});
         return std::vector<std::string>{"--policy", "snapkv", "--q", t.dir / "q.npy", "--observation-window", "0"};
       },
       "--observation-window 0 must be at least 1"},
      {"gamma for a baseline",
       [](CliTest&) {
         return std::vector<std::string>{"--policy", "streaming", "--gamma", "0.3"};
       },
       "--gamma, --transform, --block, --normalize-terms, --rope-* and --paper are used only by --policy "
       "flashcache, not streaming"},
      {"paper for a baseline",
       [](CliTest&) {
         return std::vector<std::string>{"--policy", "knorm", "--paper"};
       },
       "are used only by --policy flashcache, not knorm"},
      {"paper with a sink",
       [](CliTest&) {
         return std::vector<std::string>{"--paper", "--sink", "4"};
       },
       "--sink excludes --paper"},
      {"paper with gamma",
       [](CliTest&) {
         return std::vector<std::string>{"--paper", "--gamma", "0.3"};
       },
       "--paper fixes --gamma, --transform and --block"},
      {"paper with a base",
       [](CliTest&) {
         return std::vector<std::string>{"--paper", "--base", "peak"};
       },
       "--paper fixes --gamma, --transform and --block (and --base)"},
      {"base not a kind",
       [](CliTest&) {
         return std::vector<std::string>{"--base", "high"};
       },
       "--base: high not in {lowpass,peak,mixed}"},
      {"window share above 1",
       [](CliTest&) {
         return std::vector<std::string>{"--window-share", "1.5"};
       },
       "--window-share 1.5 is outside [0, 1]"},
      {"grid past the end",
       [](CliTest&) {
         return std::vector<std::string>{"--grid", "2:6:6"};
       },
       "--grid 2:6:6: tokens [2, 38) reach past the 37 tokens of the cache"},
      {"grid not three numbers",
       [](CliTest&) {
         return std::vector<std::string>{"--grid", "1:6"};
       },
       "--grid 1:6 is not FIRST:ROWS:COLS"},
      {"grid of no rows",
       [](CliTest&) {
         return std::vector<std::string>{"--grid", "1:0:6"};
       },
       "ROWS and COLS must be at least 1"},
      {"grids overlap",
       [](CliTest&) {
         return std::vector<std::string>{"--grid", "1:3:3", "--grid", "9:2:2"};
       },
       "--grid 9:2:2 overlaps --grid 1:3:3"},
      {"grid zone without grid",
       [](CliTest&) {
         return std::vector<std::string>{"--grid-zone", "triangle"};
       },
       "--grid-zone and --grid-tile need --grid"},
      {"grid tile 0",
       [](CliTest&) {
         return std::vector<std::string>{"--grid", "1:3:3", "--grid-tile", "0"};
       },
       "--grid-tile 0 must be at least 1"},
      {"grid with paper",
       [](CliTest&) {
         return std::vector<std::string>{"--grid", "1:3:3", "--paper"};
       },
       "excludes"},
      {"base share negative",
       [](CliTest&) {
         return std::vector<std::string>{"--base-share", "-0.25"};
       },
       "--base-share -0.25 is outside [0, 1]"},
      {"rope layout without theta",
       [](CliTest&) {
         return std::vector<std::string>{"--rope-layout", "interleaved"};
       },
       "--rope-theta is required"},
      {"rope theta 1",
       [](CliTest&) {
         return std::vector<std::string>{"--rope-theta", "1"};
       },
       "must be > 1"},
      {"out under a file",
       [](CliTest& t) {
         test::write_bytes(t.dir / "file", "x");
         t.out = t.dir / "file/out";
         return std::vector<std::string>{};
       },
       "is not a directory"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.name);
    // A fresh, valid cache for every case; the case then breaks one thing.
    for (const auto& e : fs::directory_iterator(dir.path())) fs::remove_all(e.path());
    out = dir / "out";
    write_cache<float>(k, v, {2, 2, 37, 8});
    const std::vector<std::string> extra = c.setup(*this);
    std::vector<std::string> args = compress(extra);
    std::vector<std::string> before;
    for (const auto& e : fs::directory_iterator(dir.path())) before.push_back(e.path().filename().string());

    const Result r = run_cli(args);
    EXPECT_EQ(r.code, 2);
    const auto lines = lines_of(r.err);
    ASSERT_EQ(lines.size(), 1u) << r.err;
    EXPECT_EQ(r.err.back(), '\n');
    EXPECT_EQ(lines[0].rfind("flashcache: ", 0), 0u) << lines[0];
    EXPECT_NE(lines[0].find(c.message), std::string::npos) << lines[0];
    EXPECT_EQ(r.out, "");
    expect_only(dir.path(), before);  // no output folder, no staging leftovers
  }
}

TEST_F(CliTest, ShapeMismatchNamesBothFiles) {
  write_cache<float>(dir / "x.npy", dir / "y.npy", {2, 2, 36, 8});
  const Result r = run_cli({"compress", "--k", k, "--v", dir / "x.npy", "--out", out});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "flashcache: " + k + " has shape [2, 2, 37, 8] but " + (dir / "x.npy") + " has [2, 2, 36, 8]\n");
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(CliTest, BadUsageIsOneLine) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {}, {"compress"}, {"compress", "--k", "k.npy"}, {"squash"}, {"inspect", "--k", k}}) {
    const Result r = run_cli(args);
    EXPECT_EQ(r.code, 2);
    ASSERT_EQ(lines_of(r.err).size(), 1u) << r.err;
    EXPECT_EQ(r.err.rfind("flashcache: ", 0), 0u) << r.err;
  }
}

TEST_F(CliTest, InspectRefusesBadFiles) {
  std::string b = test::read_bytes(v);
  b[0] = 'X';
  test::write_bytes(v, b);
  const Result r = run_cli({"inspect", "--k", k, "--v", v});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "flashcache: " + v + ": not a .npy file (wrong magic)\n");
}

}  // namespace
}  // namespace flashcache
