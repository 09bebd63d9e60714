#pragma once
// Bridging a head's scores over short gaps (ScoreOptions::bridge; CPU).
//
// The tokenizer spells a number digit by digit, and a number loses its
// meaning with one digit gone: a score that ranks most of a run high and one
// token of it a little lower drops that token first. A bridge raises every
// token that has a higher-scoring token within `gap` tokens on each side to the
// lower of the two (it fills holes up to 2 gap - 1 tokens wide), so that a run
// is kept or dropped whole; an isolated high token is left as it is (its
// neighbours have nothing high on their far side), so the bridge spends budget
// only inside runs.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "flashcache/rules.hpp"

namespace flashcache {
namespace detail {

// out[t] = max(in[t], min(L, R)), L the highest of in[t - gap .. t - 1] and R
// of in[t + 1 .. t + gap] (those inside [0, n)), over rankable scores only: an
// always-kept score (rules::always_kept_score) stays as it is and lends
// nothing to its neighbours. A side with no rankable score reads -inf, which
// raises nothing. in and out are [n] and do not overlap. O(n gap).
inline void bridge_scores(const float* in, float* out, std::int64_t n, std::int64_t gap) {
  const auto highest = [in](std::int64_t from, std::int64_t to) {  // over [from, to]
    float best = -std::numeric_limits<float>::infinity();
    for (std::int64_t s = from; s <= to; ++s)
      if (!rules::always_kept_score(in[s]) && in[s] > best) best = in[s];
    return best;
  };
  for (std::int64_t t = 0; t < n; ++t) {
    out[t] = in[t];
    if (rules::always_kept_score(in[t])) continue;
    const float left = highest(std::max<std::int64_t>(0, t - gap), t - 1);
    const float right = highest(t + 1, std::min(n - 1, t + gap));
    out[t] = std::max(in[t], std::min(left, right));
  }
}

}  // namespace detail
}  // namespace flashcache
