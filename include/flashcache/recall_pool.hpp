#pragma once
// Recall's scoring spread over threads: one RecallScorer per worker (layer l on
// worker l % threads, parallel.hpp), merged by maximum. Every score is a
// maximum over layers (and queries), so the merged scores are, bit for bit, what
// one scorer gives after every layer, whatever worker ran which layer.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "error.hpp"
#include "parallel.hpp"
#include "recall.hpp"

namespace flashcache {

class RecallScorerPool {
 public:
  // Starts a recall over `archive` on up to `threads` workers (at least 1):
  // every score is 0. Keeps the workers and their scratch between recalls.
  Status reset(const Archive& archive, RecallScope scope, RecallScore score, int threads) {
    if (threads < 1) return make_error(Errc::invalid_option, "recall: threads ", threads, " must be at least 1");
    pool_.resize(threads);
    if (scorers_.size() < static_cast<std::size_t>(threads)) {
      scorers_.resize(static_cast<std::size_t>(threads));
      status_.resize(scorers_.size());
    }
    for (int w = 0; w < threads; ++w) {
      FLASHCACHE_RETURN_IF_ERROR(scorers_[static_cast<std::size_t>(w)].reset(archive, scope, score));
      status_[static_cast<std::size_t>(w)] = Status::success();
    }
    threads_ = threads;
    return Status::success();
  }

  int threads() const { return threads_; }
  std::int64_t rankings() const { return threads_ == 0 ? 0 : scorers_[0].rankings(); }

  // Scores `layers` tasks in parallel: f(task, scorer, worker) -> Status adds one
  // layer to the worker's scorer (scorer.add_layer); `worker` indexes the
  // caller's per-worker scratch, if it has any. The first error is returned.
  template <class F>
  Status run(std::int64_t layers, F& f) {
    if (threads_ == 0) return make_error(Errc::invalid_shape, "recall: reset() the pool with an archive first");
    auto one = [&](std::int64_t task, int w) {
      Status& st = status_[static_cast<std::size_t>(w)];
      if (st.ok()) st = f(task, scorers_[static_cast<std::size_t>(w)], w);
    };
    pool_.run(layers, one);
    for (int w = 0; w < threads_; ++w) FLASHCACHE_RETURN_IF_ERROR(status_[static_cast<std::size_t>(w)]);
    return resident_tokens_checked();
  }

  // The resident keys each layer gave (-1 before any layer).
  std::int64_t resident_tokens() const {
    std::int64_t r = -1;
    for (int w = 0; w < threads_; ++w) r = std::max(r, scorers_[static_cast<std::size_t>(w)].resident_tokens());
    return r;
  }

  // One ranking's block scores [blocks], merged over the workers.
  Status block_scores(float* out, std::int64_t count, std::int64_t ranking = 0) const {
    if (threads_ == 0) return make_error(Errc::invalid_shape, "recall: reset() the pool with an archive first");
    FLASHCACHE_RETURN_IF_ERROR(scorers_[0].block_scores(out, count, ranking));
    part_.resize(static_cast<std::size_t>(count));
    for (int w = 1; w < threads_; ++w) {
      FLASHCACHE_RETURN_IF_ERROR(scorers_[static_cast<std::size_t>(w)].block_scores(part_.data(), count, ranking));
      for (std::int64_t b = 0; b < count; ++b) out[b] = std::max(out[b], part_[static_cast<std::size_t>(b)]);
    }
    return Status::success();
  }

  // Archive token t's and resident key t's merged scores in one ranking.
  float token_score(std::int64_t t, std::int64_t ranking = 0) const {
    float best = 0.0f;
    for (int w = 0; w < threads_; ++w)
      best = std::max(best, scorers_[static_cast<std::size_t>(w)].token_score(t, ranking));
    return best;
  }
  float resident_score(std::int64_t t, std::int64_t ranking = 0) const {
    float best = 0.0f;
    for (int w = 0; w < threads_; ++w)
      best = std::max(best, scorers_[static_cast<std::size_t>(w)].resident_score(t, ranking));
    return best;
  }

 private:
  // Each scorer checks its own layers' resident counts; layers on different
  // workers are checked here.
  Status resident_tokens_checked() const {
    const std::int64_t r = resident_tokens();
    for (int w = 0; w < threads_; ++w) {
      const std::int64_t mine = scorers_[static_cast<std::size_t>(w)].resident_tokens();
      if (mine >= 0 && mine != r)
        return make_error(Errc::invalid_shape, "recall: ", mine, " resident keys in some layers, ", r,
                          " in others (every layer holds the same cells)");
    }
    return Status::success();
  }

  int threads_ = 0;
  WorkerPool pool_;
  std::vector<RecallScorer> scorers_;
  std::vector<Status> status_;
  mutable std::vector<float> part_;  // one worker's block scores while merging (so not thread-safe)
};

}  // namespace flashcache
