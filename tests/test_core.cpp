// The no-throw core: score into caller buffers, plan, select into a caller
// buffer with a reusable workspace, gather into caller views, and protect
// masks as arguments. The reference for each is the owning front door
// (test_compress.cpp checks that one against the stages and the naive DCT).
#include <gtest/gtest.h>
#include <flashcache/flashcache.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "model_data.hpp"

namespace fc = flashcache;
using flashcache::testing::every;
using flashcache::testing::Model;

namespace {

// The paper's settings: no sink or window unless a test asks for one.
const fc::Options kPaper = fc::Options::paper();

// The core stages by hand, as an engine would run them, into caller buffers.
struct CoreResult {
  std::vector<std::int64_t> budgets;
  std::vector<std::vector<std::int32_t>> kept;
  std::vector<std::vector<float>> k, v;
};

fc::Status run_core(const Model& m, fc::Budget budget, const fc::Options& opt,
                    const std::vector<fc::ProtectMask>& masks, CoreResult* r) {
  fc::Scorer<float> scorer;  // one scorer for layers of every length
  const auto layers = m.tokens.size();
  std::vector<std::vector<float>> scores(layers);
  std::vector<std::vector<fc::HeadEnergy>> energy(layers);
  std::vector<fc::LayerSummary> summary(layers);
  for (std::size_t l = 0; l < layers; ++l) {
    scores[l].resize(static_cast<std::size_t>(m.heads * m.tokens[l]));
    energy[l].resize(static_cast<std::size_t>(m.heads));
    FLASHCACHE_RETURN_IF_ERROR(scorer.score(m.kv[l], m.vv[l], opt.score, fc::ScoreBuffers{scores[l].data(), energy[l].data()}));
    const fc::ProtectMask mask = masks.empty() ? fc::ProtectMask{} : masks[l];
    summary[l] = fc::summarize({scores[l].data(), m.heads, m.tokens[l]}, energy[l].data(), opt.select, mask);
  }
  r->budgets.resize(layers);
  fc::BudgetPlanner planner;
  FLASHCACHE_RETURN_IF_ERROR(planner.plan(summary.data(), static_cast<int>(layers), budget, opt.allocate, r->budgets.data()));
  fc::SelectWorkspace ws;
  r->kept.resize(layers);
  r->k.resize(layers);
  r->v.resize(layers);
  for (std::size_t l = 0; l < layers; ++l) {
    const std::int64_t b = r->budgets[l];
    r->kept[l].resize(static_cast<std::size_t>(m.heads * b));
    r->k[l].resize(static_cast<std::size_t>(m.heads * b * m.d));
    r->v[l].resize(r->k[l].size());
    const fc::ProtectMask mask = masks.empty() ? fc::ProtectMask{} : masks[l];
    FLASHCACHE_RETURN_IF_ERROR(fc::select_tokens({scores[l].data(), m.heads, m.tokens[l]}, b, opt.select, mask, {}, &ws,
                                                 fc::KeptView{r->kept[l].data(), b}));
    FLASHCACHE_RETURN_IF_ERROR(fc::gather(
        m.kv[l], r->kept[l].data(), fc::hnd(r->k[l].data(), fc::Heads(m.heads), fc::Tokens(b), fc::HeadDim(m.d))));
    FLASHCACHE_RETURN_IF_ERROR(fc::gather(
        m.vv[l], r->kept[l].data(), fc::hnd(r->v[l].data(), fc::Heads(m.heads), fc::Tokens(b), fc::HeadDim(m.d))));
  }
  return fc::Status::success();
}

TEST(Core, StagesByHandMatchTheFrontDoor) {
  const Model m(3, 6, {37, 53, 29});
  for (auto alloc : {fc::Allocation::dynamic, fc::Allocation::uniform}) {
    fc::Options opt = fc::Options::paper();
    opt.allocate.mode = alloc;
    opt.select.sink = 1;
    opt.select.window_share = 0.1;
    CoreResult r;
    ASSERT_TRUE(run_core(m, fc::Budget::ratio(0.3), opt, {}, &r).ok());
    const auto ref = fc::compress_model(m.kv, m.vv, fc::Budget::ratio(0.3), opt);
    EXPECT_EQ(r.budgets, ref.budgets) << fc::to_string(alloc);
    for (std::size_t l = 0; l < m.tokens.size(); ++l) {
      EXPECT_EQ(r.kept[l], ref.layers[l].kept) << "layer " << l;
      EXPECT_EQ(r.k[l], ref.layers[l].k) << "layer " << l;
      EXPECT_EQ(r.v[l], ref.layers[l].v) << "layer " << l;
    }
  }
  // Dynamic allocation moved budget between layers, so the test above compared more than a uniform split.
  CoreResult r;
  ASSERT_TRUE(run_core(m, fc::Budget::ratio(0.3), kPaper, {}, &r).ok());
  EXPECT_NE(r.budgets, (std::vector<std::int64_t>{11, 16, 9}));
}

TEST(Core, PerLayerMasksOfDifferentLengths) {
  const Model m(2, 5, {31, 47});
  const std::vector<std::vector<std::uint8_t>> bytes{every(31, 4, 1), every(47, 5, 2)};
  const std::vector<fc::ProtectMask> masks{bytes[0], bytes[1]};
  CoreResult r;
  ASSERT_TRUE(run_core(m, fc::Budget::ratio(0.5), kPaper, masks, &r).ok());
  const auto ref = fc::compress_model(m.kv, m.vv, fc::Budget::ratio(0.5), kPaper, masks);
  EXPECT_EQ(r.budgets, ref.budgets);
  for (std::size_t l = 0; l < 2; ++l) {
    EXPECT_EQ(r.kept[l], ref.layers[l].kept);
    for (std::int64_t h = 0; h < m.heads; ++h)
      for (std::int64_t t = 0; t < m.tokens[l]; ++t)
        if (bytes[l][static_cast<std::size_t>(t)]) {
          const auto* kept = ref.layers[l].kept_head(h);
          EXPECT_TRUE(std::binary_search(kept, kept + ref.layers[l].budget, static_cast<std::int32_t>(t)))
              << "layer " << l << " head " << h << " token " << t;
        }
  }
}

TEST(Core, MaskOfTheWrongLengthIsNamed) {
  const Model m(2, 4, {40, 40});
  const auto bytes = every(40, 3, 0);
  const auto short_mask = every(39, 3, 0);
  try {
    (void)fc::compress_model(m.kv, m.vv, fc::Budget::ratio(0.5), kPaper, {bytes, short_mask});
    FAIL() << "a short mask was accepted";
  } catch (const fc::Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 1: protect mask has 39 tokens but the layer has 40"), std::string::npos)
        << e.what();
  }
  fc::SelectWorkspace ws;
  std::vector<float> scores(80, 1.0f);
  std::vector<std::int32_t> kept(40);
  const fc::Status s =
      fc::select_tokens({scores.data(), 2, 40}, 20, kPaper.select, short_mask, {}, &ws, fc::KeptView{kept.data(), 20});
  EXPECT_EQ(s.code(), fc::Errc::invalid_option) << s.message();
}

}  // namespace
