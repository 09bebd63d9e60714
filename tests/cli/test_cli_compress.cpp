// `flashcache compress` run as a user would: every output file checked against the
// inputs (cli_harness.hpp), the budgets, protected and non-finite tokens, and the output
// folder's life (an existing one, missing parents, a failed write that leaves nothing).
#include "cli_harness.hpp"

namespace flashcache {
namespace {

using namespace cli_test;  // the tests' own harness
using test::lines_of;
using test::TempDir;

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
  EXPECT_EQ(o.summary["options"]["gamma"], 0.05);
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

}  // namespace
}  // namespace flashcache
