#pragma once
// Shared by the fuzz targets: a private scratch folder per process and a
// check that crashes the fuzzer (so that it saves the input) when an
// invariant breaks.
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <cstdio>
#if defined(__has_include)
#if __has_include(<sanitizer/common_interface_defs.h>)
#include <sanitizer/common_interface_defs.h>
#endif
#endif
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

namespace flashcache::fuzz {

// Aborts with a message: libFuzzer reports the crash and writes the input to crash-<hash>.
// The message also goes through the sanitizers' report channel, which libFuzzer
// keeps open when -close_fd_mask closes stderr (run_fuzz.sh does).
[[noreturn]] inline void violated(const char* what, const std::string& detail) {
  const std::string message = "fuzz invariant violated: " + std::string(what) + ": " + detail;
  std::fprintf(stderr, "%s\n", message.c_str());
#if defined(__has_include)
#if __has_include(<sanitizer/common_interface_defs.h>)
  __sanitizer_report_error_summary(message.c_str());
#endif
#endif
  std::abort();
}

#define FUZZ_CHECK(cond, detail) \
  do {                           \
    if (!(cond)) ::flashcache::fuzz::violated(#cond, (detail)); \
  } while (0)

// A folder per process, "flashcache-fuzz-<pid>" under /dev/shm (or $TMPDIR).
// libFuzzer ends with _Exit(), so no destructor removes it; instead each new
// process removes the folders of processes that no longer exist.
class ScratchDir {
 public:
  static const std::filesystem::path& path() {
    static const std::filesystem::path dir = make();
    return dir;
  }

  // Removes everything inside the folder, leaving it empty.
  static void clear() {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(path(), ec)) std::filesystem::remove_all(e.path(), ec);
  }

 private:
  static constexpr const char* kPrefix = "flashcache-fuzz-";

  // In memory where possible: on a disk-backed /tmp, creating files caps a target at a few hundred runs per second.
  static std::filesystem::path base() {
    std::error_code ec;
    if (std::getenv("TMPDIR") == nullptr && std::filesystem::is_directory("/dev/shm", ec) &&
        ::access("/dev/shm", W_OK) == 0)
      return "/dev/shm";
    return std::filesystem::temp_directory_path();
  }

  static void remove_stale(const std::filesystem::path& dir) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind(kPrefix, 0) != 0) continue;
      const std::string digits = name.substr(std::strlen(kPrefix));
      if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) continue;
      const long pid = std::strtol(digits.c_str(), nullptr, 10);
      if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) std::filesystem::remove_all(e.path(), ec);
    }
  }

  static std::filesystem::path make() {
    const std::filesystem::path b = base();
    remove_stale(b);
    const std::filesystem::path dir = b / (kPrefix + std::to_string(::getpid()));
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    if (!std::filesystem::create_directory(dir, ec)) violated("cannot create the scratch folder", dir.string());
    return dir;
  }
};

inline void write_file(const std::filesystem::path& path, const char* data, std::size_t size) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(data, static_cast<std::streamsize>(size));
  if (!f) violated("write_file", path.string());
}

}  // namespace flashcache::fuzz
