#pragma once
// Which DCT frequencies of one transform (a whole sequence, or one block) form
// the Base KV, for each kind of ScoreOptions::base (CPU; the GPU replays the same
// order on the device).
//
// The count is the same for every kind: m = lowpass_cutoff(length, gamma).
//   lowpass: frequencies 0 .. m-1;
//   peak:    the m frequencies of most energy, ties to the lower frequency;
//   mixed:   the ceil(m / 2) lowest, then the others by energy (same ties).
// "Energy" of frequency k is sum over the head dim of its squared coefficient,
// of K or of V alone: each keeps its own base.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "flashcache/options.hpp"

namespace flashcache {

// The lowest frequencies every kind keeps before ranking by energy.
inline std::int64_t base_low_frequencies(Base kind, std::int64_t m) {
  return kind == Base::lowpass ? m : kind == Base::mixed ? (m + 1) / 2 : 0;
}

// Marks in `selected` (length `len`, 1 = in the base) the base frequencies of
// one transform whose frequency energies are energy[0 .. len). `order` is
// caller scratch, grown once and then reused: nothing is allocated once warm.
template <class Real>
void choose_base_frequencies(Base kind, const Real* energy, std::int64_t len, std::int64_t m,
                             std::vector<std::int32_t>* order, std::uint8_t* selected) {
  const std::int64_t low = std::min(base_low_frequencies(kind, m), len);
  std::fill(selected, selected + len, std::uint8_t{0});
  std::fill(selected, selected + low, std::uint8_t{1});
  const std::int64_t rest = std::min(m, len) - low;
  if (rest <= 0) return;
  order->resize(static_cast<std::size_t>(len - low));
  for (std::int64_t k = low; k < len; ++k) (*order)[static_cast<std::size_t>(k - low)] = static_cast<std::int32_t>(k);
  // Most energy first, ties to the lower frequency: a strict weak order, so
  // every platform picks the same set.
  const auto stronger = [energy](std::int32_t a, std::int32_t b) {
    return energy[a] > energy[b] || (energy[a] == energy[b] && a < b);
  };
  std::nth_element(order->begin(), order->begin() + (rest - 1), order->end(), stronger);
  for (std::int64_t i = 0; i < rest; ++i) selected[(*order)[static_cast<std::size_t>(i)]] = 1;
}

}  // namespace flashcache
