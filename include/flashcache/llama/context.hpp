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
#include "flashcache/llama/recall.hpp"

namespace flashcache {
namespace llama {

enum class WhenFull { flashcache, shift, streaming, none };

// With the archive, what make_room does when new tokens would pass ContextParams::max_pos.
enum class AtMaxPos {
  refuse,   // refuse by name (the archived keys cannot be re-rotated yet)
  restart,  // compact with renumbering, as without an archive; the archive's cells no
            // longer match their positions, so they are dropped, counted
            // (RoomEvent::restart_dropped, Archive::dropped_tokens)
};

inline const char* to_string(WhenFull w) {
  switch (w) {
    case WhenFull::flashcache:
      return "flashcache";
    case WhenFull::shift:
      return "shift";
    case WhenFull::streaming:
      return "streaming";
    case WhenFull::none:
      return "none";
  }
  return "unknown";
}

inline Status parse_when_full(const std::string& name, WhenFull* out) {
  for (WhenFull w : {WhenFull::flashcache, WhenFull::shift, WhenFull::streaming, WhenFull::none})
    if (name == to_string(w)) {
      *out = w;
      return Status::success();
    }
  return make_error(Errc::invalid_option, "when-full policy '", name, "' (flashcache, shift, streaming or none)");
}

// The score a running context is compacted with: the library's, with the recent
// window at 9/10 of the kept cells (SelectOptions::window_share): on running text the
// newest tokens are worth more than the outliers (bench/stream/RULE.md).
inline CompactionSettings when_full_settings() {
  CompactionSettings c;
  c.options.select.window_share = 0.9;
  return c;
}

// The archive a running context keeps for recall at new turns: blocks of 32 neighbouring
// archived positions (bench/stream/RULE.md stages 4 and 5), no byte cap.
inline ArchiveOptions turn_archive_options() {
  ArchiveOptions o;
  o.block_size = 32;
  o.order = ArchiveOrder::position;
  return o;
}

struct ContextParams {
  WhenFull when_full = WhenFull::flashcache;
  std::int64_t n_cells = 0;  // the cap: cells the sequence may hold; 0: llama_n_ctx_seq(ctx)
  // flashcache: the sequence is compacted to round(target * cap) cells, fewer when the
  // new ones need it. 3/4 and the window share above were chosen on a dev stream by
  // bench/stream/RULE.md ("Long texts through a bounded llama.cpp context" in bench/RESULTS.md).
  double target = 0.75;
  std::int64_t n_keep = 4;  // the first n_keep positions always stay (the system prompt; llama.cpp's --keep)
  bool renumber = true;     // flashcache: kept cells get consecutive positions (needs llama_memory_can_shift)
  CompactionSettings compress = when_full_settings();  // the score and threads (each budget is the manager's)
  // flashcache with query tails (compress.options = Options::with_query_tail(...)): the
  // QueryCapture wired to the context's cb_eval. The manager follows the sequence with it
  // (QueryCapture::follow at init and after each compaction), so each compaction scores
  // with the queries decoded since the last; it needs renumbering, and the context must
  // decode this sequence only. Null: the query-free score.
  QueryCapture* queries = nullptr;
  // flashcache: the cells each compaction evicts go to an archive (ContextManager::archive())
  // instead of being dropped, so that a later question can bring them back. Needs renumber
  // off: an archived cell keeps its position, which a renumbering would make wrong. Positions
  // then keep growing past the cap (llama.cpp accepts the gaps).
  bool archive = false;
  ArchiveOptions archive_options = turn_archive_options();  // blocks of 32 by position, no cap
  // With the archive (positions kept): the highest position a new token may take; 0: the
  // model's training length - 1 (llama_model_n_ctx_train). Past it, at_max_pos says what
  // happens: a refusal by name (re-rotating the archive's keys is not done yet), or a restart.
  llama_pos max_pos = 0;
  AtMaxPos at_max_pos = AtMaxPos::refuse;
  // With the archive: at each new turn (begin_turn, then recall_turn once the turn is
  // decoded) the turn's queries bring back up to recall.budget archived cells
  // (flashcache/llama/recall.hpp); they stay through compactions until the next turn.
  // recall.capture is a QueryCapture on the context's cb_eval, not `queries` above.
  RecallSettings recall;
};
inline ContextParams context_default_params() { return ContextParams{}; }

// One time the manager made room.
struct RoomEvent {
  WhenFull policy = WhenFull::none;
  std::int64_t cells_before = 0, cells_after = 0;  // the sequence's cells before and after
  std::int64_t new_cells = 0;                      // the tokens room was made for
  llama_pos pos_max_before = -1, pos_max_after = -1;
  double ms = 0;               // the whole event
  CompactionStats compaction;  // flashcache's compaction
  // AtMaxPos::restart happened: the cells dropped (the archive's and this compaction's evicted).
  bool restarted = false;
  std::int64_t restart_dropped = 0;
};

class ContextManager {
 public:
  // Takes sequence `seq` of ctx as it is now: empty, or decoded at consecutive
  // positions. Checks what every later event needs, so that a refusal comes now.
  Status init(llama_context* ctx, llama_seq_id seq, const ContextParams& p) {
    ctx_ = nullptr;
    if (ctx == nullptr) return make_error(Errc::invalid_option, "llama: null context");
    if (llama_get_memory(ctx) == nullptr) return make_error(Errc::unsupported, "llama: context without memory");
    if (seq < 0 || static_cast<std::uint32_t>(seq) >= llama_n_seq_max(ctx))
      return make_error(Errc::invalid_option, "llama: sequence ", seq, " outside [0, ", llama_n_seq_max(ctx), ")");
    const std::int64_t n_ctx_seq = llama_n_ctx_seq(ctx);
    const std::int64_t cap = p.n_cells == 0 ? n_ctx_seq : p.n_cells;
    if (cap < 2 || cap > n_ctx_seq)
      return make_error(Errc::invalid_option, "llama: a cap of ", cap, " cells (2 to the sequence's ", n_ctx_seq,
                        " of llama_n_ctx_seq)");
    if (p.n_keep < 0 || p.n_keep >= cap - 1)
      return make_error(Errc::invalid_option, "llama: n_keep ", p.n_keep, " leaves no room in ", cap, " cells");
    if (!(p.target > 0.0 && p.target < 1.0))
      return make_error(Errc::invalid_option, "llama: target ", p.target, " must be a share of the cap in (0, 1)");
    if (p.when_full != WhenFull::flashcache && p.when_full != WhenFull::shift && p.when_full != WhenFull::streaming &&
        p.when_full != WhenFull::none)
      return make_error(Errc::invalid_option, "llama: unknown when-full policy");
    llama_memory_t mem = llama_get_memory(ctx);
    const bool shifts = p.when_full == WhenFull::shift || p.when_full == WhenFull::streaming ||
                        (p.when_full == WhenFull::flashcache && p.renumber);
    if (shifts && !llama_memory_can_shift(mem))
      return make_error(Errc::unsupported, "llama: when-full ", to_string(p.when_full),
                        p.when_full == WhenFull::flashcache ? " with renumbering" : "",
                        " moves positions, but this memory cannot shift them (llama_memory_can_shift)");
    if (p.when_full == WhenFull::flashcache) {
      FLASHCACHE_RETURN_IF_ERROR(check_supported_context(ctx));
      if (p.compress.options.score.query != QueryInput::none && p.queries == nullptr)
        return make_error(Errc::invalid_option,
                          "llama: query tails in a ContextManager need ContextParams::queries "
                          "(a QueryCapture on the context's cb_eval)");
      FLASHCACHE_RETURN_IF_ERROR(check_compress_params(compress_params(p, Budget::ratio(p.target))));
      if (p.queries != nullptr && !p.renumber)
        return make_error(Errc::invalid_option,
                          "llama: query tails in a ContextManager need renumber (the tails "
                          "read the cells at consecutive positions)");
    } else if (p.queries != nullptr) {
      return make_error(Errc::invalid_option, "llama: ContextParams::queries with when-full ", to_string(p.when_full),
                        ": query tails score flashcache's compactions only");
    }
    const bool sliding = llama_model_n_swa(llama_get_model(ctx)) > 0;
    std::int64_t sliding_cells = 0;  // a sliding-window model's cells already there, counted in its state
    if (sliding && llama_memory_seq_pos_max(mem, seq) >= 0)
      FLASHCACHE_RETURN_IF_ERROR(count_global_cells(ctx, seq, p.when_full, &sliding_cells));
    if (p.archive) {
      if (p.when_full != WhenFull::flashcache)
        return make_error(Errc::invalid_option, "llama: an archive with when-full ", to_string(p.when_full),
                          ": it keeps flashcache's evictions only");
      if (p.renumber)
        return make_error(Errc::invalid_option,
                          "llama: an archive needs renumber off: an archived cell keeps its "
                          "position, which a renumbering would make wrong");
      FLASHCACHE_RETURN_IF_ERROR(check_archive_options(p.archive_options));
      if (p.max_pos < 0) return make_error(Errc::invalid_option, "llama: max_pos ", p.max_pos, " is negative");
      if (p.at_max_pos != AtMaxPos::refuse && p.at_max_pos != AtMaxPos::restart)
        return make_error(Errc::invalid_option, "llama: unknown at_max_pos");
      if (p.at_max_pos == AtMaxPos::restart && !llama_memory_can_shift(mem))
        return make_error(Errc::unsupported,
                          "llama: AtMaxPos::restart renumbers positions, but this memory cannot shift them");
      const llama_pos limit = p.max_pos > 0 ? p.max_pos : llama_model_n_ctx_train(llama_get_model(ctx)) - 1;
      if (p.at_max_pos == AtMaxPos::restart && limit + 1 < cap)
        return make_error(Errc::invalid_option, "llama: AtMaxPos::restart with max_pos ", limit, " below the cap of ",
                          cap, " cells: a renumbered sequence could still pass max_pos");
    }
    FLASHCACHE_RETURN_IF_ERROR(check_recall_settings(p.recall));
    if (p.recall.budget > 0 && !p.archive)
      return make_error(Errc::invalid_option, "llama: recall needs the archive (ContextParams::archive)");
    if (p.recall.budget > 0 && p.recall.capture == p.queries)
      return make_error(Errc::invalid_option,
                        "llama: recall.capture and queries are one QueryCapture: the turn's queries need their own");
    const llama_pos lo = llama_memory_seq_pos_min(mem, seq), hi = llama_memory_seq_pos_max(mem, seq);
    if (p.queries != nullptr) {
      p.queries->follow(hi + 1);  // the next token decoded is the sequence's next position
    }
    ctx_ = ctx;
    seq_ = seq;
    sliding_ = sliding;
    p_ = p;
    cap_ = cap;
    base_cells_ = lo < 0 ? 0 : sliding ? sliding_cells : hi - lo + 1;
    base_pos_max_ = hi;
    archive_ = Archive{};
    max_pos_ = p.max_pos > 0 ? p.max_pos : llama_model_n_ctx_train(llama_get_model(ctx)) - 1;
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
      FLASHCACHE_RETURN_IF_ERROR(recaller_.recall(ctx_, seq_, p_.recall.capture, turn, n, &archive_, cap_, p_.n_keep,
                                                  p_.recall, scoring_threads(ctx_, p_.compress.n_threads), &st));
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
    const bool restart = p_.archive && hi + n_new > max_pos_;
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
                 : p_.when_full == WhenFull::flashcache ? compact(have, n_new, &ev, p_.renumber, p_.archive)
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

  // The sequence's cells now: those after the last event, plus one per position since.
  std::int64_t cells() const {
    if (ctx_ == nullptr) return 0;
    return base_cells_ + (llama_memory_seq_pos_max(llama_get_memory(ctx_), seq_) - base_pos_max_);
  }
  std::int64_t cap() const { return cap_; }
  std::int64_t events() const { return events_; }
  double event_ms() const { return event_ms_; }  // all events, in total
  const ContextParams& params() const { return p_; }
  // The cells compactions evicted (ContextParams::archive), with what its cap dropped.
  const Archive& archive() const { return archive_; }

 private:
  // One compaction's parameters: the settings, this budget and the capture.
  static CompressParams compress_params(const ContextParams& p, Budget budget) {
    CompressParams c;
    static_cast<CompactionSettings&>(c) = p.compress;
    c.budget = budget;
    c.queries = p.queries;
    return c;
  }

  // AtMaxPos::restart: a compaction with renumbering and no archive; once it
  // succeeded, the archive (whose positions it made wrong) is dropped, counted.
  Status restart_positions(std::int64_t have, std::int64_t n_new, RoomEvent* ev) {
    std::vector<llama_pos> recalled;  // their positions move too; they stay only by their scores
    recalled.swap(recalled_);
    if (Status s = compact(have, n_new, ev, /*renumber=*/true, /*to_archive=*/false); !s.ok()) {
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
      return make_error(Errc::invalid_shape, "llama: sequence ", seq, " holds ", s.cell_count, " cells over positions [",
                        *lo, ", ", *hi, "] with gaps: ", to_string(when_full), " needs consecutive ones");
    return Status::success();
  }

  // flashcache: compact to the target, the first n_keep and the newest turn kept;
  // the evicted cells to the archive when to_archive, the kept renumbered when renumber.
  Status compact(std::int64_t have, std::int64_t n_new, RoomEvent* ev, bool renumber, bool to_archive) {
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
    CompressParams c = compress_params(p_, Budget::tokens(keep));
    if (to_archive) {
      c.archive = &archive_;
      c.archive_options = p_.archive_options;
    }
    c.protect = recalled_.data();
    c.protect_count = recalled;
    c.options.select.sink = std::max(c.options.select.sink, p_.n_keep);
    c.options.select.window = std::max(c.options.select.window, turn);
    FLASHCACHE_RETURN_IF_ERROR(compressor_.compress(ctx_, seq_, c, &ev->compaction));
    ev->cells_after = ev->compaction.cells_after;
    if (!renumber) return Status::success();  // (query tails need renumbering: init says so)
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
