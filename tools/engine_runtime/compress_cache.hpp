#pragma once
// The integration a user copies: after prefill, hand the engine's KV cache to
// flashcache and replace it with the compact one it returns. Decoding then goes
// on over the kept tokens (with their original RoPE positions) plus new tokens.
#include <flashcache/flashcache.hpp>
#include <flashcache/parallel.hpp>
#include <flashcache/policies/baselines.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "engine_runtime/model.hpp"

namespace engine {

struct CompressSettings {
  double keep_ratio = 0.2;  // of the model's prompt tokens, split over layers by the policy
  std::string policy = "flashcache";
  std::int64_t sink = -1, window = -1;  // always-kept first / last tokens; -1: the library's default
  std::int64_t room = 0;                // new tokens each layer must still have room for
  bool uniform = false;                 // same budget in every layer instead of flashcache's dynamic split
  int threads = 1;                      // layers scored in parallel (the same budgets and tokens for any count)
};

// The prompt's query tails (flashcache/query_tail.hpp), gathered while the
// prompt is prefilled: pass it to Model::forward as its observer, then to
// CacheCompressor::compress, which then scores with Options::with_query_tail().
// Each layer's tails follow its cache slots; reset(feed) before the next prompt.
class PromptTails : public QueryObserver {
 public:
  explicit PromptTails(flashcache::QueryTailOptions opt = {}) : opt_(opt) {}

  // Before the next prompt: its feed (last_queries(N) depends on its length), tails zeroed.
  void reset(flashcache::QueryTailOptions opt = {}) {
    opt_ = opt;
    ms_ = 0;
    status_ = flashcache::Status::success();
    for (auto& t : tails_) std::fill(t.begin(), t.end(), 0.0f);
  }
  void layer_queries(int l, const float* q, std::int64_t n, const KVCache& cache) override {
    namespace fc = flashcache;
    const ModelConfig& c = cache.config();
    if (tails_.size() != static_cast<std::size_t>(cache.layers()))
      tails_.resize(static_cast<std::size_t>(cache.layers()));
    auto& tails = tails_[static_cast<std::size_t>(l)];
    tails.resize(static_cast<std::size_t>(c.kv_heads * cache.capacity(l)), 0.0f);
    const std::int64_t first = cache.length(l) - n, d = c.head_dim;
    const fc::KVView<const float> qv(q, c.heads, n, d, d, c.heads * d);  // [n][heads][d]
    const fc::KVView<const float> kv(cache.k(l, 0, 0), c.kv_heads, cache.length(l), d, cache.capacity(l) * d, d);
    const auto t0 = std::chrono::steady_clock::now();
    status_ = acc_.add(qv, first, kv, nullptr, fc::TailView<float>{tails.data(), c.kv_heads, cache.capacity(l)}, opt_);
    ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    // A forward pass has no Status to return. A throw here leaves the cache with this chunk in the
    // layers before l only: the prompt must be prefilled again (shapes are the model's, so only a
    // bug gets here).
    if (!status_.ok()) throw flashcache::Error(status_);
  }
  // Layer l's tails, one row of capacity(l) per KV head.
  flashcache::TailView<const float> layer(int l, std::int64_t kv_heads) const {
    const auto& t = tails_[static_cast<std::size_t>(l)];
    return {t.data(), kv_heads, static_cast<std::int64_t>(t.size()) / kv_heads};
  }
  int layers() const { return static_cast<int>(tails_.size()); }
  // Time spent raising tails during the forward passes (what gathering costs the prefill).
  double milliseconds() const { return ms_; }

 private:
  double ms_ = 0;
  flashcache::QueryTailOptions opt_;
  flashcache::TailAccumulator acc_;
  std::vector<std::vector<float>> tails_;
  flashcache::Status status_;
};

// Compresses engine caches with flashcache's no-throw core: score every layer
// into scores the compressor keeps, plan the budgets, then select and gather
// each layer's kept rows straight into the new cache. One compressor serves
// many prompts: its transforms, planner and scratch are reused, so a second
// prompt of the same length allocates only the new cache.
class CacheCompressor {
 public:
  // Replaces `cache` by a compact one holding budgets[l] tokens per head in
  // layer l (plus `room` for new tokens). On failure the cache is unchanged.
  // With `tails` (gathered during this prompt's prefill) flashcache scores with
  // the query-informed preset, Options::with_query_tail().
  flashcache::Status compress(KVCache& cache, const CompressSettings& s, std::vector<std::int64_t>* budgets,
                              const PromptTails* tails = nullptr) {
    namespace fc = flashcache;
    namespace fp = flashcache::policies;
    fp::Policy policy = fp::Policy::flashcache;
    FLASHCACHE_RETURN_IF_ERROR(fp::parse_policy(s.policy, &policy));
    if (fp::needs_queries(policy))
      return fc::make_error(fc::Errc::unsupported, "policy ", s.policy,
                            " needs the prompt's queries, which this engine does not keep");
    if (tails != nullptr && policy != fp::Policy::flashcache)
      return fc::make_error(fc::Errc::invalid_option, "query tails are read by policy flashcache only, not ", s.policy);
    if (tails != nullptr && tails->layers() != cache.layers())
      return fc::make_error(fc::Errc::invalid_shape, "query tails of ", tails->layers(), " layers for a cache of ",
                            cache.layers(), " (gather them during this prompt's prefill)");
    // The library's defaults (with query tails when gathered), but for what the caller set.
    fc::Options opt = tails != nullptr ? fc::Options::with_query_tail() : fc::Options{};
    if (s.sink >= 0) opt.select.sink = s.sink;
    if (s.window >= 0) opt.select.window = s.window;
    opt.allocate.mode = s.uniform ? fc::Allocation::uniform : fc::Allocation::dynamic;

    // The cache as one view per layer: [kv_heads][capacity][head_dim], `length` tokens in use.
    const int layers = cache.layers();
    const std::int64_t heads = cache.kv_heads(), dim = cache.head_dim();
    auto view = [&](const float* base, int l) {
      return fc::KVView<const float>(base, heads, cache.length(l), dim, cache.capacity(l) * dim, dim);
    };
    scores_.resize(static_cast<std::size_t>(layers));
    summary_.resize(static_cast<std::size_t>(layers));
    budgets->resize(static_cast<std::size_t>(layers));
    // Layer l is scored on worker l % threads, each worker with its own scorer.
    const int threads = std::max(1, std::min(s.threads, layers));
    pool_.resize(threads);
    if (scorers_.size() < static_cast<std::size_t>(threads)) scorers_.resize(static_cast<std::size_t>(threads));
    status_.assign(static_cast<std::size_t>(layers), fc::Status::success());
    const fc::Budget model_budget = fc::Budget::ratio(s.keep_ratio);
    auto score_layer = [&](std::int64_t l64, int w) {
      const int l = static_cast<int>(l64);
      const auto k = view(cache.k(l, 0, 0), l), v = view(cache.v(l, 0, 0), l);
      fc::LayerScores& scores = scores_[static_cast<std::size_t>(l)];
      const fc::TailView<const float> t = tails != nullptr ? tails->layer(l, heads) : fc::TailView<const float>{};
      fc::Status& st = status_[static_cast<std::size_t>(l)];
      st = policy == fp::Policy::flashcache
               ? scorers_[static_cast<std::size_t>(w)].score(
                     k, v, opt.score, &scores, fc::ScoreInputs{{}, t, model_budget.keep_ratio(cache.length(l))})
               : fp::score_with_policy(policy, {}, k, v, opt.score, fp::PolicyOptions{}, &scores);
      if (st.ok()) summary_[static_cast<std::size_t>(l)] = fc::summarize(scores.view(), scores.energy.data(), opt.select, {});
    };
    pool_.run(layers, score_layer);
    for (const fc::Status& st : status_) FLASHCACHE_RETURN_IF_ERROR(st);
    FLASHCACHE_RETURN_IF_ERROR(planner_.plan(summary_.data(), layers, model_budget, opt.allocate, budgets->data()));

    // A new, smaller cache: layer l holds budgets[l] tokens per head, plus room for new ones.
    std::vector<std::int64_t> capacity(static_cast<std::size_t>(layers));
    for (int l = 0; l < layers; ++l) capacity[l] = (*budgets)[l] + s.room;
    KVCache small(cache.config(), capacity);
    for (int l = 0; l < layers; ++l) {
      const std::int64_t budget = (*budgets)[l];
      kept_.resize(static_cast<std::size_t>(heads * budget));
      FLASHCACHE_RETURN_IF_ERROR(fc::select_tokens(scores_[static_cast<std::size_t>(l)].view(), budget, opt.select, {}, {},
                                                   &select_, fc::KeptView{kept_.data(), budget}));
      const fc::KVView<float> k_out(small.k(l, 0, 0), heads, budget, dim, small.capacity(l) * dim, dim);
      const fc::KVView<float> v_out(small.v(l, 0, 0), heads, budget, dim, small.capacity(l) * dim, dim);
      FLASHCACHE_RETURN_IF_ERROR(fc::gather(view(cache.k(l, 0, 0), l), kept_.data(), budget, k_out));
      FLASHCACHE_RETURN_IF_ERROR(fc::gather(view(cache.v(l, 0, 0), l), kept_.data(), budget, v_out));
      for (int h = 0; h < heads; ++h)
        for (std::int64_t j = 0; j < budget; ++j)
          small.position(l, h, j) = cache.position(l, h, kept_[static_cast<std::size_t>(h * budget + j)]);
      small.set_length(l, budget);
    }
    small.next_position = cache.next_position;  // new tokens continue the uncompressed sequence
    cache = std::move(small);
    return fc::Status::success();
  }

 private:
  flashcache::WorkerPool pool_;
  std::vector<flashcache::Scorer<float>> scorers_;  // one per worker
  std::vector<flashcache::Status> status_;          // one per layer
  std::vector<flashcache::LayerScores> scores_;
  std::vector<flashcache::LayerSummary> summary_;
  flashcache::BudgetPlanner planner_;
  flashcache::SelectWorkspace select_;
  std::vector<std::int32_t> kept_;
};

// One-shot form: per-layer budgets (tokens kept per KV head). Throws
// flashcache::Error on bad settings.
inline std::vector<std::int64_t> compress_cache(KVCache& cache, const CompressSettings& s,
                                                const PromptTails* tails = nullptr) {
  CacheCompressor compressor;
  std::vector<std::int64_t> budgets;
  flashcache::throw_if_error(compressor.compress(cache, s, &budgets, tails));
  return budgets;
}

}  // namespace engine
