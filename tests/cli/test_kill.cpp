// Nothing half-written: `flashcache compress` is killed with SIGKILL at random
// moments, and the output folder must then be either absent or complete
// (every file there, byte-identical to an uninterrupted run), an existing
// folder is never damaged without --force and is either intact or fully
// replaced with it, and hidden staging folders never pile up: the next run
// removes those of killed processes.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "npy/npy.hpp"
#include "test_util.hpp"

namespace flashcache {
namespace {

using test::TempDir;
namespace fs = std::filesystem;

constexpr std::int64_t kL = 4, kH = 2, kN = 256, kD = 32;  // small: a run is mostly process start and file writes

// Starts the CLI with its output thrown away; returns the child's pid.
pid_t spawn(const std::vector<std::string>& args) {
  std::vector<std::string> all = {FLASHCACHE_CLI_PATH};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::dup2(null, 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

struct Outcome {
  bool killed = false;  // SIGKILL arrived while it was still running
  int exit_code = -1;   // when it finished first

  static Outcome of(int status) {
    Outcome o;
    o.killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    if (WIFEXITED(status)) o.exit_code = WEXITSTATUS(status);
    return o;
  }
};

// Runs the CLI and kills it after `delay` (none: lets it finish).
Outcome run(const std::vector<std::string>& args, std::chrono::microseconds delay = std::chrono::microseconds(-1)) {
  const pid_t pid = spawn(args);
  EXPECT_GT(pid, 0);
  if (delay.count() >= 0) {
    const timespec ts{static_cast<time_t>(delay.count() / 1000000), static_cast<long>(delay.count() % 1000000) * 1000};
    ::nanosleep(&ts, nullptr);
    ::kill(pid, SIGKILL);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return Outcome::of(status);
}

// Hidden siblings a run leaves beside `out` (staging and moved-aside folders).
std::vector<std::string> sibling_names(const fs::path& out) {
  const std::string prefix = "." + out.filename().string().substr(0, 200) + ".flashcache-";  // names are cut at 200
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(out.parent_path())) {
    std::string name = e.path().filename().string();
    if (name.compare(0, prefix.size(), prefix) == 0) names.push_back(std::move(name));
  }
  return names;
}
int leftovers(const fs::path& out) { return static_cast<int>(sibling_names(out).size()); }

// Runs the CLI and kills it `after` the moment it starts writing: a hidden sibling of
// `out` that was not there before appears. A random moment alone seldom lands there,
// since writing is about a millisecond of a run on a fast machine.
Outcome run_killed_while_writing(const std::vector<std::string>& args, const fs::path& out,
                                 std::chrono::microseconds after) {
  const std::vector<std::string> before = sibling_names(out);  // a killed run's leftovers, deleted by this one
  const pid_t pid = spawn(args);
  EXPECT_GT(pid, 0);
  int status = 0;
  const auto is_new = [&](const std::string& n) { return std::find(before.begin(), before.end(), n) == before.end(); };
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    const std::vector<std::string> now = sibling_names(out);
    if (std::any_of(now.begin(), now.end(), is_new)) {
      std::this_thread::sleep_for(after);
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
  }
  return Outcome::of(status);
}

std::vector<std::string> file_names(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// The whole output of a run: every file summary.json implies, readable, with consistent shapes.
void expect_valid_output(const fs::path& out) {
  const nlohmann::json j = nlohmann::json::parse(test::read_bytes((out / "summary.json").string()));
  const std::int64_t L = j["shape"]["layers"], H = j["shape"]["heads"], N = j["shape"]["tokens"],
                     d = j["shape"]["head_dim"];
  ASSERT_EQ(L, kL);
  const auto budgets = j["budgets"].get<std::vector<std::int64_t>>();
  ASSERT_EQ(static_cast<std::int64_t>(budgets.size()), L);
  EXPECT_EQ(npy::read((out / "scores.npy").string()).shape, (std::vector<std::int64_t>{L, H, N}));
  EXPECT_EQ(npy::read((out / "energy_ratio.npy").string()).shape, (std::vector<std::int64_t>{L}));
  const npy::Array b = npy::read((out / "budgets.npy").string());
  ASSERT_EQ(b.shape, (std::vector<std::int64_t>{L}));
  for (std::int64_t l = 0; l < L; ++l) {
    const std::int64_t B = budgets[static_cast<std::size_t>(l)];
    EXPECT_EQ(b.data<std::int64_t>()[l], B);
    const std::string n = std::to_string(l);
    const npy::Array kept = npy::read((out / ("kept_" + n + ".npy")).string());
    ASSERT_EQ(kept.shape, (std::vector<std::int64_t>{H, B}));
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < B; ++i) {
        const std::int32_t t = kept.data<std::int32_t>()[h * B + i];
        ASSERT_TRUE(t >= 0 && t < N && (i == 0 || t > kept.data<std::int32_t>()[h * B + i - 1]));
      }
    EXPECT_EQ(npy::read((out / ("k_" + n + ".npy")).string()).shape, (std::vector<std::int64_t>{H, B, d}));
    EXPECT_EQ(npy::read((out / ("v_" + n + ".npy")).string()).shape, (std::vector<std::int64_t>{H, B, d}));
  }
}

// Same files as the reference run, byte for byte.
void expect_same_as(const fs::path& out, const fs::path& reference) {
  ASSERT_EQ(file_names(out), file_names(reference));
  for (const auto& name : file_names(reference))
    EXPECT_EQ(test::read_bytes((out / name).string()), test::read_bytes((reference / name).string())) << name;
}

class KillTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    std::vector<float> x(static_cast<std::size_t>(kL * kH * kN * kD));
    for (auto& v : x) v = normal(rng);
    npy::write(dir_ / "k.npy", {kL, kH, kN, kD}, x.data());
    for (auto& v : x) v = normal(rng);
    npy::write(dir_ / "v.npy", {kL, kH, kN, kD}, x.data());
    ASSERT_EQ(run(args(reference())).exit_code, 0);
    expect_valid_output(reference());
    const unsigned seed = std::random_device{}();
    RecordProperty("seed", static_cast<int>(seed));
    std::printf("kill test seed %u\n", seed);
    rng_.seed(seed);
  }

  // How long an uninterrupted run takes: the median of three (`prepare` runs before each).
  template <class Prepare>
  void measure(const std::vector<std::string>& a, int expected_exit, Prepare prepare) {
    std::vector<std::chrono::microseconds> times;
    for (int i = 0; i < 3; ++i) {
      prepare();
      const auto start = std::chrono::steady_clock::now();
      ASSERT_EQ(run(a).exit_code, expected_exit);
      times.push_back(std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start));
    }
    std::sort(times.begin(), times.end());
    run_time_ = times[1];
    prepare();
    std::printf("uninterrupted run: %lld us\n", static_cast<long long>(run_time_.count()));
  }

  std::vector<std::string> args(const fs::path& out, bool force = false) const {
    // The kill moments below assume that writing is much of a run: the cheap blocked low-pass
    // score keeps it so (the default global peak base scores several times longer under ASan).
    std::vector<std::string> a = {"compress", "--k", dir_ / "k.npy", "--v", dir_ / "v.npy", "--out", out.string(),
                                  "--transform", "blocked", "--base", "lowpass"};
    if (force) a.push_back("--force");
    return a;
  }
  fs::path reference() const { return dir_.path() / "reference"; }

  // A moment anywhere in a run, from before exec to just after it would have finished;
  // every other one in the last half, where the files are written and renamed.
  std::chrono::microseconds random_moment() {
    const std::int64_t t = run_time_.count(), lo = (++moments_ % 2) ? 0 : t / 2;
    return std::chrono::microseconds(std::uniform_int_distribution<std::int64_t>(lo, t * 12 / 10)(rng_));
  }

  // A delay after writing starts: up to a twentieth of a run, often less than the writing takes.
  std::chrono::microseconds moment_while_writing() {
    return std::chrono::microseconds(std::uniform_int_distribution<std::int64_t>(0, run_time_.count() / 20)(rng_));
  }

  // An existing folder with a file of known content.
  void make_existing(const fs::path& out) const {
    fs::create_directories(out);
    test::write_bytes((out / "precious.txt").string(), "not to be lost");
  }
  bool existing_intact(const fs::path& out) const {
    return file_names(out) == std::vector<std::string>{"precious.txt"} &&
           test::read_bytes((out / "precious.txt").string()) == "not to be lost";
  }

  TempDir dir_;
  std::chrono::microseconds run_time_{0};
  std::mt19937 rng_;
  int moments_ = 0;
};

constexpr int kKills = 30;  // per scenario; attempts that finish before the kill do not count

TEST_F(KillTest, NewFolderIsAbsentOrComplete) {
  const fs::path out = dir_.path() / "out";
  measure(args(out), 0, [&] { fs::remove_all(out); });
  int kills = 0, completed = 0, while_writing = 0;
  for (int attempt = 0; (kills < kKills || while_writing < 3) && attempt < 6 * kKills; ++attempt) {
    SCOPED_TRACE("attempt " + std::to_string(attempt));
    const Outcome o = attempt % 3 == 2 ? run_killed_while_writing(args(out), out, moment_while_writing())
                                       : run(args(out), random_moment());
    kills += o.killed;
    while_writing += o.killed && leftovers(out) > 0;
    if (!o.killed) {
      EXPECT_EQ(o.exit_code, 0);
    }
    if (fs::exists(out)) {
      expect_same_as(out, reference());
      expect_valid_output(out);
      ++completed;
      fs::remove_all(out);
    }
    // Each run deletes what killed runs left, then adds at most its own staging folder.
    EXPECT_LE(leftovers(out), 1);
    if (HasFatalFailure()) return;
  }
  EXPECT_GE(kills, kKills);
  EXPECT_GE(while_writing, 1);
  std::printf("new folder: %d kills mid-run (%d while writing), %d complete outputs\n", kills, while_writing,
              completed);
  // A run to the end cleans up after every killed one.
  ASSERT_EQ(run(args(out)).exit_code, 0);
  expect_same_as(out, reference());
  EXPECT_EQ(leftovers(out), 0);
}

TEST_F(KillTest, ForcedReplacementIsOldOrNewNeverDamaged) {
  const fs::path out = dir_.path() / "existing";
  measure(args(out, true), 0, [&] {
    fs::remove_all(out);
    make_existing(out);
  });
  int kills = 0, replaced = 0;
  for (int attempt = 0; kills < kKills && attempt < 4 * kKills; ++attempt) {
    SCOPED_TRACE("attempt " + std::to_string(attempt));
    const Outcome o = run(args(out, true), random_moment());
    kills += o.killed;
    if (!o.killed) {
      EXPECT_EQ(o.exit_code, 0);
    }
    // Without an atomic swap a killed run may leave the old folder moved aside; the next run puts it back.
    if (!fs::exists(out)) {
      EXPECT_TRUE(o.killed);
      ASSERT_GE(leftovers(out), 1);
      ASSERT_EQ(run(args(out)).exit_code, 2);  // without --force: puts the old folder back, then refuses to replace it
    }
    ASSERT_TRUE(fs::exists(out));
    if (!existing_intact(out)) {
      expect_same_as(out, reference());
      ++replaced;
      fs::remove_all(out);
      make_existing(out);
    }
    EXPECT_LE(leftovers(out), 2);  // a staging folder, and the old one while it is being deleted
    if (HasFatalFailure()) return;
  }
  EXPECT_GE(kills, kKills);
  std::printf("--force: %d kills mid-run, %d replacements\n", kills, replaced);
  ASSERT_EQ(run(args(out, true)).exit_code, 0);
  expect_same_as(out, reference());
  EXPECT_EQ(leftovers(out), 0);
}

TEST_F(KillTest, ExistingFolderIsNeverTouchedWithoutForce) {
  const fs::path out = dir_.path() / "existing";
  make_existing(out);
  measure(args(out), 2, [] {});
  for (int attempt = 0; attempt < 10; ++attempt) {
    SCOPED_TRACE("attempt " + std::to_string(attempt));
    const Outcome o = run(args(out), random_moment());
    if (!o.killed) {
      EXPECT_EQ(o.exit_code, 2);
    }
    ASSERT_TRUE(existing_intact(out));
    EXPECT_EQ(leftovers(out), 0);
  }
}

// Found by fuzz_cli: the hidden staging sibling is longer than the folder's
// name, so a long (but legal) --out name failed after all the work, and one
// past the file system's limit was reported as a write failure (exit 1).
TEST_F(KillTest, LongOutputNames) {
  const fs::path longest = dir_.path() / std::string(250, 'a');
  ASSERT_EQ(run(args(longest)).exit_code, 0);
  expect_same_as(longest, reference());
  EXPECT_EQ(leftovers(longest), 0);
  const fs::path too_long = dir_.path() / std::string(300, 'b');
  EXPECT_EQ(run(args(too_long)).exit_code, 2);  // a usage error, refused before any work
}

}  // namespace
}  // namespace flashcache
