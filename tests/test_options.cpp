// Options and budgets: documented defaults and named refusals.
#include <gtest/gtest.h>
#include <flashcache/archive.hpp>
#include <flashcache/options.hpp>
#include <flashcache/policies/baselines.hpp>
#include <flashcache/recall.hpp>
#include <flashcache/shared_keep.hpp>

#include <cmath>
#include <set>
#include <string>

namespace fc = flashcache;

namespace {

// The defaults are the dev texts' best configuration (bench/quality/README.md):
// the paper's scores with 4 sink tokens and half of the budget on a recent window,
// over 64-token blocks.
TEST(Options, DefaultsAreTheDevChoice) {
  const fc::Options o;
  EXPECT_DOUBLE_EQ(o.score.gamma, 0.05);  // RULER round eighteen, with key_cosine
  EXPECT_EQ(o.score.base, fc::Base::peak);
  EXPECT_EQ(o.score.transform, fc::Transform::global);
  EXPECT_EQ(o.score.block_size, 64);
  EXPECT_EQ(o.select.sink, 4);
  EXPECT_EQ(o.select.window, 0);
  EXPECT_DOUBLE_EQ(o.select.window_share, 0.5);
  EXPECT_DOUBLE_EQ(o.select.base_share, 0.0);
  EXPECT_FALSE(o.score.normalize_terms);
  EXPECT_FALSE(o.score.rope.derotate);
  EXPECT_DOUBLE_EQ(o.score.mean_weight, 0.75);  // RULER's dev2 choice, fading with the keep ratio
  EXPECT_EQ(o.score.mean_mix, fc::TailMix::sum);
  EXPECT_EQ(o.score.mean_distance, fc::MeanDistance::key_cosine);
  EXPECT_DOUBLE_EQ(o.score.mean_full_keep, 0.5);
  EXPECT_DOUBLE_EQ(o.score.mean_zero_keep, 0.25);
  EXPECT_EQ(o.score.bridge, 0);
  EXPECT_EQ(o.allocate.mode, fc::Allocation::dynamic);
  EXPECT_TRUE(fc::check_options(o).ok());
}

TEST(Options, OutOfRangeValuesAreRefusedByName) {
  fc::Options o;
  o.score.gamma = 0;
  EXPECT_NE(fc::check_options(o).message().find("gamma 0 is outside (0, 1]"), std::string::npos);
  o.score.gamma = std::nan("");
  EXPECT_EQ(fc::check_options(o).code(), fc::Errc::invalid_option);
  o = {};
  o.score.transform = fc::Transform::blocked;
  o.score.block_size = 0;
  EXPECT_NE(fc::check_options(o).message().find("block_size 0"), std::string::npos);
  o = {};
  o.select.sink = -1;
  EXPECT_NE(fc::check_options(o).message().find("sink -1"), std::string::npos);
  o = {};
  o.allocate.min_layer_ratio = 1.5;
  EXPECT_EQ(fc::check_options(o).code(), fc::Errc::invalid_option);
}

TEST(Budget, ResolvesCountsAndRatios) {
  std::int64_t n = -1;
  ASSERT_TRUE(fc::Budget::ratio(0.2).resolve(257, &n).ok());
  EXPECT_EQ(n, 51);  // round(51.4)
  ASSERT_TRUE(fc::Budget::ratio(0.5).resolve(5, &n).ok());
  EXPECT_EQ(n, 3);  // halves away from zero
  ASSERT_TRUE(fc::Budget::tokens(12).resolve(12, &n).ok());
  EXPECT_EQ(n, 12);
  const auto s = fc::Budget::tokens(300).resolve(257, &n);
  EXPECT_EQ(s.code(), fc::Errc::invalid_budget);
  EXPECT_NE(s.message().find("keep budget 300 > 257 tokens"), std::string::npos) << s.message();
  EXPECT_FALSE(fc::Budget::tokens(-1).resolve(10, &n).ok());
  EXPECT_FALSE(fc::Budget::ratio(1.01).resolve(10, &n).ok());
  EXPECT_FALSE(fc::Budget::ratio(std::nan("")).resolve(10, &n).ok());
}

}  // namespace

namespace {

TEST(Options, PaperPresetIsThePaperExactly) {
  const fc::Options p = fc::Options::paper();
  EXPECT_DOUBLE_EQ(p.score.gamma, 0.2);
  EXPECT_EQ(p.score.transform, fc::Transform::global);
  EXPECT_EQ(p.select.sink, 0);
  EXPECT_EQ(p.select.window, 0);
  EXPECT_EQ(p.select.window_share, 0.0);
  EXPECT_EQ(p.select.base_share, 0.0);
  EXPECT_FALSE(p.score.normalize_terms);
  EXPECT_FALSE(p.score.rope.derotate);
  EXPECT_DOUBLE_EQ(p.score.mean_weight, 0.0);
  EXPECT_DOUBLE_EQ(p.score.mean_full_keep, 0.0);
  EXPECT_DOUBLE_EQ(p.score.mean_zero_keep, 0.0);
  EXPECT_EQ(p.score.bridge, 0);
  EXPECT_EQ(p.allocate.mode, fc::Allocation::dynamic);
  EXPECT_TRUE(fc::check_options(p).ok());
}

TEST(Options, MeanWeightIsCheckedByName) {
  fc::Options o;
  o.score.mean_weight = 1.5;
  EXPECT_NE(fc::check_options(o).message().find("mean_weight 1.5 is outside [0, 1]"), std::string::npos);
  o.score.mean_weight = std::nan("");
  EXPECT_NE(fc::check_options(o).message().find("mean_weight nan"), std::string::npos)
      << fc::check_options(o).message();
  o.score.mean_weight = 1.0;
  o.score.mean_mix = static_cast<fc::TailMix>(7);
  EXPECT_NE(fc::check_options(o).message().find("unknown mean_mix"), std::string::npos);
  o.score.mean_mix = fc::TailMix::sum;
  o.score.mean_distance = static_cast<fc::MeanDistance>(7);
  EXPECT_NE(fc::check_options(o).message().find("unknown mean_distance"), std::string::npos);
}

// The weight that follows the budget, against the rule written out by hand:
// full from mean_full_keep up, none up to mean_zero_keep, a straight line between.
TEST(Options, MeanWeightFollowsTheKeepRatio) {
  fc::ScoreOptions o;
  o.mean_weight = 0.75;
  o.mean_full_keep = o.mean_zero_keep = 0.0;  // both 0: the weight at every keep ratio
  for (const double keep : {0.0, 0.1, 0.6, 1.0}) EXPECT_DOUBLE_EQ(fc::mean_weight_at(o, keep), 0.75) << keep;
  o.mean_full_keep = 0.5;
  o.mean_zero_keep = 0.25;
  const std::vector<std::pair<double, double>> expected = {{0.0, 0.0},  {0.2, 0.0},     {0.25, 0.0},
                                                           {0.3, 0.15}, {0.375, 0.375}, {0.45, 0.6},
                                                           {0.5, 0.75}, {0.875, 0.75},  {1.0, 0.75}};
  for (const auto& [keep, w] : expected) EXPECT_NEAR(fc::mean_weight_at(o, keep), w, 1e-12) << keep;
  o.mean_zero_keep = 0.5;  // a step: no ramp to divide by
  EXPECT_DOUBLE_EQ(fc::mean_weight_at(o, 0.4999), 0.0);
  EXPECT_DOUBLE_EQ(fc::mean_weight_at(o, 0.5), 0.75);
  EXPECT_TRUE(fc::check_options(o).ok());
}

TEST(Options, MeanKeepBoundsAreCheckedByName) {
  fc::Options o;
  o.score.mean_zero_keep = -0.1;
  EXPECT_NE(fc::check_options(o).message().find("mean_zero_keep -0.1 is outside [0, 1]"), std::string::npos);
  o = {};
  o.score.mean_zero_keep = 0.5;
  o.score.mean_full_keep = 0.25;
  EXPECT_NE(fc::check_options(o).message().find("mean_full_keep 0.25 is outside [mean_zero_keep 0.5, 1]"),
            std::string::npos)
      << fc::check_options(o).message();
  o.score.mean_full_keep = std::nan("");
  EXPECT_NE(fc::check_options(o).message().find("mean_full_keep nan"), std::string::npos);
  o.score.mean_full_keep = 1.5;
  EXPECT_NE(fc::check_options(o).message().find("mean_full_keep 1.5"), std::string::npos);
}

// The share a budget keeps, which the score's weight follows.
TEST(Options, BudgetKeepRatio) {
  EXPECT_DOUBLE_EQ(fc::Budget::ratio(0.3).keep_ratio(1000), 0.3);
  EXPECT_DOUBLE_EQ(fc::Budget::tokens(25).keep_ratio(100), 0.25);
  EXPECT_DOUBLE_EQ(fc::Budget::tokens(25).keep_ratio(0), 1.0);     // nothing there: nothing dropped
  EXPECT_DOUBLE_EQ(fc::Budget::tokens(250).keep_ratio(100), 1.0);  // resolve() refuses it by name
  EXPECT_DOUBLE_EQ(fc::Budget::ratio(-0.5).keep_ratio(10), 0.0);
}

TEST(Options, SharesAndRopeAreCheckedByName) {
  fc::Options o;
  o.select.window_share = 1.5;
  EXPECT_NE(fc::check_options(o).message().find("window_share 1.5"), std::string::npos);
  o = {};
  o.select.base_share = -0.1;
  EXPECT_NE(fc::check_options(o).message().find("base_share -0.1"), std::string::npos);
  o = {};
  o.score.rope.derotate = true;
  o.score.rope.theta = 0.5;
  EXPECT_NE(fc::check_options(o).message().find("rope theta 0.5"), std::string::npos);
  o.score.rope.theta = 1e4;
  o.score.rope.first_position = -3;
  EXPECT_NE(fc::check_options(o).message().find("first_position -3"), std::string::npos);
}

}  // namespace

namespace {

// The enum tables (enum_names.hpp): every name parses back to its value, names are distinct,
// and a value cast from an integer outside the enum is "unknown" and refused by the checks.
template <class E>
void expect_table_round_trips() {
  std::set<std::string> seen;
  for (const auto& n : fc::EnumNames<E>::table) {
    E back{};
    ASSERT_TRUE(fc::parse_enum(n.name, &back, "value").ok()) << n.name;
    EXPECT_EQ(back, n.value);
    EXPECT_STREQ(fc::enum_name(n.value), n.name);
    EXPECT_TRUE(fc::is_known(n.value));
    EXPECT_TRUE(seen.insert(n.name).second) << n.name << " twice";
  }
  const E stray = static_cast<E>(97);
  EXPECT_FALSE(fc::is_known(stray));
  EXPECT_STREQ(fc::enum_name(stray), "unknown");
  E out{};
  const fc::Status s = fc::parse_enum("no-such-name", &out, "thing");
  EXPECT_EQ(s.code(), fc::Errc::invalid_option);
  EXPECT_NE(s.message().find("unknown thing 'no-such-name' ("), std::string::npos) << s.message();
}

}  // namespace

TEST(Options, EveryEnumNameRoundTrips) {
  expect_table_round_trips<fc::Transform>();
  expect_table_round_trips<fc::Base>();
  expect_table_round_trips<fc::Allocation>();
  expect_table_round_trips<fc::QueryInput>();
  expect_table_round_trips<fc::TailMix>();
  expect_table_round_trips<fc::MeanDistance>();
  expect_table_round_trips<fc::RopeLayout>();
  expect_table_round_trips<fc::GridZone>();
  expect_table_round_trips<fc::KeepSet>();
  expect_table_round_trips<fc::HeadCombine>();
  expect_table_round_trips<fc::RecallScope>();
  expect_table_round_trips<fc::RecallScore>();
  expect_table_round_trips<fc::ArchiveOrder>();
  expect_table_round_trips<fc::RowType>();
  expect_table_round_trips<fc::policies::Policy>();
  EXPECT_EQ(fc::enum_choices<fc::Base>(), "lowpass, peak or mixed");
  EXPECT_EQ(fc::enum_choices<fc::Transform>(), "global or blocked");
}

TEST(Options, AnEnumValueOutsideItsTableIsRefused) {
  fc::Options o;
  o.score.transform = static_cast<fc::Transform>(7);
  EXPECT_NE(fc::check_options(o).message().find("unknown transform"), std::string::npos);
  o = fc::Options();
  o.score.base = static_cast<fc::Base>(7);
  EXPECT_NE(fc::check_options(o).message().find("unknown base"), std::string::npos);
  o = fc::Options();
  o.score.tail_mix = static_cast<fc::TailMix>(7);
  EXPECT_NE(fc::check_options(o).message().find("unknown tail_mix"), std::string::npos);
  o = fc::Options();
  o.allocate.mode = static_cast<fc::Allocation>(7);
  EXPECT_NE(fc::check_options(o).message().find("unknown allocation mode"), std::string::npos);
}
