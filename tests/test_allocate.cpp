// The layer budget allocator: exact sums, clamps, monotonicity, degenerate inputs.
#include <gtest/gtest.h>
#include <flashcache/allocate.hpp>

#include <numeric>
#include <random>

namespace fc = flashcache;

namespace {

std::vector<std::int64_t> allocate(const std::vector<double>& r, const std::vector<std::int64_t>& n,
                                   const std::vector<std::int64_t>& floor, std::int64_t total) {
  std::vector<std::int64_t> out;
  const fc::Status s = fc::allocate_budgets(r, n, floor, total, &out);
  EXPECT_TRUE(s.ok()) << s.message();
  return out;
}

std::int64_t sum(const std::vector<std::int64_t>& v) { return std::accumulate(v.begin(), v.end(), std::int64_t{0}); }

TEST(Allocate, ProportionalToEnergyRatioWhenNothingClamps) {
  const auto b = allocate({1.0, 2.0, 1.0}, {1000, 1000, 1000}, {0, 0, 0}, 400);
  EXPECT_EQ(b, (std::vector<std::int64_t>{100, 200, 100}));
}

TEST(Allocate, SumIsExactOnRandomInputs) {
  std::mt19937_64 rng(42);
  for (int trial = 0; trial < 500; ++trial) {
    const int layers = 1 + static_cast<int>(rng() % 40);
    std::vector<double> r(layers);
    std::vector<std::int64_t> n(layers), floor(layers);
    std::int64_t all = 0, floors = 0;
    for (int l = 0; l < layers; ++l) {
      r[l] = (rng() % 5 == 0) ? 0.0 : std::uniform_real_distribution<double>(0, 2)(rng);
      n[l] = static_cast<std::int64_t>(rng() % 3000);
      floor[l] = n[l] ? static_cast<std::int64_t>(rng() % (n[l] / 4 + 1)) : 0;
      all += n[l];
      floors += floor[l];
    }
    const std::int64_t total = floors + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(all - floors + 1));
    const auto b = allocate(r, n, floor, total);
    ASSERT_EQ(sum(b), total) << "trial " << trial;
    for (int l = 0; l < layers; ++l) {
      EXPECT_GE(b[l], floor[l]);
      EXPECT_LE(b[l], n[l]);
    }
  }
}

TEST(Allocate, ClampedLayersPassTheirExcessOn) {
  // Layer 0 wants 90% of 600 = 540 but has only 100 tokens: the rest is water-filled.
  const auto b = allocate({9.0, 0.5, 0.5}, {100, 1000, 1000}, {0, 0, 0}, 600);
  EXPECT_EQ(b[0], 100);
  EXPECT_EQ(b[1] + b[2], 500);
  EXPECT_EQ(b[1], 250);
}

TEST(Allocate, FloorsAreHonoured) {
  const auto b = allocate({1.0, 0.0, 0.0}, {100, 100, 100}, {0, 30, 10}, 120);
  EXPECT_EQ(b, (std::vector<std::int64_t>{80, 30, 10}));
}

TEST(Allocate, MonotoneInEnergyRatio) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int layers = 2 + static_cast<int>(rng() % 10);
    std::vector<double> r(layers);
    std::vector<std::int64_t> n(layers, 500), floor(layers, 5);
    for (auto& x : r) x = std::uniform_real_distribution<double>(0.01, 1)(rng);
    const std::int64_t total = 5 * layers + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(495 * layers));
    const auto before = allocate(r, n, floor, total);
    const int l = static_cast<int>(rng() % layers);
    r[l] *= 1.0 + std::uniform_real_distribution<double>(0, 1)(rng);
    const auto after = allocate(r, n, floor, total);
    EXPECT_GE(after[l], before[l]) << "trial " << trial;
  }
}

TEST(Allocate, AllZeroEnergyFallsBackToUniformRatio) {
  const auto b = allocate({0.0, 0.0, 0.0}, {100, 200, 300}, {0, 0, 0}, 120);
  EXPECT_EQ(b, (std::vector<std::int64_t>{20, 40, 60}));
}

TEST(Allocate, ZeroEnergyLayersTakeWhatFullLayersCannot) {
  // Layer 0 holds all the energy but only 50 tokens; the 150 left go to the others by size.
  const auto b = allocate({1.0, 0.0, 0.0}, {50, 100, 200}, {0, 0, 0}, 200);
  EXPECT_EQ(b, (std::vector<std::int64_t>{50, 50, 100}));
}

TEST(Allocate, RoundingTiesGoToTheLowerLayer) {
  const auto b = allocate({1.0, 1.0, 1.0}, {10, 10, 10}, {0, 0, 0}, 4);
  EXPECT_EQ(b, (std::vector<std::int64_t>{2, 1, 1}));
}

TEST(Allocate, EdgeTotals) {
  EXPECT_EQ(allocate({1.0, 3.0}, {10, 10}, {0, 0}, 0), (std::vector<std::int64_t>{0, 0}));
  EXPECT_EQ(allocate({1.0, 3.0}, {10, 10}, {0, 0}, 20), (std::vector<std::int64_t>{10, 10}));
  EXPECT_TRUE(allocate({}, {}, {}, 0).empty());
}

TEST(Allocate, PreconditionsAreNamed) {
  std::vector<std::int64_t> out;
  auto s = fc::allocate_budgets({1.0, 1.0}, {10, 10}, {0, 0}, 21, &out);
  EXPECT_EQ(s.code(), fc::Errc::invalid_budget);
  EXPECT_NE(s.message().find("total budget 21 > 20 tokens"), std::string::npos) << s.message();
  s = fc::allocate_budgets({1.0, 1.0}, {10, 10}, {6, 6}, 11, &out);
  EXPECT_NE(s.message().find("total budget 11 < 12 always-kept tokens"), std::string::npos) << s.message();
  s = fc::allocate_budgets({1.0, std::nan("")}, {10, 10}, {0, 0}, 5, &out);
  EXPECT_NE(s.message().find("energy ratio of layer 1"), std::string::npos) << s.message();
  s = fc::allocate_budgets({1.0}, {10, 10}, {0, 0}, 5, &out);
  EXPECT_EQ(s.code(), fc::Errc::invalid_shape);
  s = fc::allocate_budgets({1.0}, {10}, {11}, 5, &out);
  EXPECT_EQ(s.code(), fc::Errc::invalid_budget);
}

}  // namespace
