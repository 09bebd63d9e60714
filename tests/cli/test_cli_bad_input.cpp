// Every bad input to the `flashcache` binary: one line on stderr that names the problem,
// exit code 2, and no output folder.
#include "cli_harness.hpp"

namespace flashcache {
namespace {

using namespace cli_test;  // the tests' own harness
using test::lines_of;
using test::TempDir;

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
       "--gamma, --transform, --block, --normalize-terms, --mean-*, --bridge, --rope-* and --paper are used only by "
       "--policy flashcache, not streaming"},
      {"mean weight for a baseline",
       [](CliTest&) {
         return std::vector<std::string>{"--policy", "keydiff", "--mean-weight", "0.5"};
       },
       "are used only by --policy flashcache, not keydiff"},
      {"mean weight above 1",
       [](CliTest&) {
         return std::vector<std::string>{"--mean-weight", "1.5"};
       },
       "--mean-weight 1.5 is outside [0, 1]"},
      {"mean keep bounds out of order",
       [](CliTest&) {
         return std::vector<std::string>{"--mean-weight", "0.5", "--mean-full-keep", "0.2", "--mean-zero-keep", "0.4"};
       },
       "--mean-full-keep 0.2 is outside [--mean-zero-keep 0.4, 1]"},
      {"mean zero keep below 0",
       [](CliTest&) {
         return std::vector<std::string>{"--mean-zero-keep", "-0.1"};
       },
       "--mean-zero-keep -0.1 is outside [0, 1]"},
      {"bridge below 0",
       [](CliTest&) {
         return std::vector<std::string>{"--bridge", "-1"};
       },
       "--bridge -1 is outside [0, 64]"},
      {"mean distance not a kind",
       [](CliTest&) {
         return std::vector<std::string>{"--mean-distance", "cosine"};
       },
       "--mean-distance: cosine not in {kv_squared,key_cosine}"},
      {"mean distance for a baseline",
       [](CliTest&) {
         return std::vector<std::string>{"--policy", "keydiff", "--mean-distance", "key_cosine"};
       },
       "are used only by --policy flashcache, not keydiff"},
      {"bridge for a baseline",
       [](CliTest&) {
         return std::vector<std::string>{"--policy", "keydiff", "--bridge", "1"};
       },
       "are used only by --policy flashcache, not keydiff"},
      {"mean keep bound for a baseline",
       [](CliTest&) {
         return std::vector<std::string>{"--policy", "knorm", "--mean-full-keep", "0.5"};
       },
       "are used only by --policy flashcache, not knorm"},
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
      {"grid base share above 1",  // the library's grid_base_share, named by its flag as a whole word
       [](CliTest&) {
         return std::vector<std::string>{"--grid-base-share", "1.5"};
       },
       "--grid-base-share 1.5 is outside [0, 1]"},
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

}  // namespace
}  // namespace flashcache
