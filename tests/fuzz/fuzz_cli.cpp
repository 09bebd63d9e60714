// fuzz_cli: the `flashcache` command line (compress, inspect) run in-process
// on argument lists and input files decoded from the bytes.
//
// Input format (seeds: tests/fuzz/corpus/fuzz_cli, made by make_seeds.py):
//   arguments, one per line, up to the first NUL byte (or the end);
//   then files, each: 1 byte name index (k.npy v.npy q.npy m.npy), 2 bytes
//   little-endian length, the content (cut at the end of the input).
// Everything runs inside a private scratch folder, emptied after each input.
// Arguments containing '/' or ".." are skipped, so that --out --force can
// never reach outside it.
//
// Invariants: the exit code is 0 or 2 (1 means a write failed or an internal
// error, neither of which may happen here); a failed run leaves no output and no
// staging folder; a successful compress leaves a complete, consistent folder.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "fuzz_util.hpp"
#include "npy/npy.hpp"
#include "run_cli.hpp"

namespace fs = std::filesystem;
namespace fz = flashcache::fuzz;
namespace npy = flashcache::npy;

namespace {

constexpr const char* kFileNames[] = {"k.npy", "v.npy", "q.npy", "m.npy"};
constexpr std::size_t kMaxArgs = 40;

struct Decoded {
  std::vector<std::string> args;
  std::vector<std::pair<std::string, std::string>> files;
};

Decoded decode(const std::uint8_t* data, std::size_t size) {
  Decoded d;
  const char* p = reinterpret_cast<const char*>(data);
  const char* end = p + size;
  const char* nul = static_cast<const char*>(std::memchr(p, '\0', size));
  const char* args_end = nul ? nul : end;
  std::string cur;
  for (const char* c = p; c < args_end; ++c) {
    if (*c == '\n') {
      d.args.push_back(cur);
      cur.clear();
    } else {
      cur += *c;
    }
  }
  if (!cur.empty() || (args_end > p && args_end[-1] != '\n')) d.args.push_back(cur);
  if (d.args.size() > kMaxArgs) d.args.resize(kMaxArgs);
  p = nul ? nul + 1 : end;
  while (end - p >= 3) {
    const std::string name = kFileNames[static_cast<unsigned char>(p[0]) % 4];
    std::size_t len = static_cast<unsigned char>(p[1]) | (static_cast<std::size_t>(static_cast<unsigned char>(p[2])) << 8);
    p += 3;
    len = std::min<std::size_t>(len, static_cast<std::size_t>(end - p));
    d.files.emplace_back(name, std::string(p, len));
    p += len;
  }
  return d;
}

bool safe(const std::string& arg) { return arg.find('/') == std::string::npos && arg.find("..") == std::string::npos; }

std::string out_arg(const std::vector<std::string>& args) {
  std::string out;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--out" && i + 1 < args.size()) out = args[i + 1];
    if (args[i].rfind("--out=", 0) == 0) out = args[i].substr(6);
  }
  return out;
}

// No hidden staging or aside folders may survive a run that has returned.
void check_no_leftovers(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    FUZZ_CHECK(name.find(".flashcache-") == std::string::npos, "leftover " + name);
  }
}

// A successful compress wrote every file, with consistent shapes and ascending kept indices.
void check_output(const fs::path& out) {
  FUZZ_CHECK(fs::is_regular_file(out / "summary.json"), out.string());
  const npy::Array scores = npy::read((out / "scores.npy").string());
  const npy::Array budgets = npy::read((out / "budgets.npy").string());
  FUZZ_CHECK(scores.shape.size() == 3 && budgets.shape.size() == 1 && budgets.shape[0] == scores.shape[0],
             npy::shape_string(scores.shape) + " " + npy::shape_string(budgets.shape));
  const std::int64_t L = scores.shape[0], H = scores.shape[1], N = scores.shape[2];
  const std::int64_t* b = budgets.data<std::int64_t>();
  for (std::int64_t l = 0; l < L; ++l) {
    FUZZ_CHECK(b[l] >= 0 && b[l] <= N, "budget " + std::to_string(b[l]));
    const npy::Array kept = npy::read((out / ("kept_" + std::to_string(l) + ".npy")).string());
    FUZZ_CHECK((kept.shape == std::vector<std::int64_t>{H, b[l]}), npy::shape_string(kept.shape));
    const std::int32_t* idx = kept.data<std::int32_t>();
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t j = 0; j < b[l]; ++j) {
        const std::int32_t t = idx[h * b[l] + j];
        FUZZ_CHECK(t >= 0 && t < N, "kept index out of range");
        FUZZ_CHECK(j == 0 || t > idx[h * b[l] + j - 1], "kept indices not ascending");
      }
    for (const char* kv : {"k_", "v_"}) {
      const npy::Array x = npy::read((out / (kv + std::to_string(l) + ".npy")).string());
      FUZZ_CHECK(x.shape.size() == 3 && x.shape[0] == H && x.shape[1] == b[l], npy::shape_string(x.shape));
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const Decoded d = decode(data, size);
  if (!std::all_of(d.args.begin(), d.args.end(), safe)) return 0;
  const fs::path& dir = fz::ScratchDir::path();
  for (const auto& [name, content] : d.files) fz::write_file(dir / name, content.data(), content.size());

  std::vector<std::string> storage = {"flashcache"};
  storage.insert(storage.end(), d.args.begin(), d.args.end());
  std::vector<char*> argv;
  for (auto& s : storage) argv.push_back(s.data());
  argv.push_back(nullptr);

  const int home = ::open(".", O_RDONLY | O_DIRECTORY);
  FUZZ_CHECK(home >= 0 && ::chdir(dir.c_str()) == 0, dir.string());
  const int rc = flashcache::cli::run_cli(static_cast<int>(storage.size()), argv.data());
  FUZZ_CHECK(rc == 0 || rc == 2, "exit code " + std::to_string(rc));
  check_no_leftovers(".");
  const std::string out = out_arg(d.args);
  // Help and version print and succeed without writing; "-xh" stacks short flags, so any of them may ask for help.
  const bool help = std::any_of(d.args.begin(), d.args.end(), [](const std::string& a) {
    return a == "--help" || a == "--version" || (a.size() > 1 && a[0] == '-' && a[1] != '-' && a.find('h') != std::string::npos);
  });
  const bool compress = !d.args.empty() && d.args[0] == "compress" && !help;
  if (compress && rc == 0) check_output(out);
  const bool names_an_input =
      std::any_of(d.files.begin(), d.files.end(), [&](const auto& f) { return f.first == out; });
  std::error_code ec;  // --out may be any string, e.g. a name too long for the file system
  if (rc != 0 && !out.empty() && out != "." && !names_an_input)
    FUZZ_CHECK(!fs::exists(out, ec), "a failed run left --out " + out);
  FUZZ_CHECK(::fchdir(home) == 0 && ::close(home) == 0, "cannot return to the working folder");
  fz::ScratchDir::clear();
  return 0;
}
