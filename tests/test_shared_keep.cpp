// Shared keep-sets (shared_keep.hpp): one token set for the heads of a layer
// or for every layer and head, against a brute-force reference written here
// from the rules in the header (doubles, full sorts, no library helpers).
// This executable counts operator new, for the no-allocation test.
#include "counting_new.hpp"

#include <gtest/gtest.h>
#include <flashcache/flashcache.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <new>
#include <numeric>
#include <random>
#include <string>
#include <vector>

using flashcache_test::allocations;

namespace fc = flashcache;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Scores of several layers: layer l is [heads[l]][n].
struct Model {
  std::int64_t n = 0;
  std::vector<std::int64_t> heads;
  std::vector<std::vector<float>> score;

  std::vector<fc::ScoreView> views() const {
    std::vector<fc::ScoreView> v;
    for (std::size_t l = 0; l < heads.size(); ++l) v.push_back({score[l].data(), heads[l], n});
    return v;
  }
};

// `distinct` > 0 draws small integers, so that ties are common.
Model random_model(std::vector<std::int64_t> heads, std::int64_t n, std::uint64_t seed, int distinct = 0) {
  std::mt19937_64 rng(seed);
  Model m;
  m.n = n;
  m.heads = std::move(heads);
  for (std::int64_t h : m.heads) {
    std::vector<float> s(static_cast<std::size_t>(h * n));
    for (auto& x : s)
      x = distinct > 0 ? static_cast<float>(rng() % static_cast<std::uint64_t>(distinct))
                       : std::exponential_distribution<float>(1.0f)(rng) * static_cast<float>(1 + rng() % 4);
    m.score.push_back(std::move(s));
  }
  return m;
}

struct Ref {
  bool error = false;
  std::string why;
  std::vector<std::int32_t> kept;
};

bool unrankable(double s) { return std::isnan(s) || std::isinf(s); }

// The rules of shared_keep.hpp, brute force.
Ref reference(const Model& m, std::int64_t budget, const fc::Options& opt, const std::vector<std::uint8_t>& mask,
              fc::HeadCombine combine, std::int64_t page) {
  Ref ref;
  const std::int64_t n = m.n;
  // 1. Always kept.
  std::vector<bool> forced(static_cast<std::size_t>(n), false);
  for (std::int64_t t = 0; t < n; ++t) {
    bool f = t < opt.select.sink || t >= n - opt.select.window || (!mask.empty() && mask[static_cast<std::size_t>(t)] != 0);
    for (std::size_t l = 0; l < m.heads.size(); ++l)
      for (std::int64_t h = 0; h < m.heads[l]; ++h)
        f = f || unrankable(m.score[l][static_cast<std::size_t>(h * n + t)]);
    forced[static_cast<std::size_t>(t)] = f;
  }
  // 2. Combined scores.
  std::vector<double> sum(static_cast<std::size_t>(n), 0.0), mx(static_cast<std::size_t>(n), 0.0),
      votes(static_cast<std::size_t>(n), 0.0);
  for (std::size_t l = 0; l < m.heads.size(); ++l)
    for (std::int64_t h = 0; h < m.heads[l]; ++h) {
      const float* s = m.score[l].data() + h * n;
      double total = 0;
      std::int64_t finite = 0;
      for (std::int64_t t = 0; t < n; ++t)
        if (!unrankable(s[t])) total += s[t], ++finite;
      const double mean = finite ? total / static_cast<double>(finite) : 0.0;
      if (mean > 0)
        for (std::int64_t t = 0; t < n; ++t)
          if (!forced[static_cast<std::size_t>(t)]) {
            sum[static_cast<std::size_t>(t)] += s[t] / mean;
            mx[static_cast<std::size_t>(t)] = std::max(mx[static_cast<std::size_t>(t)], s[t] / mean);
          }
      std::vector<std::int64_t> order;
      for (std::int64_t t = 0; t < n; ++t)
        if (!forced[static_cast<std::size_t>(t)]) order.push_back(t);
      std::sort(order.begin(), order.end(),
                [&](std::int64_t a, std::int64_t b) { return s[a] != s[b] ? s[a] > s[b] : a < b; });
      for (std::size_t i = 0; i < order.size() && static_cast<std::int64_t>(i) < budget; ++i)
        votes[static_cast<std::size_t>(order[i])] += 1;
    }
  const std::vector<double>& primary = combine == fc::HeadCombine::votes            ? votes
                                       : combine == fc::HeadCombine::max_normalized ? mx
                                                                                    : sum;
  const std::vector<double> zero(static_cast<std::size_t>(n), 0.0);
  const std::vector<double>& secondary = combine == fc::HeadCombine::votes ? sum : zero;
  // 3. Pages and the budget.
  const std::int64_t pages = (n + page - 1) / page, full = n / page, r = n % page;
  bool valid = false, last_kept = false;
  for (std::int64_t k = 0; k <= full; ++k) {
    if (budget == k * page) valid = true;
    if (r > 0 && budget == k * page + r) valid = true, last_kept = true;
  }
  if (!valid) {
    ref.error = true;
    ref.why = "not whole pages";
    return ref;
  }
  const std::int64_t eligible = (r > 0 && !last_kept) ? pages - 1 : pages;
  auto first = [&](std::int64_t p) { return p * page; };
  auto end = [&](std::int64_t p) { return std::min(n, (p + 1) * page); };
  std::vector<bool> keep(static_cast<std::size_t>(pages), false);
  std::int64_t kept_tokens = 0;
  for (std::int64_t p = 0; p < pages; ++p) {
    bool f = last_kept && p == pages - 1;
    for (std::int64_t t = first(p); t < end(p); ++t) f = f || forced[static_cast<std::size_t>(t)];
    if (f && p >= eligible) {
      ref.error = true;
      ref.why = "leaves out the last page";
      return ref;
    }
    keep[static_cast<std::size_t>(p)] = f;
    if (f) kept_tokens += end(p) - first(p);
  }
  if (kept_tokens > budget) {
    ref.error = true;
    ref.why = "always-kept tokens";
    return ref;
  }
  const std::int64_t budget_pages = last_kept ? (budget - r) / page + 1 : budget / page;
  std::int64_t room = budget_pages;
  for (std::int64_t p = 0; p < pages; ++p) room -= keep[static_cast<std::size_t>(p)];
  // 4. Recent window: the newest eligible pages holding one of the last w eligible tokens.
  const std::int64_t eligible_tokens = eligible == pages ? n : eligible * page;
  const std::int64_t w =
      std::max<std::int64_t>(opt.select.window, std::llround(opt.select.window_share * static_cast<double>(budget)));
  for (std::int64_t p = eligible - 1; p >= 0 && room > 0; --p) {
    if (end(p) <= eligible_tokens - w) break;
    if (!keep[static_cast<std::size_t>(p)]) keep[static_cast<std::size_t>(p)] = true, --room;
  }
  // Base sample: evenly spaced among the free eligible pages.
  {
    std::vector<std::int64_t> free;
    for (std::int64_t p = 0; p < eligible; ++p)
      if (!keep[static_cast<std::size_t>(p)]) free.push_back(p);
    std::int64_t count = std::llround(opt.select.base_share * static_cast<double>(budget_pages));
    count = std::min({count, room, static_cast<std::int64_t>(free.size())});
    for (std::int64_t j = 0; j < count; ++j) {
      const std::int64_t rank = static_cast<std::int64_t>(
          std::floor((j + 0.5) * static_cast<double>(free.size()) / static_cast<double>(count)));
      keep[static_cast<std::size_t>(free[static_cast<std::size_t>(rank)])] = true;
    }
    room -= std::max<std::int64_t>(count, 0);
  }
  // 5. The best pages by summed scores.
  std::vector<std::int64_t> order;
  std::vector<double> pa(static_cast<std::size_t>(pages), 0.0), pb(static_cast<std::size_t>(pages), 0.0);
  for (std::int64_t p = 0; p < pages; ++p)
    for (std::int64_t t = first(p); t < end(p); ++t)
      pa[static_cast<std::size_t>(p)] += primary[static_cast<std::size_t>(t)],
          pb[static_cast<std::size_t>(p)] += secondary[static_cast<std::size_t>(t)];
  for (std::int64_t p = 0; p < eligible; ++p)
    if (!keep[static_cast<std::size_t>(p)]) order.push_back(p);
  std::sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    const auto ua = static_cast<std::size_t>(a), ub = static_cast<std::size_t>(b);
    if (pa[ua] != pa[ub]) return pa[ua] > pa[ub];
    if (pb[ua] != pb[ub]) return pb[ua] > pb[ub];
    return a < b;
  });
  for (std::int64_t i = 0; i < room; ++i) keep[static_cast<std::size_t>(order[static_cast<std::size_t>(i)])] = true;
  for (std::int64_t p = 0; p < pages; ++p)
    if (keep[static_cast<std::size_t>(p)])
      for (std::int64_t t = first(p); t < end(p); ++t) ref.kept.push_back(static_cast<std::int32_t>(t));
  return ref;
}

fc::Status run(const Model& m, std::int64_t budget, const fc::Options& opt, const std::vector<std::uint8_t>& mask,
               fc::HeadCombine combine, std::int64_t page, std::vector<std::int32_t>* kept,
               fc::KeepSet set = fc::KeepSet::per_sequence, fc::ImageSpans spans = {}) {
  const auto views = m.views();
  fc::SharedKeepOptions so;
  so.keep_set = set;
  so.combine = combine;
  so.page = page;
  fc::SharedKeepWorkspace ws;
  kept->assign(static_cast<std::size_t>(std::max<std::int64_t>(budget, 0)), -1);
  return fc::select_shared_tokens(views.data(), static_cast<std::int64_t>(views.size()), budget, opt.select,
                                  mask.empty() ? fc::ProtectMask{} : fc::ProtectMask{mask}, spans, so, &ws,
                                  kept->data());
}

std::vector<fc::Options> option_sets() {
  std::vector<fc::Options> out;
  out.push_back(fc::Options::paper());
  out.push_back(fc::Options{});  // sink 4, window_share 0.5
  fc::Options o = fc::Options::paper();
  o.select.sink = 2;
  o.select.window = 3;
  o.select.window_share = 0.25;
  o.select.base_share = 0.2;
  out.push_back(o);
  return out;
}

const fc::HeadCombine kCombines[] = {fc::HeadCombine::mean_normalized, fc::HeadCombine::max_normalized,
                                     fc::HeadCombine::votes};

TEST(SharedKeep, MatchesBruteForceReference) {
  long checked = 0, errors = 0;
  for (std::int64_t n : {37, 101})
    for (int variant = 0; variant < 3; ++variant) {
      Model m = random_model({2, 3, 5}, n, static_cast<std::uint64_t>(n * 10 + variant), variant == 1 ? 4 : 0);
      std::vector<std::uint8_t> mask;
      if (variant == 2) {
        // NaN and +inf rows in single heads, and a caller mask.
        m.score[1][static_cast<std::size_t>(2 * n + 17)] = kNaN;
        m.score[2][static_cast<std::size_t>(0 * n + 30)] = kInf;
        mask.assign(static_cast<std::size_t>(n), 0);
        mask[9] = mask[10] = mask[static_cast<std::size_t>(n / 2)] = 1;
      }
      for (const fc::Options& opt : option_sets())
        for (fc::HeadCombine c : kCombines)
          for (std::int64_t page : {1, 4, 7})
            for (std::int64_t budget = 0; budget <= n; ++budget) {
              const Ref ref = reference(m, budget, opt, mask, c, page);
              std::vector<std::int32_t> kept;
              const fc::Status st = run(m, budget, opt, mask, c, page, &kept);
              const std::string where = "n " + std::to_string(n) + " variant " + std::to_string(variant) + " combine " +
                                        fc::to_string(c) + " page " + std::to_string(page) + " budget " +
                                        std::to_string(budget) + " sink " + std::to_string(opt.select.sink);
              ASSERT_EQ(st.ok(), !ref.error) << where << ": " << st.message() << " / ref " << ref.why;
              ++checked;
              if (ref.error) {
                ++errors;
                EXPECT_EQ(st.code(), fc::Errc::invalid_budget) << where;
                EXPECT_NE(st.message().find(ref.why), std::string::npos) << where << ": " << st.message();
                continue;
              }
              ASSERT_EQ(kept, ref.kept) << where;
            }
    }
  EXPECT_GT(checked, 5000);
  EXPECT_GT(errors, 100);
  EXPECT_LT(errors, checked / 2);
}

// The form a caller uses after checking the options itself keeps the same tokens,
// and still refuses what the options do not cover (a budget below the always-kept).
TEST(SharedKeep, TrustedFormKeepsTheSameTokens) {
  const std::int64_t n = 53;
  const Model m = random_model({2, 3}, n, 91, 0);
  const auto views = m.views();
  fc::SharedKeepOptions so;
  so.page = 4;
  fc::SharedKeepWorkspace ws;
  for (const fc::Options& opt : option_sets())
    for (std::int64_t budget : {std::int64_t{13}, std::int64_t{29}, n}) {  // whole pages plus the last token
      std::vector<std::int32_t> checked(static_cast<std::size_t>(budget)), trusted(checked.size());
      const fc::Status first =
          fc::select_shared_tokens(views.data(), 2, budget, opt.select, {}, {}, so, &ws, checked.data());
      ASSERT_TRUE(first.ok()) << first.message();
      ASSERT_TRUE(fc::check_options(opt).ok());
      ASSERT_TRUE(fc::detail::select_shared_tokens_trusted(views.data(), 2, budget, opt.select, {}, {}, so, &ws,
                                                           trusted.data())
                      .ok());
      EXPECT_EQ(checked, trusted) << "budget " << budget;
    }
  fc::Options many_sinks;
  many_sinks.select.sink = 40;
  std::vector<std::int32_t> kept(4);
  EXPECT_EQ(
      fc::detail::select_shared_tokens_trusted(views.data(), 2, 4, many_sinks.select, {}, {}, so, &ws, kept.data())
          .code(),
      fc::Errc::invalid_budget);
}

TEST(SharedKeep, ExactlyBudgetAscendingAndAlwaysKept) {
  const std::int64_t n = 101;
  Model m = random_model({2, 3, 5}, n, 7);
  m.score[0][static_cast<std::size_t>(1 * n + 55)] = kNaN;
  m.score[2][static_cast<std::size_t>(4 * n + 77)] = kInf;
  std::vector<std::uint8_t> mask(static_cast<std::size_t>(n), 0);
  mask[40] = 1;
  fc::Options opt;  // sink 4, window_share 0.5
  opt.select.window = 2;
  for (fc::HeadCombine c : kCombines)
    for (std::int64_t page : {1, 4, 7})
      for (std::int64_t budget = 0; budget <= n; ++budget) {
        std::vector<std::int32_t> kept;
        if (!run(m, budget, opt, mask, c, page, &kept).ok()) continue;
        ASSERT_EQ(static_cast<std::int64_t>(kept.size()), budget);
        EXPECT_TRUE(std::is_sorted(kept.begin(), kept.end()));
        EXPECT_EQ(std::adjacent_find(kept.begin(), kept.end()), kept.end());
        for (std::int32_t t : {0, 1, 2, 3, 40, 55, 77, 99, 100})
          EXPECT_TRUE(std::binary_search(kept.begin(), kept.end(), t)) << "token " << t << " page " << page;
        // Whole pages: every kept token's page is kept entirely.
        for (std::int32_t t : kept) {
          const std::int64_t p0 = t / page * page, p1 = std::min<std::int64_t>(n, p0 + page);
          for (std::int64_t u = p0; u < p1; ++u)
            EXPECT_TRUE(std::binary_search(kept.begin(), kept.end(), static_cast<std::int32_t>(u)));
        }
      }
}

TEST(SharedKeep, BudgetBelowAlwaysKeptIsNamedError) {
  const std::int64_t n = 37;
  Model m = random_model({2, 3}, n, 3);
  m.score[1][static_cast<std::size_t>(2 * n + 20)] = kNaN;
  std::vector<std::uint8_t> mask(static_cast<std::size_t>(n), 0);
  mask[12] = 1;
  fc::Options opt = fc::Options::paper();
  opt.select.sink = 4;
  opt.select.window = 3;  // 4 + 3 + mask 1 + NaN 1 = 9 always kept
  std::vector<std::int32_t> kept;
  fc::Status st = run(m, 8, opt, mask, fc::HeadCombine::mean_normalized, 1, &kept);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), fc::Errc::invalid_budget);
  EXPECT_NE(st.message().find("keep budget 8 < 9 always-kept tokens"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("sink 4, window 3, mask 1, non-finite 1"), std::string::npos) << st.message();
  EXPECT_TRUE(run(m, 9, opt, mask, fc::HeadCombine::mean_normalized, 1, &kept).ok());
  // Pages of 4 (37 = 9 full pages + 1): pages 0, 3, 5 and the last two (32-35, 36) hold them: 4+4+4+4+1 = 17.
  st = run(m, 16, opt, mask, fc::HeadCombine::votes, 4, &kept);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("leaves out the last page"), std::string::npos) << st.message();
  st = run(m, 13, opt, mask, fc::HeadCombine::votes, 4, &kept);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("keep budget 13 < 17 always-kept tokens"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("whole pages of 4"), std::string::npos) << st.message();
  EXPECT_TRUE(run(m, 17, opt, mask, fc::HeadCombine::votes, 4, &kept).ok());
}

TEST(SharedKeep, BudgetNotWholePagesIsNamedError) {
  const std::int64_t n = 37;  // pages of 7: 5 full pages and a last page of 2
  Model m = random_model({3}, n, 5);
  std::vector<std::int32_t> kept;
  for (std::int64_t ok : {0, 2, 7, 9, 14, 16, 35, 37})
    EXPECT_TRUE(run(m, ok, fc::Options::paper(), {}, fc::HeadCombine::mean_normalized, 7, &kept).ok()) << ok;
  const fc::Status st = run(m, 12, fc::Options::paper(), {}, fc::HeadCombine::mean_normalized, 7, &kept);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), fc::Errc::invalid_budget);
  EXPECT_NE(st.message().find("keep budget 12 is not whole pages of 7 tokens"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("nearest 9 and 14"), std::string::npos) << st.message();
  // A budget with the partial last page keeps it.
  ASSERT_TRUE(run(m, 9, fc::Options::paper(), {}, fc::HeadCombine::mean_normalized, 7, &kept).ok());
  EXPECT_EQ(kept.back(), 36);
  EXPECT_EQ(kept[kept.size() - 2], 35);
  // A multiple of the page leaves it out.
  ASSERT_TRUE(run(m, 14, fc::Options::paper(), {}, fc::HeadCombine::mean_normalized, 7, &kept).ok());
  EXPECT_LT(kept.back(), 35);
}

TEST(SharedKeep, PerLayerWithOneLayerEqualsPerSequence) {
  const Model m = random_model({5}, 101, 11, 6);
  for (fc::HeadCombine c : kCombines)
    for (std::int64_t page : {1, 4, 7})
      for (std::int64_t budget : {0, 28, 33, 56, 100, 101}) {
        std::vector<std::int32_t> a, b;
        const fc::Status sa = run(m, budget, fc::Options{}, {}, c, page, &a, fc::KeepSet::per_layer);
        const fc::Status sb = run(m, budget, fc::Options{}, {}, c, page, &b, fc::KeepSet::per_sequence);
        ASSERT_EQ(sa.ok(), sb.ok()) << sa.message() << " / " << sb.message();
        EXPECT_EQ(a, b);
      }
  // per_layer takes one layer; per_head has no shared set.
  const Model two = random_model({2, 2}, 20, 1);
  std::vector<std::int32_t> kept;
  fc::Status st = run(two, 10, fc::Options{}, {}, fc::HeadCombine::votes, 1, &kept, fc::KeepSet::per_layer);
  EXPECT_EQ(st.code(), fc::Errc::invalid_option);
  EXPECT_NE(st.message().find("per_layer"), std::string::npos);
  st = run(two, 10, fc::Options{}, {}, fc::HeadCombine::votes, 1, &kept, fc::KeepSet::per_head);
  EXPECT_EQ(st.code(), fc::Errc::invalid_option);
}

TEST(SharedKeep, OneHeadPerLayerEqualsSelectTokens) {
  for (std::int64_t n : {37, 101})
    for (int distinct : {0, 3}) {
      Model m = random_model({1}, n, static_cast<std::uint64_t>(n + distinct), distinct);
      m.score[0][5] = kNaN;
      std::vector<std::uint8_t> mask(static_cast<std::size_t>(n), 0);
      mask[static_cast<std::size_t>(n - 10)] = 1;
      for (const fc::Options& opt : option_sets())
        for (fc::HeadCombine c : kCombines)
          for (std::int64_t budget = 0; budget <= n; ++budget) {
            std::vector<std::int32_t> shared, single(static_cast<std::size_t>(budget));
            const fc::Status a = run(m, budget, opt, mask, c, 1, &shared, fc::KeepSet::per_layer);
            fc::SelectWorkspace ws;
            const fc::Status b =
                fc::select_tokens(m.views()[0], budget, opt.select, mask, {}, &ws, fc::KeptView{single.data(), budget});
            ASSERT_EQ(a.ok(), b.ok()) << a.message() << " / " << b.message();
            if (a.ok()) {
              ASSERT_EQ(shared, single) << fc::to_string(c) << " budget " << budget;
            }
          }
    }
}

TEST(SharedKeep, ImageSpansNeedPageOne) {
  const Model m = random_model({2}, 40, 2);
  fc::Options opt = fc::Options::paper();
  const std::vector<fc::GridSpan> spans = {{4, 4, 4}};
  opt.select.base_share = 0.5;
  std::vector<std::int32_t> kept;
  EXPECT_TRUE(
      run(m, 12, opt, {}, fc::HeadCombine::mean_normalized, 1, &kept, fc::KeepSet::per_sequence, spans).ok());
  const fc::Status st =
      run(m, 12, opt, {}, fc::HeadCombine::mean_normalized, 4, &kept, fc::KeepSet::per_sequence, spans);
  EXPECT_EQ(st.code(), fc::Errc::unsupported);
}

TEST(SharedKeep, NamesParseAndPrint) {
  for (fc::KeepSet k : {fc::KeepSet::per_head, fc::KeepSet::per_layer, fc::KeepSet::per_sequence}) {
    fc::KeepSet back{};
    ASSERT_TRUE(fc::parse_keep_set(fc::to_string(k), &back).ok());
    EXPECT_EQ(back, k);
  }
  for (fc::HeadCombine c : kCombines) {
    fc::HeadCombine back{};
    ASSERT_TRUE(fc::parse_head_combine(fc::to_string(c), &back).ok());
    EXPECT_EQ(back, c);
  }
  fc::KeepSet k{};
  fc::HeadCombine c{};
  EXPECT_NE(fc::parse_keep_set("per_token", &k).message().find("per_token"), std::string::npos);
  EXPECT_NE(fc::parse_head_combine("median", &c).message().find("median"), std::string::npos);
  std::vector<std::int32_t> kept;
  EXPECT_EQ(run(random_model({1}, 8, 1), 4, fc::Options::paper(), {}, c, 0, &kept).code(), fc::Errc::invalid_option);
}

TEST(SharedKeep, WarmWorkspaceAllocatesNothing) {
  const Model m = random_model({2, 3, 5}, 101, 21), other = random_model({2, 3, 5}, 101, 22);
  const auto views = m.views(), other_views = other.views();
  std::vector<std::int32_t> kept(101);
  fc::SharedKeepWorkspace ws;
  for (fc::HeadCombine c : kCombines)
    for (std::int64_t page : {1, 4}) {
      fc::SharedKeepOptions so;
      so.combine = c;
      so.page = page;
      ASSERT_TRUE(fc::select_shared_tokens(views.data(), 3, 100, fc::Options{}.select, {}, {}, so, &ws, kept.data()).ok());
      const long before = allocations.load();
      const fc::Status st =
          fc::select_shared_tokens(other_views.data(), 3, 52, fc::Options{}.select, {}, {}, so, &ws, kept.data());
      const long during = allocations.load() - before;
      ASSERT_TRUE(st.ok()) << st.message();
      EXPECT_EQ(during, 0) << fc::to_string(c) << " page " << page;
    }
}

// compress_scored_model with each keep-set: per_head keeps what kKeepPerHead keeps; per_layer
// plans as it does; per_sequence keeps round(ratio * N) everywhere.
TEST(SharedKeep, CompressModelShared) {
  const std::int64_t heads = 3, n = 64, d = 8, layers = 3;
  std::vector<std::vector<float>> k(layers), v(layers);
  std::vector<fc::KVView<const float>> kv, vv;
  std::mt19937 rng(4);
  std::normal_distribution<float> g;
  for (std::int64_t l = 0; l < layers; ++l) {
    k[l].resize(static_cast<std::size_t>(heads * n * d));
    v[l].resize(k[l].size());
    for (std::size_t i = 0; i < k[l].size(); ++i) {
      k[l][i] = std::sin(0.05f * static_cast<float>(i % static_cast<std::size_t>(n * d))) +
                0.3f * g(rng) * static_cast<float>(l + 1);
      v[l][i] = g(rng);
    }
    kv.push_back(fc::hnd<const float>(k[l].data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(d)));
    vv.push_back(fc::hnd<const float>(v[l].data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(d)));
  }
  const auto scored = [&] {
    std::vector<fc::LayerScores> s(layers);
    fc::Scorer<float> scorer;
    for (std::int64_t l = 0; l < layers; ++l) EXPECT_TRUE(scorer.score(kv[l], vv[l], fc::Options{}.score, &s[l]).ok());
    return s;
  };
  const auto budget = fc::Budget::ratio(0.25);
  fc::CompressedModel<float> base, head, layer, seq;
  ASSERT_TRUE(fc::compress_scored_model<float>(kv, vv, scored(), budget, fc::Options{}, fc::kKeepPerHead, {}, {}, &base)
                  .ok());
  fc::SharedKeepOptions so;
  so.keep_set = fc::KeepSet::per_head;
  ASSERT_TRUE(fc::compress_scored_model<float>(kv, vv, scored(), budget, fc::Options{}, so, {}, {}, &head).ok());
  for (std::int64_t l = 0; l < layers; ++l) EXPECT_EQ(head.layers[l].kept, base.layers[l].kept);

  so.keep_set = fc::KeepSet::per_layer;
  const fc::Status sl = fc::compress_scored_model<float>(kv, vv, scored(), budget, fc::Options{}, so, {}, {}, &layer);
  ASSERT_TRUE(sl.ok()) << sl.message();
  EXPECT_EQ(layer.tokens_after(), base.tokens_after());
  EXPECT_EQ(layer.budgets, base.budgets);  // same plan: the shared floors are below the budgets here
  const auto all_scores = scored();
  for (std::int64_t l = 0; l < layers; ++l) {
    const auto& out = layer.layers[l];
    std::vector<std::int32_t> want(static_cast<std::size_t>(out.budget));
    fc::SharedKeepWorkspace ws;
    fc::SharedKeepOptions one;
    one.keep_set = fc::KeepSet::per_layer;
    const fc::ScoreView view = all_scores[l].view();
    ASSERT_TRUE(
        fc::select_shared_tokens(&view, 1, out.budget, fc::Options{}.select, {}, {}, one, &ws, want.data()).ok());
    for (std::int64_t h = 0; h < heads; ++h)
      EXPECT_EQ(std::vector<std::int32_t>(out.kept_head(h), out.kept_head(h) + out.budget), want);
    // K' holds the kept rows.
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t i = 0; i < out.budget; ++i)
        EXPECT_EQ(out.k[static_cast<std::size_t>((h * out.budget + i) * d)],
                  k[l][static_cast<std::size_t>((h * n + want[static_cast<std::size_t>(i)]) * d)]);
  }

  so.keep_set = fc::KeepSet::per_sequence;
  so.page = 4;  // 16 = round(0.25 * 64) is whole pages
  const fc::Status ss = fc::compress_scored_model<float>(kv, vv, scored(), budget, fc::Options{}, so, {}, {}, &seq);
  ASSERT_TRUE(ss.ok()) << ss.message();
  std::vector<fc::ScoreView> views;
  for (const auto& s : all_scores) views.push_back(s.view());
  std::vector<std::int32_t> want(16);
  fc::SharedKeepWorkspace ws;
  ASSERT_TRUE(
      fc::select_shared_tokens(views.data(), layers, 16, fc::Options{}.select, {}, {}, so, &ws, want.data()).ok());
  for (std::int64_t l = 0; l < layers; ++l) {
    EXPECT_EQ(seq.budgets[l], 16);
    for (std::int64_t h = 0; h < heads; ++h)
      EXPECT_EQ(std::vector<std::int32_t>(seq.layers[l].kept_head(h), seq.layers[l].kept_head(h) + 16), want);
  }
  // Layers of different lengths cannot share one set.
  auto short_k = kv, short_v = vv;
  short_k[1] = fc::hnd<const float>(k[1].data(), fc::Heads(heads), fc::Tokens(n - 1), fc::HeadDim(d));
  short_v[1] = fc::hnd<const float>(v[1].data(), fc::Heads(heads), fc::Tokens(n - 1), fc::HeadDim(d));
  std::vector<fc::LayerScores> short_scores(layers);
  fc::Scorer<float> scorer;
  for (std::int64_t l = 0; l < layers; ++l)
    ASSERT_TRUE(scorer.score(short_k[l], short_v[l], fc::Options{}.score, &short_scores[l]).ok());
  so.page = 1;
  EXPECT_EQ(
      fc::compress_scored_model<float>(short_k, short_v, std::move(short_scores), budget, fc::Options{}, so, {}, {}, &seq)
          .code(),
      fc::Errc::invalid_shape);
}

}  // namespace
