#pragma once
// Small helpers shared by the quality evaluations (quality_eval, grid_eval):
// comma lists, the run's provenance (command output, UTC time), means and
// medians, and [L, H, N, d] float16/float32 arrays read as float.
#include <flashcache/types.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "npy/npy.hpp"

namespace flashcache::quality {

// "a,b,,c" -> {a, b, c}
inline std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

// The standard output of a shell command, trailing newlines and blanks removed
// (empty when it cannot run): the git revision and machine in a record.
inline std::string run_text(const std::string& cmd) {
  std::string out;
  if (std::FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[256];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    ::pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

inline std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

inline double mean_of(const std::vector<double>& x) {
  double s = 0;
  for (double e : x) s += e;
  return x.empty() ? 0.0 : s / static_cast<double>(x.size());
}

inline double median_of(std::vector<double> x) {
  if (x.empty()) return 0.0;
  std::sort(x.begin(), x.end());
  const std::size_t m = x.size() / 2;
  return x.size() % 2 ? x[m] : 0.5 * (x[m - 1] + x[m]);
}

// A 4-d float16 or float32 array as float; a NaN or infinity is refused (the
// fixtures are finite, so one is a broken file).
inline std::vector<float> load_floats(const std::string& path, std::vector<std::int64_t>* shape) {
  const npy::Array a = npy::read(path);
  if (a.shape.size() != 4) throw std::runtime_error(path + ": expected a 4-d array [L, H, N, d]");
  *shape = a.shape;
  const auto n = static_cast<std::size_t>(npy::element_count(a.shape));
  std::vector<float> out(n);
  if (a.is<half_t>()) {
    for (std::size_t i = 0; i < n; ++i) out[i] = to_float(a.data<half_t>()[i]);
  } else if (a.is<float>()) {
    std::copy_n(a.data<float>(), n, out.begin());
  } else {
    throw std::runtime_error(path + ": expected float16 or float32");
  }
  for (float x : out)
    if (!std::isfinite(x)) throw std::runtime_error(path + ": holds a NaN or infinity");
  return out;
}

}  // namespace flashcache::quality
