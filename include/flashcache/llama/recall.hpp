#pragma once
// Recall at a new turn: the cells a running context evicted (an Archive, kept
// by ContextManager with AfterCompaction::archive) are scored with the new turn's
// own queries, and the blocks it needs come back before the reply is generated.
//
// A compaction decides before the question is known; a question is the first
// moment its queries exist. After the program decoded the turn (its queries
// captured through cb_eval by a QueryCapture that follows the turn), the
// recall reads the sequence's state, scores every archived token by the
// largest attention probability the turn's queries give it over the whole
// context (flashcache/recall.hpp, one ranking shared by every layer and head,
// as llama.cpp's cells need), and takes the best blocks within the budget.
// A block comes back only where there is room or it beats, by that same
// score, the resident cells it would displace (never the first n_keep, never
// the turn). The new sequence (the residents kept and the blocks, each cell at
// its original position) replaces the old one, and the turn is decoded again
// (RecallRedo::turn) or only its last token (RecallRedo::last_token: its logits
// are what the reply starts from), so the reply sees what came back. The
// displaced residents go to the archive.
//
// Nothing is lost: the archive changes only after the sequence was replaced and
// decoded again; any failure before puts the original state back. A q8_0 K
// cache is refused by name: llama.cpp stores its keys Hadamard-rotated, the
// captured queries are not.
#include <llama.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "flashcache/archive.hpp"
#include "flashcache/error.hpp"
#include "flashcache/llama/checks.hpp"
#include "flashcache/llama/queries.hpp"
#include "flashcache/llama/recall_params.hpp"
#include "flashcache/llama/sequence.hpp"
#include "flashcache/llama/state/rows.hpp"
#include "flashcache/recall.hpp"
#include "flashcache/recall_pool.hpp"
#include "flashcache/view.hpp"

namespace flashcache {
namespace llama {

class TurnRecaller {
 public:
  Status recall(llama_context* ctx, llama_seq_id seq, const RecallRequest& req, RecallStats* stats) {
    const auto t0 = clock::now();
    RecallStats st;
    recalled_pos_.clear();
    FLASHCACHE_RETURN_IF_ERROR(check_supported(ctx, seq));
    const RecallSettings& r = req.settings;
    FLASHCACHE_RETURN_IF_ERROR(check_recall_settings(r));
    QueryCapture* capture = r.capture;
    Archive* archive = req.archive;
    const llama_token* turn = req.turn;
    const std::int64_t n = req.n, cap = req.cap, n_keep = req.n_keep;
    if (archive == nullptr || capture == nullptr || turn == nullptr || n < 1)
      return make_error(Errc::invalid_option, "llama recall: null archive, capture or turn, or ", n, " turn tokens");
    if (cap < 2 || n_keep < 0 || req.threads < 1)
      return make_error(Errc::invalid_option, "llama recall: cap ", cap, ", n_keep ", n_keep, ", ", req.threads,
                        " threads");
    if (r.budget == 0 || archive->tokens() == 0) {  // nothing to bring back: nothing read
      capture->pause();
      if (stats != nullptr) *stats = st;
      return Status::success();
    }
    FLASHCACHE_RETURN_IF_ERROR(state_.read(ctx, seq));
    FLASHCACHE_RETURN_IF_ERROR(state_.map_layers());
    const SeqState& s = state_.state();
    const std::vector<std::int32_t>& order = state_.order();
    const std::int64_t heads = state_.kv_heads();
    FLASHCACHE_RETURN_IF_ERROR(check_turn(ctx, heads, *capture, *archive, n));
    st.cells_before = st.cells_after = s.cell_count;
    FLASHCACHE_RETURN_IF_ERROR(score(heads, *capture, *archive, r.score, req.threads, &st));
    capture->pause();  // the turn's queries are used; a decode again must not count as new tokens
    const auto t1 = clock::now();
    st.score_ms = ms(t0, t1);
    // Decoding the whole turn again needs the cell just before it: llama.cpp takes a
    // batch only at the sequence's last position + 1. Without it (a compaction during
    // the turn evicted it), only the last token is decoded again.
    const std::int64_t cells = s.cell_count;
    const bool whole_turn = r.redo == RecallRedo::turn && cells > n &&
                            state_.position(order[static_cast<std::size_t>(cells - n - 1)]) == state_.pos_max() - n;
    const std::int64_t redo = whole_turn ? n : 1;
    // A quarter of the cap stays free of the protected set (n_keep, the turn, the recalled)
    // for the reply, which the next compactions must find room for.
    const std::int64_t budget = std::min(r.budget, std::max<std::int64_t>(0, cap - 1 - n_keep - n - cap / 4));
    FLASHCACHE_RETURN_IF_ERROR(choose(*archive, cap, n_keep, whole_turn ? n + 1 : n, budget));
    if (room_.blocks.empty()) {
      st.ms = ms(t0, clock::now());
      if (stats != nullptr) *stats = st;
      return Status::success();
    }
    // The new sequence: every resident not displaced (without what is decoded
    // again) and the recalled tokens, by position.
    merged_.clear();
    for (std::int64_t i = 0; i < cells - redo; ++i)
      if (!displaced_mask_[static_cast<std::size_t>(i)]) merged_.push_back({order[static_cast<std::size_t>(i)], -1});
    for (const std::int64_t b : room_.blocks)
      for (std::int64_t t = archive->block_first(b); t < archive->block_first(b) + archive->block_tokens(b); ++t)
        merged_.push_back({-1, t});
    std::sort(merged_.begin(), merged_.end(),
              [&](const Merged& x, const Merged& y) { return pos_of(s, *archive, x) < pos_of(s, *archive, y); });
    for (const Merged& m : merged_)
      if (m.cell < 0) recalled_pos_.push_back(archive->positions()[m.token]);
    FLASHCACHE_RETURN_IF_ERROR(state_.write(static_cast<std::uint32_t>(merged_.size()),
                                            MergedCells{state_.blob(), s, *archive, merged_.data()}));
    const auto t2 = clock::now();
    FLASHCACHE_RETURN_IF_ERROR(replace_and_redo(ctx, seq, turn + (n - redo), redo));
    const auto t3 = clock::now();
    // Committed: the recalled blocks leave the archive, the displaced residents enter it.
    const std::int64_t dropped = archive->dropped_tokens();
    FLASHCACHE_RETURN_IF_ERROR(archive->erase(room_.blocks.data(), static_cast<std::int64_t>(room_.blocks.size())));
    FLASHCACHE_RETURN_IF_ERROR(
        state_.archive_cells(displaced_.data(), static_cast<std::int64_t>(displaced_.size()), archive));
    st.archive_dropped = archive->dropped_tokens() - dropped;
    st.recalled = static_cast<std::int64_t>(recalled_pos_.size());
    st.displaced = static_cast<std::int64_t>(displaced_.size());
    st.redecoded = redo;
    st.cells_after = static_cast<std::int64_t>(merged_.size()) + redo;
    st.write_ms = ms(t1, t2);
    st.redo_ms = ms(t2, t3);
    st.ms = ms(t0, clock::now());
    if (stats != nullptr) *stats = st;
    return Status::success();
  }

  // The positions the last recall brought back, ascending.
  const std::vector<llama_pos>& recalled_positions() const { return recalled_pos_; }

 private:
  using clock = std::chrono::steady_clock;
  static double ms(clock::time_point a, clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  }

  // A cell of the new sequence: a resident (its blob index) or an archived token.
  struct Merged {
    std::int32_t cell;
    std::int64_t token;
  };
  static std::int32_t pos_of(const SeqState& s, const Archive& a, const Merged& m) {
    return m.cell >= 0 ? s.pos[static_cast<std::size_t>(m.cell)] : a.positions()[m.token];
  }
  // The writer's view of the merged cells (detail::write_cells).
  struct MergedCells {
    const std::uint8_t* blob;
    const SeqState& s;
    const Archive& a;
    const Merged* cells;
    std::int32_t pos(std::uint32_t i) const { return pos_of(s, a, cells[i]); }
    const std::uint8_t* k(std::size_t l, std::uint32_t i) const {
      const Merged& m = cells[i];
      return m.cell >= 0 ? detail::cell_k(blob, s, l, static_cast<std::size_t>(m.cell))
                         : a.k_row(static_cast<int>(l), m.token);
    }
    const std::uint8_t* v(std::size_t l, std::uint32_t i) const {
      const Merged& m = cells[i];
      return m.cell >= 0 ? detail::cell_v(blob, s, l, static_cast<std::size_t>(m.cell))
                         : a.v_row(static_cast<int>(l), m.token);
    }
    std::size_t v_step(std::size_t l, std::uint32_t i) const {
      // an archived V row holds its elements in order
      return cells[i].cell >= 0 ? detail::cell_v_step(s, l) : s.layers[l].v_elem_bytes;
    }
  };

  // The turn is the sequence's last n positions, the capture holds its queries
  // (one run ending at the last), and the archive holds this state's rows.
  Status check_turn(llama_context* ctx, std::int64_t heads, const QueryCapture& q, const Archive& a, std::int64_t n) {
    const SeqState& s = state_.state();
    if (s.layers[0].k_type == GgmlType::q8_0)
      return make_error(Errc::unsupported,
                        "llama recall: a q8_0 K cache (llama.cpp stores its keys Hadamard-rotated; the captured "
                        "queries are not)");
    FLASHCACHE_RETURN_IF_ERROR(detail::check_logit_scale(llama_get_model(ctx)));
    FLASHCACHE_RETURN_IF_ERROR(state_.archive_matches(a));
    const std::vector<std::int32_t>& order = state_.order();
    const std::int64_t cells = s.cell_count;
    if (n > cells)
      return make_error(Errc::invalid_option, "llama recall: a turn of ", n, " tokens in ", cells, " cells");
    const llama_pos hi = state_.pos_max();
    for (std::int64_t i = 0; i < n; ++i)
      if (state_.position(order[static_cast<std::size_t>(cells - n + i)]) != hi - n + 1 + i)
        return make_error(Errc::invalid_option, "llama recall: the turn's ", n,
                          " tokens are not the sequence's last positions (", hi - n + 1, " to ", hi, ")");
    FLASHCACHE_RETURN_IF_ERROR(q.status());
    if (!q.running() || !q.complete() || q.layers() != llama_model_n_layer(llama_get_model(ctx)) ||
        q.end_position() != hi + 1)
      return make_error(Errc::invalid_option, "llama recall: the QueryCapture did not follow the turn (it saw ",
                        q.tokens_seen(), " tokens in ", q.layers(), " layers up to position ", q.end_position() - 1,
                        "; the turn ends at ", hi, "): ContextManager::begin_turn before the turn is decoded");
    const std::int64_t dim = static_cast<std::int64_t>(s.layers[0].k_embd) / heads;
    for (const int l : state_.model_layers()) {
      const QueryWindow& w = q.window(l);
      // The window is a ring: its kept queries are one or two runs of consecutive positions.
      if (w.kept() < 1 || w.first_kept() < hi - n + 1 || w.first_kept() + w.kept() != hi + 1)
        return make_error(Errc::invalid_option, "llama recall: layer ", l,
                          "'s captured queries are not the turn's last positions");
      if (w.head_dim() != dim || w.heads() % heads != 0)
        return make_error(Errc::unsupported, "llama recall: queries of ", w.heads(), " heads of ", w.head_dim(),
                          " for ", heads, " KV heads of ", dim);
    }
    return Status::success();
  }

  // Every archived token's score (and every resident's) from the turn's queries,
  // the layers spread over the threads (recall_pool.hpp); then merged.
  Status score(std::int64_t heads, const QueryCapture& q, const Archive& a, RecallScore how, int threads,
               RecallStats* st) {
    const SeqState& s = state_.state();
    const std::vector<int>& model_layer = state_.model_layers();
    const std::int64_t cells = s.cell_count, layers = static_cast<std::int64_t>(s.layers.size());
    const std::int64_t m = q.window(model_layer[0]).kept(), r = cells - m;
    const std::int64_t embd = static_cast<std::int64_t>(s.layers[0].k_embd), dim = embd / heads;
    const int workers = static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(threads, layers)));
    FLASHCACHE_RETURN_IF_ERROR(scorers_.reset(a, RecallScope::shared, how, workers));
    if (work_.size() < static_cast<std::size_t>(workers)) work_.resize(static_cast<std::size_t>(workers));
    for (int w = 0; w < workers; ++w)
      work_[static_cast<std::size_t>(w)].keys.resize(static_cast<std::size_t>(cells * embd));
    auto one_layer = [&](std::int64_t l, RecallScorer& scorer, int w) {
      Worker& x = work_[static_cast<std::size_t>(w)];
      layer_to_float(state_.blob(), s, static_cast<std::size_t>(l), Part::k, state_.order().data(),
                     static_cast<std::uint32_t>(cells), x.keys.data());
      const float* k = x.keys.data();
      return scorer.add_layer<float>(
          static_cast<int>(l), in_order(q.window(model_layer[static_cast<std::size_t>(l)]), &x.queries),
          nhd(k, Tokens(r), Heads(heads), HeadDim(dim)), nhd(k + r * embd, Tokens(m), Heads(heads), HeadDim(dim)));
    };
    FLASHCACHE_RETURN_IF_ERROR(scorers_.run(layers, one_layer));
    block_score_.resize(static_cast<std::size_t>(a.blocks()));
    FLASHCACHE_RETURN_IF_ERROR(scorers_.block_scores(block_score_.data(), a.blocks()));
    resident_score_.resize(static_cast<std::size_t>(r));
    for (std::int64_t t = 0; t < r; ++t) resident_score_[static_cast<std::size_t>(t)] = scorers_.resident_score(t);
    st->archive_tokens = a.tokens();
    st->queries = m;
    return Status::success();
  }

  // The blocks to bring back and the residents they displace (choose_recall): the
  // first n_keep and the last `turn` cells stay. Fills room_, displaced_ (blob
  // indices) and displaced_mask_ (by position order).
  Status choose(const Archive& a, std::int64_t cap, std::int64_t n_keep, std::int64_t turn, std::int64_t budget) {
    const std::vector<std::int32_t>& order = state_.order();
    const std::int64_t cells = static_cast<std::int64_t>(order.size());
    const std::int64_t first = std::min(n_keep, cells), end = std::max(first, cells - turn);
    FLASHCACHE_RETURN_IF_ERROR(choose_recall(a, block_score_.data(), resident_score_.data(), first, end,
                                             std::max<std::int64_t>(0, cap - cells), budget, &room_));
    displaced_.clear();
    displaced_mask_.assign(static_cast<std::size_t>(cells), 0);
    for (const std::int64_t i : room_.displaced) {
      displaced_mask_[static_cast<std::size_t>(i)] = 1;
      displaced_.push_back(order[static_cast<std::size_t>(i)]);
    }
    return Status::success();
  }

  // Replaces the sequence by the merged cells and decodes `redo` tokens again after it;
  // any failure puts the original state back.
  Status replace_and_redo(llama_context* ctx, llama_seq_id seq, const llama_token* tokens, std::int64_t redo) {
    const llama_pos hi = state_.pos_max();
    const bool sliding = state_.sliding();
    return state_.replace(
        "llama recall",
        [&]() -> Status {
          llama_memory_t mem = llama_get_memory(ctx);
          // The sliding layers' section came back as it was, the turn included: it is decoded again below.
          if (sliding && !llama_memory_seq_rm(mem, seq, hi - static_cast<llama_pos>(redo) + 1, -1))
            return make_error(Errc::unsupported, "llama recall: llama_memory_seq_rm refused the turn's positions");
          if (llama_memory_seq_pos_max(mem, seq) >= hi - redo + 1)
            return make_error(Errc::unsupported, "llama recall: after the write the last position is ",
                              llama_memory_seq_pos_max(mem, seq), ", expected below ", hi - redo + 1);
          const std::int64_t step = std::max<std::int64_t>(1, llama_n_batch(ctx));
          for (std::int64_t i = 0; i < redo; i += step) {
            const std::int64_t count = std::min(step, redo - i);
            fill_batch(tokens + i, count, hi - redo + 1 + static_cast<llama_pos>(i), seq, i + count == redo);
            if (const int rc = llama_decode(ctx, batch_view(count)); rc != 0)
              return make_error(Errc::unsupported, "llama recall: decoding the turn again failed (llama_decode ", rc,
                                i > 0 ? "; an earlier chunk went through, so the context's logits are no longer the "
                                        "turn's: decode its last token again before sampling"
                                      : "",
                                ")");
          }
          if (llama_memory_seq_pos_max(mem, seq) != hi)
            return make_error(Errc::unsupported, "llama recall: after decoding again the last position is ",
                              llama_memory_seq_pos_max(mem, seq), ", expected ", hi);
          return Status::success();
        },
        ", the archive unchanged");
  }

  void fill_batch(const llama_token* tokens, std::int64_t count, llama_pos first, llama_seq_id seq, bool last) {
    tokens_.assign(tokens, tokens + count);
    pos_.resize(static_cast<std::size_t>(count));
    n_seq_.assign(static_cast<std::size_t>(count), 1);
    seq_ = seq;
    seq_ptr_.assign(static_cast<std::size_t>(count), &seq_);
    logits_.assign(static_cast<std::size_t>(count), 0);
    for (std::int64_t i = 0; i < count; ++i) pos_[static_cast<std::size_t>(i)] = first + static_cast<llama_pos>(i);
    if (last) logits_.back() = 1;
  }
  llama_batch batch_view(std::int64_t count) {
    llama_batch b{};
    b.n_tokens = static_cast<std::int32_t>(count);
    b.token = tokens_.data();
    b.pos = pos_.data();
    b.n_seq_id = n_seq_.data();
    b.seq_id = seq_ptr_.data();
    b.logits = logits_.data();
    return b;
  }

  // A window's kept queries [Hq][kept][d] in position order: its one run in place,
  // or its two runs (the ring wrapped) copied into `buf`.
  static KVView<const float> in_order(const QueryWindow& w, std::vector<float>* buf) {
    if (w.pieces() == 1) return w.piece(0).q;
    const std::int64_t heads = w.heads(), d = w.head_dim(), m = w.kept();
    buf->resize(static_cast<std::size_t>(heads * m * d));
    std::int64_t at = 0;
    for (int i = 0; i < w.pieces(); ++i) {
      const KVView<const float> q = w.piece(i).q;
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t t = 0; t < q.tokens; ++t)
          std::copy(q.row(h, t), q.row(h, t) + d, buf->data() + (h * m + at + t) * d);
      at += q.tokens;
    }
    return hnd<const float>(buf->data(), Heads(heads), Tokens(m), HeadDim(d));
  }

  struct Worker {                // one scoring thread's scratch
    std::vector<float> queries;  // a wrapped window's queries in order
    std::vector<float> keys;     // one layer's keys, [cells][kv heads x head dim]
  };

  RecallScorerPool scorers_;
  std::vector<Worker> work_;
  SequenceState state_;
  std::vector<std::int32_t> displaced_;
  std::vector<std::uint8_t> displaced_mask_;
  std::vector<float> block_score_, resident_score_;
  RecallRoom room_;
  std::vector<Merged> merged_;
  std::vector<llama_pos> recalled_pos_;
  // The batch decoded again.
  std::vector<llama_token> tokens_;
  std::vector<llama_pos> pos_;
  std::vector<std::int32_t> n_seq_;
  std::vector<llama_seq_id*> seq_ptr_;
  std::vector<std::int8_t> logits_;
  llama_seq_id seq_ = 0;
};

}  // namespace llama
}  // namespace flashcache
