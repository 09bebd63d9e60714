#pragma once
// What a running context (ContextManager, llama/context.hpp) is asked to do, the
// rules that tie those fields together (check_context_params), and what it reports
// each time it makes room (RoomEvent).
#include <llama.h>

#include <cstdint>
#include <string>

#include "flashcache/archive.hpp"
#include "flashcache/enum_names.hpp"
#include "flashcache/error.hpp"
#include "flashcache/llama/checks.hpp"
#include "flashcache/llama/params.hpp"
#include "flashcache/llama/queries.hpp"
#include "flashcache/llama/recall_params.hpp"

namespace flashcache {
namespace llama {

enum class WhenFull { flashcache, shift, streaming, none };

// What a flashcache compaction does with the positions of the cells it keeps and with
// the cells it evicts. One choice, not two flags: an archived cell keeps its position,
// which a renumbering would make wrong.
enum class AfterCompaction {
  renumber,        // the evicted are dropped; the kept get consecutive positions (llama_memory_can_shift)
  keep_positions,  // the evicted are dropped; the kept keep theirs (gaps, which llama.cpp accepts)
  archive,         // the evicted go to an archive that recall reads; the kept keep their positions
};

// With the archive, what make_room does when new tokens would pass ContextParams::max_pos.
enum class AtMaxPos {
  refuse,   // refuse by name (the archived keys cannot be re-rotated yet)
  restart,  // compact with renumbering, as without an archive; the archive's cells no
            // longer match their positions, so they are dropped, counted
            // (RoomEvent::restart_dropped, Archive::dropped_tokens)
};

}  // namespace llama
template <>
struct EnumNames<llama::WhenFull> {
  static constexpr EnumName<llama::WhenFull> table[] = {{llama::WhenFull::flashcache, "flashcache"},
                                                        {llama::WhenFull::shift, "shift"},
                                                        {llama::WhenFull::streaming, "streaming"},
                                                        {llama::WhenFull::none, "none"}};
};
template <>
struct EnumNames<llama::AfterCompaction> {
  static constexpr EnumName<llama::AfterCompaction> table[] = {
      {llama::AfterCompaction::renumber, "renumber"},
      {llama::AfterCompaction::keep_positions, "keep_positions"},
      {llama::AfterCompaction::archive, "archive"}};
};
template <>
struct EnumNames<llama::AtMaxPos> {
  static constexpr EnumName<llama::AtMaxPos> table[] = {{llama::AtMaxPos::refuse, "refuse"},
                                                        {llama::AtMaxPos::restart, "restart"}};
};
namespace llama {

inline const char* to_string(WhenFull w) { return enum_name(w); }
inline Status parse_when_full(const std::string& name, WhenFull* out) {
  return parse_enum(name, out, "when-full policy");
}
inline const char* to_string(AfterCompaction a) { return enum_name(a); }
inline const char* to_string(AtMaxPos a) { return enum_name(a); }

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
  // flashcache: the kept cells' positions and the evicted cells. With the archive, positions
  // keep growing past the cap (llama.cpp accepts the gaps), and ContextManager::archive() holds
  // what was evicted, so that a later question can bring it back.
  AfterCompaction after_compaction = AfterCompaction::renumber;
  CompactionSettings compress = when_full_settings();  // the score and threads (each budget is the manager's)
  // flashcache with query tails (compress.options = Options::with_query_tail(...)): the
  // QueryCapture wired to the context's cb_eval. The manager follows the sequence with it
  // (QueryCapture::follow at init and after each compaction), so each compaction scores
  // with the queries decoded since the last; it needs renumbering, and the context must
  // decode this sequence only. Null: the query-free score.
  QueryCapture* queries = nullptr;
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

  bool archives() const { return when_full == WhenFull::flashcache && after_compaction == AfterCompaction::archive; }
  bool renumbers() const { return when_full == WhenFull::flashcache && after_compaction == AfterCompaction::renumber; }
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

// The cells the sequence may hold: ContextParams::n_cells, or the context's per sequence.
inline std::int64_t context_cap(llama_context* ctx, const ContextParams& p) {
  return p.n_cells == 0 ? static_cast<std::int64_t>(llama_n_ctx_seq(ctx)) : p.n_cells;
}
// The highest position a token may take: ContextParams::max_pos, or the training length - 1.
inline llama_pos context_max_pos(llama_context* ctx, const ContextParams& p) {
  return p.max_pos > 0 ? p.max_pos : llama_model_n_ctx_train(llama_get_model(ctx)) - 1;
}

// One compaction's parameters in a running context: its settings, this budget and the capture.
inline CompressParams compaction_params(const ContextParams& p, Budget budget) {
  CompressParams c;
  static_cast<CompactionSettings&>(c) = p.compress;
  c.budget = budget;
  c.queries = p.queries;
  return c;
}

// Every rule that ties ContextParams's fields together and to the context, checked by
// name before anything changes (ContextManager::init calls it).
inline Status check_context_params(llama_context* ctx, llama_seq_id seq, const ContextParams& p) {
  if (ctx == nullptr) return make_error(Errc::invalid_option, "llama: null context");
  llama_memory_t mem = llama_get_memory(ctx);
  if (mem == nullptr) return make_error(Errc::unsupported, "llama: context without memory");
  if (seq < 0 || static_cast<std::uint32_t>(seq) >= llama_n_seq_max(ctx))
    return make_error(Errc::invalid_option, "llama: sequence ", seq, " outside [0, ", llama_n_seq_max(ctx), ")");
  const std::int64_t n_ctx_seq = llama_n_ctx_seq(ctx);
  const std::int64_t cap = context_cap(ctx, p);
  if (cap < 2 || cap > n_ctx_seq)
    return make_error(Errc::invalid_option, "llama: a cap of ", cap, " cells (2 to the sequence's ", n_ctx_seq,
                      " of llama_n_ctx_seq)");
  if (p.n_keep < 0 || p.n_keep >= cap - 1)
    return make_error(Errc::invalid_option, "llama: n_keep ", p.n_keep, " leaves no room in ", cap, " cells");
  if (!(p.target > 0.0 && p.target < 1.0))
    return make_error(Errc::invalid_option, "llama: target ", p.target, " must be a share of the cap in (0, 1)");
  if (!is_known(p.when_full)) return make_error(Errc::invalid_option, "llama: unknown when-full policy");
  if (!is_known(p.after_compaction)) return make_error(Errc::invalid_option, "llama: unknown after_compaction");
  const bool shifts = p.when_full == WhenFull::shift || p.when_full == WhenFull::streaming || p.renumbers();
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
    FLASHCACHE_RETURN_IF_ERROR(check_compress_params(compaction_params(p, Budget::ratio(p.target))));
    if (p.queries != nullptr && !p.renumbers())
      return make_error(Errc::invalid_option, "llama: query tails in a ContextManager need renumber (the tails read ",
                        "the cells at consecutive positions), not after_compaction ", to_string(p.after_compaction));
  } else if (p.queries != nullptr) {
    return make_error(Errc::invalid_option, "llama: ContextParams::queries with when-full ", to_string(p.when_full),
                      ": query tails score flashcache's compactions only");
  }
  if (p.after_compaction == AfterCompaction::archive) {
    if (p.when_full != WhenFull::flashcache)
      return make_error(Errc::invalid_option, "llama: an archive with when-full ", to_string(p.when_full),
                        ": it keeps flashcache's evictions only");
    FLASHCACHE_RETURN_IF_ERROR(check_archive_options(p.archive_options));
    if (p.max_pos < 0) return make_error(Errc::invalid_option, "llama: max_pos ", p.max_pos, " is negative");
    if (!is_known(p.at_max_pos)) return make_error(Errc::invalid_option, "llama: unknown at_max_pos");
    if (p.at_max_pos == AtMaxPos::restart && !llama_memory_can_shift(mem))
      return make_error(Errc::unsupported,
                        "llama: AtMaxPos::restart renumbers positions, but this memory cannot shift them");
    const llama_pos limit = context_max_pos(ctx, p);
    if (p.at_max_pos == AtMaxPos::restart && limit + 1 < cap)
      return make_error(Errc::invalid_option, "llama: AtMaxPos::restart with max_pos ", limit, " below the cap of ",
                        cap, " cells: a renumbered sequence could still pass max_pos");
  }
  FLASHCACHE_RETURN_IF_ERROR(check_recall_settings(p.recall));
  if (p.recall.budget > 0 && !p.archives())
    return make_error(Errc::invalid_option,
                      "llama: recall needs the archive (ContextParams::after_compaction = archive)");
  if (p.recall.budget > 0 && p.recall.capture == p.queries)
    return make_error(Errc::invalid_option,
                      "llama: recall.capture and queries are one QueryCapture: the turn's queries need their own");
  return Status::success();
}

}  // namespace llama
}  // namespace flashcache
