#pragma once
// The one error model.
//
// Every check produces a Status: a code plus a message that names the problem
// ("keep budget 12 < 20 always-kept tokens"). The no-throw core and the GPU API
// return the Status (an engine may run them with -fno-exceptions or inside a
// CUDA graph capture); the CPU front door turns a failed one into a thrown
// flashcache::Error, and exists only when exceptions are on (config.hpp).
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>

#include "config.hpp"

namespace flashcache {

enum class Errc {
  ok = 0,
  invalid_shape,   // extents that do not fit together
  invalid_stride,  // strides that overlap or break the contiguous head dim
  invalid_budget,  // budgets out of range or below the protected set
  invalid_option,  // gamma, block size, sink/window, mask length ...
  unsupported,     // a valid request this build or kernel cannot run
  io_error,        // files (CLI, .npy)
  cuda_error,      // a CUDA runtime/library call failed
};

inline const char* to_string(Errc e) {
  switch (e) {
    case Errc::ok:
      return "ok";
    case Errc::invalid_shape:
      return "invalid shape";
    case Errc::invalid_stride:
      return "invalid stride";
    case Errc::invalid_budget:
      return "invalid budget";
    case Errc::invalid_option:
      return "invalid option";
    case Errc::unsupported:
      return "unsupported";
    case Errc::io_error:
      return "I/O error";
    case Errc::cuda_error:
      return "CUDA error";
  }
  return "unknown error";
}

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Errc code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status success() { return {}; }
  bool ok() const { return code_ == Errc::ok; }
  explicit operator bool() const { return ok(); }
  Errc code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Errc code_ = Errc::ok;
  std::string message_;
};

class Error : public std::runtime_error {
 public:
  explicit Error(const Status& s) : std::runtime_error("flashcache: " + s.message()), code_(s.code()) {}
  Error(Errc code, const std::string& message) : Error(Status(code, message)) {}
  Errc code() const { return code_; }

 private:
  Errc code_;
};

#if FLASHCACHE_EXCEPTIONS
// Throws when `s` is a failure; the CPU front door's way of surfacing a Status.
inline void throw_if_error(const Status& s) {
  if (!s.ok()) throw Error(s);
}
#endif

// Builds a message from streamable parts without <sstream> at every call site.
namespace detail {
inline void append(std::string& out, const std::string& s) { out += s; }
inline void append(std::string& out, const char* s) { out += s; }
inline void append(std::string& out, char c) { out += c; }
inline void append(std::string& out, double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  out += buf;
}
template <class T>
void append(std::string& out, const T& v) {
  out += std::to_string(v);
}
}  // namespace detail

template <class... Parts>
Status make_error(Errc code, const Parts&... parts) {
  std::string msg;
  (detail::append(msg, parts), ...);
  return Status(code, std::move(msg));
}

}  // namespace flashcache

// Propagates a failed Status to the caller.
#define FLASHCACHE_RETURN_IF_ERROR(expr)      \
  do {                                        \
    ::flashcache::Status fc_status_ = (expr); \
    if (!fc_status_.ok()) return fc_status_;  \
  } while (0)
