#include "output_dir.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <memory>
#include <system_error>
#include <vector>

#include "cli_error.hpp"

namespace flashcache::cli {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void write_failure(const std::string& what, const std::error_code& ec) {
  throw CliError(kExitFailure, what + ": " + ec.message());
}

// The target as a folder name: "out/" and "out/." mean "out".
fs::path normal_target(const fs::path& target) {
  fs::path p = target.lexically_normal();
  if (!p.has_filename() && p.has_parent_path()) p = p.parent_path();
  const std::string name = p.filename().string();
  if (name.empty() || name == "." || name == ".." || p == p.root_path())
    usage_error("--out: '" + target.string() + "' does not name a new folder");
  return p;
}

fs::path parent_of(const fs::path& p) { return p.has_parent_path() ? p.parent_path() : fs::path("."); }

bool is_empty_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_empty(p, ec) && !ec;
}

// Hidden siblings are ".<name>.flashcache-<tmp|old>-<pid>-<n>", with the name cut
// so that they stay within the 255 bytes a file name may have.
constexpr std::size_t kSiblingNameKeep = 200;

bool name_is_cut(const fs::path& target) { return target.filename().string().size() > kSiblingNameKeep; }

std::string sibling_prefix(const fs::path& target) {
  return "." + target.filename().string().substr(0, kSiblingNameKeep) + ".flashcache-";
}

// A fresh hidden sibling of `target`; tag is "tmp" or "old".
fs::path make_sibling(const fs::path& target, const char* tag) {
  const fs::path parent = parent_of(target);
  for (int n = 0; n < 1000; ++n) {
    const fs::path p =
        parent / (sibling_prefix(target) + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(n));
    std::error_code ec;
    if (fs::create_directory(p, ec)) return p;
    if (ec) write_failure("cannot create a folder beside '" + target.string() + "'", ec);
  }
  throw CliError(kExitFailure, "cannot create a folder beside '" + target.string() + "': too many leftovers");
}

std::error_code rename_ec(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::rename(from, to, ec);
  return ec;
}

// Swaps two paths in one step (Linux renameat2); false if unsupported here.
bool exchange(const fs::path& a, const fs::path& b, std::error_code* ec) {
#if defined(RENAME_EXCHANGE)
  if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0) return true;
  if (errno != EINVAL && errno != ENOSYS) *ec = std::error_code(errno, std::generic_category());
#else
  (void)a;
  (void)b;
  (void)ec;
#endif
  return false;
}

bool process_gone(const std::string& digits) {
  if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) return false;
  const auto pid = static_cast<pid_t>(std::stol(digits));
  return pid > 0 && pid != ::getpid() && ::kill(pid, 0) != 0 && errno == ESRCH;
}

// What a run killed before it could clean up (SIGKILL, power loss) left beside
// the target: ".<name>.flashcache-tmp-<pid>-<n>" and ".<name>.flashcache-old-<pid>-<n>"
// of processes that no longer exist. A staging folder is deleted. An "old" one
// is the previous target moved aside by the non-atomic --force path: it is put
// back if the target is missing, and deleted otherwise. Best effort.
void clean_leftovers(const fs::path& target) {
  const std::string prefix = sibling_prefix(target);
  std::vector<fs::path> staging, old;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(parent_of(target), ec)) {
    const std::string name = e.path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string rest = name.substr(prefix.size());  // "tmp-<pid>-<n>" or "old-<pid>-<n>"
    const std::size_t dash = rest.find('-', 4);
    if (rest.size() < 4 || rest[3] != '-' || dash == std::string::npos || !process_gone(rest.substr(4, dash - 4)))
      continue;
    if (rest.compare(0, 3, "tmp") == 0) staging.push_back(e.path());
    // With a cut name an "old" folder may belong to another target: left alone.
    if (rest.compare(0, 3, "old") == 0 && !name_is_cut(target)) old.push_back(e.path());
  }
  for (const fs::path& p : old) {
    if (!fs::exists(fs::symlink_status(target, ec)))
      rename_ec(p, target);  // if this fails, the old folder stays where it is
    else
      fs::remove_all(p, ec);
  }
  for (const fs::path& p : staging) fs::remove_all(p, ec);
}

}  // namespace

void StagedDir::check_target(const fs::path& target, bool force) {
  const fs::path t = normal_target(target);
  std::error_code ec;
  const fs::file_status parent = fs::status(parent_of(t), ec);
  if (fs::exists(parent) && !fs::is_directory(parent))
    usage_error("--out: '" + parent_of(t).string() + "' is not a directory");
  const fs::file_status st = fs::symlink_status(t, ec);
  if (ec && ec != std::errc::no_such_file_or_directory)  // e.g. a name too long: refused before any work
    usage_error("--out: '" + t.string() + "': " + ec.message());
  if (!fs::exists(st)) return;
  if (!fs::is_directory(st)) usage_error("--out: '" + t.string() + "' exists and is not a directory");
  if (!force && !is_empty_dir(t))
    usage_error("--out: '" + t.string() + "' exists and is not empty (--force replaces it)");
}

StagedDir::StagedDir(const fs::path& target, bool force) : target_(normal_target(target)), force_(force) {
  std::error_code ec;
  fs::create_directories(parent_of(target_), ec);
  if (ec) write_failure("cannot create '" + parent_of(target_).string() + "'", ec);
  clean_leftovers(target_);
  staging_ = make_sibling(target_, "tmp");
}

StagedDir::~StagedDir() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(staging_, ec);  // best effort: the target was never touched
}

void StagedDir::commit() {
  // Checked again: the target may have appeared while we worked.
  check_target(target_, force_);
  std::error_code ec;
  const bool occupied = fs::exists(fs::symlink_status(target_, ec));
  if (!occupied || is_empty_dir(target_)) {
    // rename(2) replaces an empty directory atomically.
    if ((ec = rename_ec(staging_, target_))) write_failure("cannot move the results to '" + target_.string() + "'", ec);
    committed_ = true;
    return;
  }
  // --force over a non-empty folder: swap, then delete the old contents.
  if (exchange(staging_, target_, &ec)) {
    committed_ = true;
    fs::remove_all(staging_, ec);
    return;
  }
  if (ec) write_failure("cannot replace '" + target_.string() + "'", ec);
  // No atomic swap here: move the old folder aside, move ours in, delete the old one.
  const fs::path old = make_sibling(target_, "old");
  fs::remove(old, ec);
  if ((ec = rename_ec(target_, old))) write_failure("cannot move '" + target_.string() + "' aside", ec);
  if ((ec = rename_ec(staging_, target_))) {
    rename_ec(old, target_);  // put the old one back
    write_failure("cannot move the results to '" + target_.string() + "'", ec);
  }
  committed_ = true;
  fs::remove_all(old, ec);
}

void write_text_file(const fs::path& path, const std::string& text) {
  struct Closer {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::unique_ptr<std::FILE, Closer> f(std::fopen(path.c_str(), "wb"));
  auto fail = [&] {
    write_failure("cannot write '" + path.string() + "'", std::error_code(errno, std::generic_category()));
  };
  if (!f) fail();
  if (std::fwrite(text.data(), 1, text.size(), f.get()) != text.size() || std::fflush(f.get()) != 0) fail();
  if (std::fclose(f.release()) != 0) fail();
}

}  // namespace flashcache::cli
