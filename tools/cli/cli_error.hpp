#pragma once
// How the CLI fails: one message and an exit code; main() prints
// "flashcache: <message>" on stderr and exits with the code.
#include <cstdio>
#include <stdexcept>
#include <string>

#include "flashcache/enum_names.hpp"

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

// The value of enum E that flag `flag` names (its table, flashcache/enum_names.hpp); an unknown
// name is a usage error that lists the choices.
template <class E>
E enum_flag(const std::string& flag, const std::string& name) {
  E out{};
  if (const Status s = parse_enum(name, &out, flag.c_str()); !s.ok()) usage_error(s.message());
  return out;
}

}  // namespace flashcache::cli
