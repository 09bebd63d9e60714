#pragma once
// Recall: a question's queries rank the archive's blocks (archive.hpp), and the
// best come back within a budget.
//
// When a new question arrives, its queries exist for the first time: they are
// what can tell which evicted tokens it needs. For each layer, the question's
// queries q [Hq][m][d] (after RoPE, as attention sees them) attend over the
// whole context: the resident keys, the archived keys and the question's own
// keys, causally. An archived token's score is the largest attention
// probability any of those queries gives it (tails, query_tail.hpp, with
// min_distance 0), over the query heads of its KV head and then, by the scope:
//   shared    over the layers and KV heads too: one ranking for the sequence,
//             as llama.cpp's cells need (one set of cells for every layer);
//   per_head  one ranking per (layer, KV head), for caches that keep a set per
//             head (the core's compress_model, the numpy evaluation).
// A block's score is its best token's (RecallScore::exact), or a bound that
// reads no archived key against a query (RecallScore::digest, Quest's): the
// block's per-channel minimum and maximum key give the largest logit any key
// within could reach, sum over c of max(q_c min_c, q_c max_c), and its score is
// exp(that scaled logit - the query's log-sum-exp over the resident and question
// keys), the most over the queries; the residents' scores then share that
// denominator. A bound may pass 1; it ranks, it is no probability.
//
// select_recall() then takes the highest-scoring blocks, whole, while they fit
// the budget (ties to the older block); a block nobody attends to (score 0)
// never comes back. choose_recall() does the same where blocks displace
// residents of a full sequence, each only if it beats them.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "archive.hpp"
#include "enum_names.hpp"
#include "error.hpp"
#include "query_tail.hpp"
#include "types.hpp"
#include "view.hpp"

namespace flashcache {

enum class RecallScope { shared, per_head };

template <>
struct EnumNames<RecallScope> {
  static constexpr EnumName<RecallScope> table[] = {{RecallScope::shared, "shared"},
                                                    {RecallScope::per_head, "per_head"}};
};
inline const char* to_string(RecallScope e) { return enum_name(e); }

// How an archived block is scored: its best token's attention probability, or Quest's bound.
enum class RecallScore { exact, digest };

template <>
struct EnumNames<RecallScore> {
  static constexpr EnumName<RecallScore> table[] = {{RecallScore::exact, "exact"}, {RecallScore::digest, "digest"}};
};
inline const char* to_string(RecallScore e) { return enum_name(e); }

class RecallScorer {
 public:
  // Starts a recall over `archive`: every block's score is 0.
  Status reset(const Archive& archive, RecallScope scope = RecallScope::shared,
               RecallScore score = RecallScore::exact) {
    if (!is_known(scope)) return make_error(Errc::invalid_option, "recall: unknown scope");
    if (!is_known(score)) return make_error(Errc::invalid_option, "recall: unknown score");
    archive_ = &archive;
    scope_ = scope;
    score_ = score;
    token_score_.assign(static_cast<std::size_t>(rankings() * archive.tokens()), 0.0f);
    bound_.assign(static_cast<std::size_t>(rankings() * archive.blocks()), 0.0f);
    resident_score_.clear();
    resident_tokens_ = -1;
    return Status::success();
  }

  // Rankings kept: 1 (shared), or layers x KV heads (per_head; ranking l * kv_heads + h).
  std::int64_t rankings() const {
    if (archive_ == nullptr) return 0;
    return scope_ == RecallScope::shared ? 1 : archive_->shape().layers * archive_->shape().kv_heads;
  }

  // One layer: the question's queries q [Hq][m][d], the resident keys of the
  // layer [Hkv][R][d] and the question's own keys [Hkv][m][d] (positions after
  // every other key). Raises the archived tokens' scores.
  template <class T>
  Status add_layer(int layer, KVView<const T> q, KVView<const T> resident, KVView<const T> question) {
    if (archive_ == nullptr) return make_error(Errc::invalid_shape, "recall: reset() it with an archive first");
    const ArchiveShape& s = archive_->shape();
    if (layer < 0 || layer >= s.layers)
      return make_error(Errc::invalid_shape, "recall: layer ", layer, " of ", s.layers);
    if (static_cast<std::int64_t>(token_score_.size()) != rankings() * archive_->tokens())
      return make_error(Errc::invalid_shape, "recall: the archive changed since reset()");
    FLASHCACHE_RETURN_IF_ERROR(check_view(resident, "resident K"));
    FLASHCACHE_RETURN_IF_ERROR(check_view(question, "question K"));
    if (resident.heads != s.kv_heads || resident.head_dim != s.head_dim || question.heads != s.kv_heads ||
        question.head_dim != s.head_dim)
      return make_error(Errc::invalid_shape, "recall: keys are ", resident.heads, "x", resident.head_dim,
                        " (resident) and ", question.heads, "x", question.head_dim, " (question) but the archive is ",
                        s.kv_heads, " KV heads x ", s.head_dim);
    if (q.tokens != question.tokens)
      return make_error(Errc::invalid_shape, "recall: ", q.tokens, " queries but ", question.tokens,
                        " question keys (one key per query position)");
    const std::int64_t r = resident.tokens, a = archive_->tokens(), m = question.tokens;
    const std::int64_t n = r + a + m, d = s.head_dim;
    if (resident_tokens_ >= 0 && r != resident_tokens_)
      return make_error(Errc::invalid_shape, "recall: ", r, " resident keys in layer ", layer, ", ", resident_tokens_,
                        " in the layers before (every layer holds the same cells)");
    if (resident_tokens_ < 0) {
      resident_tokens_ = r;
      resident_score_.assign(static_cast<std::size_t>(rankings() * r), 0.0f);
    }
    if (a == 0 || m == 0) return Status::success();
    if (score_ == RecallScore::digest) return add_digest(layer, q, resident, question);
    // The whole context as one [Hkv][n][d] float view: resident, archived, question.
    keys_.resize(static_cast<std::size_t>(s.kv_heads * n * d));
    for (std::int64_t h = 0; h < s.kv_heads; ++h) {
      float* out = keys_.data() + h * n * d;
      for (std::int64_t t = 0; t < r; ++t) row_to_float(resident.row(h, t), d, out + t * d);
      for (std::int64_t t = 0; t < a; ++t) load_archived(archive_->k_row(layer, t), h, out + (r + t) * d);
      for (std::int64_t t = 0; t < m; ++t) row_to_float(question.row(h, t), d, out + (r + a + t) * d);
    }
    tails_.assign(static_cast<std::size_t>(s.kv_heads * n), 0.0f);
    QueryTailOptions every;
    every.min_distance = 0;
    const KVView<const float> k = hnd<const float>(keys_.data(), Heads(s.kv_heads), Tokens(n), HeadDim(d));
    FLASHCACHE_RETURN_IF_ERROR(
        tails_acc_.add(q, r + a, k, nullptr, TailView<float>{tails_.data(), s.kv_heads, n}, every));
    for (std::int64_t h = 0; h < s.kv_heads; ++h) {
      float* score = token_score_.data() + ranking_of(layer, h) * a;
      for (std::int64_t t = 0; t < a; ++t)
        score[t] = std::max(score[t], tails_[static_cast<std::size_t>(h * n + r + t)]);
      float* kept = resident_score_.data() + ranking_of(layer, h) * r;
      for (std::int64_t t = 0; t < r; ++t) kept[t] = std::max(kept[t], tails_[static_cast<std::size_t>(h * n + t)]);
    }
    return Status::success();
  }

  // Archive token t's score in one ranking: its largest attention probability so
  // far (RecallScore::exact; 0 with the digest, which scores blocks only).
  float token_score(std::int64_t t, std::int64_t ranking = 0) const {
    return token_score_[static_cast<std::size_t>(ranking * archive_->tokens() + t)];
  }

  // Resident key t's score in one ranking, on the same scale as the archived
  // tokens': what a recall would displace it for. 0 before any add_layer.
  float resident_score(std::int64_t t, std::int64_t ranking = 0) const {
    return resident_tokens_ <= 0 ? 0.0f : resident_score_[static_cast<std::size_t>(ranking * resident_tokens_ + t)];
  }
  // The resident keys each layer gave (-1 before the first add_layer).
  std::int64_t resident_tokens() const { return resident_tokens_; }

  // One ranking's block scores [blocks] into caller memory: each block's best token.
  Status block_scores(float* out, std::int64_t count, std::int64_t ranking = 0) const {
    if (archive_ == nullptr) return make_error(Errc::invalid_shape, "recall: reset() it with an archive first");
    if (count != archive_->blocks())
      return make_error(Errc::invalid_shape, "recall: ", count, " block scores for ", archive_->blocks(), " blocks");
    if (ranking < 0 || ranking >= rankings())
      return make_error(Errc::invalid_shape, "recall: ranking ", ranking, " of ", rankings(), " (", to_string(scope_),
                        ")");
    if (score_ == RecallScore::digest) {
      for (std::int64_t b = 0; b < count; ++b) out[b] = bound_[static_cast<std::size_t>(ranking * count + b)];
      return Status::success();
    }
    for (std::int64_t b = 0; b < count; ++b) {
      const std::int64_t first = archive_->block_first(b);
      float best = 0.0f;
      for (std::int64_t t = first; t < first + archive_->block_tokens(b); ++t)
        best = std::max(best, token_score(t, ranking));
      out[b] = best;
    }
    return Status::success();
  }

 private:
  using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

  // RecallScore::digest for one layer: the queries' lse over the resident and
  // question keys (causal), the residents' probabilities under it, and each
  // archived block's bound.
  template <class T>
  Status add_digest(int layer, KVView<const T> q, KVView<const T> resident, KVView<const T> question) {
    const ArchiveShape& s = archive_->shape();
    const std::int64_t r = resident.tokens, m = question.tokens, n = r + m, d = s.head_dim;
    const std::int64_t blocks = archive_->blocks(), group = q.heads / s.kv_heads;
    if (q.heads % s.kv_heads != 0 || q.head_dim != d)
      return make_error(Errc::invalid_shape, "recall: ", q.heads, " query heads of ", q.head_dim, " for ", s.kv_heads,
                        " KV heads of ", d);
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    keys_.resize(static_cast<std::size_t>(n * d));
    lo_.resize(static_cast<std::size_t>(blocks * d));
    hi_.resize(static_cast<std::size_t>(blocks * d));
    row_.resize(static_cast<std::size_t>(d));
    qbuf_.resize(static_cast<std::size_t>(m * d));
    lbuf_.resize(static_cast<std::size_t>(m * n));
    Eigen::Map<Matrix> qm(qbuf_.data(), m, d), logits(lbuf_.data(), m, n);
    for (std::int64_t h = 0; h < s.kv_heads; ++h) {
      for (std::int64_t t = 0; t < r; ++t) row_to_float(resident.row(h, t), d, keys_.data() + t * d);
      for (std::int64_t t = 0; t < m; ++t) row_to_float(question.row(h, t), d, keys_.data() + (r + t) * d);
      for (std::int64_t b = 0; b < blocks; ++b) {  // the block's per-channel range
        float* lo = lo_.data() + b * d;
        float* hi = hi_.data() + b * d;
        std::fill(lo, lo + d, std::numeric_limits<float>::infinity());
        std::fill(hi, hi + d, -std::numeric_limits<float>::infinity());
        const std::int64_t first = archive_->block_first(b);
        for (std::int64_t t = first; t < first + archive_->block_tokens(b); ++t) {
          load_archived(archive_->k_row(layer, t), h, row_.data());
          for (std::int64_t c = 0; c < d; ++c) {
            lo[c] = std::min(lo[c], row_[static_cast<std::size_t>(c)]);
            hi[c] = std::max(hi[c], row_[static_cast<std::size_t>(c)]);
          }
        }
      }
      const Eigen::Map<const Matrix> keys(keys_.data(), n, d);
      float* kept = resident_score_.data() + ranking_of(layer, h) * r;
      float* bound = bound_.data() + ranking_of(layer, h) * blocks;
      for (std::int64_t g = h * group; g < (h + 1) * group; ++g) {
        for (std::int64_t i = 0; i < m; ++i) row_to_float(q.row(g, i), d, qm.data() + i * d);
        // [m][n] in tiles of TailAccumulator's sizes: Eigen keeps their packed blocks on the
        // stack, where one whole product would take a heap buffer.
        for (std::int64_t i0 = 0; i0 < m; i0 += TailAccumulator::kQueryTile)
          for (std::int64_t j0 = 0; j0 < n; j0 += TailAccumulator::kKeyTile) {
            const std::int64_t rows = std::min(TailAccumulator::kQueryTile, m - i0);
            const std::int64_t cols = std::min(TailAccumulator::kKeyTile, n - j0);
            logits.block(i0, j0, rows, cols).noalias() =
                qm.block(i0, 0, rows, d) * keys.block(j0, 0, cols, d).transpose();
          }
        logits *= scale;
        for (std::int64_t i = 0; i < m; ++i) {
          const std::int64_t seen = r + i + 1;  // causal: query i sees the residents and question keys 0..i
          float top = -std::numeric_limits<float>::infinity();
          for (std::int64_t j = 0; j < seen; ++j) top = std::max(top, logits(i, j));
          double sum = 0;
          for (std::int64_t j = 0; j < seen; ++j) sum += std::exp(static_cast<double>(logits(i, j) - top));
          const float lse = top + static_cast<float>(std::log(sum));
          if (!std::isfinite(lse)) continue;  // a NaN query or key: this query ranks nothing
          for (std::int64_t t = 0; t < r; ++t) kept[t] = std::max(kept[t], std::exp(logits(i, t) - lse));
          const float* qi = qm.data() + i * d;
          for (std::int64_t b = 0; b < blocks; ++b) {
            const float* lo = lo_.data() + b * d;
            const float* hi = hi_.data() + b * d;
            float most = 0;
            for (std::int64_t c = 0; c < d; ++c) most += std::max(qi[c] * lo[c], qi[c] * hi[c]);
            // exp of at most 80: a loose bound stays finite and still ranks (exp(88) overflows)
            const float score = std::exp(std::min(most * scale - lse, 80.0f));
            if (score > bound[b]) bound[b] = score;  // (a NaN bound never wins)
          }
        }
      }
    }
    return Status::success();
  }

  std::int64_t ranking_of(int layer, std::int64_t h) const {
    return scope_ == RecallScope::shared ? 0 : layer * archive_->shape().kv_heads + h;
  }

  // KV head h's part of an archived K row, as floats.
  void load_archived(const unsigned char* row, std::int64_t h, float* out) const {
    const ArchiveShape& s = archive_->shape();
    const std::int64_t d = s.head_dim;
    switch (s.k_type) {
      case RowType::f32:
        return row_to_float(reinterpret_cast<const float*>(row) + h * d, d, out);
      case RowType::f16:
        return row_to_float(reinterpret_cast<const half_t*>(row) + h * d, d, out);
      case RowType::bf16:
        return row_to_float(reinterpret_cast<const bfloat16_t*>(row) + h * d, d, out);
      case RowType::q8_0:
        return q8_0_to_float(row, h * d, d, out);
    }
  }

  const Archive* archive_ = nullptr;
  RecallScope scope_ = RecallScope::shared;
  RecallScore score_ = RecallScore::exact;
  std::vector<float> bound_;           // digest: [rankings][blocks]
  std::vector<float> lo_, hi_, row_;   // digest: one layer's block ranges [blocks][d] for a KV head, a row
  std::vector<float> qbuf_, lbuf_;     // digest: the queries [m][d] and their logits [m][n]
  std::vector<float> token_score_;     // [rankings][archive tokens]
  std::vector<float> resident_score_;  // [rankings][resident tokens]
  std::int64_t resident_tokens_ = -1;
  std::vector<float> keys_;   // one layer's context keys [Hkv][n][d]
  std::vector<float> tails_;  // [Hkv][n]
  TailAccumulator tails_acc_;
};

namespace detail {

// The blocks with a score above 0 (a NaN score never comes back) into *order,
// highest score first, ties to the lower block: the order both recalls take them in.
inline void rank_blocks(std::int64_t blocks, const float* scores, std::vector<std::int64_t>* order) {
  order->clear();
  for (std::int64_t b = 0; b < blocks; ++b)
    if (scores[b] > 0) order->push_back(b);
  // Score descending, then block ascending: std::sort with a total order (a
  // stable sort would take a buffer from the heap).
  std::sort(order->begin(), order->end(),
            [&](std::int64_t x, std::int64_t y) { return scores[x] > scores[y] || (scores[x] == scores[y] && x < y); });
}

}  // namespace detail

// The blocks to bring back: highest score first (ties to the lower block),
// whole blocks while their tokens fit `budget`, only blocks with a score above
// 0 (a NaN score never comes back). *chosen: the blocks, ascending; `order` is
// scratch. Both keep their capacity between calls.
inline Status select_recall(const Archive& archive, const float* scores, std::int64_t budget,
                            std::vector<std::int64_t>* chosen, std::vector<std::int64_t>* order) {
  if (chosen == nullptr || order == nullptr) return make_error(Errc::invalid_shape, "select_recall: null outputs");
  chosen->clear();
  if (budget < 0) return make_error(Errc::invalid_budget, "select_recall: budget ", budget, " is negative");
  const std::int64_t blocks = archive.blocks();
  if (blocks == 0) return Status::success();
  if (scores == nullptr) return make_error(Errc::invalid_shape, "select_recall: null scores");
  detail::rank_blocks(blocks, scores, order);
  std::int64_t used = 0;
  for (const std::int64_t b : *order) {
    const std::int64_t n = archive.block_tokens(b);
    if (used + n > budget) continue;  // only the last block is shorter: it may still fit
    chosen->push_back(b);
    used += n;
  }
  std::sort(chosen->begin(), chosen->end());
  return Status::success();
}

// Recall into a sequence that has `room` free cells, where bringing a block back
// may displace residents: what comes back and what leaves. Blocks go best first
// (ties to the lower block), whole, while their tokens fit `budget`, only with a
// score above 0, and each only where there is room or it beats, by score, every
// resident it displaces. The residents that may make room are [first, end) of
// resident_scores (the protected ones lie outside it), lowest score first (ties
// to the lower index). No allocation once the vectors have their capacity.
struct RecallRoom {
  std::vector<std::int64_t> blocks;             // the blocks to bring back, ascending
  std::vector<std::int64_t> displaced;          // the residents they displace (indices), ascending
  std::vector<std::int64_t> order, candidates;  // scratch
};

inline Status choose_recall(const Archive& archive, const float* block_scores, const float* resident_scores,
                            std::int64_t first, std::int64_t end, std::int64_t room, std::int64_t budget,
                            RecallRoom* out) {
  if (out == nullptr) return make_error(Errc::invalid_shape, "choose_recall: null output");
  out->blocks.clear();
  out->displaced.clear();
  if (budget < 0) return make_error(Errc::invalid_budget, "choose_recall: budget ", budget, " is negative");
  if (room < 0 || first < 0 || end < first)
    return make_error(Errc::invalid_shape, "choose_recall: room ", room, " and residents [", first, ", ", end, ")");
  if (archive.blocks() > 0 && block_scores == nullptr)
    return make_error(Errc::invalid_shape, "choose_recall: null block scores");
  if (end > first && resident_scores == nullptr)
    return make_error(Errc::invalid_shape, "choose_recall: null resident scores");
  std::vector<std::int64_t>& victims = out->candidates;
  victims.clear();
  for (std::int64_t i = first; i < end; ++i) victims.push_back(i);
  const float* rs = resident_scores;
  std::sort(victims.begin(), victims.end(),
            [&](std::int64_t x, std::int64_t y) { return rs[x] < rs[y] || (rs[x] == rs[y] && x < y); });
  detail::rank_blocks(archive.blocks(), block_scores, &out->order);
  const float* bs = block_scores;
  std::int64_t used = 0, out_count = 0;  // tokens brought back; residents displaced (the lowest first)
  for (const std::int64_t b : out->order) {
    const std::int64_t size = archive.block_tokens(b);
    if (used + size > budget) continue;
    const std::int64_t need = std::max<std::int64_t>(0, used + size - room);  // residents out in all
    if (need > static_cast<std::int64_t>(victims.size())) continue;
    bool beats = true;
    for (std::int64_t v = out_count; v < need && beats; ++v) beats = bs[b] > rs[victims[static_cast<std::size_t>(v)]];
    if (!beats) continue;
    out->blocks.push_back(b);
    used += size;
    out_count = std::max(out_count, need);
  }
  std::sort(out->blocks.begin(), out->blocks.end());
  out->displaced.assign(victims.begin(), victims.begin() + out_count);
  std::sort(out->displaced.begin(), out->displaced.end());
  return Status::success();
}

}  // namespace flashcache
