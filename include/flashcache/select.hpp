#pragma once
// Stage 3, select: which tokens each head keeps (CPU).
//
// Guarantees, each checked by a test of the same name:
//   - every head keeps exactly `budget` tokens, listed in ascending order;
//   - protected tokens are always kept: the first `sink`, the last `window`,
//     those the caller's mask marks, and non-finite tokens (score +inf or NaN);
//   - the recent window (window_share) takes the newest tokens outside image
//     spans (ImageSpans), never a span's patches;
//   - the rest are the highest scores, ties to the lower token index;
//   - a budget below the protected set is an error, never a silent drop.
// The rules shared with the GPU come from rules.hpp.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "mask.hpp"
#include "options.hpp"
#include "rules.hpp"
#include "score.hpp"

namespace flashcache {

// A score that cannot be ranked (+inf from a non-finite row, or NaN): always kept.
inline bool is_forced_score(float s) { return rules::always_kept_score(s); }

// Whether token t of a layer of n tokens is in the caller's protected set
// (sink, window, mask); shared by all heads.
inline bool is_protected(std::int64_t t, std::int64_t n, const SelectOptions& opt, ProtectMask mask) {
  return rules::is_protected(t, n, opt.sink, opt.window, mask[t]);
}

// The protected set (sink, window, mask) of a layer of `tokens` tokens as
// bytes (tests and the GPU tests' references use it).
inline std::vector<std::uint8_t> protected_tokens(std::int64_t tokens, const SelectOptions& opt,
                                                  ProtectMask mask = {}) {
  std::vector<std::uint8_t> keep(static_cast<std::size_t>(tokens), 0);
  for (std::int64_t t = 0; t < tokens; ++t) keep[static_cast<std::size_t>(t)] = is_protected(t, tokens, opt, mask);
  return keep;
}

// The largest always-kept set over the layer's heads (protected or with an
// unrankable score): the least budget the layer can take.
inline std::int64_t protected_count(ScoreView s, const SelectOptions& opt, ProtectMask mask) {
  std::int64_t most = 0;
  for (std::int64_t h = 0; h < s.heads; ++h) {
    const float* score = s.head(h);
    std::int64_t count = 0;
    for (std::int64_t t = 0; t < s.tokens; ++t)
      count += is_protected(t, s.tokens, opt, mask) || is_forced_score(score[t]);
    most = std::max(most, count);
  }
  return most;
}

// The same from a precomputed protected set (bytes, one per token).
inline std::int64_t protected_count(const LayerScores& s, const std::vector<std::uint8_t>& base) {
  std::int64_t most = 0;
  for (std::int64_t h = 0; h < s.heads; ++h) {
    std::int64_t count = 0;
    for (std::int64_t t = 0; t < s.tokens; ++t) count += base[static_cast<std::size_t>(t)] || is_forced_score(s(h, t));
    most = std::max(most, count);
  }
  return most;
}

// The recent window of a layer whose heads keep `budget` tokens: the fixed
// `window` or round(window_share * budget), whichever is larger.
inline std::int64_t window_tokens(const SelectOptions& opt, std::int64_t budget) {
  return rules::recent_window(opt.window, opt.window_share, budget);
}

// Evenly spaced tokens of the base sample for a layer budget.
inline std::int64_t base_tokens(const SelectOptions& opt, std::int64_t budget) {
  return rules::base_sample_tokens(opt.base_share, budget);
}

// Marks the newest not-yet-kept tokens among the last `window`, at most
// `room` of them; returns how many it marked.
inline std::int64_t keep_recent(std::int64_t n, std::int64_t window, std::int64_t room, std::uint8_t* keep) {
  std::int64_t marked = 0;
  for (std::int64_t t = n - 1; t >= std::max<std::int64_t>(0, n - window) && marked < room; --t)
    if (!keep[t]) keep[t] = 1, ++marked;
  return marked;
}

// The same window over the newest `window` tokens outside image spans
// (rules::recent_window_start): a span's tokens are never the recent window.
inline std::int64_t keep_recent(std::int64_t n, std::int64_t window, std::int64_t room, ImageSpans spans,
                                std::uint8_t* keep) {
  if (spans.empty()) return keep_recent(n, window, room, keep);
  const std::int64_t start = rules::recent_window_start(n, window, spans);
  std::int64_t marked = 0;
  for (std::int64_t t = n - 1; t >= start && marked < room; --t) {
    bool in_span = false;
    for (const GridSpan& g : spans) in_span |= t >= g.first && t < g.end();
    if (!in_span && !keep[t]) keep[t] = 1, ++marked;
  }
  return marked;
}

// Marks `count` of the not-yet-kept tokens outside `skip`, spread evenly over
// them: the j-th pick is the free token at rank floor((j + 1/2) * free / count).
template <class Skip>
std::int64_t keep_evenly_spaced_if(std::int64_t n, std::int64_t count, std::uint8_t* keep, Skip skip) {
  std::int64_t free = 0;
  for (std::int64_t t = 0; t < n; ++t) free += !keep[t] && !skip(t);
  count = std::min(count, free);
  if (count <= 0) return 0;
  std::int64_t j = 0, rank = 0;
  for (std::int64_t t = 0; t < n && j < count; ++t) {
    if (keep[t] || skip(t)) continue;
    if (rank == rules::evenly_spaced_rank(j, count, free)) keep[t] = 1, ++j;
    ++rank;
  }
  return j;
}

inline std::int64_t keep_evenly_spaced(std::int64_t n, std::int64_t count, std::uint8_t* keep) {
  return keep_evenly_spaced_if(n, count, keep, [](std::int64_t) { return false; });
}

// Marks up to `count` free tokens of a span on a regular sub-grid of about
// sqrt(count rows / cols) rows by count / that columns, each pick at the
// centre of its cell. Returns how many it marked (fewer where a pick is
// already kept).
inline std::int64_t keep_grid_sample(const GridSpan& g, std::int64_t count, std::uint8_t* keep) {
  count = std::min(count, g.tokens());
  if (count <= 0) return 0;
  const rules::GridSampleShape shape = rules::grid_sample_shape(count, g.rows, g.cols);
  std::int64_t marked = 0;
  for (std::int64_t cell = 0; cell < shape.r * shape.c && marked < count; ++cell) {
    const std::int64_t t = rules::grid_sample_token(g.first, g.rows, g.cols, shape, cell);
    if (!keep[t]) keep[t] = 1, ++marked;
  }
  return marked;
}

// The base sample of a head keeping `budget` tokens, at most `room` of them.
// Without spans: round(base_share * budget) tokens evenly spaced. With spans,
// the budget is shared by free tokens: span g takes
// round(grid_base_share * budget * free_g / free) as a sub-grid, the tokens
// outside the spans round(base_share * budget * free_rest / free) evenly
// spaced among themselves.
inline std::int64_t keep_base_sample(std::int64_t n, std::int64_t budget, std::int64_t room, const SelectOptions& opt,
                                     ImageSpans spans, std::uint8_t* keep) {
  if (spans.empty()) return keep_evenly_spaced(n, std::min(base_tokens(opt, budget), room), keep);
  std::int64_t free = 0;
  for (std::int64_t t = 0; t < n; ++t) free += !keep[t];
  if (free == 0 || room <= 0) return 0;
  const auto share = [&](double ratio, std::int64_t part) { return rules::base_share_of(ratio, budget, part, free); };
  std::int64_t marked = 0, free_in_spans = 0;
  for (const GridSpan& g : spans) {
    std::int64_t part = 0;
    for (std::int64_t t = g.first; t < g.end(); ++t) part += !keep[t];
    free_in_spans += part;
    marked += keep_grid_sample(g, std::min(share(opt.grid_base_share, part), room - marked), keep);
  }
  const auto in_span = [spans](std::int64_t t) {
    for (const GridSpan& g : spans)
      if (t >= g.first && t < g.end()) return true;
    return false;
  };
  return marked +
         keep_evenly_spaced_if(n, std::min(share(opt.base_share, free - free_in_spans), room - marked), keep, in_span);
}

// Caller-owned scratch of select_tokens(): grows to the longest layer seen,
// then selection allocates nothing.
struct SelectWorkspace {
  std::vector<std::uint8_t> keep;
  std::vector<std::int32_t> candidates;
};

// Where select_tokens() writes: head h's kept indices at data + h * head_stride.
struct KeptView {
  std::int32_t* data = nullptr;
  std::int64_t head_stride = 0;  // at least the budget
};

// Writes the `budget` kept tokens of every head, ascending, into `kept`.
// The mask and the image spans, when given, must lie inside the layer's
// tokens. No allocation once `ws` has seen a layer this long.
inline Status select_tokens(ScoreView s, std::int64_t budget, const SelectOptions& opt, ProtectMask mask,
                            ImageSpans spans, SelectWorkspace* ws, KeptView kept) {
  FLASHCACHE_RETURN_IF_ERROR(check_options(opt));
  FLASHCACHE_RETURN_IF_ERROR(check_mask(mask, s.tokens));
  FLASHCACHE_RETURN_IF_ERROR(check_grid_spans(spans));
  FLASHCACHE_RETURN_IF_ERROR(check_grids_fit(spans, s.tokens));
  if (ws == nullptr) return make_error(Errc::invalid_shape, "select: null workspace");
  const std::int64_t n = s.tokens;
  if (s.heads < 0 || n < 0) return make_error(Errc::invalid_shape, "select: ", s.heads, " heads x ", n, " tokens");
  if (n > std::numeric_limits<std::int32_t>::max())
    return make_error(Errc::unsupported, n, " tokens do not fit the int32 token indices");
  if (budget < 0 || budget > n)
    return make_error(Errc::invalid_budget, "keep budget ", budget, " is outside [0, ", n, "] tokens");
  if (s.heads * n > 0 && s.data == nullptr) return make_error(Errc::invalid_shape, "select: null scores");
  if (s.heads * budget > 0 && kept.data == nullptr) return make_error(Errc::invalid_shape, "select: null kept buffer");
  if (s.heads > 1 && kept.head_stride < budget)
    return make_error(Errc::invalid_stride, "select: kept head stride ", kept.head_stride, " < budget ", budget);

  std::vector<std::uint8_t>& keep = ws->keep;
  std::vector<std::int32_t>& candidates = ws->candidates;
  keep.resize(static_cast<std::size_t>(n));
  if (candidates.capacity() < static_cast<std::size_t>(n)) candidates.reserve(static_cast<std::size_t>(n));
  for (std::int64_t h = 0; h < s.heads; ++h) {
    const float* score = s.head(h);
    std::int64_t forced = 0;
    for (std::int64_t t = 0; t < n; ++t) {
      const bool f = is_protected(t, n, opt, mask) || is_forced_score(score[t]);
      keep[static_cast<std::size_t>(t)] = f;
      forced += f;
    }
    if (forced > budget) {
      std::int64_t masked = 0, nonfinite = 0;
      for (std::int64_t t = 0; t < n; ++t) {
        masked += mask[t];
        nonfinite += is_forced_score(score[t]);
      }
      return make_error(Errc::invalid_budget, "keep budget ", budget, " < ", forced, " always-kept tokens in head ", h,
                        " (sink ", std::min(opt.sink, n), ", window ", std::min(opt.window, n), ", mask ", masked,
                        ", non-finite ", nonfinite, "; overlaps counted once)");
    }
    std::int64_t taken = forced;
    taken += keep_recent(n, window_tokens(opt, budget), budget - taken, spans, keep.data());
    taken += keep_base_sample(n, budget, budget - taken, opt, spans, keep.data());
    candidates.clear();
    for (std::int64_t t = 0; t < n; ++t)
      if (!keep[static_cast<std::size_t>(t)]) candidates.push_back(static_cast<std::int32_t>(t));
    const auto rest = static_cast<std::ptrdiff_t>(budget - taken);
    auto higher = [score](std::int32_t a, std::int32_t b) { return rules::ranks_above(score[a], a, score[b], b); };
    if (rest > 0 && rest < static_cast<std::ptrdiff_t>(candidates.size()))
      std::nth_element(candidates.begin(), candidates.begin() + rest, candidates.end(), higher);
    for (std::ptrdiff_t i = 0; i < rest; ++i)
      keep[static_cast<std::size_t>(candidates[static_cast<std::size_t>(i)])] = 1;
    // Emitting in token order gives ascending indices without a sort.
    std::int32_t* out = kept.data + h * kept.head_stride;
    for (std::int64_t t = 0, i = 0; t < n; ++t)
      if (keep[static_cast<std::size_t>(t)]) out[i++] = static_cast<std::int32_t>(t);
  }
  return Status::success();
}

// Owning form: kept[h * budget + i].
inline Status select_tokens(const LayerScores& s, std::int64_t budget, const SelectOptions& opt,
                            std::vector<std::int32_t>* kept, ProtectMask mask = {}, ImageSpans spans = {}) {
  if (budget >= 0 && budget <= s.tokens) kept->resize(static_cast<std::size_t>(s.heads * budget));
  SelectWorkspace ws;
  return select_tokens(s.view(), budget, opt, mask, spans, &ws, KeptView{kept->data(), budget});
}

}  // namespace flashcache
