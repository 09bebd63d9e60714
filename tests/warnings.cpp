// Every CPU header, and the templates an engine instantiates, compiled under
// -Wall -Wextra -Wconversion -Wsign-conversion -Werror (tests/CMakeLists.txt)
// by this build's compiler and, as a ctest, by the other of g++ / clang++.
// Compiling is the test; nothing runs.
#include <flashcache/allocate.hpp>
#include <flashcache/archive.hpp>
#include <flashcache/batch.hpp>
#include <flashcache/config.hpp>
#include <flashcache/score/dct.hpp>
#include <flashcache/error.hpp>
#include <flashcache/score/fft.hpp>
#include <flashcache/score/fft_butterflies.hpp>
#include <flashcache/flashcache.hpp>
#include <flashcache/gather.hpp>
#include <flashcache/mask.hpp>
#include <flashcache/options.hpp>
#include <flashcache/plan.hpp>
#include <flashcache/policies/attention.hpp>
#include <flashcache/policies/baselines.hpp>
#include <flashcache/query_tail.hpp>
#include <flashcache/recall.hpp>
#include <flashcache/recall_pool.hpp>
#include <flashcache/rules.hpp>
#include <flashcache/score.hpp>
#include <flashcache/score/blocked.hpp>
#include <flashcache/score/global.hpp>
#include <flashcache/score/grid.hpp>
#include <flashcache/score/rows.hpp>
#include <flashcache/select.hpp>
#include <flashcache/types.hpp>
#include <flashcache/version.hpp>
#include <flashcache/view.hpp>

#include <vector>

namespace fc = flashcache;

// Instantiations for the three element types and both arithmetic types.
template <class T, class Real>
void instantiate(std::vector<fc::KVView<T>>& k, std::vector<fc::KVView<const T>>& kc, const fc::Options& opt) {
  (void)fc::compress<Real, T>(k[0], k[0], fc::Budget::ratio(0.2), opt);
  (void)fc::compress_model<Real, T>(k, k, fc::Budget::ratio(0.2), opt);
  for (auto p : {fc::policies::Policy::flashcache, fc::policies::Policy::snapkv, fc::policies::Policy::keydiff})
    (void)fc::policies::compress_model<Real, T>(p, k, k, k, fc::Budget::ratio(0.2), opt);
  fc::BatchWorkspace<Real> ws;
  fc::BatchOutputs<T> out;
  (void)fc::compress_batch(kc.data(), kc.data(), static_cast<int>(kc.size()), fc::Batch{}, fc::Budget::ratio(0.2), opt,
                           nullptr, {}, &ws, out);
  (void)fc::score_layer<Real>(k[0], k[0], opt.score);
  // Query tails: fed, merged, and read by the score.
  fc::TailAccumulator acc;
  std::vector<float> tails(1), other(1);
  (void)acc.add(kc[0], 0, kc[0], nullptr, fc::TailView<float>{tails.data(), 1, 1}, fc::last_queries(1));
  (void)fc::merge_tails(fc::TailView<const float>{other.data(), 1, 1}, fc::TailView<float>{tails.data(), 1, 1});
  fc::Scorer<Real> scorer;
  fc::LayerScores scores;
  (void)scorer.score(kc[0], kc[0], fc::Options::with_query_tail().score, &scores,
                     fc::ScoreInputs{{}, fc::TailView<const float>{tails.data(), 1, 1}});
  // Recall on several threads: each worker's scorer adds its layers.
  fc::Archive archive;
  fc::RecallScorerPool pool;
  (void)pool.reset(archive, fc::RecallScope::shared, fc::RecallScore::exact, 2);
  auto add = [&](std::int64_t l, fc::RecallScorer& s, int) {
    return s.add_layer(static_cast<int>(l), kc[0], kc[0], kc[0]);
  };
  (void)pool.run(1, add);
  std::vector<float> blocks(1);
  (void)pool.block_scores(blocks.data(), 1);
}

void instantiate_all() {
  fc::Options opt;
  std::vector<fc::KVView<float>> kf(1);
  std::vector<fc::KVView<const float>> kfc(1);
  std::vector<fc::KVView<fc::half_t>> kh(1);
  std::vector<fc::KVView<const fc::half_t>> khc(1);
  std::vector<fc::KVView<fc::bfloat16_t>> kb(1);
  std::vector<fc::KVView<const fc::bfloat16_t>> kbc(1);
  instantiate<float, float>(kf, kfc, opt);
  instantiate<float, double>(kf, kfc, opt);
  instantiate<fc::half_t, float>(kh, khc, opt);
  instantiate<fc::bfloat16_t, float>(kb, kbc, opt);
}
