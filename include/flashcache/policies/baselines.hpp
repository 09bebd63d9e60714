#pragma once
// Baseline policies: other ways to score tokens, sharing FlashCache's select
// and gather stages, so that every quality and speed claim is a side-by-side
// comparison. Each fills a LayerScores (higher = keep); the always-kept sets
// (sink, window, mask) come from Options as for FlashCache.
//
//   streaming  StreamingLLM: the most recent tokens (plus SelectOptions::sink)
//   knorm      keys of lowest L2 norm first
//   keydiff    KeyDiff: keys least similar in direction to the head's mean
//              (normalised) key first; attention-free, like knorm
//   random     seeded uniform scores
//   snapkv     SnapKV: attention of the last `observation_window` queries,
//              summed, max-pooled over `pool_kernel` tokens; the window is kept
//   h2o        H2O: attention accumulated over all queries (heavy hitters);
//              its recent half is SelectOptions::window
// FlashCache itself reads the queries when ScoreOptions::query says so: each key's
// tail (query_tail.hpp) from the prompt's queries, mixed with the residual.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "../flashcache.hpp"
#include "attention.hpp"

namespace flashcache::policies {

enum class Policy { flashcache, streaming, knorm, keydiff, random, snapkv, h2o };

}  // namespace flashcache::policies

namespace flashcache {
template <>
struct EnumNames<policies::Policy> {
  static constexpr EnumName<policies::Policy> table[] = {{policies::Policy::flashcache, "flashcache"},
                                                         {policies::Policy::streaming, "streaming"},
                                                         {policies::Policy::knorm, "knorm"},
                                                         {policies::Policy::keydiff, "keydiff"},
                                                         {policies::Policy::random, "random"},
                                                         {policies::Policy::snapkv, "snapkv"},
                                                         {policies::Policy::h2o, "h2o"}};
};
}  // namespace flashcache

namespace flashcache::policies {

inline const char* to_string(Policy p) { return enum_name(p); }
inline Status parse_policy(const std::string& name, Policy* out) { return parse_enum(name, out, "policy"); }

inline bool needs_queries(Policy p) { return p == Policy::snapkv || p == Policy::h2o; }
// FlashCache reads queries when its options say so (ScoreOptions::query).
inline bool needs_queries(Policy p, const ScoreOptions& opt) {
  return needs_queries(p) || (p == Policy::flashcache && opt.query != QueryInput::none);
}

struct PolicyOptions {
  std::uint64_t seed = 0;                // random
  std::int64_t observation_window = 32;  // snapkv: queries that vote
  std::int64_t pool_kernel = 7;          // snapkv: max-pool width (odd)
  // flashcache with QueryInput::tail: which prompt queries feed the tails
  // (query_tail.hpp): every `tail.stride`-th, and only the last `tail_last`
  // when it is above 0 (0: all of them); the defaults are the chosen feed.
  QueryTailOptions tail;
  std::int64_t tail_last = kTailLastQueries;
};

// Each key's tail from the prompt's queries q (the whole prompt, one chunk),
// the cheaper forms of PolicyOptions applied; tails [k.heads][k.tokens].
template <class T>
Status prompt_tails(KVView<const T> q, KVView<const T> k, const PolicyOptions& po, TailAccumulator* acc,
                    std::vector<float>* tails) {
  FLASHCACHE_RETURN_IF_ERROR(check_queries(q, k));
  if (po.tail_last < 0) return make_error(Errc::invalid_option, "tail_last ", po.tail_last, " is negative");
  tails->assign(static_cast<std::size_t>(k.heads * k.tokens), 0.0f);
  QueryTailOptions feed = po.tail;
  if (po.tail_last > 0) feed.from_position = std::max(feed.from_position, k.tokens - po.tail_last);
  return acc->add(q, 0, k, nullptr, TailView<float>{tails->data(), k.heads, k.tokens}, feed);
}

namespace detail {
inline void reset(LayerScores* out, std::int64_t heads, std::int64_t tokens) {
  out->heads = heads;
  out->tokens = tokens;
  out->score.assign(static_cast<std::size_t>(heads * tokens), 0.0f);
  out->energy.assign(static_cast<std::size_t>(heads), HeadEnergy{});
  out->nonfinite = 0;
}
}  // namespace detail

// Later tokens score higher.
inline void streaming_scores(std::int64_t heads, std::int64_t tokens, LayerScores* out) {
  detail::reset(out, heads, tokens);
  for (std::int64_t h = 0; h < heads; ++h)
    for (std::int64_t t = 0; t < tokens; ++t)
      out->score[static_cast<std::size_t>(h * tokens + t)] = static_cast<float>(t);
}

// score = -||k_t||: the lowest-norm keys are kept.
template <class T>
Status knorm_scores(KVView<const T> k, LayerScores* out) {
  FLASHCACHE_RETURN_IF_ERROR(check_view(k, "K"));
  detail::reset(out, k.heads, k.tokens);
  for (std::int64_t h = 0; h < k.heads; ++h)
    for (std::int64_t t = 0; t < k.tokens; ++t) {
      double sq = 0;
      for (std::int64_t c = 0; c < k.head_dim; ++c)
        sq += static_cast<double>(to_float(k(h, t, c))) * to_float(k(h, t, c));
      out->score[static_cast<std::size_t>(h * k.tokens + t)] = static_cast<float>(-std::sqrt(sq));
    }
  return Status::success();
}

// KeyDiff: score = -cos(k_t, a), a = the mean of the head's unit keys, so the
// keys pointing away from the common direction are kept. A zero key scores 0.
template <class T>
Status keydiff_scores(KVView<const T> k, LayerScores* out) {
  FLASHCACHE_RETURN_IF_ERROR(check_view(k, "K"));
  detail::reset(out, k.heads, k.tokens);
  std::vector<double> anchor(static_cast<std::size_t>(k.head_dim)), norm(static_cast<std::size_t>(k.tokens));
  for (std::int64_t h = 0; h < k.heads; ++h) {
    std::fill(anchor.begin(), anchor.end(), 0.0);
    for (std::int64_t t = 0; t < k.tokens; ++t) {
      double sq = 0;
      for (std::int64_t c = 0; c < k.head_dim; ++c)
        sq += static_cast<double>(to_float(k(h, t, c))) * to_float(k(h, t, c));
      norm[static_cast<std::size_t>(t)] = std::sqrt(sq);
      if (sq > 0)
        for (std::int64_t c = 0; c < k.head_dim; ++c)
          anchor[static_cast<std::size_t>(c)] += to_float(k(h, t, c)) / norm[static_cast<std::size_t>(t)];
    }
    double anchor_norm = 0;
    for (double a : anchor) anchor_norm += a * a;
    anchor_norm = std::sqrt(anchor_norm);
    for (std::int64_t t = 0; t < k.tokens; ++t) {
      double dot = 0;
      for (std::int64_t c = 0; c < k.head_dim; ++c) dot += anchor[static_cast<std::size_t>(c)] * to_float(k(h, t, c));
      const double denom = anchor_norm * norm[static_cast<std::size_t>(t)];
      out->score[static_cast<std::size_t>(h * k.tokens + t)] = static_cast<float>(denom > 0 ? -dot / denom : 0.0);
    }
  }
  return Status::success();
}

inline void random_scores(std::int64_t heads, std::int64_t tokens, std::uint64_t seed, LayerScores* out) {
  detail::reset(out, heads, tokens);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (auto& s : out->score) s = u(rng);
}

// SnapKV. Window tokens score +inf-free but highest (they are the voters);
// callers usually also protect them with SelectOptions::window.
template <class T>
Status snapkv_scores(KVView<const T> q, KVView<const T> k, const PolicyOptions& po, LayerScores* out) {
  FLASHCACHE_RETURN_IF_ERROR(check_queries(q, k));
  if (po.observation_window < 1 || po.pool_kernel < 1 || po.pool_kernel % 2 == 0)
    return make_error(Errc::invalid_option, "snapkv needs observation_window >= 1 and an odd pool_kernel (got ",
                      po.observation_window, ", ", po.pool_kernel, ")");
  const std::int64_t n = k.tokens, group = k.heads ? q.heads / k.heads : 1;
  detail::reset(out, k.heads, n);
  const std::int64_t first = std::max<std::int64_t>(0, n - po.observation_window);
  std::vector<double> votes(static_cast<std::size_t>(n));
  for (std::int64_t h = 0; h < k.heads; ++h) {
    std::fill(votes.begin(), votes.end(), 0.0);
    for (std::int64_t g = 0; g < group; ++g) add_causal_attention(q, k, h * group + g, h, first, n, votes.data());
    for (double& x : votes) x /= static_cast<double>(group);
    // Max-pool the prefix's votes so that neighbours of a hit come along; the window itself ranks first.
    const std::int64_t half = po.pool_kernel / 2;
    for (std::int64_t t = 0; t < n; ++t) {
      double best = 0;
      if (t >= first) {
        best = 2.0 * static_cast<double>(po.observation_window);  // above any pooled vote sum
      } else {
        for (std::int64_t u = std::max<std::int64_t>(0, t - half); u <= std::min(first - 1, t + half); ++u)
          best = std::max(best, votes[static_cast<std::size_t>(u)]);
      }
      out->score[static_cast<std::size_t>(h * n + t)] = static_cast<float>(best);
    }
  }
  return Status::success();
}

// H2O: each key's attention summed over every query that sees it.
template <class T>
Status h2o_scores(KVView<const T> q, KVView<const T> k, LayerScores* out) {
  FLASHCACHE_RETURN_IF_ERROR(check_queries(q, k));
  const std::int64_t n = k.tokens, group = k.heads ? q.heads / k.heads : 1;
  detail::reset(out, k.heads, n);
  std::vector<double> acc(static_cast<std::size_t>(n));
  for (std::int64_t h = 0; h < k.heads; ++h) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (std::int64_t g = 0; g < group; ++g) add_causal_attention(q, k, h * group + g, h, 0, n, acc.data());
    for (std::int64_t t = 0; t < n; ++t)
      out->score[static_cast<std::size_t>(h * n + t)] =
          static_cast<float>(acc[static_cast<std::size_t>(t)] / static_cast<double>(group));
  }
  return Status::success();
}

// Scores one layer with any policy; q may be empty unless the policy needs it.
// FlashCache scores the request's image spans over their 2D grid and reads
// `keep` (the share of tokens the caller keeps, ScoreInputs::keep); the
// baselines read neither.
template <class Real = float, class T>
Status score_with_policy(Policy p, KVView<const T> q, KVView<const T> k, KVView<const T> v, const ScoreOptions& opt,
                         const PolicyOptions& po, LayerScores* out, ImageSpans spans = {}, double keep = 1.0) {
  FLASHCACHE_RETURN_IF_ERROR(check_pair(k, v));
  if (needs_queries(p, opt) && q.empty() && !k.empty())
    return make_error(Errc::invalid_option, "policy ", to_string(p), p == Policy::flashcache ? " with query tail" : "",
                      " needs queries (Q)");
  switch (p) {
    case Policy::flashcache: {
      Scorer<Real> scorer;
      if (opt.query == QueryInput::none || k.empty()) return scorer.score(k, v, opt, out, ScoreInputs{spans, {}, keep});
      TailAccumulator acc;
      std::vector<float> tails;
      FLASHCACHE_RETURN_IF_ERROR(prompt_tails(q, k, po, &acc, &tails));
      return scorer.score(k, v, opt, out,
                          ScoreInputs{spans, TailView<const float>{tails.data(), k.heads, k.tokens}, keep});
    }
    case Policy::streaming:
      streaming_scores(k.heads, k.tokens, out);
      return Status::success();
    case Policy::knorm:
      return knorm_scores(k, out);
    case Policy::keydiff:
      return keydiff_scores(k, out);
    case Policy::random:
      random_scores(k.heads, k.tokens, po.seed, out);
      return Status::success();
    case Policy::snapkv:
      return snapkv_scores(q, k, po, out);
    case Policy::h2o:
      return h2o_scores(q, k, out);
  }
  return make_error(Errc::invalid_option, "unknown policy");
}

#if FLASHCACHE_EXCEPTIONS
// Compresses a whole model with any policy; q holds one view per layer when
// the policy needs queries (else it may be empty). Baselines have no energy
// ratios, so under Allocation::dynamic their budgets fall back to a uniform
// ratio, as in their papers. `masks` is empty or one protect mask per layer;
// `spans` are the request's image spans. Throws flashcache::Error.
template <class Real = float, class T>
CompressedModel<std::remove_const_t<T>> compress_model(Policy p, const std::vector<KVView<T>>& q,
                                                       const std::vector<KVView<T>>& k, const std::vector<KVView<T>>& v,
                                                       Budget budget, const Options& opt = {},
                                                       const PolicyOptions& po = {},
                                                       const std::vector<ProtectMask>& masks = {},
                                                       ImageSpans spans = {}) {
  using E = std::remove_const_t<T>;
  throw_if_error(flashcache::detail::check_model_inputs(k, v.size(), opt));
  if (needs_queries(p, opt.score) && q.size() != k.size())
    throw Error(make_error(Errc::invalid_shape, "policy ", to_string(p), " needs Q for every layer: ", q.size(),
                           " Q layers, ", k.size(), " K layers"));
  const auto qc = flashcache::detail::const_views(q), kc = flashcache::detail::const_views(k),
             vc = flashcache::detail::const_views(v);
  std::vector<LayerScores> scores(k.size());
  for (std::size_t l = 0; l < k.size(); ++l) {
    const KVView<const E> ql = needs_queries(p, opt.score) ? qc[l] : KVView<const E>{};
    throw_if_error(
        flashcache::detail::at_layer(score_with_policy<Real, E>(p, ql, kc[l], vc[l], opt.score, po, &scores[l], spans,
                                                                budget.keep_ratio(kc[l].tokens)),
                                     1, 0, static_cast<int>(l)));
  }
  CompressedModel<E> model;
  throw_if_error(
      flashcache::compress_scored_model<E>(kc, vc, std::move(scores), budget, opt, kKeepPerHead, masks, spans, &model));
  return model;
}
#endif  // FLASHCACHE_EXCEPTIONS

}  // namespace flashcache::policies
