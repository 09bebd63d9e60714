// The no-throw core: score into caller buffers, plan, select into a caller
// buffer with a reusable workspace, gather into caller views, the ragged
// batch entry, protect masks as arguments, and tensor-parallel planning.
// The reference for each is the owning front door (test_compress.cpp checks
// that one against the stages and the naive DCT).
#include <gtest/gtest.h>
#include <flashcache/flashcache.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace fc = flashcache;

namespace {

// The paper's settings: no sink or window unless a test asks for one.
const fc::Options kPaper = fc::Options::paper();

// Smooth sinusoids along tokens plus noise and a few spikes, [heads][n][d].
std::vector<float> layer_data(std::int64_t heads, std::int64_t n, std::int64_t d, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> noise(0, 0.1 * static_cast<double>(1 + seed / 10));  // layers differ
  std::vector<float> x(static_cast<std::size_t>(heads * n * d));
  for (std::int64_t h = 0; h < heads; ++h)
    for (std::int64_t t = 0; t < n; ++t)
      for (std::int64_t c = 0; c < d; ++c)
        x[static_cast<std::size_t>((h * n + t) * d + c)] = static_cast<float>(
            std::sin(0.03 * static_cast<double>(t * (c % 4 + 1)) + static_cast<double>(h) * (1.0 + 0.1 * seed)) +
            noise(rng) + ((t * 7 + h * 3 + static_cast<std::int64_t>(seed)) % 19 == 0 ? 1.5 : 0.0));
  return x;
}

struct Model {
  std::int64_t heads, d;
  std::vector<std::int64_t> tokens;
  std::vector<std::vector<float>> k, v;
  std::vector<fc::KVView<const float>> kv, vv;

  Model(std::int64_t h, std::int64_t dim, std::vector<std::int64_t> n) : heads(h), d(dim), tokens(std::move(n)) {
    for (std::size_t l = 0; l < tokens.size(); ++l) {
      k.push_back(layer_data(heads, tokens[l], d, 10 * l + 1));
      v.push_back(layer_data(heads, tokens[l], d, 10 * l + 2));
    }
    for (std::size_t l = 0; l < tokens.size(); ++l) {
      kv.push_back(fc::hnd<const float>(k[l].data(), fc::Heads(heads), fc::Tokens(tokens[l]), fc::HeadDim(d)));
      vv.push_back(fc::hnd<const float>(v[l].data(), fc::Heads(heads), fc::Tokens(tokens[l]), fc::HeadDim(d)));
    }
  }
};

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

std::vector<std::uint8_t> every(std::int64_t n, std::int64_t step, std::int64_t offset) {
  std::vector<std::uint8_t> m(static_cast<std::size_t>(n), 0);
  for (std::int64_t t = offset; t < n; t += step) m[static_cast<std::size_t>(t)] = 1;
  return m;
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

TEST(Core, PlanNamesTheLayerAndChecksItsInput) {
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

// Packs the sequences of a batch in NHD order: [tokens][heads][d].
std::vector<float> pack_nhd(const std::vector<std::vector<float>>& seqs, const std::vector<std::int64_t>& len,
                            std::int64_t heads, std::int64_t d) {
  std::vector<float> out;
  for (std::size_t b = 0; b < seqs.size(); ++b)
    for (std::int64_t t = 0; t < len[b]; ++t)
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t c = 0; c < d; ++c) out.push_back(seqs[b][static_cast<std::size_t>((h * len[b] + t) * d + c)]);
  return out;
}

TEST(Core, RaggedBatchMatchesEachSequenceAlone) {
  const std::int64_t heads = 2, d = 5, layers = 3;
  const std::vector<std::int64_t> len{41, 0, 67, 23};
  const std::vector<std::int32_t> indptr{0, 41, 41, 108, 131};
  const std::int64_t capacity = 140;  // more rows than the batch uses
  fc::Options opt = fc::Options::paper();
  opt.select.window = 2;
  // Per sequence and layer: the data, and the reference from the front door.
  std::vector<std::vector<float>> k_packed(layers), v_packed(layers);
  std::vector<std::vector<std::uint8_t>> mask_bytes(layers);
  for (std::int64_t l = 0; l < layers; ++l) {
    std::vector<std::vector<float>> ks, vs;
    for (std::size_t b = 0; b < len.size(); ++b) {
      ks.push_back(layer_data(heads, len[b], d, 100 * l + 2 * b + 1));
      vs.push_back(layer_data(heads, len[b], d, 100 * l + 2 * b + 2));
    }
    k_packed[l] = pack_nhd(ks, len, heads, d);
    v_packed[l] = pack_nhd(vs, len, heads, d);
    k_packed[l].resize(static_cast<std::size_t>(capacity * heads * d), 9.0f);
    v_packed[l].resize(k_packed[l].size(), 9.0f);
    mask_bytes[l] = every(capacity, 11, l);
  }
  std::vector<fc::KVView<const float>> kv, vv;
  std::vector<fc::ProtectMask> masks;
  for (std::int64_t l = 0; l < layers; ++l) {
    kv.push_back(fc::nhd<const float>(k_packed[l].data(), fc::Tokens(capacity), fc::Heads(heads), fc::HeadDim(d)));
    vv.push_back(fc::nhd<const float>(v_packed[l].data(), fc::Tokens(capacity), fc::Heads(heads), fc::HeadDim(d)));
    masks.emplace_back(mask_bytes[l]);
  }
  std::vector<std::vector<std::int32_t>> kept(layers, std::vector<std::int32_t>(heads * capacity, -1));
  std::vector<std::int32_t*> kept_ptr;
  std::vector<std::vector<float>> k_out(layers, std::vector<float>(heads * capacity * d)), v_out = k_out;
  std::vector<fc::KVView<float>> k_out_view, v_out_view;
  for (std::int64_t l = 0; l < layers; ++l) {
    kept_ptr.push_back(kept[l].data());
    k_out_view.push_back(fc::hnd(k_out[l].data(), fc::Heads(heads), fc::Tokens(capacity), fc::HeadDim(d)));
    v_out_view.push_back(fc::hnd(v_out[l].data(), fc::Heads(heads), fc::Tokens(capacity), fc::HeadDim(d)));
  }
  const int sequences = static_cast<int>(len.size());
  std::vector<std::int32_t> kept_indptr(layers * (sequences + 1));
  std::vector<std::int64_t> budgets(layers * sequences);
  std::vector<double> ratio(layers * sequences);
  fc::BatchOutputs<float> out;
  out.kept = kept_ptr.data();
  out.kept_indptr = kept_indptr.data();
  out.budgets = budgets.data();
  out.energy_ratio = ratio.data();
  out.k_out = k_out_view.data();
  out.v_out = v_out_view.data();
  fc::BatchWorkspace<> ws;
  for (int call = 0; call < 2; ++call) {  // the second call reuses the warm workspace
    const fc::Status s =
        fc::compress_batch(kv.data(), vv.data(), static_cast<int>(layers), fc::Batch{sequences, indptr.data()},
                           fc::Budget::ratio(0.25), opt, masks.data(), {}, &ws, out);
    ASSERT_TRUE(s.ok()) << s.message();
  }

  for (int b = 0; b < sequences; ++b) {
    std::vector<fc::KVView<const float>> ks, vs;
    std::vector<fc::ProtectMask> ms;
    for (std::int64_t l = 0; l < layers; ++l) {
      ks.push_back(fc::token_range(kv[l], indptr[b], len[b]));
      vs.push_back(fc::token_range(vv[l], indptr[b], len[b]));
      ms.push_back(masks[l].slice(indptr[b], len[b]));
    }
    const auto ref = fc::compress_model(ks, vs, fc::Budget::ratio(0.25), opt, ms);
    for (std::int64_t l = 0; l < layers; ++l) {
      const std::int64_t bud = budgets[l * sequences + b];
      const std::int32_t row = kept_indptr[l * (sequences + 1) + b];
      ASSERT_EQ(bud, ref.budgets[l]) << "sequence " << b << " layer " << l;
      EXPECT_EQ(kept_indptr[l * (sequences + 1) + b + 1], row + bud);
      EXPECT_DOUBLE_EQ(ratio[l * sequences + b], ref.energy_ratio[l]);
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t i = 0; i < bud; ++i) {
          const std::int32_t t = kept[l][h * capacity + row + i];
          ASSERT_EQ(t, ref.layers[l].kept_head(h)[i]) << "sequence " << b << " layer " << l << " head " << h;
          for (std::int64_t c = 0; c < d; ++c) {
            EXPECT_EQ(k_out_view[l](h, row + i, c), kv[l](h, indptr[b] + t, c));
            EXPECT_EQ(v_out_view[l](h, row + i, c), vv[l](h, indptr[b] + t, c));
          }
        }
    }
  }
  EXPECT_EQ(kept_indptr[1], kept_indptr[2]);  // the empty sequence keeps nothing
}

TEST(Core, BatchRefusesBadInput) {
  const Model m(2, 4, {30});
  std::vector<std::int32_t> kept(60), kept_indptr(3);
  std::int32_t* kp = kept.data();
  fc::BatchOutputs<float> out;
  out.kept = &kp;
  out.kept_indptr = kept_indptr.data();
  fc::BatchWorkspace<> ws;
  const std::vector<std::int32_t> decreasing{0, 20, 10};
  fc::Status s = fc::compress_batch(m.kv.data(), m.vv.data(), 1, fc::Batch{2, decreasing.data()},
                                    fc::Budget::ratio(0.5), kPaper, nullptr, {}, &ws, out);
  EXPECT_EQ(s.code(), fc::Errc::invalid_shape);
  EXPECT_NE(s.message().find("indptr decreases at sequence 1"), std::string::npos) << s.message();
  const std::vector<std::int32_t> too_long{0, 20, 31};
  s = fc::compress_batch(m.kv.data(), m.vv.data(), 1, fc::Batch{2, too_long.data()}, fc::Budget::ratio(0.5), kPaper,
                         nullptr, {}, &ws, out);
  EXPECT_NE(s.message().find("indptr ends at 31 but the view holds 30 tokens"), std::string::npos) << s.message();
  s = fc::compress_batch(m.kv.data(), m.vv.data(), 1, fc::Batch{2, nullptr}, fc::Budget::ratio(0.5), kPaper, nullptr, {},
                         &ws, out);
  EXPECT_NE(s.message().find("needs an indptr"), std::string::npos) << s.message();
  out.kept = nullptr;
  s = fc::compress_batch(m.kv.data(), m.vv.data(), 1, fc::Batch{}, fc::Budget::ratio(0.5), kPaper, nullptr, {}, &ws, out);
  EXPECT_NE(s.message().find("kept and kept_indptr are required"), std::string::npos) << s.message();
  out.kept = &kp;
  const std::vector<std::int32_t> ok{0, 10, 30};
  s = fc::compress_batch(m.kv.data(), m.vv.data(), 1, fc::Batch{2, ok.data()}, fc::Budget::tokens(11), kPaper, nullptr, {},
                         &ws, out);
  EXPECT_NE(s.message().find("sequence 0: layer 0: keep budget 11 > 10 tokens"), std::string::npos) << s.message();
}

// Heads [first, first + count) of a layer: what one tensor-parallel rank holds.
fc::KVView<const float> head_range(fc::KVView<const float> x, std::int64_t first, std::int64_t count) {
  fc::KVView<const float> r = x;
  r.data = x.data + first * x.head_stride;
  r.heads = count;
  return r;
}

TEST(Core, TensorParallelRanksPlanTheBudgetsOfOneRank) {
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
