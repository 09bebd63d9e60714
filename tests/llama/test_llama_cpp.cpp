// flashcache/llama.hpp inside llama.cpp (llama-cpp-python 0.3.36) on SmolLM2-135M:
// compaction through the public API, checked against llama.cpp's own logits, and the
// query capture against llama.cpp's own attention probabilities.
// Skips with an install hint without llama.cpp or the model.
#include "llama_test_model.hpp"

#if !FLASHCACHE_HAVE_LLAMA

TEST(LlamaCpp, NeedsLlamaCpp) { GTEST_SKIP() << FLASHCACHE_LLAMA_INSTALL_HINT; }

#else

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using llama_test::g_model;

// A prompt of a few hundred tokens with some structure (repeats, numbers, prose).
std::string test_prompt() {
  std::string p = "The library keeps a compressed cache. ";
  for (int i = 0; i < 24; ++i)
    p += "Item " + std::to_string(i * 7 % 13) + ": the frequency-domain score of token " + std::to_string(i) +
         " is its deviation from the smooth base; outliers are kept. ";
  return p;
}

struct Ctx {
  llama_context* ctx = nullptr;
  std::vector<llama_token> prompt;
  int n_vocab = 0;
  ~Ctx() {
    if (ctx != nullptr) llama_free(ctx);
  }
  llama_memory_t mem() const { return llama_get_memory(ctx); }
};

struct CacheKind {
  ggml_type type;
  llama_flash_attn_type fa;
  const char* name;
  // Compacted vs the same positions left as holes, max |logit difference| allowed;
  // -1: compared with llama.cpp's own compaction of those holes instead (exactly).
  // With an f32 cache the two are equal (0 measured). With f16, bf16 and q8_0 caches
  // the logits of this llama.cpp build (GGML_NATIVE on a CPU with AVX512-FP16)
  // depend on the cells' order and on n_kv alone: llama.cpp's own state round trip
  // of a sequence with one position removed moves them by 0.51 (f16, flash
  // attention); this test's holes differ from the compacted cache by 0.37 / 0.46
  // (f16 with / without flash attention) and by 0.55 or < 2e-3 (q8_0, depending on
  // which contexts the process made before), while ours equals llama.cpp's own
  // compaction bit for bit.
  float holes_tol;
};

// A context with the test prompt prefilled, but for its last token.
void make_ctx(Ctx* c, CacheKind kind = {GGML_TYPE_F16, LLAMA_FLASH_ATTN_TYPE_AUTO, "f16", 0}, uint32_t n_seq = 1,
              bool unified = false) {
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = 1024;
  cp.n_batch = 512;
  cp.n_ubatch = 512;
  cp.n_seq_max = n_seq;
  cp.kv_unified = unified;
  cp.n_threads = cp.n_threads_batch = 1;
  cp.type_k = cp.type_v = kind.type;
  cp.flash_attn_type = kind.fa;
  c->ctx = llama_init_from_model(g_model, cp);
  ASSERT_NE(c->ctx, nullptr) << kind.name;
  const llama_vocab* vocab = llama_model_get_vocab(g_model);
  c->n_vocab = llama_vocab_n_tokens(vocab);
  c->prompt = ls::tokenize(vocab, test_prompt(), true);
  ASSERT_GT(c->prompt.size(), 300u);
  ASSERT_EQ(ls::decode(c->ctx, c->prompt.data(), static_cast<int>(c->prompt.size()) - 1, 0, 0, false), 0);
}

// Logits of decoding `token` next in sequence 0.
std::vector<float> next_logits(Ctx& c, llama_token token) {
  std::vector<float> l;
  const llama_pos pos = llama_memory_seq_pos_max(c.mem(), 0) + 1;
  EXPECT_EQ(ls::decode(c.ctx, &token, 1, pos, 0, false, &l), 0);
  return l;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float d = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

std::vector<std::uint8_t> state_of(Ctx& c) {
  std::vector<std::uint8_t> b(llama_state_seq_get_size(c.ctx, 0));
  EXPECT_EQ(llama_state_seq_get_data(c.ctx, b.data(), b.size(), 0), b.size());
  return b;
}

// The library's default compaction to `budget` cells.
fl::CompressParams keep(fc::Budget budget) {
  fl::CompressParams p = fl::compress_default_params();
  p.budget = budget;
  return p;
}

// The same scored with the prompt's query tails.
fl::CompressParams keep_with_tails(fc::Budget budget, const fl::QueryCapture* capture) {
  fl::CompressParams p = keep(budget);
  p.options = fc::Options::with_query_tail();
  p.queries = capture;
  return p;
}

class LlamaCpp : public llama_test::ModelTest {};

const CacheKind kKinds[] = {
    {GGML_TYPE_F16, LLAMA_FLASH_ATTN_TYPE_ENABLED, "f16, flash attention (V rows)", -1},
    {GGML_TYPE_F16, LLAMA_FLASH_ATTN_TYPE_DISABLED, "f16, no flash attention (V transposed)", -1},
    {GGML_TYPE_F32, LLAMA_FLASH_ATTN_TYPE_DISABLED, "f32, V transposed", 1e-4f},
    {GGML_TYPE_BF16, LLAMA_FLASH_ATTN_TYPE_DISABLED, "bf16, V transposed", -1},
    {GGML_TYPE_Q8_0, LLAMA_FLASH_ATTN_TYPE_ENABLED, "q8_0 (K Hadamard-rotated)", -1},
};

// llama.cpp's own compaction: the sequence's state written and read back.
void llama_round_trip(Ctx& c) {
  std::vector<std::uint8_t> b = state_of(c);
  ASSERT_TRUE(llama_memory_seq_rm(c.mem(), 0, -1, -1));
  ASSERT_EQ(llama_state_seq_set_data(c.ctx, b.data(), b.size(), 0), b.size());
}

// llama.cpp's own attention probabilities during a prefill ("kq_soft_max-<layer>", a node
// of its own without flash attention: [n_kv][tokens][query heads] floats, key index = cell),
// reduced to each key's tail as flashcache/query_tail.hpp defines it: the largest
// probability any query at position >= first gives the key from kTailMinDistance
// positions on, over the query heads that read its KV head. Every other node goes to the
// QueryCapture, so one cb_eval feeds both.
struct AttentionProbe {
  AttentionProbe(fl::QueryCapture* c, std::int64_t prompt, std::int64_t first_fed, std::int64_t heads_per_kv,
                 std::int64_t kv)
      : capture(c), n(prompt), first(first_fed), group(heads_per_kv), kv_heads(kv) {}

  static bool eval(ggml_tensor* t, bool ask, void* user) {
    auto* self = static_cast<AttentionProbe*>(user);
    const int layer = probabilities_layer(t);
    if (layer < 0) return fl::QueryCapture::eval(t, ask, self->capture);
    if (ask) return true;
    self->take(layer, t);
    return true;  // false would stop llama.cpp's compute
  }

  int layers() const { return static_cast<int>(seen.size()); }
  bool complete() const {
    if (!problem.empty() || seen.empty()) return false;
    for (std::int64_t rows : seen)
      if (rows != n) return false;
    return true;
  }
  // Layer 0, query head 0: the probability the query at position `pos` (>= first) gives key j.
  float head0_probability(std::int64_t pos, std::int64_t j) const {
    return head0[static_cast<std::size_t>((pos - first) * n + j)];
  }

  fl::QueryCapture* capture;
  std::int64_t n, first, group, kv_heads;
  std::vector<std::int64_t> seen;          // rows each layer has seen
  std::vector<std::vector<float> > tails;  // [layer][kv head * n + key]
  std::vector<float> head0;                // [pos - first][key]
  std::string problem;

 private:
  static int probabilities_layer(const ggml_tensor* t) {
    static const char kName[] = "kq_soft_max-";
    if (t == nullptr || std::strncmp(t->name, kName, sizeof kName - 1) != 0) return -1;
    return std::atoi(t->name + sizeof kName - 1);
  }

  void take(int layer, const ggml_tensor* t) {
    const std::int64_t n_kv = t->ne[0], rows = t->ne[1], heads = t->ne[2];
    if (seen.size() <= static_cast<std::size_t>(layer)) {
      seen.resize(static_cast<std::size_t>(layer) + 1, 0);
      tails.resize(seen.size(), std::vector<float>(static_cast<std::size_t>(kv_heads * n), 0.0f));
    }
    if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t) || t->ne[3] != 1 || heads != group * kv_heads) {
      problem = std::string(t->name) + " is not a contiguous float [n_kv][tokens][heads] tensor";
      return;
    }
    std::vector<float> p(static_cast<std::size_t>(n_kv * rows * heads));
    ggml_backend_tensor_get(t, p.data(), 0, p.size() * sizeof(float));
    std::int64_t& done = seen[static_cast<std::size_t>(layer)];
    if (layer == 0 && head0.empty()) head0.assign(static_cast<std::size_t>((n - first) * n), 0.0f);
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t pos = done + r;
      if (pos < first || pos >= n) continue;
      for (std::int64_t g = 0; g < heads; ++g) {
        const float* row = p.data() + static_cast<std::size_t>((g * rows + r) * n_kv);
        float* tail = tails[static_cast<std::size_t>(layer)].data() + static_cast<std::size_t>(g / group * n);
        for (std::int64_t j = 0; j + fc::kTailMinDistance <= pos; ++j) tail[j] = std::max(tail[j], row[j]);
        if (layer == 0 && g == 0)  // keys past n_kv are not in the cache yet: probability 0
          std::copy(row, row + std::min(n, n_kv), head0.begin() + static_cast<std::ptrdiff_t>((pos - first) * n));
      }
    }
    done += rows;
  }
};
}  // namespace

TEST_F(LlamaCpp, PinnedVersion) { EXPECT_TRUE(fl::check_llama_version().ok()) << fl::check_llama_version().message(); }

TEST_F(LlamaCpp, KeepAllRoundTripGivesTheSameLogits) {
  for (const CacheKind& kind : kKinds) {
    SCOPED_TRACE(kind.name);
    Ctx a;
    make_ctx(&a, kind);
    const llama_pos last = llama_memory_seq_pos_max(a.mem(), 0) + 1;
    const auto plain = next_logits(a, a.prompt.back());
    ASSERT_TRUE(llama_memory_seq_rm(a.mem(), 0, last, -1));  // that token out again
    fl::CompactionStats st;
    const fc::Status s = fl::compress_sequence(a.ctx, 0, keep(fc::Budget::ratio(1.0)), &st);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(st.cells_after, st.cells_before);
    EXPECT_EQ(st.cells_before, static_cast<std::int64_t>(a.prompt.size()) - 1);
    EXPECT_LE(max_abs_diff(next_logits(a, a.prompt.back()), plain), 1e-5f);
  }
}

TEST_F(LlamaCpp, CompactedCacheEqualsTheSamePositionsLeftAsHoles) {
  for (const CacheKind& kind : kKinds) {
    SCOPED_TRACE(kind.name);
    Ctx a;
    make_ctx(&a, kind);
    const std::vector<std::uint8_t> original = state_of(a);
    const llama_pos pos_max = llama_memory_seq_pos_max(a.mem(), 0);
    fl::SequenceCompressor comp;
    fl::CompactionStats st;
    const fc::Status s = comp.compress(a.ctx, 0, keep(fc::Budget::ratio(0.3)), &st);
    ASSERT_TRUE(s.ok()) << s.message();
    const std::int64_t n = static_cast<std::int64_t>(a.prompt.size()) - 1;
    EXPECT_EQ(st.cells_before, n);
    EXPECT_EQ(st.cells_after, std::llround(0.3 * static_cast<double>(n)));
    EXPECT_LT(st.kv_bytes_after, st.kv_bytes_before);
    EXPECT_LT(llama_state_seq_get_size(a.ctx, 0), original.size());
    EXPECT_EQ(llama_memory_seq_pos_max(a.mem(), 0), pos_max);
    const std::vector<llama_pos> kept = comp.kept_positions();
    ASSERT_EQ(static_cast<std::int64_t>(kept.size()), st.cells_after);
    EXPECT_EQ(kept.back(), pos_max);
    EXPECT_EQ(kept.front(), 0);  // the attention sink
    ls::log_state().used_max_p1 = -1;
    const auto compacted = next_logits(a, a.prompt.back());
    const long used_compacted = ls::log_state().used_max_p1;
    // n_kv evidence: compacted, the kept cells are cells 0..kept-1.
    EXPECT_EQ(used_compacted, st.cells_after);

    // The same context back as prefilled (a lone sequence restores to cells 0..n-1), then the
    // dropped positions removed in place: seq_rm takes [p0, p1), one call per dropped position.
    ASSERT_TRUE(llama_memory_seq_rm(a.mem(), 0, -1, -1));
    ASSERT_EQ(llama_state_seq_set_data(a.ctx, original.data(), original.size(), 0), original.size());
    std::size_t k = 0;
    for (llama_pos p = 0; p <= pos_max; ++p) {
      if (k < kept.size() && kept[k] == p) {
        ++k;
        continue;
      }
      ASSERT_TRUE(llama_memory_seq_rm(a.mem(), 0, p, p + 1));
    }
    if (kind.holes_tol >= 0) {
      ls::log_state().used_max_p1 = -1;
      const auto holes = next_logits(a, a.prompt.back());
      // With holes the highest used cell stays where it was.
      EXPECT_EQ(ls::log_state().used_max_p1, n);
      EXPECT_LE(max_abs_diff(compacted, holes), kind.holes_tol);
      EXPECT_EQ(ls::argmax(compacted.data(), a.n_vocab), ls::argmax(holes.data(), a.n_vocab));
    } else {
      llama_round_trip(a);  // the holes compacted by llama.cpp itself: same cell order as ours
      const auto theirs = next_logits(a, a.prompt.back());
      EXPECT_EQ(max_abs_diff(compacted, theirs), 0.0f);
      EXPECT_EQ(ls::argmax(compacted.data(), a.n_vocab), ls::argmax(theirs.data(), a.n_vocab));
    }
  }
}

TEST_F(LlamaCpp, DecodingContinuesAndASecondCompressionWorks) {
  Ctx a;
  make_ctx(&a);
  fl::SequenceCompressor comp;
  fl::CompactionStats st;
  ASSERT_TRUE(comp.compress(a.ctx, 0, keep(fc::Budget::ratio(0.2)), &st).ok());
  llama_token next = a.prompt.back();
  for (int i = 0; i < 24; ++i) {
    const auto l = next_logits(a, next);
    ASSERT_EQ(static_cast<int>(l.size()), a.n_vocab);
    next = ls::argmax(l.data(), a.n_vocab);
  }
  const llama_pos pos_max = llama_memory_seq_pos_max(a.mem(), 0);
  EXPECT_EQ(pos_max, static_cast<llama_pos>(a.prompt.size()) - 1 + 23);
  fl::CompactionStats again;
  const fc::Status s = comp.compress(a.ctx, 0, keep(fc::Budget::tokens(st.cells_after)), &again);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(again.cells_before, st.cells_after + 24);
  EXPECT_EQ(again.cells_after, st.cells_after);
  EXPECT_EQ(llama_memory_seq_pos_max(a.mem(), 0), pos_max);
  for (int i = 0; i < 8; ++i) next = ls::argmax(next_logits(a, next).data(), a.n_vocab);
  EXPECT_EQ(llama_memory_seq_pos_max(a.mem(), 0), pos_max + 8);
}

TEST_F(LlamaCpp, RefusedStatesLeaveTheSequenceAsItWas) {
  Ctx a;
  make_ctx(&a);
  const std::vector<std::uint8_t> good = state_of(a);
  fl::SeqState s;
  ASSERT_TRUE(fl::parse_seq_state(good.data(), good.size(), &s).ok());
  struct Case {
    const char* name;
    std::vector<std::uint8_t> blob;
    const char* why;
  };
  std::vector<Case> cases;
  cases.push_back({"truncated", std::vector<std::uint8_t>(good.begin(), good.end() - 100), "truncated"});
  {
    std::vector<std::uint8_t> b = good;
    const std::uint32_t magic = 0x67677371u;  // llama_state_seq_save_file's 'ggsq'
    std::memcpy(b.data(), &magic, 4);
    cases.push_back({"foreign", b, "not a llama.cpp sequence state"});
  }
  {
    // Layer 1's K section and layer 0's V section swapped: with f16 K and V of one size the
    // parser cannot tell, so the same swap on a blob whose V type was rewritten to bf16 (two types).
    std::vector<std::uint8_t> b = good;
    const std::int32_t bf16 = 30;
    std::memcpy(b.data() + s.layers[0].v_offset - 12, &bf16, 4);
    const auto at = [&b](std::size_t i) { return b.begin() + static_cast<std::ptrdiff_t>(i); };
    const std::size_t k1 = s.layers[1].k_offset - 12, v0 = s.layers[0].v_offset - 12, v1 = s.layers[1].v_offset - 12;
    std::vector<std::uint8_t> r(b.begin(), at(k1));
    r.insert(r.end(), at(v0), at(v1));
    r.insert(r.end(), at(k1), at(v0));
    r.insert(r.end(), at(v1), b.end());
    cases.push_back({"reordered", r, "K of layer 1 is bf16, of layer 0 f16"});
  }
  {
    // Another version's layout: a cell ext after each cell's sequence count (as M-RoPE models write).
    std::vector<std::uint8_t> b(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(s.meta_offset));
    for (std::uint32_t i = 0; i < s.cell_count; ++i) {
      const std::uint8_t* cell = good.data() + s.meta_offset + 12 * i;
      b.insert(b.end(), cell, cell + 8);
      const std::int32_t ext[3] = {5, 6, 7};  // x, y, token
      const auto* e = reinterpret_cast<const std::uint8_t*>(ext);
      b.insert(b.end(), e, e + 12);
      b.insert(b.end(), cell + 8, cell + 12);
    }
    b.insert(b.end(), good.begin() + static_cast<std::ptrdiff_t>(s.data_offset), good.end());
    cases.push_back({"other version (cell ext)", b, "cell ext present"});
  }
  {
    std::vector<std::uint8_t> b = good;
    const std::uint32_t layers = 29;
    std::memcpy(b.data() + s.data_offset + 4, &layers, 4);
    cases.push_back({"wrong layer count", b, "llama state"});
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    fl::SequenceCompressor comp;
    const fc::Status st =
        comp.compress_state(a.ctx, 0, c.blob.data(), c.blob.size(), keep(fc::Budget::ratio(0.2)), nullptr);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find(c.why), std::string::npos) << st.message();
    EXPECT_EQ(state_of(a), good);
  }
  // And decoding still works on the untouched sequence.
  EXPECT_EQ(static_cast<int>(next_logits(a, a.prompt.back()).size()), a.n_vocab);
}

// Query tails in llama.cpp: the queries QueryCapture takes from the prefill (cb_eval),
// against the keys of the sequence's state, give the tails that llama.cpp's own attention
// probabilities of the same prefill give (kq_soft_max, without flash attention); compressing
// with them keeps another set and decoding goes on; what does not fit is refused with the
// sequence unchanged.
TEST_F(LlamaCpp, QueryTailsFromThePrefillMatchLlamaCppsAttention) {
  const llama_vocab* vocab = llama_model_get_vocab(g_model);
  const std::vector<llama_token> prompt = ls::tokenize(vocab, test_prompt(), true);
  const auto n = static_cast<std::int64_t>(prompt.size());
  fl::QueryCapture capture;
  capture.begin(n);
  const std::int64_t kv_heads = llama_model_n_head_kv(g_model);
  AttentionProbe probe(&capture, n, std::max<std::int64_t>(0, n - fc::kTailLastQueries),
                       llama_model_n_head(g_model) / kv_heads, kv_heads);
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = 1024;
  cp.n_batch = cp.n_ubatch = 128;  // several ubatches: the capture counts positions across them
  cp.n_threads = cp.n_threads_batch = 1;
  cp.type_k = cp.type_v = GGML_TYPE_F32;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;  // the probabilities are a node of their own
  cp.cb_eval = AttentionProbe::eval;
  cp.cb_eval_user_data = &probe;
  Ctx a;
  a.ctx = llama_init_from_model(g_model, cp);
  ASSERT_NE(a.ctx, nullptr);
  ASSERT_EQ(ls::decode(a.ctx, prompt.data(), static_cast<int>(n), 0, 0, false), 0);
  ASSERT_TRUE(capture.status().ok()) << capture.status().message();
  ASSERT_TRUE(capture.complete());
  ASSERT_EQ(capture.layers(), llama_model_n_layer(g_model));
  ASSERT_EQ(probe.layers(), capture.layers());
  ASSERT_TRUE(probe.complete()) << probe.problem;
  EXPECT_EQ(capture.first_position(), probe.first);

  const std::vector<std::uint8_t> blob = state_of(a);
  fl::SeqState s;
  ASSERT_TRUE(fl::parse_seq_state(blob.data(), blob.size(), &s).ok());
  const std::vector<std::int32_t> order = fl::cells_by_position(s);
  // A prompt prefilled into an empty cache: position p in cell p, the probabilities' key index.
  for (std::int64_t p = 0; p < n; ++p) ASSERT_EQ(order[static_cast<std::size_t>(p)], p);
  const std::int64_t dim = static_cast<std::int64_t>(s.layers[0].k_embd) / kv_heads;
  fc::TailAccumulator acc;
  double first_layer = 0, worst = 0, largest = 0;
  for (int l = 0; l < capture.layers(); ++l) {
    std::vector<float> k(static_cast<std::size_t>(n * kv_heads * dim));
    fl::layer_to_float(blob.data(), s, static_cast<std::size_t>(l), fl::Part::k, order.data(),
                       static_cast<std::uint32_t>(n), k.data());
    const auto kv = fc::nhd<const float>(k.data(), fc::Tokens(n), fc::Heads(kv_heads), fc::HeadDim(dim));
    std::vector<float> ours(static_cast<std::size_t>(kv_heads * n), 0.0f);
    ASSERT_TRUE(acc.add(capture.layer(l), capture.first_position(), kv, nullptr, {ours.data(), kv_heads, n}).ok());
    const std::vector<float>& theirs = probe.tails[static_cast<std::size_t>(l)];
    double d = 0;
    for (std::size_t i = 0; i < ours.size(); ++i) d = std::max(d, std::fabs(static_cast<double>(ours[i]) - theirs[i]));
    worst = std::max(worst, d);
    for (float t : theirs) largest = std::max(largest, static_cast<double>(t));
    if (l == 0) {
      first_layer = d;
      // Query head 0's probabilities from captured row r against llama.cpp's row of position
      // first + r + offset, over the keys both see: aligned they agree, one row off they do not.
      const fc::KVView<const float> qc = capture.layer(0);
      const auto probability_gap = [&](std::int64_t offset) {
        double gap = 0;
        for (std::int64_t r = 0; r < qc.tokens; ++r) {
          const std::int64_t pos = capture.first_position() + r, pe = pos + offset;
          if (pe < probe.first || pe >= n) continue;
          std::vector<double> logit(static_cast<std::size_t>(pos + 1));
          for (std::int64_t j = 0; j <= pos; ++j) {
            double dot = 0;
            for (std::int64_t e = 0; e < dim; ++e) dot += static_cast<double>(qc(0, r, e)) * kv(0, j, e);
            logit[static_cast<std::size_t>(j)] = dot / std::sqrt(static_cast<double>(dim));
          }
          const double top = *std::max_element(logit.begin(), logit.end());
          double sum = 0;
          for (double x : logit) sum += std::exp(x - top);
          for (std::int64_t j = 0; j <= std::min(pos, pe); ++j)
            gap = std::max(gap, std::fabs(std::exp(logit[static_cast<std::size_t>(j)] - top) / sum -
                                          probe.head0_probability(pe, j)));
        }
        return gap;
      };
      const double aligned = probability_gap(0);
      const double shifted = probability_gap(1);
      EXPECT_GT(shifted, 10 * aligned) << "aligned probability gap " << aligned;
    }
  }
  // One runtime, one f32 cache: only the order of float sums differs (measured: 2e-7 at
  // layer 0, 2e-6 at most over the layers; a capture one position off is 0.04 away).
  EXPECT_LT(first_layer, 2e-5);
  EXPECT_LT(worst, 2e-5);
  EXPECT_GT(largest, 0.1);  // the comparison saw real attention

  // Compress with them: another keep-set than without, and decoding goes on.
  const std::vector<std::uint8_t> before = state_of(a);
  fl::SequenceCompressor comp;
  fl::CompactionStats st;
  fc::Status st_tail = comp.compress(a.ctx, 0, keep_with_tails(fc::Budget::ratio(0.3), &capture), &st);
  ASSERT_TRUE(st_tail.ok()) << st_tail.message();
  const std::vector<llama_pos> with_tails = comp.kept_positions();
  EXPECT_TRUE(st.query_tails);
  for (float x : next_logits(a, prompt.back())) ASSERT_TRUE(std::isfinite(x));
  // A second compression with the same capture is refused: the sequence is no longer the prompt.
  const std::vector<std::uint8_t> now = state_of(a);
  const fc::Status again = comp.compress(a.ctx, 0, keep_with_tails(fc::Budget::ratio(0.5), &capture), &st);
  EXPECT_FALSE(again.ok());
  EXPECT_NE(again.message().find("once, right after the prefill"), std::string::npos) << again.message();
  EXPECT_EQ(state_of(a), now);
  // The original again, compressed without queries: another set.
  ASSERT_TRUE(llama_memory_seq_rm(a.mem(), 0, -1, -1));
  ASSERT_EQ(llama_state_seq_set_data(a.ctx, before.data(), before.size(), 0), before.size());
  ASSERT_TRUE(comp.compress(a.ctx, 0, keep(fc::Budget::ratio(0.3)), &st).ok());
  EXPECT_FALSE(st.query_tails);
  EXPECT_NE(comp.kept_positions(), with_tails);
  // Options and capture must go together.
  const std::vector<std::uint8_t> small = state_of(a);
  EXPECT_FALSE(comp.compress(a.ctx, 0, keep_with_tails(fc::Budget::ratio(0.5), nullptr), &st).ok());
  fl::CompressParams capture_without_tails = keep(fc::Budget::ratio(0.5));
  capture_without_tails.queries = &capture;
  EXPECT_FALSE(comp.compress(a.ctx, 0, capture_without_tails, &st).ok());
  EXPECT_EQ(state_of(a), small);
}

TEST_F(LlamaCpp, RefusesASequenceThatMayShareCells) {
  Ctx a;
  make_ctx(&a, {GGML_TYPE_F16, LLAMA_FLASH_ATTN_TYPE_AUTO, "f16", 0}, 2, /*unified=*/true);
  llama_memory_seq_cp(a.mem(), 0, 1, -1, -1);
  const std::vector<std::uint8_t> before = state_of(a);
  const fc::Status s = fl::compress_sequence(a.ctx, 0, keep(fc::Budget::ratio(0.2)), nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("may share cells"), std::string::npos) << s.message();
  EXPECT_EQ(state_of(a), before);
}

#endif  // FLASHCACHE_HAVE_LLAMA
