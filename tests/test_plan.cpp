// The budget planner (plan.hpp): errors that name the layer, the fallback
// without energy, and tensor-parallel ranks that plan from all-reduced
// summaries, checked against compress_model on the whole model.
#include <gtest/gtest.h>
#include <flashcache/flashcache.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "model_data.hpp"

namespace fc = flashcache;
using flashcache::testing::Model;

namespace {

// The paper's settings: no sink or window unless a test asks for one.
const fc::Options kPaper = fc::Options::paper();

TEST(Plan, NamesTheLayerAndChecksItsInput) {
  fc::BudgetPlanner planner;
  std::vector<fc::LayerSummary> summary(2);
  summary[0].tokens = 20;
  summary[1].tokens = 8;
  std::vector<std::int64_t> budgets(2);
  fc::Status s = planner.plan(summary.data(), 2, fc::Budget::tokens(10), kPaper.allocate, budgets.data());
  EXPECT_EQ(s.code(), fc::Errc::invalid_budget);
  EXPECT_NE(s.message().find("layer 1: keep budget 10 > 8 tokens"), std::string::npos) << s.message();
  summary[0].protected_count = 19;
  summary[1].protected_count = 8;
  s = planner.plan(summary.data(), 2, fc::Budget::ratio(0.5), kPaper.allocate, budgets.data());
  EXPECT_NE(s.message().find("total budget 14 < 27 always-kept tokens"), std::string::npos) << s.message();
  EXPECT_EQ(planner.plan(nullptr, 2, fc::Budget::ratio(0.5), kPaper.allocate, budgets.data()).code(), fc::Errc::invalid_shape);
  // No energy anywhere: dynamic falls back to a uniform ratio of the model total (round(0.5 * 28) = 14).
  summary[0].protected_count = summary[1].protected_count = 0;
  ASSERT_TRUE(planner.plan(summary.data(), 2, fc::Budget::ratio(0.5), kPaper.allocate, budgets.data()).ok());
  EXPECT_EQ(budgets[0] + budgets[1], 14);
  EXPECT_EQ(budgets[0], 10);
}

// Heads [first, first + count) of a layer: what one tensor-parallel rank holds.
fc::KVView<const float> head_range(fc::KVView<const float> x, std::int64_t first, std::int64_t count) {
  fc::KVView<const float> r = x;
  r.data = x.data + first * x.head_stride;
  r.heads = count;
  return r;
}

TEST(Plan, TensorParallelRanksPlanTheBudgetsOfOneRank) {
  const Model m(8, 6, {45, 45, 45, 45});
  const int layers = 4;
  fc::Options opt = fc::Options::paper();
  opt.select.sink = 2;
  opt.allocate.min_layer_ratio = 0.05;
  const fc::Budget budget = fc::Budget::ratio(0.2);
  // One rank holding every head.
  const auto ref = fc::compress_model(m.kv, m.vv, budget, opt);
  for (int ranks : {2, 3, 4}) {
    std::vector<fc::LayerSummary> reduced(layers);
    std::vector<std::vector<std::vector<float>>> scores(ranks, std::vector<std::vector<float>>(layers));
    for (int r = 0; r < ranks; ++r) {
      const std::int64_t first = m.heads * r / ranks, count = m.heads * (r + 1) / ranks - first;
      fc::Scorer<float> scorer;
      std::vector<fc::HeadEnergy> energy(static_cast<std::size_t>(count));
      for (int l = 0; l < layers; ++l) {
        auto& s = scores[r][l];
        s.resize(static_cast<std::size_t>(count * 45));
        ASSERT_TRUE(scorer
                        .score(head_range(m.kv[l], first, count), head_range(m.vv[l], first, count), opt.score, fc::ScoreBuffers{s.data(),
                               energy.data()})
                        .ok());
        const fc::LayerSummary mine = fc::summarize({s.data(), count, 45}, energy.data(), opt.select, {});
        reduced[l] = r == 0 ? mine : fc::combine(reduced[l], mine);  // the all-reduce
      }
    }
    std::vector<std::int64_t> budgets(layers);
    fc::BudgetPlanner planner;
    ASSERT_TRUE(planner.plan(reduced.data(), layers, budget, opt.allocate, budgets.data()).ok());
    EXPECT_EQ(budgets, ref.budgets) << ranks << " ranks";
    for (int l = 0; l < layers; ++l) EXPECT_NEAR(planner.energy_ratio()[l], ref.energy_ratio[l], 1e-12);
    // With the shared budgets, each rank's selection is the one rank's selection of those heads.
    fc::SelectWorkspace ws;
    for (int r = 0; r < ranks; ++r) {
      const std::int64_t first = m.heads * r / ranks, count = m.heads * (r + 1) / ranks - first;
      for (int l = 0; l < layers; ++l) {
        std::vector<std::int32_t> kept(static_cast<std::size_t>(count * budgets[l]));
        ASSERT_TRUE(fc::select_tokens({scores[r][l].data(), count, 45}, budgets[l], opt.select, {}, {}, &ws,
                                      fc::KeptView{kept.data(), budgets[l]})
                        .ok());
        const auto& all = ref.layers[l].kept;
        EXPECT_TRUE(std::equal(kept.begin(), kept.end(), all.begin() + first * budgets[l]))
            << ranks << " ranks, rank " << r << ", layer " << l;
      }
    }
  }
  // The split moved budget between layers: dynamic allocation was exercised.
  EXPECT_FALSE(std::all_of(ref.budgets.begin(), ref.budgets.end(), [&](std::int64_t b) { return b == 9; }));
}

}  // namespace
