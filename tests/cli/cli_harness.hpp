#pragma once
// What the tests of the `flashcache` binary share (test_cli_*.cpp): running it as a user
// would, the test caches, the check of every output file of a compress run against its
// inputs, and the CliTest fixture (a fresh folder with a K and V cache).
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

namespace flashcache::cli_test {

namespace fs = std::filesystem;
using test::lines_of;
using test::TempDir;

struct Result {
  int code = -1;
  std::string out, err;
};

inline std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs the binary with `args`; stdout and stderr go to a folder of their own
// so that the work folder holds only what the test and the CLI put there.
inline Result run_cli(const std::vector<std::string>& args) {
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

inline constexpr std::int64_t kOutlierToken = 17;

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

inline bool contains(const npy::Array& kept, std::int64_t h, std::int64_t token) {
  const std::int64_t b = kept.shape[1];
  const std::int32_t* row = kept.data<std::int32_t>() + h * b;
  return std::find(row, row + b, static_cast<std::int32_t>(token)) != row + b;
}

// Checks every file of a compress run against the inputs; returns what the
// tests check further.
inline Outputs check_outputs(const std::string& out, const std::string& k_path, const std::string& v_path) {
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
inline void expect_only(const fs::path& dir, std::vector<std::string> keep) {
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

}  // namespace flashcache::cli_test
