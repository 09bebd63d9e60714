#pragma once
// A llama.cpp sequence that never hits the wall: before each llama_decode the
// program says how many cells it is about to add, and when they would not fit
// the sequence's cap, the manager makes room by a policy:
//   flashcache  compact the sequence to a share of the cap (SequenceCompressor),
//               the first n_keep positions and the newest turn protected, the
//               kept cells optionally renumbered to consecutive positions;
//   shift       llama.cpp's context shift: keep n_keep, drop half of the rest;
//   streaming   StreamingLLM: keep n_keep (the sink), drop the oldest cells
//               after it, just as many as the new ones need;
//   none        refuse, as llama.cpp does when its context is full.
// shift and streaming renumber the kept cells, as llama.cpp's shift does.
// flashcache may score with query tails (ContextParams::queries): the queries
// decoded since the last compaction, captured through cb_eval (llama/queries.hpp).
//
//   flashcache::llama::ContextManager cm;
//   flashcache::llama::ContextParams p = flashcache::llama::context_default_params();
//   if (auto s = cm.init(ctx, 0, p); !s) ...
//   llama_pos pos;
//   if (auto s = cm.make_room(n_tokens, &pos); !s) ...   // then decode the tokens at pos, pos+1, ...
//
// Safe by construction: renumbering (llama_memory_seq_add) is a K-shift that
// llama.cpp applies only at the next decode, and a state read before it would
// keep stale keys. The manager makes room only when asked right before a
// decode; if asked again before the decode that applies its last renumbering,
// and room is needed, it refuses by name instead of reading the sequence.
//
// Positions: make_room returns where the new tokens go (the sequence's last
// position + 1). The manager counts the sequence's cells from its positions:
// the program adds tokens only through the positions it is given, and removes
// none of the sequence's cells itself.
#include <llama.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "flashcache/error.hpp"
#include "flashcache/llama/compress.hpp"
#include "flashcache/llama/context_params.hpp"
#include "flashcache/llama/recall.hpp"

namespace flashcache {
namespace llama {

class ContextManager {
 public:
  // Takes sequence `seq` of ctx as it is now: empty, or decoded at consecutive
  // positions. Checks what every later event needs, so that a refusal comes now.
  Status init(llama_context* ctx, llama_seq_id seq, const ContextParams& p) {
    ctx_ = nullptr;
    FLASHCACHE_RETURN_IF_ERROR(check_context_params(ctx, seq, p));
    llama_memory_t mem = llama_get_memory(ctx);
    const bool sliding = llama_model_n_swa(llama_get_model(ctx)) > 0;
    std::int64_t sliding_cells = 0;  // a sliding-window model's cells already there, counted in its state
    if (sliding && llama_memory_seq_pos_max(mem, seq) >= 0)
      FLASHCACHE_RETURN_IF_ERROR(count_global_cells(ctx, seq, p.when_full, &sliding_cells));
    const llama_pos lo = llama_memory_seq_pos_min(mem, seq), hi = llama_memory_seq_pos_max(mem, seq);
    if (p.queries != nullptr) {
      p.queries->follow(hi + 1);  // the next token decoded is the sequence's next position
    }
    ctx_ = ctx;
    seq_ = seq;
    sliding_ = sliding;
    p_ = p;
    cap_ = context_cap(ctx, p);
    base_cells_ = lo < 0 ? 0 : sliding ? sliding_cells : hi - lo + 1;
    base_pos_max_ = hi;
    archive_ = Archive{};
    max_pos_ = context_max_pos(ctx, p);
    protect_from_ = -1;
    recalled_.clear();
    if (p.recall.capture != nullptr) p.recall.capture->pause();
    pending_ = false;
    events_ = 0;
    event_ms_ = 0;
    return Status::success();
  }

  // The newest turn starts at position `pos` (-1: none): cells at pos and after
  // stay through the next events (flashcache), and pos follows a renumbering.
  void protect_from(llama_pos pos) { protect_from_ = pos; }
  llama_pos protected_from() const { return protect_from_; }

  // A new turn starts with the next token: it is protected (protect_from), the
  // cells the last turn recalled are no longer, and with recall on the capture
  // starts following the turn's queries.
  void begin_turn() {
    const llama_pos next = ctx_ == nullptr ? 0 : llama_memory_seq_pos_max(llama_get_memory(ctx_), seq_) + 1;
    protect_from(next);
    recalled_.clear();
    if (ctx_ != nullptr && p_.recall.budget > 0) p_.recall.capture->follow(next, p_.recall.queries);
  }

  // The turn turn[0..n), begun by begin_turn, is decoded: its queries score the
  // archive and what it needs comes back, the turn (or its last token) decoded
  // again (ContextParams::recall). The logits of the context's last token are then
  // the turn's, as after the program's own decode. A refusal or failure leaves the
  // sequence and the archive as they were. With recall off, or nothing recalled,
  // nothing changes.
  Status recall_turn(const llama_token* turn, std::int64_t n, RecallStats* stats = nullptr) {
    if (ctx_ == nullptr) return make_error(Errc::invalid_option, "llama: ContextManager used before a successful init");
    RecallStats st;
    if (p_.recall.budget > 0) {
      RecallRequest req;
      req.turn = turn;
      req.n = n;
      req.archive = &archive_;
      req.cap = cap_;
      req.n_keep = p_.n_keep;
      req.settings = p_.recall;
      req.threads = scoring_threads(ctx_, p_.compress.n_threads);
      FLASHCACHE_RETURN_IF_ERROR(recaller_.recall(ctx_, seq_, req, &st));
    }
    if (st.recalled > 0) {
      recalled_ = recaller_.recalled_positions();
      base_cells_ = st.cells_after;
      base_pos_max_ = llama_memory_seq_pos_max(llama_get_memory(ctx_), seq_);
    }
    if (stats != nullptr) *stats = st;
    return Status::success();
  }
  // The positions the current turn's recall brought back, ascending.
  const std::vector<llama_pos>& recalled() const { return recalled_; }

  // Call right before decoding n_new tokens of the sequence. Makes room when
  // they would not fit the cap and sets *next_pos to the first new token's
  // position; *event (when given) says what was done, its policy `none` if
  // nothing. A refusal changes nothing.
  Status make_room(std::int64_t n_new, llama_pos* next_pos, RoomEvent* event = nullptr) {
    if (ctx_ == nullptr) return make_error(Errc::invalid_option, "llama: ContextManager used before a successful init");
    if (next_pos == nullptr) return make_error(Errc::invalid_option, "llama: make_room: null next_pos");
    RoomEvent ev;
    llama_memory_t mem = llama_get_memory(ctx_);
    const llama_pos hi = llama_memory_seq_pos_max(mem, seq_);
    if (pending_ && hi != base_pos_max_) pending_ = false;  // a decode since: the renumbering is applied
    const std::int64_t have = cells();
    ev.cells_before = ev.cells_after = have;
    ev.new_cells = n_new;
    ev.pos_max_before = ev.pos_max_after = hi;
    const std::int64_t room = cap_ - 1 - p_.n_keep;  // the newest cell and n_keep stay in every policy
    if (n_new < 0 || n_new > room)
      return make_error(Errc::invalid_budget, "llama: ", n_new, " new cells; a cap of ", cap_, " with n_keep ",
                        p_.n_keep, " makes room for 1 to ", room, " at a time (decode in smaller chunks)");
    const bool restart = p_.archives() && hi + n_new > max_pos_;
    if (restart && p_.at_max_pos == AtMaxPos::refuse)
      return make_error(Errc::unsupported, "llama: ", n_new, " new tokens after position ", hi, " pass position ",
                        max_pos_,
                        ", the highest a token may take (ContextParams::max_pos; by default the model's "
                        "training length - 1): with an archive the positions are kept, and renumbering them is "
                        "not supported yet (AtMaxPos::restart renumbers and drops the archive)");
    if (have + n_new > cap_ || restart) {
      if (p_.when_full == WhenFull::none)
        return make_error(Errc::invalid_budget, "llama: the context is full: sequence ", seq_, " holds ", have, " of ",
                          cap_, " cells and ", n_new, " more do not fit (when-full none)");
      if (pending_)
        return make_error(Errc::invalid_option, "llama: sequence ", seq_,
                          "'s positions were renumbered by the "
                          "last make_room and llama.cpp applies that at the next llama_decode: decode the tokens "
                          "room was made for before asking for more");
      const auto t0 = std::chrono::steady_clock::now();
      Status s = restart                                ? restart_positions(have, n_new, &ev)
                 : p_.when_full == WhenFull::flashcache ? compact(have, n_new, &ev, p_.after_compaction)
                                                        : drop(have, n_new, &ev);
      if (!s.ok()) return s;
      ev.policy = p_.when_full;
      ev.pos_max_after = llama_memory_seq_pos_max(mem, seq_);
      base_cells_ = ev.cells_after;
      base_pos_max_ = ev.pos_max_after;
      ev.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      ++events_;
      event_ms_ += ev.ms;
    }
    *next_pos = llama_memory_seq_pos_max(mem, seq_) + 1;
    if (event != nullptr) *event = ev;
    return Status::success();
  }

  // Forgets the sequence from position `pos` on (a conversation edited there, or a reply
  // thrown away): its cells at pos and after leave the memory, the archive's blocks that
  // hold such positions leave the archive (*archive_dropped: their tokens, earlier ones in
  // a shared block included), the turn's protection and recall end. Cells before pos stay
  // as they are. A refusal or failure changes nothing.
  Status forget_from(llama_pos pos, std::int64_t* archive_dropped = nullptr) {
    if (ctx_ == nullptr) return make_error(Errc::invalid_option, "llama: ContextManager used before a successful init");
    if (pos < 0) return make_error(Errc::invalid_option, "llama: forget_from(", pos, "): a position is at least 0");
    llama_memory_t mem = llama_get_memory(ctx_);
    const llama_pos hi = llama_memory_seq_pos_max(mem, seq_);
    if (pending_ && hi != base_pos_max_) pending_ = false;  // a decode since: the renumbering is applied
    if (pending_)
      return make_error(Errc::invalid_option, "llama: forget_from: sequence ", seq_,
                        "'s positions were renumbered by the last make_room; decode first");
    std::vector<std::int64_t> blocks;  // the archive's blocks with a position at or after pos
    std::int64_t dropped = 0;
    for (std::int64_t b = 0; b < archive_.blocks(); ++b) {
      const std::int32_t* at = archive_.positions() + archive_.block_first(b);
      if (std::any_of(at, at + archive_.block_tokens(b), [pos](std::int32_t q) { return q >= pos; })) {
        blocks.push_back(b);
        dropped += archive_.block_tokens(b);
      }
    }
    std::int64_t cells_left = base_cells_;  // the cells below pos, known before anything changes
    if (pos <= base_pos_max_) {             // inside what the last event left: count in the state
      SequenceState state;
      FLASHCACHE_RETURN_IF_ERROR(state.read_unchecked(ctx_, seq_, detail::state_sections(llama_get_model(ctx_))));
      const std::vector<llama_pos>& cell_pos = state.state().pos;
      cells_left = std::count_if(cell_pos.begin(), cell_pos.end(), [pos](llama_pos q) { return q < pos; });
    }
    if (hi >= pos && !llama_memory_seq_rm(mem, seq_, pos, -1))
      return make_error(Errc::unsupported, "llama: the memory refused to remove sequence ", seq_,
                        "'s cells from position ", pos);
    if (!blocks.empty())
      FLASHCACHE_RETURN_IF_ERROR(archive_.erase(blocks.data(), static_cast<std::int64_t>(blocks.size())));
    if (pos <= base_pos_max_) {
      base_cells_ = cells_left;
      base_pos_max_ = llama_memory_seq_pos_max(mem, seq_);
    }
    protect_from_ = -1;
    recalled_.erase(std::remove_if(recalled_.begin(), recalled_.end(), [pos](llama_pos q) { return q >= pos; }),
                    recalled_.end());
    if (p_.queries != nullptr) p_.queries->follow(llama_memory_seq_pos_max(mem, seq_) + 1);
    if (archive_dropped != nullptr) *archive_dropped = dropped;
    return Status::success();
  }

  // The sequence's cells now: those after the last event, plus one per position since.
  std::int64_t cells() const {
    if (ctx_ == nullptr) return 0;
    return base_cells_ + (llama_memory_seq_pos_max(llama_get_memory(ctx_), seq_) - base_pos_max_);
  }
  std::int64_t cap() const { return cap_; }
  std::int64_t events() const { return events_; }
  double event_ms() const { return event_ms_; }  // all events, in total
  const ContextParams& params() const { return p_; }
  // The cells compactions evicted (AfterCompaction::archive), with what its cap dropped.
  const Archive& archive() const { return archive_; }

 private:
  // AtMaxPos::restart: a compaction with renumbering and no archive; once it
  // succeeded, the archive (whose positions it made wrong) is dropped, counted.
  Status restart_positions(std::int64_t have, std::int64_t n_new, RoomEvent* ev) {
    std::vector<llama_pos> recalled;  // their positions move too; they stay only by their scores
    recalled.swap(recalled_);
    if (Status s = compact(have, n_new, ev, AfterCompaction::renumber); !s.ok()) {
      recalled_.swap(recalled);  // a refusal changes nothing
      return s;
    }
    ev->restarted = true;
    ev->restart_dropped = archive_.tokens() + (ev->compaction.cells_before - ev->compaction.cells_after);
    archive_.drop_all();
    // A turn under way goes on being captured in the new frame (its earlier queries are lost).
    QueryCapture* turn = p_.recall.capture;
    if (turn != nullptr && turn->running())
      turn->follow(llama_memory_seq_pos_max(llama_get_memory(ctx_), seq_) + 1, p_.recall.queries);
    return Status::success();
  }

  // A sliding-window model's memory reports the sliding cache's lowest position, so the cells a
  // sequence already holds are counted in its state (its global section, one cell per position).
  // shift and streaming renumber a consecutive run: they need positions without gaps.
  static Status count_global_cells(llama_context* ctx, llama_seq_id seq, WhenFull when_full, std::int64_t* cells) {
    SequenceState state;
    FLASHCACHE_RETURN_IF_ERROR(state.read_unchecked(ctx, seq, StateSections::global_then_sliding));
    const SeqState& s = state.state();
    *cells = s.cell_count;
    if (s.pos.empty() || when_full == WhenFull::flashcache || when_full == WhenFull::none) return Status::success();
    const auto [lo, hi] = std::minmax_element(s.pos.begin(), s.pos.end());
    if (*hi - *lo + 1 != static_cast<std::int64_t>(s.cell_count))
      return make_error(Errc::invalid_shape, "llama: sequence ", seq, " holds ", s.cell_count,
                        " cells over positions [", *lo, ", ", *hi, "] with gaps: ", to_string(when_full),
                        " needs consecutive ones");
    return Status::success();
  }

  // flashcache: compact to the target, the first n_keep and the newest turn kept;
  // the evicted cells to the archive or dropped, the kept renumbered or not, as `after` says.
  Status compact(std::int64_t have, std::int64_t n_new, RoomEvent* ev, AfterCompaction after) {
    llama_memory_t mem = llama_get_memory(ctx_);
    const llama_pos lo = llama_memory_seq_pos_min(mem, seq_), hi = llama_memory_seq_pos_max(mem, seq_);
    // (A sliding-window model's memory reports the sliding cache's lowest position: not a bound here.)
    const llama_pos floor = sliding_ ? protect_from_ : lo;
    const std::int64_t turn = protect_from_ < 0 || protect_from_ > hi ? 0 : hi - std::max(protect_from_, floor) + 1;
    const std::int64_t most = cap_ - n_new;
    std::int64_t keep = std::min<std::int64_t>(std::llround(p_.target * static_cast<double>(cap_)), most);
    const std::int64_t recalled = static_cast<std::int64_t>(recalled_.size());
    const std::int64_t kept_anyway = std::min(have, p_.n_keep + std::max<std::int64_t>(turn, 1) + recalled);
    if (kept_anyway > most)
      return make_error(Errc::invalid_budget, "llama: the first ", p_.n_keep, " cells, the newest turn's ", turn,
                        " and the ", recalled, " recalled leave no room for ", n_new, " new cells in ", cap_,
                        " (protect_from a later position)");
    keep = std::min(std::max(keep, kept_anyway), have);  // (a restart may find fewer cells than the target)
    CompressParams c = compaction_params(p_, Budget::tokens(keep));
    if (after == AfterCompaction::archive) {
      c.archive = &archive_;
      c.archive_options = p_.archive_options;
    }
    c.protect = recalled_.data();
    c.protect_count = recalled;
    c.options.select.sink = std::max(c.options.select.sink, p_.n_keep);
    c.options.select.window = std::max(c.options.select.window, turn);
    FLASHCACHE_RETURN_IF_ERROR(compressor_.compress(ctx_, seq_, c, &ev->compaction));
    ev->cells_after = ev->compaction.cells_after;
    if (after != AfterCompaction::renumber) return Status::success();  // (query tails need it: init says so)
    // Runs of consecutive kept positions, each moved down to follow the last, in
    // ascending order: a run's new positions are below every later run's old ones.
    const std::vector<llama_pos>& kept = compressor_.kept_positions();
    llama_pos next = kept.front();
    for (std::size_t i = 0; i < kept.size();) {
      std::size_t j = i + 1;
      while (j < kept.size() && kept[j] == kept[j - 1] + 1) ++j;
      const llama_pos delta = next - kept[i];
      if (delta != 0) llama_memory_seq_add(mem, seq_, kept[i], kept[j - 1] + 1, delta);
      next += static_cast<llama_pos>(j - i);
      i = j;
    }
    if (protect_from_ >= 0 && turn > 0) protect_from_ = next - static_cast<llama_pos>(turn);
    // The queries so far are in the old frame: the next compaction reads those decoded from here.
    if (p_.queries != nullptr) p_.queries->follow(next);
    pending_ = true;
    return Status::success();
  }

  // shift and streaming: drop a run of cells after the first n_keep, renumber the rest.
  Status drop(std::int64_t have, std::int64_t n_new, RoomEvent* ev) {
    llama_memory_t mem = llama_get_memory(ctx_);
    const llama_pos hi = llama_memory_seq_pos_max(mem, seq_);
    // A sliding-window model's memory reports the sliding cache's lowest position; its sequence
    // was consecutive at init (checked there) and shift and streaming keep it so: its lowest is hi - have + 1.
    const llama_pos lo = sliding_ ? hi - static_cast<llama_pos>(have) + 1 : llama_memory_seq_pos_min(mem, seq_);
    if (hi - lo + 1 != have)
      return make_error(Errc::invalid_shape, "llama: sequence ", seq_, " holds positions [", lo, ", ", hi,
                        "] with gaps (", have, " cells): ", to_string(p_.when_full), " needs consecutive ones");
    const std::int64_t need = have + n_new - cap_;
    const std::int64_t left = have - p_.n_keep;
    const std::int64_t n_drop =
        p_.when_full == WhenFull::shift ? std::max(left / 2, need) : need;  // llama.cpp: n_discard = n_left / 2
    const llama_pos from = lo + static_cast<llama_pos>(p_.n_keep), to = from + static_cast<llama_pos>(n_drop);
    if (!llama_memory_seq_rm(mem, seq_, from, to))
      return make_error(Errc::unsupported, "llama: llama_memory_seq_rm refused positions [", from, ", ", to, ")");
    llama_memory_seq_add(mem, seq_, to, -1, -static_cast<llama_pos>(n_drop));
    if (protect_from_ >= to)
      protect_from_ -= static_cast<llama_pos>(n_drop);
    else if (protect_from_ >= from)
      protect_from_ = from;
    ev->cells_after = have - n_drop;
    pending_ = true;
    return Status::success();
  }

  llama_context* ctx_ = nullptr;
  llama_seq_id seq_ = 0;
  ContextParams p_;
  std::int64_t cap_ = 0;
  std::int64_t base_cells_ = 0;  // cells after the last event (or at init)
  llama_pos base_pos_max_ = -1;  // the last position then
  llama_pos protect_from_ = -1;
  bool pending_ = false;  // the last event's renumbering waits for a decode
  bool sliding_ = false;  // a sliding-window model: the memory's lowest position is the sliding cache's
  std::int64_t events_ = 0;
  double event_ms_ = 0;
  SequenceCompressor compressor_;
  Archive archive_;
  TurnRecaller recaller_;
  std::vector<llama_pos> recalled_;  // the current turn's recalled positions: kept through compactions
  llama_pos max_pos_ = 0;            // with the archive: the highest position a token may take
};

}  // namespace llama
}  // namespace flashcache
