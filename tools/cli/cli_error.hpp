#pragma once
// How the CLI fails: one message and an exit code; main() prints
// "flashcache: <message>" on stderr and exits with the code.
#include <cstdio>
#include <stdexcept>
#include <string>

namespace flashcache::cli {

enum ExitCode : int {
  kExitOk = 0,
  kExitFailure = 1,  // the inputs were fine but writing the outputs failed
  kExitUsage = 2,    // bad options or bad input files: nothing was written
};

class CliError : public std::runtime_error {
 public:
  CliError(int code, const std::string& message) : std::runtime_error(message), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

// A number as people write it in messages: 0.2, 1e-05, 37.
inline std::string num(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

[[noreturn]] inline void usage_error(const std::string& message) { throw CliError(kExitUsage, message); }

}  // namespace flashcache::cli
