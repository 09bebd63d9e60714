// The warm no-throw core allocates nothing: this executable replaces the
// global operator new with one that counts, runs each stage once to warm its
// workspace, then counts the allocations of a second run (same shapes, new
// values). Eigen allocates with its own malloc, which operator new does not
// see: with EIGEN_RUNTIME_NO_MALLOC it checks every heap allocation against a
// switch, and its assertion here counts instead of aborting.
#include "counting_new.hpp"

#include <atomic>
namespace {
std::atomic<long> eigen_heap_allocations{0};
}
#define EIGEN_RUNTIME_NO_MALLOC
#define eigen_assert(x)                                                       \
  do {                                                                        \
    if (!(x)) eigen_heap_allocations.fetch_add(1, std::memory_order_relaxed); \
  } while (0)
#include <gtest/gtest.h>
#include <flashcache/flashcache.hpp>
#include <flashcache/recall.hpp>

#include <cmath>
#include <cstdlib>
#include <new>
#include <vector>

using flashcache_test::allocations;

namespace fc = flashcache;

namespace {

struct Layers {
  std::int64_t heads = 4, d = 16;
  std::vector<std::int64_t> tokens{300, 173, 300};
  std::vector<std::vector<float>> k, v;
  std::vector<fc::KVView<const float>> kv, vv;

  explicit Layers(double phase) {
    for (std::size_t l = 0; l < tokens.size(); ++l) {
      k.emplace_back(static_cast<std::size_t>(heads * tokens[l] * d));
      v.emplace_back(k.back().size());
      for (std::size_t i = 0; i < k[l].size(); ++i) {
        k[l][i] = static_cast<float>(std::sin(phase + 0.01 * static_cast<double>(i)) + (i % 97 == 0 ? 2.0 : 0.0));
        v[l][i] = static_cast<float>(std::cos(phase + 0.02 * static_cast<double>(i)));
      }
      kv.push_back(fc::hnd<const float>(k[l].data(), fc::Heads(heads), fc::Tokens(tokens[l]), fc::HeadDim(d)));
      vv.push_back(fc::hnd<const float>(v[l].data(), fc::Heads(heads), fc::Tokens(tokens[l]), fc::HeadDim(d)));
    }
  }
};

// Caller-owned state and buffers, sized once for the largest layer.
struct Engine {
  fc::Scorer<float> scorer;
  fc::BudgetPlanner planner;
  fc::SelectWorkspace select;
  std::vector<std::vector<float>> scores;
  std::vector<std::vector<fc::HeadEnergy>> energy;
  std::vector<fc::LayerSummary> summary;
  std::vector<std::int64_t> budgets;
  std::vector<std::vector<std::int32_t>> kept;
  std::vector<std::vector<float>> k_out, v_out;

  explicit Engine(const Layers& m)
      : scores(m.tokens.size()),
        energy(m.tokens.size(), std::vector<fc::HeadEnergy>(static_cast<std::size_t>(m.heads))),
        summary(m.tokens.size()),
        budgets(m.tokens.size()),
        kept(m.tokens.size()),
        k_out(m.tokens.size()),
        v_out(m.tokens.size()) {
    for (std::size_t l = 0; l < m.tokens.size(); ++l) {
      scores[l].resize(static_cast<std::size_t>(m.heads * m.tokens[l]));
      kept[l].resize(static_cast<std::size_t>(m.heads * m.tokens[l]));
      k_out[l].resize(static_cast<std::size_t>(m.heads * m.tokens[l] * m.d));
      v_out[l].resize(k_out[l].size());
    }
  }

  // Every stage once; false on the first failed Status.
  bool run(const Layers& m, const fc::Options& opt, fc::ImageSpans spans = {}) {
    const int layers = static_cast<int>(m.tokens.size());
    for (int l = 0; l < layers; ++l) {
      if (!scorer
               .score(m.kv[l], m.vv[l], opt.score, fc::ScoreBuffers{scores[l].data(), energy[l].data()},
                      fc::ScoreInputs{spans, {}})
               .ok())
        return false;
      summary[l] = fc::summarize({scores[l].data(), m.heads, m.tokens[l]}, energy[l].data(), opt.select, {});
    }
    if (!planner.plan(summary.data(), layers, fc::Budget::ratio(0.2), opt.allocate, budgets.data()).ok()) return false;
    for (int l = 0; l < layers; ++l) {
      const std::int64_t b = budgets[l];
      if (!fc::select_tokens({scores[l].data(), m.heads, m.tokens[l]}, b, opt.select, {}, spans, &select,
                             fc::KeptView{kept[l].data(), b})
               .ok())
        return false;
      if (!fc::gather(m.kv[l], kept[l].data(),
                      fc::hnd(k_out[l].data(), fc::Heads(m.heads), fc::Tokens(b), fc::HeadDim(m.d)))
               .ok())
        return false;
      if (!fc::gather(m.vv[l], kept[l].data(),
                      fc::hnd(v_out[l].data(), fc::Heads(m.heads), fc::Tokens(b), fc::HeadDim(m.d)))
               .ok())
        return false;
    }
    return true;
  }
};

// Heap allocations by operator new and by Eigen while `f` runs.
template <class F>
long heap_allocations(F&& f) {
  const long before = allocations.load() + eigen_heap_allocations.load();
  Eigen::internal::set_is_malloc_allowed(false);
  f();
  Eigen::internal::set_is_malloc_allowed(true);
  return allocations.load() + eigen_heap_allocations.load() - before;
}

TEST(NoAlloc, WarmStagesAllocateNothing) {
  const Layers first(0.0), second(1.0);
  fc::Options paper = fc::Options::paper();
  paper.select.sink = 4;
  paper.select.window_share = 0.1;
  paper.select.base_share = 0.2;
  paper.score.normalize_terms = true;
  paper.score.bridge = 2;
  // Image spans with edge tiles and the grid base sample (the grid residual),
  // tiled (blocked transform: 8 x 8 tiles) and whole (global).
  fc::Options images;
  images.score.transform = fc::Transform::blocked;
  const std::vector<fc::GridSpan> spans = {{1, 9, 10}, {100, 7, 9}};
  fc::Options images_global = images;
  images_global.score.transform = fc::Transform::global;
  // The blocked residual with each base (300 and 173 tokens end in shorter
  // blocks), and the global one's mixed base.
  fc::Options peak;
  peak.score.transform = fc::Transform::blocked;
  fc::Options lowpass_blocked = peak;
  lowpass_blocked.score.base = fc::Base::lowpass;
  fc::Options mixed_blocked = peak;
  mixed_blocked.score.base = fc::Base::mixed;
  fc::Options mixed_global;
  mixed_global.score.base = fc::Base::mixed;
  // Keys de-rotated before the transform, global and blocked (with spans).
  fc::Options rope;
  rope.score.rope.derotate = true;
  fc::Options rope_blocked = images;
  rope_blocked.score.rope.derotate = true;
  rope_blocked.score.rope.layout = fc::RopeLayout::interleaved;
  // The defaults (global, peak base); 300 and 173 tokens.
  struct Config {
    fc::Options opt;
    bool images = false;
  };
  for (const Config& c : {Config{paper}, Config{fc::Options{}}, Config{images, true}, Config{images_global, true},
                          Config{peak}, Config{lowpass_blocked}, Config{mixed_blocked}, Config{mixed_global},
                          Config{rope}, Config{rope_blocked, true}}) {
    const fc::ImageSpans s = c.images ? fc::ImageSpans(spans) : fc::ImageSpans{};
    Engine engine(first);
    ASSERT_TRUE(engine.run(first, c.opt, s));
    bool ok = false;
    const long during = heap_allocations([&] { ok = engine.run(second, c.opt, s); });
    ASSERT_TRUE(ok);
    EXPECT_EQ(during, 0) << fc::to_string(c.opt.score.transform) << " " << fc::to_string(c.opt.score.base) << ", "
                         << s.size() << " spans" << (c.opt.score.rope.derotate ? ", rope" : "");
  }
  const fc::Options opt = paper;
  // The counters work: the owning front door allocates, and so does Eigen for a
  // fresh scorer of the blocked transform (its block matrices are Eigen's).
  const long eigen_before = eigen_heap_allocations.load();
  (void)heap_allocations([&] {
    fc::Scorer<float> fresh;
    fc::Options blocked;
    blocked.score.transform = fc::Transform::blocked;
    std::vector<float> scores(static_cast<std::size_t>(second.heads * second.tokens[1]));
    std::vector<fc::HeadEnergy> energy(static_cast<std::size_t>(second.heads));
    (void)fresh.score(second.kv[1], second.vv[1], blocked.score, fc::ScoreBuffers{scores.data(), energy.data()});
  });
  EXPECT_GT(eigen_heap_allocations.load() - eigen_before, 0);
  const long front_before = allocations.load();
  (void)fc::compress_model(second.kv, second.vv, fc::Budget::ratio(0.2), opt);
  EXPECT_GT(allocations.load() - front_before, 0);
}

// The distance from the mean, with a weight that follows the keep ratio: warmed
// where its weight is 0 (keep 0.1), then scored where it mixes (keep 0.9), on a
// layer of the same shape, nothing is allocated: its buffers are sized whatever
// the weight. The same for either distance, and for a scorer that switches.
TEST(NoAlloc, WarmMeanDistanceAllocatesNothingAtAnyKeepRatio) {
  const Layers first(0.0), second(1.0);
  fc::Options opt;
  opt.score.mean_weight = 0.75;
  opt.score.mean_full_keep = 0.5;
  opt.score.mean_zero_keep = 0.25;
  fc::Scorer<float> scorer;
  std::vector<float> scores(static_cast<std::size_t>(first.heads * first.tokens[0]));
  std::vector<fc::HeadEnergy> energy(static_cast<std::size_t>(first.heads));
  const auto run = [&](const Layers& m, double keep) {
    return scorer
        .score(m.kv[0], m.vv[0], opt.score, fc::ScoreBuffers{scores.data(), energy.data()},
               fc::ScoreInputs{{}, {}, keep})
        .ok();
  };
  ASSERT_TRUE(run(first, 0.1));
  for (const fc::MeanDistance distance : {fc::MeanDistance::kv_squared, fc::MeanDistance::key_cosine}) {
    opt.score.mean_distance = distance;
    bool ok = false;
    EXPECT_EQ(heap_allocations([&] { ok = run(second, 0.9); }), 0) << fc::to_string(distance);
    EXPECT_TRUE(ok);
  }
}

// The query tails warm: a prefill fed in chunks (tiles of queries and keys,
// every length of the tail buffers), then the score that mixes them, on a layer
// the accumulator and scorer have seen.
TEST(NoAlloc, WarmQueryTailsAllocateNothing) {
  const Layers first(0.0), second(1.0);
  const std::int64_t n = first.tokens[0], heads = first.heads, d = first.d, q_heads = 2 * heads;
  std::vector<float> q(static_cast<std::size_t>(q_heads * n * d));
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
  const auto qv = fc::hnd<const float>(q.data(), fc::Heads(q_heads), fc::Tokens(n), fc::HeadDim(d));
  fc::TailAccumulator acc;
  fc::Scorer<float> scorer;
  fc::Options opt = fc::Options::with_query_tail();
  std::vector<float> tails(static_cast<std::size_t>(heads * n)), scores(tails.size());
  std::vector<fc::HeadEnergy> energy(static_cast<std::size_t>(heads));
  const auto run = [&](const Layers& m) {
    std::fill(tails.begin(), tails.end(), 0.0f);
    bool ok = true;
    for (std::int64_t first_row = 0; first_row < n; first_row += 70) {
      const std::int64_t chunk = std::min<std::int64_t>(70, n - first_row);
      ok &= acc.add(fc::token_range(qv, first_row, chunk), first_row, fc::token_range(m.kv[0], 0, first_row + chunk),
                    nullptr, fc::TailView<float>{tails.data(), heads, n})
                .ok();
    }
    ok &= scorer
              .score(m.kv[0], m.vv[0], opt.score, fc::ScoreBuffers{scores.data(), energy.data()},
                     fc::ScoreInputs{{}, fc::TailView<const float>{tails.data(), heads, n}})
              .ok();
    return ok;
  };
  ASSERT_TRUE(run(first));
  bool ok = false;
  EXPECT_EQ(heap_allocations([&] { ok = run(second); }), 0);
  EXPECT_TRUE(ok);
}

// The archive and its recall warm: an eviction appended (the archive reserved
// for its cap), a question's queries scored over every layer, the blocks chosen
// and taken back, on an archive of the same size as the warm-up's. In position
// order the eviction arrives in descending positions, so the merge reorders it.
void check_warm_archive(fc::ArchiveOrder archive_order, fc::RecallScore how) {
  SCOPED_TRACE(fc::to_string(how));
  const Layers m(0.0);
  const std::int64_t heads = m.heads, d = m.d, n = 120, question = 6;
  const int layers = static_cast<int>(m.tokens.size());
  const fc::ArchiveShape shape{layers, heads, d, fc::RowType::f32, fc::RowType::f32};
  fc::Archive archive;
  ASSERT_TRUE(archive.reset(shape, {16, 0, archive_order}).ok());
  archive.reserve(n);
  // Rows of the evicted tokens: tokens 0..n of each layer, [token][head][d].
  std::vector<std::vector<float>> rows(static_cast<std::size_t>(layers),
                                       std::vector<float>(static_cast<std::size_t>(n * heads * d)));
  std::vector<const void*> k, v;
  for (int l = 0; l < layers; ++l) {
    for (std::int64_t t = 0; t < n; ++t)
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t c = 0; c < d; ++c)
          rows[static_cast<std::size_t>(l)][static_cast<std::size_t>((t * heads + h) * d + c)] =
              m.kv[static_cast<std::size_t>(l)](h, t, c);
    k.push_back(rows[static_cast<std::size_t>(l)].data());
    v.push_back(rows[static_cast<std::size_t>(l)].data());
  }
  std::vector<std::int32_t> positions(static_cast<std::size_t>(n)), back(static_cast<std::size_t>(n));
  for (std::int64_t t = 0; t < n; ++t)
    positions[static_cast<std::size_t>(t)] =
        static_cast<std::int32_t>(archive_order == fc::ArchiveOrder::position ? n - 1 - t : t);
  std::vector<float> q(static_cast<std::size_t>(2 * heads * question * d));
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>(std::sin(0.61 * static_cast<double>(i)));
  const auto qv = fc::hnd<const float>(q.data(), fc::Heads(2 * heads), fc::Tokens(question), fc::HeadDim(d));
  std::vector<std::vector<float>> out(static_cast<std::size_t>(layers),
                                      std::vector<float>(static_cast<std::size_t>(n * heads * d)));
  std::vector<void*> k_out, v_out;
  for (auto& o : out) {
    k_out.push_back(o.data());
    v_out.push_back(o.data());
  }
  fc::RecallScorer scorer;
  std::vector<float> block_scores(static_cast<std::size_t>(n));
  std::vector<std::int64_t> chosen, order, all;
  chosen.reserve(static_cast<std::size_t>(n));
  order.reserve(static_cast<std::size_t>(n));
  all.reserve(static_cast<std::size_t>(n));
  const auto cycle = [&] {
    bool ok = archive.append(positions.data(), n, k.data(), heads * d * 4, v.data(), heads * d * 4).ok();
    ok &= scorer.reset(archive, fc::RecallScope::shared, how).ok();
    for (int l = 0; l < layers; ++l) {
      const auto resident = fc::token_range(m.kv[static_cast<std::size_t>(l)], n, 40);
      const auto asked = fc::token_range(m.kv[static_cast<std::size_t>(l)], n + 40, question);
      ok &= scorer.add_layer(l, qv, resident, asked).ok();
    }
    ok &= scorer.block_scores(block_scores.data(), archive.blocks()).ok();
    ok &= fc::select_recall(archive, block_scores.data(), 32, &chosen, &order).ok();
    all.clear();  // then every block goes back too: the archive empties for the next cycle
    for (std::int64_t b = 0; b < archive.blocks(); ++b) all.push_back(b);
    std::int64_t taken = 0;
    ok &=
        archive.take(all.data(), static_cast<std::int64_t>(all.size()), back.data(), k_out.data(), v_out.data(), &taken)
            .ok();
    return ok && taken == n && !chosen.empty();
  };
  ASSERT_TRUE(cycle());
  bool ok = false;
  EXPECT_EQ(heap_allocations([&] { ok = cycle(); }), 0);
  EXPECT_TRUE(ok);
}

TEST(NoAlloc, WarmArchiveAndRecallAllocateNothing) {
  check_warm_archive(fc::ArchiveOrder::eviction, fc::RecallScore::exact);
  check_warm_archive(fc::ArchiveOrder::position, fc::RecallScore::digest);
}

TEST(NoAlloc, WarmBatchAllocatesNothing) {
  const Layers first(0.0), second(2.0);
  // Layers 0 and 2 hold 300 tokens: two sequences of 120 and 180 in each.
  const std::vector<fc::KVView<const float>> k{first.kv[0], first.kv[2]}, v{first.vv[0], first.vv[2]};
  const std::vector<fc::KVView<const float>> k2{second.kv[0], second.kv[2]}, v2{second.vv[0], second.vv[2]};
  const std::vector<std::int32_t> indptr{0, 120, 300};
  std::vector<std::vector<std::int32_t>> kept(2, std::vector<std::int32_t>(4 * 300));
  std::vector<std::int32_t*> kept_ptr{kept[0].data(), kept[1].data()};
  std::vector<std::int32_t> kept_indptr(6);
  std::vector<std::vector<float>> k_out(2, std::vector<float>(4 * 300 * 16)), v_out = k_out;
  std::vector<fc::KVView<float>> k_view{fc::hnd(k_out[0].data(), fc::Heads(4), fc::Tokens(300), fc::HeadDim(16)),
                                        fc::hnd(k_out[1].data(), fc::Heads(4), fc::Tokens(300), fc::HeadDim(16))};
  std::vector<fc::KVView<float>> v_view{fc::hnd(v_out[0].data(), fc::Heads(4), fc::Tokens(300), fc::HeadDim(16)),
                                        fc::hnd(v_out[1].data(), fc::Heads(4), fc::Tokens(300), fc::HeadDim(16))};
  fc::BatchOutputs<float> out;
  out.kept = kept_ptr.data();
  out.kept_indptr = kept_indptr.data();
  out.k_out = k_view.data();
  out.v_out = v_view.data();
  fc::BatchWorkspace<> ws;
  fc::Options opt = fc::Options::paper();
  opt.select.window = 8;
  ASSERT_TRUE(fc::compress_batch(k.data(), v.data(), 2, fc::Batch{2, indptr.data()}, fc::Budget::ratio(0.2), opt,
                                 nullptr, {}, &ws, out)
                  .ok());
  fc::Status s;
  const long during = heap_allocations([&] {
    s = fc::compress_batch(k2.data(), v2.data(), 2, fc::Batch{2, indptr.data()}, fc::Budget::ratio(0.2), opt, nullptr,
                           {}, &ws, out);
  });
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(during, 0);
  // Each sequence keeps its model total over the two layers: round(0.2 * 2 * 120), round(0.2 * 2 * 180).
  EXPECT_EQ(kept_indptr[1] + kept_indptr[4], 48);
  EXPECT_EQ(kept_indptr[2] - kept_indptr[1] + kept_indptr[5] - kept_indptr[4], 72);
}

}  // namespace
