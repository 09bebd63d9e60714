// Built with -fno-exceptions (tests/CMakeLists.txt): the no-throw core, end
// to end, from everything the library's umbrella header includes. No gtest,
// whose own library is built with exceptions; a failed check prints and
// returns 1.
#include <flashcache/flashcache.hpp>
#include <flashcache/policies/baselines.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

static_assert(FLASHCACHE_EXCEPTIONS == 0, "this test must be compiled with -fno-exceptions");

namespace fc = flashcache;

namespace {

int failures = 0;

void check(bool ok, const char* what) {
  if (!ok) {
    std::printf("FAILED: %s\n", what);
    ++failures;
  }
}

}  // namespace

int main() {
  const std::int64_t heads = 3, d = 8;
  const std::vector<std::int64_t> tokens{57, 31};
  std::vector<std::vector<float>> k(2), v(2);
  std::vector<fc::KVView<const float>> kv, vv;
  for (std::size_t l = 0; l < 2; ++l) {
    const auto n = tokens[l];
    k[l].resize(static_cast<std::size_t>(heads * n * d));
    v[l].resize(k[l].size());
    for (std::size_t i = 0; i < k[l].size(); ++i) {
      k[l][i] = static_cast<float>(std::sin(0.05 * static_cast<double>(i % static_cast<std::size_t>(n * d)) / 8.0));
      v[l][i] = static_cast<float>(std::cos(0.03 * static_cast<double>(i)));
    }
    // A spike at token 17 of head 1: the highest score, so it must be kept.
    for (std::int64_t c = 0; c < d; ++c) k[l][static_cast<std::size_t>((1 * n + 17) * d + c)] += 3.0f;
    kv.push_back(fc::hnd<const float>(k[l].data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(d)));
    vv.push_back(fc::hnd<const float>(v[l].data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(d)));
  }

  // Score, plan, select, gather, each returning a Status.
  fc::Scorer<float> scorer;
  fc::Options opt = fc::Options::paper();
  opt.select.sink = 1;
  std::vector<std::vector<float>> scores(2);
  std::vector<std::vector<fc::HeadEnergy>> energy(2, std::vector<fc::HeadEnergy>(heads));
  std::vector<fc::LayerSummary> summary(2);
  for (std::size_t l = 0; l < 2; ++l) {
    scores[l].resize(static_cast<std::size_t>(heads * tokens[l]));
    check(scorer.score(kv[l], vv[l], opt.score, fc::ScoreBuffers{scores[l].data(), energy[l].data()}).ok(), "score");
    summary[l] = fc::summarize({scores[l].data(), heads, tokens[l]}, energy[l].data(), opt.select, {});
  }
  std::vector<std::int64_t> budgets(2);
  fc::BudgetPlanner planner;
  check(planner.plan(summary.data(), 2, fc::Budget::ratio(0.25), opt.allocate, budgets.data()).ok(), "plan");
  check(budgets[0] + budgets[1] == std::llround(0.25 * 88), "model total kept");
  fc::SelectWorkspace ws;
  for (std::size_t l = 0; l < 2; ++l) {
    const std::int64_t b = budgets[l];
    std::vector<std::int32_t> kept(static_cast<std::size_t>(heads * b));
    check(fc::select_tokens({scores[l].data(), heads, tokens[l]}, b, opt.select, {}, {}, &ws, fc::KeptView{kept.data(), b}).ok(),
          "select");
    bool spike = false, sink = true, ascending = true;
    for (std::int64_t i = 0; i < b; ++i) spike = spike || kept[static_cast<std::size_t>(b + i)] == 17;
    for (std::int64_t h = 0; h < heads; ++h) {
      sink = sink && kept[static_cast<std::size_t>(h * b)] == 0;
      for (std::int64_t i = 1; i < b; ++i)
        ascending =
            ascending && kept[static_cast<std::size_t>(h * b + i - 1)] < kept[static_cast<std::size_t>(h * b + i)];
    }
    check(spike, "the spike is kept");
    check(sink, "the sink token is kept");
    check(ascending, "kept indices ascend");
    std::vector<float> k_out(static_cast<std::size_t>(heads * b * d));
    check(fc::gather(kv[l], kept.data(), fc::hnd(k_out.data(), fc::Heads(heads), fc::Tokens(b), fc::HeadDim(d))).ok(),
          "gather");
    bool rows = true;
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t i = 0; i < b; ++i)
        rows = rows && k_out[static_cast<std::size_t>((h * b + i) * d + 3)] ==
                           kv[l](h, kept[static_cast<std::size_t>(h * b + i)], 3);
    check(rows, "gathered rows");
  }

  // Bad input is a Status, not a crash or an abort.
  fc::Options bad;
  bad.score.gamma = 2.0;
  check(scorer.score(kv[0], vv[0], bad.score, fc::ScoreBuffers{scores[0].data(), energy[0].data()}).code() == fc::Errc::invalid_option,
        "gamma 2 refused");
  std::vector<std::int32_t> kept(static_cast<std::size_t>(heads * tokens[1]));
  check(
      fc::select_tokens({scores[1].data(), heads, tokens[1]}, tokens[1] + 1, opt.select, {}, {}, &ws, fc::KeptView{kept.data(), 0})
              .code() == fc::Errc::invalid_budget,
      "budget past the tokens refused");

  // The batch entry over both sequences of layer 0 cut in two.
  const std::vector<std::int32_t> indptr{0, 20, 57};
  std::vector<std::int32_t> batch_kept(static_cast<std::size_t>(heads * 57)), kept_indptr(3);
  std::int32_t* kept_ptr = batch_kept.data();
  fc::BatchOutputs<float> out;
  out.kept = &kept_ptr;
  out.kept_indptr = kept_indptr.data();
  fc::BatchWorkspace<> batch_ws;
  check(fc::compress_batch(kv.data(), vv.data(), 1, fc::Batch{2, indptr.data()}, fc::Budget::ratio(0.5), opt, nullptr, {},
                           &batch_ws, out)
            .ok(),
        "batch");
  check(kept_indptr[1] == 10 && kept_indptr[2] == 10 + 19, "batch budgets: round(0.5 * 20), round(0.5 * 37)");

  if (failures == 0) std::printf("no-exceptions core: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
