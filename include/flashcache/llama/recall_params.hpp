#pragma once
// What a recall at a new turn is asked to do (RecallSettings, which a running
// context keeps; RecallRequest, one call) and what it reports (RecallStats);
// flashcache/llama/recall.hpp does the recall.
#include <llama.h>

#include <cstdint>

#include "flashcache/archive.hpp"
#include "flashcache/enum_names.hpp"
#include "flashcache/error.hpp"
#include "flashcache/llama/queries.hpp"
#include "flashcache/recall.hpp"

namespace flashcache {
namespace llama {

// What is decoded again once recalled cells are in.
enum class RecallRedo {
  last_token,  // the turn's last token: its logits see the recalled cells in every layer
  turn,        // the whole turn: its own cells are recomputed with the recalled ones (only the last
               // token when the cell before the turn is gone: llama.cpp decodes after the last position)
};

}  // namespace llama
template <>
struct EnumNames<llama::RecallRedo> {
  static constexpr EnumName<llama::RecallRedo> table[] = {{llama::RecallRedo::last_token, "last_token"},
                                                          {llama::RecallRedo::turn, "turn"}};
};
namespace llama {

inline const char* to_string(RecallRedo r) { return enum_name(r); }

struct RecallSettings {
  // Cells a new turn may bring back; 0: no recall. At most cap - 1 - n_keep - the turn -
  // cap / 4: a quarter of the cap stays outside the protected set for the reply.
  std::int64_t budget = 0;
  RecallRedo redo = RecallRedo::turn;
  std::int64_t queries = 256;              // the turn's last queries that score
  RecallScore score = RecallScore::exact;  // each block's best token, or Quest's digest bound (recall.hpp)
  // The QueryCapture on the context's cb_eval that takes the turn's queries
  // (ContextManager::begin_turn starts it; it pauses after the recall).
  QueryCapture* capture = nullptr;
};

inline Status check_recall_settings(const RecallSettings& r) {
  if (r.budget < 0) return make_error(Errc::invalid_budget, "llama recall: budget ", r.budget, " is negative");
  if (r.budget == 0) return Status::success();
  if (!is_known(r.redo)) return make_error(Errc::invalid_option, "llama recall: unknown redo");
  if (!is_known(r.score)) return make_error(Errc::invalid_option, "llama recall: unknown score");
  if (r.queries < 1) return make_error(Errc::invalid_option, "llama recall: ", r.queries, " queries (at least 1)");
  if (r.capture == nullptr)
    return make_error(Errc::invalid_option,
                      "llama recall: RecallSettings::capture is null (a QueryCapture on the context's cb_eval "
                      "takes the turn's queries)");
  return Status::success();
}

// What one recall did.
struct RecallStats {
  std::int64_t archive_tokens = 0;                 // scored
  std::int64_t queries = 0;                        // the turn's queries that scored them
  std::int64_t recalled = 0;                       // cells brought back
  std::int64_t displaced = 0;                      // resident cells moved to the archive to make room
  std::int64_t redecoded = 0;                      // tokens decoded again
  std::int64_t archive_dropped = 0;                // cells the archive's cap dropped when the displaced went in
  std::int64_t cells_before = 0, cells_after = 0;  // the sequence's (0 when nothing was read)
  double score_ms = 0, write_ms = 0, redo_ms = 0, ms = 0;
};

// One recall: the turn `turn[0..n)` was just decoded as the sequence's last n
// positions, with settings.capture following it; its archived cells come back into
// a sequence of at most `cap` cells whose first n_keep positions stay.
struct RecallRequest {
  const llama_token* turn = nullptr;
  std::int64_t n = 0;
  Archive* archive = nullptr;
  std::int64_t cap = 0, n_keep = 0;
  RecallSettings settings;
  int threads = 1;  // scoring threads
};

}  // namespace llama
}  // namespace flashcache
