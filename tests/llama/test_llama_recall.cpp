// Recall at a new turn (flashcache/llama/recall.hpp, ContextManager::begin_turn and
// recall_turn) on SmolLM2-135M: the recalled cells come back bit for bit at their
// positions, every position decoded stays resident or archived, the turn decoded again
// sees exactly the cells now in the sequence, recalled cells survive the next
// compaction, and a refused or failed recall leaves the sequence and the archive as
// they were (bytes compared). Skips without llama.cpp or the model.
#include "llama_test_model.hpp"

#if !FLASHCACHE_HAVE_LLAMA

TEST(LlamaRecall, NeedsLlamaCpp) { GTEST_SKIP() << FLASHCACHE_LLAMA_INSTALL_HINT; }

#else

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace {

using llama_test::Ctx;
using llama_test::g_model;
using llama_test::ledger_tokens;
using llama_test::state_of;

const char* kTurn = " Question: on which day did shipment 3 leave the harbour? Answer: on day";

// A context whose cb_eval feeds `capture`, with an f16 (or the given) cache.
void make_ctx(Ctx* c, fl::QueryCapture* capture, ggml_type type = GGML_TYPE_F16) {
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = 512;
  cp.n_batch = cp.n_ubatch = 128;
  cp.n_threads = cp.n_threads_batch = 1;
  cp.type_k = cp.type_v = type;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
  cp.cb_eval = fl::QueryCapture::eval;
  cp.cb_eval_user_data = capture;
  c->ctx = llama_init_from_model(g_model, cp);
  ASSERT_NE(c->ctx, nullptr);
}

fl::ContextParams recalling(fl::QueryCapture* capture, std::int64_t cells = 256, std::int64_t budget = 32,
                            fl::RecallRedo redo = fl::RecallRedo::last_token) {
  fl::ContextParams p = fl::context_default_params();
  p.n_cells = cells;
  p.after_compaction = fl::AfterCompaction::archive;
  p.archive_options.block_size = 16;
  p.recall.budget = budget;
  p.recall.redo = redo;
  p.recall.capture = capture;
  p.compress.n_threads = 1;
  return p;
}

// Streams the first n tokens of the text through the manager in chunks of 50.
void stream(Ctx* c, fl::ContextManager* cm, int n) {
  const std::vector<llama_token> text = ledger_tokens(40);
  ASSERT_GE(static_cast<int>(text.size()), n);
  for (int i = 0; i < n; i += 50) {
    const int m = std::min(50, n - i);
    llama_pos pos = -1;
    const fc::Status s = cm->make_room(m, &pos);
    ASSERT_TRUE(s.ok()) << s.message();
    ASSERT_EQ(ls::decode(c->ctx, text.data() + i, m, pos, 0, false), 0);
  }
}

// begin_turn, then the turn decoded through the manager; returns its tokens.
std::vector<llama_token> decode_turn(Ctx* c, fl::ContextManager* cm) {
  const std::vector<llama_token> turn = ls::tokenize(llama_model_get_vocab(g_model), kTurn, false);
  cm->begin_turn();
  llama_pos pos = -1;
  EXPECT_TRUE(cm->make_room(static_cast<std::int64_t>(turn.size()), &pos).ok());
  EXPECT_EQ(ls::decode(c->ctx, turn.data(), static_cast<int>(turn.size()), pos, 0, false), 0);
  return turn;
}

using llama_test::archived_rows;
using llama_test::Rows;
using llama_test::state_rows;

class LlamaRecall : public llama_test::ModelTest {};

}  // namespace

// The turn's queries bring blocks back: each recalled cell is the archived cell bit
// for bit at its position, it left the archive, and every position decoded is resident
// or archived exactly once.
TEST_F(LlamaRecall, RecalledCellsComeBackBitForBitAndNothingIsLost) {
  fl::QueryCapture capture;
  Ctx c;
  make_ctx(&c, &capture);
  fl::ContextManager cm;
  ASSERT_TRUE(cm.init(c.ctx, 0, recalling(&capture, 256, 32)).ok());
  stream(&c, &cm, 500);
  const std::vector<llama_token> turn = decode_turn(&c, &cm);
  const Rows before = archived_rows(cm.archive());
  ASSERT_GT(before.size(), 64u);
  const std::int64_t decoded = 500 + static_cast<std::int64_t>(turn.size());

  fl::RecallStats st;
  const fc::Status s = cm.recall_turn(turn.data(), static_cast<std::int64_t>(turn.size()), &st);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_GT(st.recalled, 0);
  EXPECT_LE(st.recalled, 32);
  EXPECT_EQ(st.redecoded, 1);
  ASSERT_EQ(cm.recalled().size(), static_cast<std::size_t>(st.recalled));

  const Rows resident = state_rows(state_of(c));
  const Rows after = archived_rows(cm.archive());
  EXPECT_EQ(static_cast<std::int64_t>(resident.size()), cm.cells());
  EXPECT_EQ(static_cast<std::int64_t>(resident.size() + after.size()), decoded);  // each position once
  for (const llama_pos p : cm.recalled()) {
    ASSERT_EQ(before.count(p), 1u) << "position " << p << " was not archived";
    EXPECT_EQ(after.count(p), 0u) << "position " << p << " is still archived";
    ASSERT_EQ(resident.count(p), 1u) << "position " << p << " is not resident";
    EXPECT_TRUE(resident.at(p) == before.at(p)) << "position " << p << " came back with other bytes";
  }
  for (std::int32_t p = 0; p < decoded; ++p) EXPECT_EQ(resident.count(p) + after.count(p), 1u) << "position " << p;
}

// Decoding the turn again: the last token's logits are those of the turn decoded over
// exactly the cells the sequence now holds before it (rebuilt in a second context).
TEST_F(LlamaRecall, TheTurnDecodedAgainSeesTheRecalledCells) {
  fl::QueryCapture capture;
  Ctx c;
  make_ctx(&c, &capture);
  fl::ContextManager cm;
  ASSERT_TRUE(cm.init(c.ctx, 0, recalling(&capture, 256, 32, fl::RecallRedo::turn)).ok());
  stream(&c, &cm, 500);
  const std::vector<llama_token> turn = decode_turn(&c, &cm);
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(g_model));
  const std::vector<float> old_logits(llama_get_logits_ith(c.ctx, -1), llama_get_logits_ith(c.ctx, -1) + n_vocab);
  fl::RecallStats st;
  ASSERT_TRUE(cm.recall_turn(turn.data(), static_cast<std::int64_t>(turn.size()), &st).ok());
  ASSERT_GT(st.recalled, 0);
  EXPECT_EQ(st.redecoded, static_cast<std::int64_t>(turn.size()));
  const std::vector<float> logits(llama_get_logits_ith(c.ctx, -1), llama_get_logits_ith(c.ctx, -1) + n_vocab);

  // The reference: the same cells without the turn, in another context, and the turn decoded there.
  fl::QueryCapture unused;
  Ctx ref;
  make_ctx(&ref, &unused);
  const std::vector<std::uint8_t> blob = state_of(c);
  ASSERT_EQ(llama_state_seq_set_data(ref.ctx, blob.data(), blob.size(), 0), blob.size());
  const llama_pos hi = llama_memory_seq_pos_max(ref.mem(), 0), first = hi - static_cast<llama_pos>(turn.size()) + 1;
  ASSERT_TRUE(llama_memory_seq_rm(ref.mem(), 0, first, -1));
  std::vector<float> want;
  ASSERT_EQ(ls::decode(ref.ctx, turn.data(), static_cast<int>(turn.size()), first, 0, false, &want), 0);
  ASSERT_EQ(want.size(), logits.size());
  float diff = 0, moved = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::abs(want[i] - logits[i]));
    moved = std::max(moved, std::abs(old_logits[i] - logits[i]));
  }
  EXPECT_LT(diff, 1e-3f);
  EXPECT_GT(moved, 1e-3f);  // the recalled cells changed what the turn predicts
}

// A turn longer than the queries kept (RecallSettings::queries): the capture's ring
// wraps, and its two runs score as one, in position order.
TEST_F(LlamaRecall, ATurnLongerThanTheQueriesKeptStillRecalls) {
  fl::QueryCapture capture;
  Ctx c;
  make_ctx(&c, &capture);
  fl::ContextParams p = recalling(&capture, 256, 32);
  p.recall.queries = 8;
  fl::ContextManager cm;
  ASSERT_TRUE(cm.init(c.ctx, 0, p).ok());
  stream(&c, &cm, 500);
  const std::vector<llama_token> turn = decode_turn(&c, &cm);
  ASSERT_GT(turn.size() % 8, 0u);  // the ring wraps
  ASSERT_EQ(capture.window(0).pieces(), 2);
  fl::RecallStats st;
  const fc::Status s = cm.recall_turn(turn.data(), static_cast<std::int64_t>(turn.size()), &st);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(st.queries, 8);
  EXPECT_GT(st.recalled, 0);
  EXPECT_EQ(static_cast<std::int64_t>(state_rows(state_of(c)).size() + archived_rows(cm.archive()).size()),
            500 + static_cast<std::int64_t>(turn.size()));
}

// A full context: the recalled blocks displace the lowest-scoring residents (never the
// first n_keep, never the turn), which go to the archive; the cap holds; and the
// recalled cells stay through the next compaction.
TEST_F(LlamaRecall, ResidentsMakeRoomAndRecalledCellsSurviveTheNextCompaction) {
  fl::QueryCapture capture;
  Ctx c;
  make_ctx(&c, &capture);
  fl::ContextManager cm;
  ASSERT_TRUE(cm.init(c.ctx, 0, recalling(&capture, 300, 64)).ok());  // 275 cells after the stream
  stream(&c, &cm, 500);
  // Fill the context to the cap before the turn.
  const std::vector<llama_token> text = ledger_tokens(40);
  const std::vector<llama_token> turn = ls::tokenize(llama_model_get_vocab(g_model), kTurn, false);
  const auto n_turn = static_cast<std::int64_t>(turn.size());
  const std::int64_t fill = cm.cap() - cm.cells() - n_turn;
  ASSERT_GT(fill, 0);
  llama_pos pos = -1;
  ASSERT_TRUE(cm.make_room(fill, &pos).ok());
  ASSERT_EQ(ls::decode(c.ctx, text.data() + 500, static_cast<int>(fill), pos, 0, false), 0);
  cm.begin_turn();
  ASSERT_TRUE(cm.make_room(n_turn, &pos).ok());
  ASSERT_EQ(ls::decode(c.ctx, turn.data(), static_cast<int>(n_turn), pos, 0, false), 0);
  ASSERT_EQ(cm.cells(), cm.cap());
  const std::int64_t decoded = 500 + fill + n_turn;

  fl::RecallStats st;
  const fc::Status s = cm.recall_turn(turn.data(), n_turn, &st);
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_GT(st.recalled, 0);
  EXPECT_EQ(st.displaced, st.recalled);  // no room: each cell back displaces one
  EXPECT_EQ(cm.cells(), cm.cap());
  const Rows resident = state_rows(state_of(c));
  EXPECT_EQ(static_cast<std::int64_t>(resident.size() + archived_rows(cm.archive()).size()), decoded);
  for (llama_pos p = 0; p < cm.params().n_keep; ++p) EXPECT_EQ(resident.count(p), 1u) << "n_keep position " << p;
  for (llama_pos p = pos; p < pos + n_turn; ++p) EXPECT_EQ(resident.count(p), 1u) << "turn position " << p;

  // The reply's first token needs room: a compaction, which keeps every recalled cell.
  const std::vector<llama_pos> recalled = cm.recalled();
  fl::RoomEvent ev;
  ASSERT_TRUE(cm.make_room(1, &pos, &ev).ok());
  ASSERT_EQ(ev.policy, fl::WhenFull::flashcache);
  const Rows kept = state_rows(state_of(c));
  for (const llama_pos p : recalled) EXPECT_EQ(kept.count(p), 1u) << "recalled position " << p << " was evicted";
}

// Refusals and failures change nothing: a recall whose turn was not followed by the
// capture, a q8_0 K cache, and a turn whose decoding again fails (an invalid token)
// all leave the sequence and the archive byte for byte as they were.
TEST_F(LlamaRecall, ARefusedOrFailedRecallChangesNothing) {
  fl::QueryCapture capture;
  Ctx c;
  make_ctx(&c, &capture);
  fl::ContextManager cm;
  ASSERT_TRUE(cm.init(c.ctx, 0, recalling(&capture, 256, 32, fl::RecallRedo::turn)).ok());
  stream(&c, &cm, 500);
  const std::vector<llama_token> turn = ls::tokenize(llama_model_get_vocab(g_model), kTurn, false);
  llama_pos pos = -1;
  ASSERT_TRUE(cm.make_room(static_cast<std::int64_t>(turn.size()), &pos).ok());  // no begin_turn
  ASSERT_EQ(ls::decode(c.ctx, turn.data(), static_cast<int>(turn.size()), pos, 0, false), 0);
  std::vector<std::uint8_t> seq = state_of(c);
  Rows archive = archived_rows(cm.archive());
  fc::Status s = cm.recall_turn(turn.data(), static_cast<std::int64_t>(turn.size()));
  EXPECT_EQ(s.code(), fc::Errc::invalid_option);
  EXPECT_NE(s.message().find("did not follow the turn"), std::string::npos) << s.message();
  EXPECT_TRUE(state_of(c) == seq);
  EXPECT_TRUE(archived_rows(cm.archive()) == archive);

  // The same turn, followed, with a token llama.cpp refuses when it is decoded again.
  const std::vector<llama_token> again = decode_turn(&c, &cm);
  std::vector<llama_token> bad(again);
  bad.back() = llama_vocab_n_tokens(llama_model_get_vocab(g_model)) + 7;
  seq = state_of(c);
  archive = archived_rows(cm.archive());
  const std::int64_t cells = cm.cells();
  s = cm.recall_turn(bad.data(), static_cast<std::int64_t>(bad.size()));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("the original state is restored, the archive unchanged"), std::string::npos)
      << s.message();
  EXPECT_TRUE(state_of(c) == seq);
  EXPECT_TRUE(archived_rows(cm.archive()) == archive);
  EXPECT_EQ(cm.cells(), cells);
  EXPECT_TRUE(cm.recalled().empty());
}

TEST_F(LlamaRecall, AQ8KCacheIsRefusedByName) {
  fl::QueryCapture capture;
  Ctx c;
  make_ctx(&c, &capture, GGML_TYPE_Q8_0);
  fl::ContextManager cm;
  ASSERT_TRUE(cm.init(c.ctx, 0, recalling(&capture)).ok());
  stream(&c, &cm, 500);
  const std::vector<llama_token> turn = decode_turn(&c, &cm);
  const std::vector<std::uint8_t> seq = state_of(c);
  const Rows archive = archived_rows(cm.archive());
  const fc::Status s = cm.recall_turn(turn.data(), static_cast<std::int64_t>(turn.size()));
  EXPECT_EQ(s.code(), fc::Errc::unsupported);
  EXPECT_NE(s.message().find("q8_0 K cache"), std::string::npos) << s.message();
  EXPECT_TRUE(state_of(c) == seq);
  EXPECT_TRUE(archived_rows(cm.archive()) == archive);
}

// Nothing archived yet, or recall off: the turn changes nothing and reads nothing.
TEST_F(LlamaRecall, AnEmptyArchiveRecallsNothing) {
  fl::QueryCapture capture;
  Ctx c;
  make_ctx(&c, &capture);
  fl::ContextManager cm;
  ASSERT_TRUE(cm.init(c.ctx, 0, recalling(&capture)).ok());
  stream(&c, &cm, 100);  // fits: no compaction
  const std::vector<llama_token> turn = decode_turn(&c, &cm);
  const std::vector<std::uint8_t> seq = state_of(c);
  fl::RecallStats st;
  ASSERT_TRUE(cm.recall_turn(turn.data(), static_cast<std::int64_t>(turn.size()), &st).ok());
  EXPECT_EQ(st.recalled, 0);
  EXPECT_EQ(st.archive_tokens, 0);
  EXPECT_EQ(st.ms, 0.0);
  EXPECT_TRUE(state_of(c) == seq);
}

// Recall needs the archive and its own capture: init refuses by name.
TEST_F(LlamaRecall, InitRefusesRecallWithoutItsParts) {
  fl::QueryCapture capture;
  Ctx c;
  make_ctx(&c, &capture);
  fl::ContextManager cm;
  fl::ContextParams p = recalling(&capture);
  p.after_compaction = fl::AfterCompaction::keep_positions;
  fc::Status s = cm.init(c.ctx, 0, p);
  EXPECT_NE(s.message().find("recall needs the archive"), std::string::npos) << s.message();
  p = recalling(nullptr);
  s = cm.init(c.ctx, 0, p);
  EXPECT_NE(s.message().find("RecallSettings::capture is null"), std::string::npos) << s.message();
  p = recalling(&capture);
  p.recall.budget = -1;
  s = cm.init(c.ctx, 0, p);
  EXPECT_EQ(s.code(), fc::Errc::invalid_budget) << s.message();
}

#endif
