#pragma once
// One keep-set shared by several KV heads and layers (CPU).
//
// Engines that hold one cell per token for all layers and heads (llama.cpp)
// or one block table per sequence (vLLM, SGLang) cannot keep a different
// token set per (layer, head). select_shared_tokens() picks one set for the
// heads of the layers it is given, with select_tokens()'s guarantees:
//   - exactly `budget` tokens, ascending;
//   - always kept: the protected set (sink, window, mask) and every token
//     whose score is +inf or NaN in any head of any layer given;
//   - then the recent window (window_share) and the base sample, by
//     select.hpp's keep_recent() and keep_base_sample();
//   - the rest the highest combined scores (HeadCombine), ties to the lower
//     index;
//   - a budget below the always-kept set is an error naming the counts;
//   - no allocation once the SharedKeepWorkspace has seen this shape.
//
// Pages (SharedKeepOptions::page = P > 1): the tokens are cut into pages of P
// tokens, page p = tokens [p P, min(N, (p + 1) P)), so the last page holds
// r = N mod P tokens when r > 0 (a partial page). Whole pages are kept:
//   - budget (in tokens) must be whole pages: a multiple of P (the partial
//     last page, if any, is then not kept), or a multiple of P plus r (the
//     partial last page is then kept). Any other budget is an error naming
//     the nearest valid budgets below and above. The result is always exactly
//     `budget` tokens.
//   - a page holding an always-kept token is kept (its tokens count toward
//     the budget, and a budget below them is the named error); when the budget
//     leaves the partial last page out but that page holds an always-kept
//     token, that is an error too.
//   - the recent window is the newest pages holding the last
//     window_tokens(opt, budget) tokens that may be kept; the base sample is
//     round(base_share * pages kept) evenly spaced pages (image spans need
//     page 1: they are refused by name otherwise);
//   - the rest are the pages with the highest sum of their tokens' combined
//     scores (for votes: most votes summed, then the mean_normalized sum),
//     ties to the lower page.
// With P = 1 every rule is select_tokens()'s, token by token.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "enum_names.hpp"
#include "error.hpp"
#include "mask.hpp"
#include "options.hpp"
#include "rules.hpp"
#include "score.hpp"
#include "select.hpp"

namespace flashcache {

// Which heads share a keep-set.
enum class KeepSet {
  per_head,      // every (layer, head) its own set: select_tokens()
  per_layer,     // one set for the heads of a layer
  per_sequence,  // one set for every layer and head
};

// How per-head scores become one score per token.
enum class HeadCombine {
  mean_normalized,  // each head's finite scores divided by that head's mean, summed over heads (and layers)
  max_normalized,   // the same normalisation, max over heads instead of the sum
  votes,            // each head votes for its own top-`budget` tokens; most votes first, ties by mean_normalized
};

template <>
struct EnumNames<KeepSet> {
  static constexpr EnumName<KeepSet> table[] = {
      {KeepSet::per_head, "per_head"}, {KeepSet::per_layer, "per_layer"}, {KeepSet::per_sequence, "per_sequence"}};
};
inline const char* to_string(KeepSet e) { return enum_name(e); }
template <>
struct EnumNames<HeadCombine> {
  static constexpr EnumName<HeadCombine> table[] = {{HeadCombine::mean_normalized, "mean_normalized"},
                                                    {HeadCombine::max_normalized, "max_normalized"},
                                                    {HeadCombine::votes, "votes"}};
};
inline const char* to_string(HeadCombine e) { return enum_name(e); }

inline Status parse_keep_set(std::string_view name, KeepSet* out) { return parse_enum(name, out, "keep set"); }
inline Status parse_head_combine(std::string_view name, HeadCombine* out) {
  return parse_enum(name, out, "head combine");
}

struct SharedKeepOptions {
  KeepSet keep_set = KeepSet::per_sequence;
  HeadCombine combine = HeadCombine::mean_normalized;
  // Keep whole pages of `page` tokens (page 0 starts at token 0). The budget
  // must be whole pages: a multiple of `page`, or a multiple plus the size of
  // the partial last page (which is then kept); otherwise an error names the
  // nearest valid budgets. A page holding an always-kept token is kept. See
  // the header comment for the full rule.
  std::int64_t page = 1;
};

// No shared set: every head keeps its own tokens (compress_scored_model).
inline constexpr SharedKeepOptions kKeepPerHead{KeepSet::per_head, HeadCombine::mean_normalized, 1};

inline Status check_shared_options(const SharedKeepOptions& s) {
  if (s.page < 1) return make_error(Errc::invalid_option, "page ", s.page, " must be at least 1");
  if (!is_known(s.keep_set)) return make_error(Errc::invalid_option, "unknown keep set");
  if (!is_known(s.combine)) return make_error(Errc::invalid_option, "unknown head combine");
  return Status::success();
}

// Caller-owned scratch of select_shared_tokens(): grows to the longest
// sequence seen, then selection allocates nothing.
struct SharedKeepWorkspace {
  std::vector<std::uint8_t> forced;     // [tokens] always kept
  std::vector<double> primary;          // [tokens] combined score (votes: vote count)
  std::vector<double> secondary;        // [tokens] votes: the mean_normalized sum
  std::vector<std::uint8_t> page_keep;  // [pages]
  std::vector<double> page_primary, page_secondary;
  std::vector<std::int32_t> candidates;  // tokens (votes) or pages
};

namespace detail {

// The pages of a sequence of n tokens and how a budget falls on them.
struct PageSplit {
  std::int64_t page = 1, pages = 0, last = 0;  // last: tokens of the last page
  bool partial = false;                        // last < page
  bool last_kept = false;                      // the budget includes the partial last page
  std::int64_t eligible = 0;                   // pages that may be kept
  std::int64_t budget_pages = 0;               // pages kept

  std::int64_t first(std::int64_t p) const { return p * page; }
  std::int64_t size(std::int64_t p) const { return p == pages - 1 ? last : page; }
};

inline Status split_pages(std::int64_t n, std::int64_t budget, std::int64_t page, PageSplit* s) {
  s->page = page;
  s->pages = (n + page - 1) / page;
  const std::int64_t r = n % page;
  s->partial = r > 0;
  s->last = n == 0 ? 0 : (r > 0 ? r : page);
  if (!s->partial || budget % page == 0) {
    s->last_kept = false;
    s->eligible = s->partial ? s->pages - 1 : s->pages;
    s->budget_pages = budget / page;
    return Status::success();
  }
  if (budget % page == r) {
    s->last_kept = true;
    s->eligible = s->pages;
    s->budget_pages = (budget - r) / page + 1;
    return Status::success();
  }
  const std::int64_t base = budget / page * page;
  const std::int64_t lo = s->partial && base + r <= budget ? base + r : base;
  const std::int64_t hi = s->partial && base + r >= budget ? base + r : std::min(base + page, n);
  return make_error(Errc::invalid_budget, "keep budget ", budget, " is not whole pages of ", page, " tokens (", n,
                    " tokens: ", n / page, " full pages and a last page of ", r,
                    "); a budget is a multiple of the page or that plus ", r, ": nearest ", lo, " and ", hi);
}

}  // namespace detail

// Tokens always kept by a shared set over `layers` (all of the same token
// count): the protected set and every token with an unrankable score in some
// head, expanded to whole pages. Allocates nothing.
inline std::int64_t shared_protected_count(const ScoreView* layers, std::int64_t layer_count, const SelectOptions& opt,
                                           ProtectMask mask, std::int64_t page = 1) {
  if (layer_count <= 0 || page < 1) return 0;
  const std::int64_t n = layers[0].tokens;
  std::int64_t count = 0;
  for (std::int64_t p0 = 0; p0 < n; p0 += page) {
    const std::int64_t end = std::min(n, p0 + page);
    bool forced = false;
    for (std::int64_t t = p0; t < end && !forced; ++t) {
      forced = is_protected(t, n, opt, mask);
      for (std::int64_t l = 0; l < layer_count && !forced; ++l)
        for (std::int64_t h = 0; h < layers[l].heads && !forced; ++h) forced = is_forced_score(layers[l](h, t));
    }
    if (forced) count += end - p0;
  }
  return count;
}

// One keep-set for `layer_count` layers (each a ScoreView of the same token
// count; heads may differ), written to kept[0..budget), ascending.
// shared.keep_set: per_sequence takes any number of layers, per_layer exactly
// one; per_head has no shared set (use select_tokens) and is refused.
//
// Combined scores, in double: a head's mean is over its finite scores (a head
// whose mean is 0 adds 0); mean_normalized sums score / mean over every
// (layer, head), max_normalized takes the largest; votes: every head votes for
// its `budget` highest scores among the tokens not always kept (ties to the
// lower index), tokens rank by votes, then by mean_normalized.
namespace detail {
// select_shared_tokens for a caller that has run check_options(opt) and
// check_shared_options(shared) itself; every other input is checked.
inline Status select_shared_tokens_trusted(const ScoreView* layers, std::int64_t layer_count, std::int64_t budget,
                                           const SelectOptions& opt, ProtectMask mask, ImageSpans spans,
                                           const SharedKeepOptions& shared, SharedKeepWorkspace* ws,
                                           std::int32_t* kept);
}  // namespace detail

inline Status select_shared_tokens(const ScoreView* layers, std::int64_t layer_count, std::int64_t budget,
                                   const SelectOptions& opt, ProtectMask mask, ImageSpans spans,
                                   const SharedKeepOptions& shared, SharedKeepWorkspace* ws, std::int32_t* kept) {
  FLASHCACHE_RETURN_IF_ERROR(check_options(opt));
  FLASHCACHE_RETURN_IF_ERROR(check_shared_options(shared));
  return detail::select_shared_tokens_trusted(layers, layer_count, budget, opt, mask, spans, shared, ws, kept);
}

inline Status detail::select_shared_tokens_trusted(const ScoreView* layers, std::int64_t layer_count,
                                                   std::int64_t budget, const SelectOptions& opt, ProtectMask mask,
                                                   ImageSpans spans, const SharedKeepOptions& shared,
                                                   SharedKeepWorkspace* ws, std::int32_t* kept) {
  if (shared.keep_set == KeepSet::per_head)
    return make_error(Errc::invalid_option, "keep set per_head has no shared set (select_tokens keeps one per head)");
  if (layer_count < 1 || layers == nullptr)
    return make_error(Errc::invalid_shape, "shared select: ", layer_count, " layers (at least 1)");
  if (shared.keep_set == KeepSet::per_layer && layer_count != 1)
    return make_error(Errc::invalid_option, "keep set per_layer selects one layer at a time, got ", layer_count,
                      " layers (per_sequence shares one set over several)");
  if (ws == nullptr) return make_error(Errc::invalid_shape, "shared select: null workspace");
  const std::int64_t n = layers[0].tokens;
  for (std::int64_t l = 0; l < layer_count; ++l) {
    const ScoreView& s = layers[l];
    if (s.tokens != n)
      return make_error(Errc::invalid_shape, "shared select: layer ", l, " has ", s.tokens, " tokens but layer 0 has ",
                        n, " (a shared set needs one token count)");
    if (s.heads < 0) return make_error(Errc::invalid_shape, "shared select: layer ", l, " has ", s.heads, " heads");
    if (s.heads * n > 0 && s.data == nullptr)
      return make_error(Errc::invalid_shape, "shared select: layer ", l, ": null scores");
  }
  FLASHCACHE_RETURN_IF_ERROR(check_mask(mask, n));
  FLASHCACHE_RETURN_IF_ERROR(check_grid_spans(spans));
  FLASHCACHE_RETURN_IF_ERROR(check_grids_fit(spans, n));
  if (n > std::numeric_limits<std::int32_t>::max())
    return make_error(Errc::unsupported, n, " tokens do not fit the int32 token indices");
  if (budget < 0 || budget > n)
    return make_error(Errc::invalid_budget, "keep budget ", budget, " is outside [0, ", n, "] tokens");
  if (budget > 0 && kept == nullptr) return make_error(Errc::invalid_shape, "shared select: null kept buffer");
  if (shared.page > 1 && !spans.empty())
    return make_error(Errc::unsupported, "shared keep-sets with page ", shared.page,
                      " > 1 do not take image spans (their sub-grid sample is per token)");
  detail::PageSplit pages;
  FLASHCACHE_RETURN_IF_ERROR(detail::split_pages(n, budget, shared.page, &pages));

  const auto un = static_cast<std::size_t>(n);
  ws->forced.resize(un);
  ws->primary.resize(un);
  ws->secondary.resize(un);
  std::uint8_t* forced = ws->forced.data();
  double* primary = ws->primary.data();
  double* secondary = ws->secondary.data();
  if (ws->candidates.capacity() < un) ws->candidates.reserve(un);

  // 1. The always-kept tokens.
  std::int64_t nonfinite = 0;
  for (std::int64_t t = 0; t < n; ++t) {
    bool bad = false;
    for (std::int64_t l = 0; l < layer_count && !bad; ++l)
      for (std::int64_t h = 0; h < layers[l].heads && !bad; ++h) bad = is_forced_score(layers[l](h, t));
    nonfinite += bad;
    forced[t] = bad || is_protected(t, n, opt, mask);
  }

  // 2. Combined scores of the other tokens.
  std::fill(primary, primary + n, 0.0);
  std::fill(secondary, secondary + n, 0.0);
  const bool votes = shared.combine == HeadCombine::votes;
  const bool use_max = shared.combine == HeadCombine::max_normalized;
  double* normalized = votes ? secondary : primary;
  for (std::int64_t l = 0; l < layer_count; ++l)
    for (std::int64_t h = 0; h < layers[l].heads; ++h) {
      const float* score = layers[l].head(h);
      double sum = 0;
      std::int64_t finite = 0;
      for (std::int64_t t = 0; t < n; ++t)
        if (!is_forced_score(score[t])) sum += static_cast<double>(score[t]), ++finite;
      const double mean = finite > 0 ? sum / static_cast<double>(finite) : 0.0;
      if (mean > 0)
        for (std::int64_t t = 0; t < n; ++t) {
          if (forced[t]) continue;
          const double x = static_cast<double>(score[t]) / mean;
          normalized[t] = use_max ? std::max(normalized[t], x) : normalized[t] + x;
        }
      if (!votes) continue;
      std::vector<std::int32_t>& c = ws->candidates;
      c.clear();
      for (std::int64_t t = 0; t < n; ++t)
        if (!forced[t]) c.push_back(static_cast<std::int32_t>(t));
      const auto top = static_cast<std::ptrdiff_t>(std::min<std::int64_t>(budget, static_cast<std::int64_t>(c.size())));
      auto higher = [score](std::int32_t a, std::int32_t b) { return rules::ranks_above(score[a], a, score[b], b); };
      if (top > 0 && top < static_cast<std::ptrdiff_t>(c.size()))
        std::nth_element(c.begin(), c.begin() + top, c.end(), higher);
      for (std::ptrdiff_t i = 0; i < top; ++i) primary[c[static_cast<std::size_t>(i)]] += 1.0;
    }

  // 3. Pages: their always-kept marks and summed scores.
  const auto up = static_cast<std::size_t>(pages.pages);
  ws->page_keep.resize(up);
  ws->page_primary.resize(up);
  ws->page_secondary.resize(up);
  std::uint8_t* keep = ws->page_keep.data();
  std::int64_t taken = 0, forced_tokens = 0;
  for (std::int64_t p = 0; p < pages.pages; ++p) {
    double a = 0, b = 0;
    // The partial last page is kept whenever the budget includes it.
    bool f = pages.last_kept && p == pages.pages - 1;
    for (std::int64_t t = pages.first(p); t < pages.first(p) + pages.size(p); ++t) {
      a += primary[t];
      b += secondary[t];
      if (forced[t]) {
        if (p >= pages.eligible)
          return make_error(Errc::invalid_budget, "keep budget ", budget, " leaves out the last page (", pages.last,
                            " tokens) but its token ", t, " is always kept; use a budget of whole pages plus ",
                            pages.last);
        f = true;
      }
    }
    ws->page_primary[static_cast<std::size_t>(p)] = a;
    ws->page_secondary[static_cast<std::size_t>(p)] = b;
    keep[p] = f;
    taken += f;
    if (f) forced_tokens += pages.size(p);
  }
  if (forced_tokens > budget) {
    std::int64_t masked = 0;
    for (std::int64_t t = 0; t < n; ++t) masked += mask[t];
    return make_error(Errc::invalid_budget, "keep budget ", budget, " < ", forced_tokens,
                      " always-kept tokens shared by ", layer_count, " layers (sink ", std::min(opt.sink, n),
                      ", window ", std::min(opt.window, n), ", mask ", masked, ", non-finite ", nonfinite,
                      "; overlaps counted once", shared.page > 1 ? "; whole pages of " : "",
                      shared.page > 1 ? std::to_string(shared.page) : std::string(), ")");
  }

  // 4. The recent window and the base sample, in pages (tokens when page is 1).
  const std::int64_t eligible = pages.eligible;
  const std::int64_t eligible_tokens = eligible == pages.pages ? n : eligible * pages.page;
  const std::int64_t w = std::min(window_tokens(opt, budget), eligible_tokens);
  const std::int64_t window_pages = w <= 0 ? 0 : eligible - (eligible_tokens - w) / pages.page;
  const std::int64_t want = pages.budget_pages;
  taken += keep_recent(eligible, window_pages, want - taken, spans, keep);  // spans: page 1 only
  taken += keep_base_sample(eligible, want, want - taken, opt, spans, keep);

  // 5. The highest summed scores, ties to the lower page.
  std::vector<std::int32_t>& c = ws->candidates;
  c.clear();
  for (std::int64_t p = 0; p < eligible; ++p)
    if (!keep[p]) c.push_back(static_cast<std::int32_t>(p));
  const double* pa = ws->page_primary.data();
  const double* pb = ws->page_secondary.data();
  auto higher = [pa, pb](std::int32_t a, std::int32_t b) {
    if (pa[a] != pa[b]) return pa[a] > pa[b];
    if (pb[a] != pb[b]) return pb[a] > pb[b];
    return a < b;
  };
  const auto rest = static_cast<std::ptrdiff_t>(want - taken);
  if (rest > static_cast<std::ptrdiff_t>(c.size()))
    return make_error(Errc::invalid_budget, "keep budget ", budget, " needs ", want, " pages but only ", eligible,
                      " may be kept");
  if (rest > 0 && rest < static_cast<std::ptrdiff_t>(c.size()))
    std::nth_element(c.begin(), c.begin() + rest, c.end(), higher);
  for (std::ptrdiff_t i = 0; i < rest; ++i) keep[c[static_cast<std::size_t>(i)]] = 1;

  // 6. The kept pages' tokens, in token order.
  std::int64_t out = 0;
  for (std::int64_t p = 0; p < pages.pages; ++p)
    if (keep[p])
      for (std::int64_t t = pages.first(p); t < pages.first(p) + pages.size(p); ++t) {
        if (out == budget) return make_error(Errc::invalid_budget, "shared select: more than ", budget, " tokens");
        kept[out++] = static_cast<std::int32_t>(t);
      }
  if (out != budget)
    return make_error(Errc::invalid_budget, "shared select: kept ", out, " tokens, not the budget ", budget);
  return Status::success();
}

}  // namespace flashcache
