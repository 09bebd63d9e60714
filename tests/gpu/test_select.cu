// The select stage (flashcache/cuda/kernels/select.cuh): the base sample's and
// the recent window's rules replayed on the host against the CPU, and on the
// device: the defaults' window share, the base sample, budgets from none to
// all, exact ties, and the budgets the device must refuse.
#include <gtest/gtest.h>

#include "element_types.cuh"
#include "flashcache/select.hpp"
#include "gpu_testing.cuh"
#include "host_fixture.cuh"

namespace flashcache::gpu_testing {
namespace {

using host::expect_error;

// Kept sets against the CPU, for each element type.
FLASHCACHE_ELEMENT_TYPED_SUITE(GpuSelect);

// The library's defaults: 4 sink tokens and the newest half of each layer's
// budget, ranked above every score on the GPU, newest first, as on the CPU; then
// a fixed window larger than the share, and the share with a mask and NaNs.
TYPED_TEST(GpuSelect, DefaultOptionsKeepTheRecentWindowShare) {
  FLASHCACHE_REQUIRE_DEVICE();
  for (int variant = 0; variant < 3; ++variant) {
    Case c;
    c.name = "defaults, variant " + std::to_string(variant);
    c.layers = 3;
    c.heads = 2;
    c.head_dim = 64;
    c.lengths = {0, 33, 300, 1000, 57};
    c.opt = Options{};
    if (variant == 1) {
      c.opt.score.transform = Transform::global;
      // Larger than round(0.25 * budget) in the short sequences (budgets 10 and 17), yet
      // within every budget with the sink: the CPU refuses a sink + window above a budget.
      c.opt.select.window = 5;
      c.opt.select.window_share = 0.25;
    }
    if (variant == 2) {
      c.mask_every = 37;
      c.nan_tokens = 4;
      c.opt.allocate.mode = Allocation::uniform;
    }
    c.budget = Budget::ratio(0.3);
    c.seed = 4321 + static_cast<std::uint64_t>(variant);
    run_and_check<TypeParam>(c);
  }
}

// The base sample: evenly spaced tokens (base_share) and, inside image spans,
// a regular sub-grid (grid_base_share, 0.75 by default), after the sink and the
// recent window, as select.hpp picks them.
TYPED_TEST(GpuSelect, BaseSampleMatchesTheCpu) {
  FLASHCACHE_REQUIRE_DEVICE();
  for (int variant = 0; variant < 4; ++variant) {
    const bool spans = variant >= 2;
    const Transform transform = variant % 2 ? Transform::global : Transform::blocked;
    Case c;
    c.name = std::string("base sample, ") + (spans ? "spans, " : "") + to_string(transform);
    c.layers = 2;
    c.heads = 2;
    c.head_dim = 64;
    c.lengths = {120, 97, 300};
    c.opt = Options{};  // sink 4, half the budget to the recent window, grid_base_share 0.75
    c.opt.score.transform = transform;
    if (transform == Transform::blocked) c.opt.score.base = Base::lowpass;  // the GPU's blocked kernel: low-pass only
    c.opt.score.block_size = 32;
    c.opt.select.base_share = spans ? 0.1 : 0.25;
    c.opt.allocate.mode = Allocation::uniform;  // exact budgets: the sample's picks follow the budget
    if (spans) c.spans = {{10, 7, 5}, {50, 6, 6}};
    c.mask_every = 23;
    c.nan_tokens = 3;
    c.budget = Budget::ratio(0.4);
    c.seed = 77 + static_cast<std::uint64_t>(variant);
    run_and_check<TypeParam>(c);
  }
}

TYPED_TEST(GpuSelect, BudgetsNoneAllAndCounts) {
  FLASHCACHE_REQUIRE_DEVICE();
  const std::vector<Budget> budgets = {Budget::tokens(0), Budget::ratio(1.0), Budget::tokens(1), Budget::tokens(50),
                                       Budget::ratio(0.5)};
  for (std::size_t i = 0; i < budgets.size(); ++i) {
    Case c;
    c.name = "budget case " + std::to_string(i);
    c.lengths = {50, 120};
    c.opt = blocked(64);
    c.budget = budgets[i];
    c.seed = 900 + i;
    run_and_check<TypeParam>(c);
  }
}

TYPED_TEST(GpuSelect, BudgetBelowProtectedIsReported) {
  FLASHCACHE_REQUIRE_DEVICE();
  Case c;
  c.lengths = {100, 100};
  c.opt = blocked(64);
  c.opt.select.sink = 8;
  c.opt.select.window = 8;
  c.budget = Budget::tokens(10);
  c.gather = false;
  const Status s = run_expecting_device_failure<TypeParam>(c);
  EXPECT_EQ(s.code(), Errc::invalid_budget) << s.message();
  EXPECT_NE(s.message().find("protected"), std::string::npos) << s.message();
}

TYPED_TEST(GpuSelect, CountAboveAShortSequenceIsReported) {
  FLASHCACHE_REQUIRE_DEVICE();
  Case c;
  c.lengths = {100, 5};
  c.opt = blocked(64);
  c.budget = Budget::tokens(10);
  c.gather = false;
  const Status s = run_expecting_device_failure<TypeParam>(c);
  EXPECT_EQ(s.code(), Errc::invalid_budget) << s.message();
  EXPECT_NE(s.message().find("sequence 1"), std::string::npos) << s.message();
}

// Exact ties: all-zero rows score 0 everywhere, and the
// kept set must be the CPU's, the lowest indices.
TYPED_TEST(GpuSelect, ExactTiesGoToTheLowerIndex) {
  FLASHCACHE_REQUIRE_DEVICE();
  for (Transform transform : {Transform::blocked, Transform::global}) {
    Case c =
        one_sequence(257, transform == Transform::blocked ? blocked(64) : global_transform(), {}, Budget::ratio(0.3));
    c.all_zero = true;
    c.name = std::string("all zero / ") + to_string(transform);
    run_and_check<TypeParam>(c);
  }
}

}  // namespace
}  // namespace flashcache::gpu_testing

namespace flashcache::gpu_testing::host {
namespace {

// ---- the base sample of select_kernel: its rules and its order of passes --------

// base_sample_kernel (flashcache/cuda/kernels/select.cuh) replayed on the host, one
// token or cell at a time where the kernel scans a CTA's worth: which tokens it
// marks, given the forced ones.
std::vector<std::uint8_t> base_sample_as_the_kernel_does(const std::vector<std::uint8_t>& forced, std::int64_t recent,
                                                         std::int64_t budget, const Options& opt,
                                                         const std::vector<GridSpan>& spans) {
  namespace kn = fcc::kernels;
  const auto n = static_cast<std::int64_t>(forced.size());
  std::vector<std::uint8_t> mark(forced.size(), 0);
  const kn::GridSpans grids = fcc::detail::grid_spans(spans, opt.score);
  long long forced_count = 0;
  for (std::uint8_t f : forced) forced_count += f;
  const std::int64_t window_start = flashcache::rules::recent_window_start(n, recent, grids);
  auto in_window = [&](std::int64_t t) { return t >= window_start && !grids.contains(t); };
  long long window_free = 0;
  for (std::int64_t t = window_start; t < n; ++t) window_free += in_window(t) && !forced[static_cast<std::size_t>(t)];
  const long long room = budget - forced_count;
  const long long window_taken = std::min(window_free, room);
  const long long room_left = room - window_taken;
  const long long free = n - forced_count - window_taken;
  auto taken = [&](std::int64_t t) { return in_window(t) || forced[static_cast<std::size_t>(t)] != 0; };
  auto mark_evenly = [&](long long count, long long pool, auto eligible) {
    count = std::min(count, pool);
    if (count <= 0) return;
    long long rank = 0;
    for (std::int64_t t = 0; t < n; ++t)
      if (eligible(t)) {
        if (kn::evenly_spaced_pick(rank, count, pool)) mark[static_cast<std::size_t>(t)] = 1;
        ++rank;
      }
  };
  if (room_left <= 0 || free <= 0) return mark;
  if (grids.count == 0) {
    mark_evenly(std::min<long long>(std::llround(opt.select.base_share * static_cast<double>(budget)), room_left), free,
                [&](std::int64_t t) { return !taken(t); });
    return mark;
  }
  long long marked = 0, free_in_spans = 0;
  for (int g = 0; g < grids.count; ++g) {
    const long long first = grids.first[g], rows = grids.rows[g], cols = grids.cols[g];
    long long part = 0;
    for (long long t = first; t < first + rows * cols; ++t) part += !taken(t);
    free_in_spans += part;
    long long count = kn::base_share_of(opt.select.grid_base_share, budget, part, free);
    count = std::min({count, room_left - marked, rows * cols});
    if (count <= 0) continue;
    const kn::GridSampleShape shape = kn::grid_sample_shape(count, rows, cols);
    long long eligible = 0;
    for (long long cell = 0; cell < shape.r * shape.c; ++cell) {
      const long long t = kn::grid_sample_token(first, rows, cols, shape, cell);
      if (taken(t)) continue;
      if (eligible < count) mark[static_cast<std::size_t>(t)] = 1;
      ++eligible;
    }
    marked += std::min(eligible, count);
  }
  const long long outside = kn::base_share_of(opt.select.base_share, budget, free - free_in_spans, free);
  mark_evenly(std::min(outside, room_left - marked), free - free_in_spans,
              [&](std::int64_t t) { return !taken(t) && !grids.contains(t); });
  return mark;
}

TEST(GpuBaseSample, TheKernelsPassesPickWhatTheCpuPicks) {
  std::mt19937_64 rng(5);
  int sampled = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const std::int64_t n = 1 + static_cast<std::int64_t>(rng() % 160);
    std::vector<std::uint8_t> forced(static_cast<std::size_t>(n), 0);
    const int every = 3 + static_cast<int>(rng() % 20);
    for (std::int64_t t = 0; t < n; ++t) forced[static_cast<std::size_t>(t)] = (rng() % every) == 0 || t < 2;
    std::int64_t forced_count = 0;
    for (std::uint8_t f : forced) forced_count += f;
    const std::int64_t budget = forced_count + static_cast<std::int64_t>(rng() % (n - forced_count + 1));
    Options o;
    std::vector<GridSpan> given;
    o.select.window = 0;
    o.select.window_share = (rng() % 3) * 0.25;
    o.select.base_share = (rng() % 3) * 0.2;
    o.select.grid_base_share = (rng() % 4) * 0.25;
    // Up to three spans that fit, in any order, sometimes none.
    const int spans = static_cast<int>(rng() % 4);
    std::int64_t at = static_cast<std::int64_t>(rng() % 8);
    for (int g = 0; g < spans; ++g) {
      const std::int64_t rows = 1 + static_cast<std::int64_t>(rng() % 7),
                         cols = 1 + static_cast<std::int64_t>(rng() % 9);
      if (at + rows * cols > n) break;
      given.push_back({at, rows, cols});
      at += rows * cols + static_cast<std::int64_t>(rng() % 10);
    }
    if (given.size() > 1 && rng() % 2) std::swap(given.front(), given.back());
    SCOPED_TRACE("trial " + std::to_string(trial));
    // The CPU: forced, then the window, then the sample (select_tokens' order).
    std::vector<std::uint8_t> keep = forced;
    const std::int64_t recent = flashcache::window_tokens(o.select, budget);
    std::int64_t taken = forced_count;
    taken += flashcache::keep_recent(n, recent, budget - taken, given, keep.data());
    std::vector<std::uint8_t> before = keep;
    flashcache::keep_base_sample(n, budget, budget - taken, o.select, given, keep.data());
    const std::vector<std::uint8_t> mark = base_sample_as_the_kernel_does(forced, recent, budget, o, given);
    std::int64_t picks = 0;
    for (std::int64_t t = 0; t < n; ++t) {
      const bool cpu = keep[static_cast<std::size_t>(t)] && !before[static_cast<std::size_t>(t)];
      ASSERT_EQ(mark[static_cast<std::size_t>(t)] != 0, cpu) << "token " << t << " of " << n << ", budget " << budget;
      ASSERT_FALSE(mark[static_cast<std::size_t>(t)] && before[static_cast<std::size_t>(t)]) << "token " << t;
      picks += cpu;
    }
    ASSERT_LE(taken + picks, budget);
    sampled += picks > 0;
  }
  EXPECT_GT(sampled, 1000);  // most trials do sample something
}

TEST(GpuBaseSample, KeysOrderTheWindowThenTheSampleAboveEveryScore) {
  namespace kn = fcc::kernels;
  // ordered_key of the largest finite float: its bits with the sign bit set.
  EXPECT_GT(kn::kBaseSampleKey, 0x7F7FFFFFu | 0x80000000u);
  EXPECT_LT(kn::kBaseSampleKey, 0xFFFFFFFFu - static_cast<std::uint32_t>(kn::kMaxWindowAge));
}

// select_kernel's recent window replayed on the host with the kernel's own
// helpers (window_picks_start, window_pick, window_key): where the picks start,
// then the keys of the free tokens and the radix select's rule (the `room`
// highest keys, ties to the lower index). Scores stand in below kBaseSampleKey.
// `keys_only`: the picks start at the window's start (the keys alone decide).
std::vector<std::uint8_t> window_as_the_kernel_does(const std::vector<std::uint8_t>& forced, std::int64_t window_start,
                                                    long long room, const fcc::kernels::GridSpans& grids,
                                                    bool keys_only = false) {
  namespace kn = fcc::kernels;
  const auto n = static_cast<std::int64_t>(forced.size());
  auto free_in_window = [&](std::int64_t t) {
    return kn::window_pick(t, window_start, grids) && !forced[static_cast<std::size_t>(t)];
  };
  long long window_free = 0;
  for (std::int64_t t = window_start; t < n; ++t) window_free += free_in_window(t);
  std::int64_t picks_from = window_start;
  const long long skip = window_free - room;
  if (skip > 0 && !keys_only) {
    picks_from = n;
    long long rank = 0;
    for (std::int64_t t = window_start; t < n; ++t) {
      const bool e = free_in_window(t);
      if (kn::window_picks_start(e, rank, skip)) picks_from = t;
      rank += e;
    }
  }
  // Key in the high word, the complement of the token in the low: larger first is
  // the higher key, ties to the lower token.
  std::vector<std::uint64_t> order;
  order.reserve(forced.size());
  for (std::int64_t t = 0; t < n; ++t) {
    if (forced[static_cast<std::size_t>(t)]) continue;
    const std::uint32_t key = kn::window_pick(t, picks_from, grids)
                                  ? kn::window_key(n - 1 - t)
                                  : 0x80000000u + static_cast<std::uint32_t>((t * 2654435761ull) % 0x7F000000u);
    order.push_back(std::uint64_t{key} << 32 | (0xFFFFFFFFu - static_cast<std::uint32_t>(t)));
  }
  std::vector<std::uint8_t> picked(forced.size(), 0);
  const auto take = static_cast<std::ptrdiff_t>(std::min<long long>(room, static_cast<long long>(order.size())));
  std::nth_element(order.begin(), order.begin() + take, order.end(), std::greater<>());
  for (std::ptrdiff_t i = 0; i < take; ++i) {
    const std::uint64_t item = order[static_cast<std::size_t>(i)];
    if ((item >> 32) > kn::kBaseSampleKey) picked[0xFFFFFFFFu - (item & 0xFFFFFFFFu)] = 1;  // a window pick
  }
  return picked;
}

TEST(GpuSelect, AWindowLongerThanTheKeysTakesItsNewestTokensAsTheCpu) {
  namespace kn = fcc::kernels;
  // 9M window tokens: more than kMaxWindowAge, so keys alone tie the oldest.
  const std::int64_t n = 9'100'300, recent = 9'000'000;
  ASSERT_GT(recent, kn::kMaxWindowAge);
  const std::vector<GridSpan> spans{{n - 70'000, 100, 300}};  // inside the window: never part of it
  const kn::GridSpans grids = fcc::detail::grid_spans(spans, flashcache::ScoreOptions{});
  std::vector<std::uint8_t> forced(static_cast<std::size_t>(n), 0);
  for (std::int64_t t = 0; t < n; ++t) forced[static_cast<std::size_t>(t)] = t < 4 || t % 997 == 5 || t >= n - 16;
  const std::int64_t window_start = flashcache::rules::recent_window_start(n, recent, grids);
  ASSERT_GT(window_start, 0);
  ASSERT_FALSE(forced[static_cast<std::size_t>(window_start)]);
  long long window_free = 0;
  for (std::int64_t t = window_start; t < n; ++t)
    window_free += !grids.contains(t) && !forced[static_cast<std::size_t>(t)];
  for (long long room : {1LL, 10LL, 5000LL, 8'500'000LL, window_free - 1, window_free, window_free + 7}) {
    SCOPED_TRACE("room " + std::to_string(room));
    std::vector<std::uint8_t> cpu = forced;
    const std::int64_t marked = flashcache::keep_recent(n, recent, room, spans, cpu.data());
    ASSERT_EQ(marked, std::min(room, window_free));
    const std::vector<std::uint8_t> gpu = window_as_the_kernel_does(forced, window_start, room, grids);
    std::int64_t mismatches = 0, first = -1, picks = 0;
    for (std::int64_t t = 0; t < n; ++t) {
      const bool want = cpu[static_cast<std::size_t>(t)] && !forced[static_cast<std::size_t>(t)];
      const bool got = gpu[static_cast<std::size_t>(t)] != 0;
      picks += got;
      if (want != got && mismatches++ == 0) first = t;
    }
    EXPECT_EQ(mismatches, 0) << "first at token " << first;
    EXPECT_EQ(picks, marked);
  }
  // The keys alone (the picks from the window's start) take the oldest of the tied ones.
  const long long room = 8'500'000;
  std::vector<std::uint8_t> cpu = forced;
  flashcache::keep_recent(n, recent, room, spans, cpu.data());
  const std::vector<std::uint8_t> keys_only = window_as_the_kernel_does(forced, window_start, room, grids, true);
  EXPECT_TRUE(keys_only[static_cast<std::size_t>(window_start)] && !cpu[static_cast<std::size_t>(window_start)]);
}

}  // namespace
}  // namespace flashcache::gpu_testing::host
