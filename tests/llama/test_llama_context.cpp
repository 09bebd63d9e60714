// The llama.cpp adapter as a context manager (flashcache/llama/context.hpp) and
// compaction beside other sequences, inside llama.cpp on SmolLM2-135M. Skips
// with an install hint without llama.cpp or the model.
#include "llama_test_model.hpp"

#if !FLASHCACHE_HAVE_LLAMA

TEST(LlamaContext, NeedsLlamaCpp) { GTEST_SKIP() << FLASHCACHE_LLAMA_INSTALL_HINT; }

#else

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

namespace {

using llama_test::g_model;
using llama_test::ledger_tokens;

using llama_test::Ctx;
using llama_test::state_of;

void make_ctx(Ctx* c, uint32_t n_ctx, uint32_t n_seq = 1, bool unified = false, int threads = 1,
              fl::QueryCapture* capture = nullptr) {
  llama_context_params cp = llama_context_default_params();
  if (capture != nullptr) {
    cp.cb_eval = fl::QueryCapture::eval;
    cp.cb_eval_user_data = capture;
  }
  cp.n_ctx = n_ctx;
  cp.n_batch = cp.n_ubatch = 256;
  cp.n_seq_max = n_seq;
  cp.kv_unified = unified;
  cp.n_threads = cp.n_threads_batch = threads;
  c->ctx = llama_init_from_model(g_model, cp);
  ASSERT_NE(c->ctx, nullptr);
}

// Decodes toks through the manager in chunks; returns the events seen.
std::vector<fl::RoomEvent> stream(Ctx& c, fl::ContextManager& cm, const std::vector<llama_token>& toks, int chunk,
                                  llama_pos* max_pos) {
  std::vector<fl::RoomEvent> events;
  for (std::size_t i = 0; i < toks.size(); i += static_cast<std::size_t>(chunk)) {
    const int m = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(chunk), toks.size() - i));
    llama_pos pos = -1;
    fl::RoomEvent ev;
    const fc::Status s = cm.make_room(m, &pos, &ev);
    EXPECT_TRUE(s.ok()) << s.message();
    if (!s.ok()) break;
    if (ev.policy != fl::WhenFull::none) events.push_back(ev);
    EXPECT_LE(cm.cells() + m, cm.cap());
    EXPECT_EQ(ls::decode(c.ctx, toks.data() + i, m, pos, 0, false), 0);
    *max_pos = std::max(*max_pos, llama_memory_seq_pos_max(c.mem(), 0));
  }
  return events;
}

class LlamaContext : public llama_test::ModelTest {};

}  // namespace

// flashcache when full: positions stay below the cap, the first n_keep cells
// are the prefill's bit for bit (their shift is 0), the cell count is tracked.
TEST_F(LlamaContext, FlashcacheKeepsTheFirstCellsAndPositionsBelowTheCap) {
  const std::vector<llama_token> toks = ledger_tokens(70);
  ASSERT_GT(toks.size(), 1100u);
  Ctx ref;
  make_ctx(&ref, 512);
  ASSERT_EQ(ls::decode(ref.ctx, toks.data(), 64, 0, 0, false), 0);  // the stream's first chunk
  const std::vector<std::uint8_t> first = state_of(ref, 0);
  fl::SeqState fs;
  ASSERT_TRUE(fl::parse_seq_state(first.data(), first.size(), &fs).ok());

  Ctx c;
  make_ctx(&c, 512);
  fl::ContextManager cm;
  fl::ContextParams p = fl::context_default_params();
  ASSERT_TRUE(cm.init(c.ctx, 0, p).ok());
  EXPECT_EQ(cm.cap(), 512);
  llama_pos max_pos = -1;
  const std::vector<fl::RoomEvent> events = stream(c, cm, toks, 64, &max_pos);
  ASSERT_GE(events.size(), 2u);
  EXPECT_LT(max_pos, 512);
  const std::int64_t target = std::llround(p.target * 512);
  for (const fl::RoomEvent& e : events) {
    EXPECT_EQ(e.policy, fl::WhenFull::flashcache);
    EXPECT_EQ(e.cells_after, target);
    EXPECT_EQ(e.pos_max_after, target - 1);
  }
  // The count from positions is the state's count; positions are consecutive from 0.
  const std::vector<std::uint8_t> now = state_of(c, 0);
  fl::SeqState s;
  ASSERT_TRUE(fl::parse_seq_state(now.data(), now.size(), &s).ok());
  EXPECT_EQ(static_cast<std::int64_t>(s.cell_count), cm.cells());
  EXPECT_EQ(llama_memory_seq_pos_min(c.mem(), 0), 0);
  EXPECT_EQ(llama_memory_seq_pos_max(c.mem(), 0) + 1, cm.cells());
  const std::vector<std::int32_t> order = fl::cells_by_position(s), ref_order = fl::cells_by_position(fs);
  const fl::LayerState &L = s.layers[3], &R = fs.layers[3];
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(
        std::memcmp(now.data() + L.k_offset + static_cast<std::size_t>(order[i]) * L.k_row_bytes,
                    first.data() + R.k_offset + static_cast<std::size_t>(ref_order[i]) * R.k_row_bytes, L.k_row_bytes),
        0)
        << "cell " << i;
}

// A second event before the decode that applies the first one's renumbering
// is refused by name, and changes nothing.
TEST_F(LlamaContext, ASecondEventBeforeTheDecodeIsRefused) {
  const std::vector<llama_token> toks = ledger_tokens(40);
  Ctx c;
  make_ctx(&c, 512);
  fl::ContextManager cm;
  ASSERT_TRUE(cm.init(c.ctx, 0, fl::context_default_params()).ok());
  llama_pos max_pos = -1;
  stream(c, cm, std::vector<llama_token>(toks.begin(), toks.begin() + 512), 128, &max_pos);
  ASSERT_EQ(cm.cells(), 512);
  llama_pos pos = -1;
  fl::RoomEvent ev;
  ASSERT_TRUE(cm.make_room(64, &pos, &ev).ok());
  ASSERT_EQ(ev.policy, fl::WhenFull::flashcache);
  EXPECT_EQ(pos, std::llround(fl::context_default_params().target * 512));
  const std::vector<std::uint8_t> before = state_of(c, 0);
  const fc::Status s = cm.make_room(300, &pos);  // 384 + 300 > 512: room again, but the shift is pending
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("llama_decode"), std::string::npos) << s.message();
  EXPECT_EQ(state_of(c, 0), before);
  // After the decode it applies, the manager goes on.
  ASSERT_TRUE(cm.make_room(64, &pos).ok());
  ASSERT_EQ(ls::decode(c.ctx, toks.data() + 512, 64, pos, 0, false), 0);
  ASSERT_TRUE(cm.make_room(300, &pos, &ev).ok());
  EXPECT_EQ(ev.policy, fl::WhenFull::flashcache);
}

// shift and streaming do llama.cpp's and StreamingLLM's arithmetic.
TEST_F(LlamaContext, ShiftAndStreamingDropWhatTheyShould) {
  const std::vector<llama_token> toks = ledger_tokens(40);
  for (fl::WhenFull w : {fl::WhenFull::shift, fl::WhenFull::streaming}) {
    Ctx c;
    make_ctx(&c, 512);
    fl::ContextManager cm;
    fl::ContextParams p = fl::context_default_params();
    p.when_full = w;
    ASSERT_TRUE(cm.init(c.ctx, 0, p).ok());
    llama_pos max_pos = -1;
    stream(c, cm, std::vector<llama_token>(toks.begin(), toks.begin() + 512), 128, &max_pos);
    llama_pos pos = -1;
    fl::RoomEvent ev;
    ASSERT_TRUE(cm.make_room(64, &pos, &ev).ok()) << fl::to_string(w);
    const std::int64_t want = w == fl::WhenFull::shift ? 4 + (508 - 254) : 512 - 64;
    EXPECT_EQ(ev.cells_after, want) << fl::to_string(w);
    EXPECT_EQ(pos, want);
    ASSERT_EQ(ls::decode(c.ctx, toks.data() + 512, 64, pos, 0, false), 0);
    EXPECT_EQ(llama_memory_seq_pos_max(c.mem(), 0), want + 63);
  }
}

// Every refusal names its problem and changes nothing.
TEST_F(LlamaContext, RefusalsChangeNothing) {
  const std::vector<llama_token> toks = ledger_tokens(40);
  Ctx c;
  make_ctx(&c, 512);
  ASSERT_EQ(ls::decode(c.ctx, toks.data(), 512, 0, 0, false), 0);
  const std::vector<std::uint8_t> before = state_of(c, 0);
  fl::ContextManager cm;
  fl::ContextParams p = fl::context_default_params();
  auto refused = [&](const fl::ContextParams& q, const char* what) {
    const fc::Status s = cm.init(c.ctx, 0, q);
    EXPECT_FALSE(s.ok()) << what;
    EXPECT_NE(s.message().find(what), std::string::npos) << s.message();
  };
  fl::ContextParams q = p;
  q.n_cells = 4096;
  refused(q, "llama_n_ctx_seq");
  q = p;
  q.n_keep = 600;
  refused(q, "n_keep");
  q = p;
  q.target = 1.0;
  refused(q, "target");
  q = p;
  q.compress.options = fc::Options::with_query_tail();
  refused(q, "query tails");
  fl::QueryCapture capture;
  q.queries = &capture;
  q.after_compaction = fl::AfterCompaction::keep_positions;
  refused(q, "need renumber");
  q = p;
  q.queries = &capture;
  refused(q, "ScoreOptions::query is none");
  q = p;
  q.when_full = fl::WhenFull::shift;
  q.queries = &capture;
  refused(q, "flashcache's compactions only");
  q = p;
  q.compress.options.score.rope.derotate = true;
  refused(q, "de-rotation");
  ASSERT_TRUE(cm.init(c.ctx, 0, p).ok());
  llama_pos pos = -1;
  EXPECT_FALSE(cm.make_room(600, &pos).ok());  // more than a cap can make room for
  p.when_full = fl::WhenFull::none;
  ASSERT_TRUE(cm.init(c.ctx, 0, p).ok());
  const fc::Status full = cm.make_room(1, &pos);
  EXPECT_FALSE(full.ok());
  EXPECT_NE(full.message().find("context is full"), std::string::npos) << full.message();
  EXPECT_EQ(state_of(c, 0), before);
}

// The compressor's own refusals by name, the sequence untouched: de-rotation, and a
// cache type it does not read (q4_0 keys).
TEST_F(LlamaContext, CompressorRefusalsChangeNothing) {
  const std::vector<llama_token> toks = ledger_tokens(12);
  {
    Ctx c;
    make_ctx(&c, 512);
    ASSERT_EQ(ls::decode(c.ctx, toks.data(), static_cast<int>(toks.size()), 0, 0, false), 0);
    const std::vector<std::uint8_t> before = state_of(c, 0);
    fl::CompressParams p = fl::compress_default_params();
    p.options.score.rope.derotate = true;
    const fc::Status s = fl::compress_sequence(c.ctx, 0, p, nullptr);
    EXPECT_NE(s.message().find("de-rotation"), std::string::npos) << s.message();
    EXPECT_EQ(state_of(c, 0), before);
  }
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = 512;
  cp.n_batch = cp.n_ubatch = 256;
  cp.n_threads = cp.n_threads_batch = 1;
  cp.type_k = GGML_TYPE_Q4_0;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
  Ctx q;
  q.ctx = llama_init_from_model(g_model, cp);
  ASSERT_NE(q.ctx, nullptr);
  ASSERT_EQ(ls::decode(q.ctx, toks.data(), static_cast<int>(toks.size()), 0, 0, false), 0);
  const std::vector<std::uint8_t> before = state_of(q, 0);
  const fc::Status s = fl::compress_sequence(q.ctx, 0, fl::compress_default_params(), nullptr);
  EXPECT_NE(s.message().find("q4_0"), std::string::npos) << s.message();
  EXPECT_EQ(state_of(q, 0), before);
}

// Separate streams (kv_unified = false), 2 to 4 sequences: each compressed on
// its own leaves every other byte-identical, and all decode on.
TEST_F(LlamaContext, SeparateStreamsCompressOneSequenceAtATime) {
  for (int n_seq : {2, 4}) {
    Ctx c;
    make_ctx(&c, static_cast<uint32_t>(512 * n_seq), static_cast<uint32_t>(n_seq), false);
    std::vector<std::vector<llama_token> > toks;
    for (int q = 0; q < n_seq; ++q) {
      toks.push_back(ledger_tokens(12 + 3 * q, q));
      ASSERT_LT(toks.back().size(), 512u);  // one stream's cells
      ASSERT_EQ(ls::decode(c.ctx, toks.back().data(), static_cast<int>(toks.back().size()), 0, q, false), 0);
    }
    fl::SequenceCompressor comp;
    fl::CompressParams p = fl::compress_default_params();
    p.budget = fc::Budget::ratio(0.3);
    for (int q = 0; q < n_seq; ++q) {
      std::vector<std::vector<std::uint8_t> > others;
      for (int o = 0; o < n_seq; ++o) others.push_back(o == q ? std::vector<std::uint8_t>() : state_of(c, o));
      fl::CompactionStats st;
      const fc::Status s = comp.compress(c.ctx, q, p, &st);
      ASSERT_TRUE(s.ok()) << n_seq << " sequences, sequence " << q << ": " << s.message();
      EXPECT_LT(st.cells_after, st.cells_before);
      for (int o = 0; o < n_seq; ++o)
        if (o != q) {
          EXPECT_EQ(state_of(c, o), others[static_cast<std::size_t>(o)]) << "sequence " << o;
        }
    }
    for (int q = 0; q < n_seq; ++q) {
      const llama_token t = toks[static_cast<std::size_t>(q)][5];
      EXPECT_EQ(ls::decode(c.ctx, &t, 1, llama_memory_seq_pos_max(c.mem(), q) + 1, q, false), 0);
    }
  }
}

// One unified cache: another sequence over the same positions may share cells
// (a seq_cp), also under an id above n_seq_max; refused, nothing changed.
TEST_F(LlamaContext, UnifiedCacheRefusesSequencesThatMayShareCells) {
  const std::vector<llama_token> toks = ledger_tokens(20);
  for (llama_seq_id other : {1, 200}) {
    Ctx c;
    make_ctx(&c, 1024, 2, true);
    ASSERT_EQ(ls::decode(c.ctx, toks.data(), static_cast<int>(toks.size()), 0, 0, false), 0);
    llama_memory_seq_cp(c.mem(), 0, other, -1, -1);
    ASSERT_GE(llama_memory_seq_pos_min(c.mem(), other), 0);
    const std::vector<std::uint8_t> before = state_of(c, 0);
    fl::CompactionStats st;
    const fc::Status s = fl::compress_sequence(c.ctx, 0, fl::compress_default_params(), &st);
    EXPECT_FALSE(s.ok()) << "sequence " << other;
    EXPECT_NE(s.message().find("may share cells"), std::string::npos) << s.message();
    EXPECT_EQ(state_of(c, 0), before);
  }
}

// The kept cells do not depend on the scoring threads. The text is decoded once;
// each thread count compresses that state, set back into the context.
TEST_F(LlamaContext, ThreadsKeepTheSameCells) {
  const std::vector<llama_token> toks = ledger_tokens(40);
  Ctx c;
  make_ctx(&c, 1024);
  ASSERT_EQ(ls::decode(c.ctx, toks.data(), static_cast<int>(toks.size()), 0, 0, false), 0);
  const std::vector<std::uint8_t> decoded = state_of(c);
  std::vector<llama_pos> first;
  for (int threads : {1, 2, 3}) {
    ASSERT_TRUE(llama_memory_seq_rm(c.mem(), 0, -1, -1));
    ASSERT_EQ(llama_state_seq_set_data(c.ctx, decoded.data(), decoded.size(), 0), decoded.size());
    fl::SequenceCompressor comp;
    fl::CompressParams p = fl::compress_default_params();
    p.n_threads = threads;
    fl::CompactionStats st;
    ASSERT_TRUE(comp.compress(c.ctx, 0, p, &st).ok());
    EXPECT_EQ(st.threads, threads);
    if (first.empty())
      first = comp.kept_positions();
    else
      EXPECT_EQ(comp.kept_positions(), first) << threads << " threads";
  }
}

// A mean_weight that follows the budget scores the cells as the fixed weight it
// resolves to at the call's keep ratio (0.375 of the cells: weight 0.375).
TEST_F(LlamaContext, MeanWeightFollowsTheCallsBudget) {
  const std::vector<llama_token> toks = ledger_tokens(12);
  auto kept = [&](double weight, double full_keep, double zero_keep) {
    Ctx c;
    make_ctx(&c, 1024);
    EXPECT_EQ(ls::decode(c.ctx, toks.data(), static_cast<int>(toks.size()), 0, 0, false), 0);
    fl::SequenceCompressor comp;
    fl::CompressParams p = fl::compress_default_params();
    p.budget = fc::Budget::ratio(0.375);
    p.options.select.window_share = 0;  // the score chooses all but the sink and the newest cell
    p.options.score.mean_weight = weight;
    p.options.score.mean_full_keep = full_keep;
    p.options.score.mean_zero_keep = zero_keep;
    fl::CompactionStats st;
    const fc::Status s = comp.compress(c.ctx, 0, p, &st);
    EXPECT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(st.cells_after, std::llround(0.375 * static_cast<double>(toks.size())));
    return comp.kept_positions();
  };
  const std::vector<llama_pos> fixed = kept(0.375, 0, 0);
  EXPECT_EQ(kept(0.75, 0.5, 0.25), fixed);
  EXPECT_NE(kept(0.75, 0, 0), fixed);  // the weights differ in what they keep
}

// Query tails in a running context. The capture follows the sequence: before any
// renumbering its kept queries are, bit for bit, those a plain prefill of the same
// tokens in the same chunks gives. Each compaction scores with them (its kept cells
// differ from the query-free manager's on the same tokens), and after the renumbering
// the capture follows from the new next position. A capture out of step is refused
// by name, the sequence unchanged.
TEST_F(LlamaContext, QueryTailsFollowTheRunningSequence) {
  const std::vector<llama_token> toks = ledger_tokens(70);
  ASSERT_GT(toks.size(), 1200u);
  fl::QueryCapture ref_capture;
  Ctx ref;
  make_ctx(&ref, 512, 1, false, 1, &ref_capture);
  ref_capture.begin(512);
  for (int i = 0; i < 512; i += 64) ASSERT_EQ(ls::decode(ref.ctx, toks.data() + i, 64, i, 0, false), 0);
  ASSERT_TRUE(ref_capture.complete());

  fl::QueryCapture capture;
  Ctx c;
  make_ctx(&c, 512, 1, false, 1, &capture);
  fl::ContextManager cm;
  fl::ContextParams p = fl::context_default_params();
  p.queries = &capture;
  p.compress.options = fc::Options::with_query_tail(p.compress.options);
  ASSERT_TRUE(cm.init(c.ctx, 0, p).ok());
  Ctx plain;
  make_ctx(&plain, 512);
  fl::ContextManager cm_plain;
  ASSERT_TRUE(cm_plain.init(plain.ctx, 0, fl::context_default_params()).ok());
  const std::vector<llama_token> head(toks.begin(), toks.begin() + 512);
  llama_pos max_pos = -1;
  EXPECT_TRUE(stream(c, cm, head, 64, &max_pos).empty());
  EXPECT_TRUE(stream(plain, cm_plain, head, 64, &max_pos).empty());
  ASSERT_TRUE(capture.status().ok()) << capture.status().message();
  ASSERT_EQ(capture.end_position(), 512);
  ASSERT_EQ(capture.layers(), llama_model_n_layer(g_model));
  for (int l = 0; l < capture.layers(); ++l) {
    const fc::QueryWindow& w = capture.window(l);
    ASSERT_EQ(w.kept(), fc::kTailLastQueries);
    ASSERT_EQ(w.first_kept(), 512 - fc::kTailLastQueries);
    const fc::KVView<const float> want = ref_capture.layer(l);
    for (int i = 0; i < w.pieces(); ++i) {
      const fc::QueryPiece piece = w.piece(i);
      for (std::int64_t r = 0; r < piece.q.tokens; ++r)
        ASSERT_EQ(std::memcmp(piece.q.row(0, r), want.row(0, piece.first + r - ref_capture.first_position()),
                              static_cast<std::size_t>(want.heads * want.head_dim) * sizeof(float)),
                  0)
            << "layer " << l << " position " << piece.first + r;
    }
  }

  llama_pos pos = -1, pos_plain = -1;
  fl::RoomEvent ev, ev_plain;
  ASSERT_TRUE(cm.make_room(64, &pos, &ev).ok());
  ASSERT_TRUE(cm_plain.make_room(64, &pos_plain, &ev_plain).ok());
  ASSERT_EQ(ev.policy, fl::WhenFull::flashcache);
  EXPECT_TRUE(ev.compaction.query_tails);
  EXPECT_FALSE(ev_plain.compaction.query_tails);
  EXPECT_EQ(pos, pos_plain);
  EXPECT_NE(state_of(c, 0), state_of(plain, 0));  // the tails chose other cells
  EXPECT_EQ(capture.end_position(), pos);
  EXPECT_EQ(capture.tokens_seen(), 0);
  ASSERT_EQ(ls::decode(c.ctx, toks.data() + 512, 64, pos, 0, false), 0);
  const std::vector<llama_token> rest(toks.begin() + 576, toks.end());
  const std::vector<fl::RoomEvent> events = stream(c, cm, rest, 64, &max_pos);
  ASSERT_GE(events.size(), 2u);
  for (const fl::RoomEvent& e : events) EXPECT_TRUE(e.compaction.query_tails);
  EXPECT_LT(llama_memory_seq_pos_max(c.mem(), 0), 512);

  capture.follow(0);  // out of step with the sequence
  const std::vector<std::uint8_t> before = state_of(c, 0);
  const fc::Status s = cm.make_room(512 - cm.cells() + 1, &pos);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("did not follow"), std::string::npos) << s.message();
  EXPECT_EQ(state_of(c, 0), before);
}

#endif
