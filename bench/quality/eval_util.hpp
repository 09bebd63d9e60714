#pragma once
// Small helpers shared by the quality evaluations (quality_eval, grid_eval):
// comma lists, means and medians. The caches are read by cache_io.hpp, the
// results files and their provenance written by results_io.hpp.
#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

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

}  // namespace flashcache::quality
