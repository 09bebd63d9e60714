// Selection guarantees, each by name.
#include <gtest/gtest.h>
#include <flashcache/select.hpp>

#include <algorithm>
#include <limits>
#include <numeric>
#include <random>
#include <set>

namespace fc = flashcache;

namespace {

fc::LayerScores scores_from(std::int64_t heads, std::int64_t tokens, std::vector<float> s) {
  fc::LayerScores out;
  out.heads = heads;
  out.tokens = tokens;
  out.score = std::move(s);
  out.energy.resize(static_cast<std::size_t>(heads));
  return out;
}

fc::LayerScores random_scores(std::int64_t heads, std::int64_t tokens, std::uint64_t seed, int distinct = 0) {
  std::mt19937_64 rng(seed);
  std::vector<float> s(static_cast<std::size_t>(heads * tokens));
  for (auto& x : s)
    x = distinct ? static_cast<float>(rng() % static_cast<std::uint64_t>(distinct))
                 : std::uniform_real_distribution<float>(0, 1)(rng);
  return scores_from(heads, tokens, std::move(s));
}

// The selection rules themselves, without the default sink and recent window.
std::vector<std::int32_t> select(const fc::LayerScores& s, std::int64_t budget,
                                 const fc::Options& opt = fc::Options::paper(), fc::ProtectMask mask = {},
                                 const std::vector<fc::GridSpan>& spans = {}) {
  std::vector<std::int32_t> kept;
  const fc::Status st = fc::select_tokens(s, budget, opt.select, &kept, mask, spans);
  EXPECT_TRUE(st.ok()) << st.message();
  return kept;
}

// The naive rule: sort by (score desc, index asc) after the protected ones.
std::vector<std::int32_t> naive_select(const fc::LayerScores& s, std::int64_t h, std::int64_t budget,
                                       const fc::Options& opt) {
  const auto base = fc::protected_tokens(s.tokens, opt.select);
  std::vector<std::int32_t> order(static_cast<std::size_t>(s.tokens));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
    const bool pa = base[a] || std::isinf(s(h, a)), pb = base[b] || std::isinf(s(h, b));
    if (pa != pb) return pa;
    return s(h, a) > s(h, b);
  });
  order.resize(static_cast<std::size_t>(budget));
  std::sort(order.begin(), order.end());
  return order;
}

TEST(Select, KeepsExactlyBudgetAscending) {
  for (std::int64_t n : {1, 7, 100, 257}) {
    const auto s = random_scores(3, n, static_cast<std::uint64_t>(n));
    for (std::int64_t budget : {std::int64_t{0}, std::int64_t{1}, n / 3, n}) {
      const auto kept = select(s, budget);
      ASSERT_EQ(kept.size(), static_cast<std::size_t>(3 * budget));
      for (std::int64_t h = 0; h < 3; ++h)
        EXPECT_TRUE(std::is_sorted(kept.begin() + h * budget, kept.begin() + (h + 1) * budget) &&
                    std::adjacent_find(kept.begin() + h * budget, kept.begin() + (h + 1) * budget) ==
                        kept.begin() + (h + 1) * budget);
    }
  }
}

TEST(Select, MatchesNaiveRuleIncludingTies) {
  fc::Options opt = fc::Options::paper();
  opt.select.sink = 2;
  opt.select.window = 3;
  for (std::int64_t n : {7, 64, 301}) {
    const auto s = random_scores(2, n, static_cast<std::uint64_t>(n + 1), /*distinct=*/4);  // many ties
    for (std::int64_t budget : {std::int64_t{5}, std::max<std::int64_t>(5, n / 2), n}) {
      const auto kept = select(s, budget, opt);
      for (std::int64_t h = 0; h < 2; ++h) {
        const std::vector<std::int32_t> head(kept.begin() + h * budget, kept.begin() + (h + 1) * budget);
        EXPECT_EQ(head, naive_select(s, h, budget, opt)) << "n " << n << " budget " << budget;
      }
    }
  }
}

TEST(Select, TiesGoToTheLowerIndex) {
  const auto s = scores_from(1, 6, {1, 5, 5, 1, 5, 1});
  EXPECT_EQ(select(s, 2), (std::vector<std::int32_t>{1, 2}));
  EXPECT_EQ(select(s, 4), (std::vector<std::int32_t>{0, 1, 2, 4}));
}

TEST(Select, ProtectedTokensAreAlwaysKept) {
  const auto s = scores_from(1, 10, {9, 9, 9, 9, 9, 0, 0, 0, 0, 0});
  std::vector<std::uint8_t> mask(10, 0);
  mask[6] = 1;
  fc::Options opt = fc::Options::paper();
  opt.select.sink = 1;
  opt.select.window = 2;
  EXPECT_EQ(select(s, 5, opt, mask), (std::vector<std::int32_t>{0, 1, 6, 8, 9}));
  EXPECT_EQ(select(s, 4, opt, mask), (std::vector<std::int32_t>{0, 6, 8, 9}));
}

TEST(Select, NonFiniteTokensAreAlwaysKept) {
  const float inf = std::numeric_limits<float>::infinity();
  const auto s = scores_from(2, 5, {0, inf, 3, 0, 0, 0, 0, 0, 0, inf});
  EXPECT_EQ(select(s, 2), (std::vector<std::int32_t>{1, 2, 0, 4}));
}

TEST(Select, BudgetBelowProtectedSetIsAnError) {
  const auto s = random_scores(2, 40, 1);
  fc::Options opt = fc::Options::paper();
  opt.select.sink = 4;
  opt.select.window = 8;
  std::vector<std::int32_t> kept;
  const fc::Status st = fc::select_tokens(s, 11, opt.select, &kept);
  EXPECT_EQ(st.code(), fc::Errc::invalid_budget);
  EXPECT_NE(st.message().find("keep budget 11 < 12 always-kept tokens"), std::string::npos) << st.message();
  EXPECT_EQ(fc::select_tokens(s, 41, {}, &kept).code(), fc::Errc::invalid_budget);
  EXPECT_EQ(fc::select_tokens(s, -1, {}, &kept).code(), fc::Errc::invalid_budget);
}

TEST(Select, ProtectedCountIsTheLargestHeadsSet) {
  const float inf = std::numeric_limits<float>::infinity();
  const auto s = scores_from(2, 6, {0, 0, 0, 0, 0, 0, inf, 0, inf, 0, 0, 0});
  fc::Options opt = fc::Options::paper();
  opt.select.sink = 1;
  EXPECT_EQ(fc::protected_count(s, fc::protected_tokens(6, opt.select)), 2);  // head 1: token 0 (sink, inf) and 2
}

}  // namespace

namespace {

// window_share: after the protected tokens, the newest round(share * B) tokens.
TEST(Select, WindowShareKeepsTheNewestShareOfTheBudget) {
  const auto s = random_scores(2, 50, 7);
  fc::Options opt = fc::Options::paper();
  opt.select.window_share = 0.25;
  const auto kept = select(s, 20, opt);  // 5 of 20 go to the recent window
  for (std::int64_t h = 0; h < 2; ++h) {
    const std::set<std::int32_t> heads(kept.begin() + h * 20, kept.begin() + (h + 1) * 20);
    for (std::int32_t t = 45; t < 50; ++t) EXPECT_TRUE(heads.count(t)) << "head " << h << " token " << t;
  }
  // The fixed window and the share do not add up: the larger applies.
  opt.select.window = 8;
  EXPECT_EQ(fc::window_tokens(opt.select, 20), 8);
  opt.select.window = 2;
  EXPECT_EQ(fc::window_tokens(opt.select, 20), 5);
}

TEST(Select, WindowShareNeverExceedsTheBudget) {
  const auto s = random_scores(1, 30, 3);
  fc::Options opt = fc::Options::paper();
  opt.select.sink = 4;
  opt.select.window_share = 1.0;  // the whole budget, but the sink comes first
  const auto kept = select(s, 10, opt);
  const std::vector<std::int32_t> want = {0, 1, 2, 3, 24, 25, 26, 27, 28, 29};
  EXPECT_EQ(kept, want);
}

TEST(Select, BaseShareSpreadsTokensEvenly) {
  // Scores that rise with the index: the outliers are all at the end.
  std::vector<float> rising(100);
  for (int t = 0; t < 100; ++t) rising[t] = static_cast<float>(t);
  const auto s = scores_from(1, 100, rising);
  fc::Options opt = fc::Options::paper();
  opt.select.base_share = 0.5;
  const auto kept = select(s, 10, opt);
  // 5 evenly spaced among the 100 free tokens: ranks (2j + 1) * 100 / 10 = 10, 30, 50, 70, 90;
  // then the 5 highest of the rest: 95..99.
  const std::vector<std::int32_t> want = {10, 30, 50, 70, 90, 95, 96, 97, 98, 99};
  EXPECT_EQ(kept, want);
}

TEST(Select, BaseShareSkipsTokensAlreadyKept) {
  const auto s = random_scores(3, 41, 11);
  fc::Options opt = fc::Options::paper();
  opt.select.sink = 3;
  opt.select.window_share = 0.25;
  opt.select.base_share = 0.5;
  for (std::int64_t budget : {3, 4, 12, 20, 41}) {
    const auto kept = select(s, budget, opt);
    ASSERT_EQ(kept.size(), static_cast<std::size_t>(3 * budget));
    for (std::int64_t h = 0; h < 3; ++h) {
      const auto first = kept.begin() + h * budget, last = first + budget;
      EXPECT_TRUE(std::is_sorted(first, last));
      EXPECT_EQ(std::set<std::int32_t>(first, last).size(), static_cast<std::size_t>(budget)) << "duplicates";
      for (std::int32_t t = 0; t < 3; ++t) EXPECT_TRUE(std::count(first, last, t)) << "sink token " << t;
    }
  }
}

}  // namespace

namespace {

// The newest `recent` tokens outside the spans, from the definition.
std::vector<std::int64_t> text_window(std::int64_t n, std::int64_t recent, const std::vector<fc::GridSpan>& spans) {
  std::vector<std::int64_t> out;
  for (std::int64_t t = n - 1; t >= 0 && static_cast<std::int64_t>(out.size()) < recent; --t) {
    bool in_span = false;
    for (const auto& g : spans) in_span |= t >= g.first && t < g.end();
    if (!in_span) out.push_back(t);
  }
  return out;
}

TEST(Select, RecentWindowSkipsImageSpans) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 400; ++trial) {
    const std::int64_t n = 5 + static_cast<std::int64_t>(rng() % 120);
    std::vector<fc::GridSpan> spans;
    std::int64_t at = static_cast<std::int64_t>(rng() % 6);
    for (int g = 0; g < 4; ++g) {  // spans touching each other, the sequence's end, or neither
      const std::int64_t rows = 1 + static_cast<std::int64_t>(rng() % 4), cols = 1 + static_cast<std::int64_t>(rng() % 6);
      if (at + rows * cols > n) break;
      spans.push_back({at, rows, cols});
      at += rows * cols + static_cast<std::int64_t>(rng() % 3);
    }
    if (spans.size() > 1 && rng() % 2) std::swap(spans.front(), spans.back());
    const std::int64_t recent = static_cast<std::int64_t>(rng() % (n + 3));
    const std::vector<std::int64_t> want = text_window(n, recent, spans);
    const std::int64_t start = fc::rules::recent_window_start(n, recent, fc::ImageSpans(spans));
    // The window is exactly the text tokens at or after `start`.
    std::vector<std::int64_t> got;
    for (std::int64_t t = n - 1; t >= start; --t) {
      bool in_span = false;
      for (const auto& g : spans) in_span |= t >= g.first && t < g.end();
      if (!in_span) got.push_back(t);
    }
    ASSERT_EQ(got, want) << "trial " << trial << " n " << n << " recent " << recent;
    // And select_tokens keeps it (room permitting), never a span token for it.
    std::vector<std::uint8_t> keep(static_cast<std::size_t>(n), 0);
    const std::int64_t room = static_cast<std::int64_t>(rng() % (n + 1));
    const std::int64_t marked = fc::keep_recent(n, recent, room, spans, keep.data());
    ASSERT_EQ(marked, std::min<std::int64_t>(room, static_cast<std::int64_t>(want.size())));
    for (std::int64_t i = 0; i < marked; ++i) ASSERT_TRUE(keep[static_cast<std::size_t>(want[i])]) << want[i];
  }
}

TEST(Select, ImageOnlyCacheSpendsNoWindowOnPatches) {
  // CLS, then a 4 x 5 image: the window share finds only the CLS token.
  const auto s = random_scores(1, 21, 5);
  fc::Options opt = fc::Options::paper();
  opt.select.window_share = 0.5;
  const auto kept = select(s, 8, opt, {}, {{1, 4, 5}});
  // Without spans the window would be tokens 17..20; with them it is token 0,
  // and the other 7 are the highest-scoring patches.
  std::vector<std::int32_t> patches(20);
  std::iota(patches.begin(), patches.end(), 1);
  std::sort(patches.begin(), patches.end(), [&](std::int32_t a, std::int32_t b) { return s(0, a) > s(0, b); });
  std::vector<std::int32_t> want(patches.begin(), patches.begin() + 7);
  want.push_back(0);
  std::sort(want.begin(), want.end());
  EXPECT_EQ(kept, want);
}

}  // namespace
