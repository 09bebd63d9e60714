// The engine against the numpy reference (tools/smollm2) on the
// real SmolLM2 model: token ids, logits, greedy tokens with the full cache, and
// decoding over a compressed cache. Expected values: data/reference.json, written
// once by make_reference.py. Skips when the model package is not installed.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <memory>

#include "engine_runtime/compress_cache.hpp"
#include "find_model/find_model.hpp"
#include "engine_runtime/generate.hpp"
#include "engine_runtime/tokenizer.hpp"

namespace {

using nlohmann::json;

// One thread: OpenMP barriers on a loaded 2-core CI machine cost more than the second core gains.
constexpr int kThreads = 1;

struct Loaded {
  engine::GgufFile gguf;
  std::unique_ptr<engine::Model> model;
  std::unique_ptr<engine::Tokenizer> tok;
  json ref;
};

// Loaded once for all tests; null when the model package is absent.
const Loaded* loaded() {
  static std::unique_ptr<Loaded> cached = [] {
    const std::string path = flashcache::model_finder::find_default_model();
    if (path.empty()) return std::unique_ptr<Loaded>();
    auto l = std::make_unique<Loaded>();
    l->gguf = engine::load_gguf(path);
    l->model = std::make_unique<engine::Model>(l->gguf);
    l->tok = std::make_unique<engine::Tokenizer>(l->gguf);
    std::ifstream in(ENGINE_TEST_DATA "/reference.json");
    l->ref = json::parse(in);
    return l;
  }();
  return cached.get();
}

#define REQUIRE_MODEL()       \
  const Loaded* L = loaded(); \
  if (L == nullptr) GTEST_SKIP() << "the SmolLM2 model is not installed; " << flashcache::model_finder::model_install_hint()

// |engine - numpy| <= 1e-3 relative (to max(1, |numpy|)) on the reference's top-20 logits.
double worst_relative_error(const std::vector<float>& logits, const json& top) {
  double worst = 0;
  for (std::size_t j = 0; j < top["ids"].size(); ++j) {
    const double want = top["logits"][j].get<double>();
    const double got = logits[top["ids"][j].get<std::size_t>()];
    worst = std::max(worst, std::abs(got - want) / std::max(1.0, std::abs(want)));
  }
  return worst;
}

std::vector<int> prompt_ids(const Loaded& L) { return L.ref["prompt_ids"].get<std::vector<int>>(); }

// The reference prompt prefilled once for all tests, in pieces that end at each
// reference position, so that each piece's last logits can be checked.
struct Prefilled {
  engine::KVCache cache;                      // room for kRoom more tokens
  std::vector<std::vector<float>> logits_at;  // at the reference positions; the last is the prompt's last token
};
constexpr int kRoom = 32;

const Prefilled& prefilled(const Loaded& L) {
  static std::unique_ptr<Prefilled> cached = [&L] {
    const auto ids = prompt_ids(L);
    auto p = std::make_unique<Prefilled>();
    p->cache = engine::KVCache(L.model->config(), static_cast<std::int64_t>(ids.size()) + kRoom);
    engine::Workspace ws;
    std::int64_t done = 0;
    for (const auto& at : L.ref["logits"]) {
      const auto pos = at["position"].get<std::int64_t>();
      p->logits_at.emplace_back(static_cast<std::size_t>(L.model->config().vocab));
      L.model->forward(ids.data() + done, pos + 1 - done, p->cache, ws, kThreads, p->logits_at.back().data());
      done = pos + 1;
    }
    EXPECT_EQ(done, static_cast<std::int64_t>(ids.size()));
    return p;
  }();
  return *cached;
}

TEST(EngineTokenizer, SameIdsAsPythonOnAwkwardStrings) {
  REQUIRE_MODEL();
  for (const auto& c : L->ref["tokenizer"]) {
    const auto text = c["text"].get<std::string>();
    EXPECT_EQ(L->tok->encode(text), c["ids"].get<std::vector<int>>()) << "text: " << text;
    EXPECT_EQ(L->tok->decode(L->tok->encode(text)), text);
  }
}

TEST(EngineTokenizer, SameIdsAsTheFixturePrompt) {
  REQUIRE_MODEL();
  std::ifstream in(ENGINE_FIXTURES "/smollm2_prompt/meta.json");
  const json meta = json::parse(in);
  const auto ids = L->tok->encode(meta["prompt"].get<std::string>());
  const auto want = meta["token_ids"].get<std::vector<int>>();
  const auto n = meta["prompt_range"][1].get<std::size_t>();
  ASSERT_EQ(ids.size(), n);
  EXPECT_TRUE(std::equal(ids.begin(), ids.end(), want.begin()));
  // The chat template comes from the GGUF: its default system prompt is the fixture's.
  EXPECT_EQ(meta["prompt"].get<std::string>().rfind(L->tok->chat("").substr(0, 60), 0), 0u);
}

TEST(EngineTokenizer, RefusesInvalidUtf8) {
  REQUIRE_MODEL();
  EXPECT_THROW(L->tok->encode(std::string("ok \xC3\x28 bad")), std::invalid_argument);
  EXPECT_THROW(L->tok->encode(std::string("\xED\xA0\x80")), std::invalid_argument);  // a surrogate
}

TEST(EngineModel, LogitsMatchNumpy) {
  REQUIRE_MODEL();
  const Prefilled& p = prefilled(*L);
  for (std::size_t j = 0; j < p.logits_at.size(); ++j) {
    const json& at = L->ref["logits"][j];
    const double err = worst_relative_error(p.logits_at[j], at);
    EXPECT_LE(err, 1e-3) << "position " << at["position"];
    std::printf("position %d: max relative logit error %.2e\n", at["position"].get<int>(), err);
  }
}

TEST(EngineModel, GreedyTokensMatchNumpyWithTheFullCache) {
  REQUIRE_MODEL();
  const auto ids = prompt_ids(*L);
  const auto want = L->ref["greedy_full"].get<std::vector<int>>();
  ASSERT_LE(want.size(), static_cast<std::size_t>(kRoom));
  engine::KVCache cache = prefilled(*L).cache;
  engine::Workspace ws;
  const auto& logits = prefilled(*L).logits_at.back();
  EXPECT_EQ(engine::greedy(*L->model, logits, static_cast<int>(want.size()), cache, ws, kThreads), want);
}

// The library's streaming policy keeps the same tokens as the numpy reference's
// hand-made cache (first `sink`, last budget - sink); decoding over both agrees.
TEST(EngineModel, CompressedDecodeMatchesNumpyGather) {
  REQUIRE_MODEL();
  const auto ids = prompt_ids(*L);
  const json& c = L->ref["compressed"];
  const auto budget = c["budget"].get<std::int64_t>();
  const auto want_kept = c["kept"].get<std::vector<int>>();
  const auto want_tokens = c["tokens"].get<std::vector<int>>();
  engine::KVCache cache = prefilled(*L).cache;
  engine::Workspace ws;
  const auto& logits = prefilled(*L).logits_at.back();

  engine::CompressSettings s;
  s.policy = "streaming";
  s.keep_ratio = static_cast<double>(budget) / static_cast<double>(ids.size());
  s.sink = c["sink"].get<std::int64_t>();
  s.uniform = true;
  s.room = static_cast<std::int64_t>(want_tokens.size());
  const auto budgets = engine::compress_cache(cache, s);
  ASSERT_EQ(budgets.size(), static_cast<std::size_t>(cache.layers()));
  for (const auto b : budgets) ASSERT_EQ(b, budget);
  for (int l = 0; l < cache.layers(); ++l)
    for (int h = 0; h < cache.kv_heads(); ++h)
      for (std::int64_t j = 0; j < budget; ++j)
        ASSERT_EQ(cache.position(l, h, j), want_kept[static_cast<std::size_t>(j)]) << l << " " << h << " " << j;
  EXPECT_EQ(cache.next_position, static_cast<std::int64_t>(ids.size()));

  std::vector<std::vector<float>> chosen_by;
  const auto tokens =
      engine::greedy(*L->model, logits, static_cast<int>(want_tokens.size()), cache, ws, kThreads, {}, &chosen_by);
  EXPECT_EQ(tokens, want_tokens);
  for (std::size_t step = 0; step < chosen_by.size(); ++step)
    EXPECT_LE(worst_relative_error(chosen_by[step], c["logits"][step]), 1e-3) << "step " << step;
}

// FlashCache's per-head selection: decoding over the cache compress_cache builds
// equals decoding over a cache gathered here, row by row, from the full one.
TEST(EngineModel, FlashcacheDecodeEqualsAHandGatheredCache) {
  REQUIRE_MODEL();
  const auto ids = prompt_ids(*L);
  constexpr int kSteps = 6;
  const engine::KVCache& full = prefilled(*L).cache;
  engine::Workspace ws;
  const auto& logits = prefilled(*L).logits_at.back();
  engine::KVCache compact = full;
  engine::CompressSettings s;
  s.keep_ratio = 0.3;
  s.sink = 4;
  s.window = 16;
  s.room = kSteps;
  const auto budgets = engine::compress_cache(compact, s);

  std::vector<std::int64_t> capacity;
  for (auto b : budgets) capacity.push_back(b + kSteps);
  engine::KVCache gathered(L->model->config(), capacity);
  bool heads_differ = false;
  for (int l = 0; l < full.layers(); ++l) {
    for (int h = 0; h < full.kv_heads(); ++h)
      for (std::int64_t j = 0; j < budgets[static_cast<std::size_t>(l)]; ++j) {
        const int t = compact.position(l, h, j);
        ASSERT_TRUE(t >= 0 && t < static_cast<int>(ids.size()));
        if (j > 0) {
          ASSERT_LT(compact.position(l, h, j - 1), t);
        }
        heads_differ = heads_differ || t != compact.position(l, 0, j);
        std::copy_n(full.k(l, h, t), full.head_dim(), gathered.k(l, h, j));
        std::copy_n(full.v(l, h, t), full.head_dim(), gathered.v(l, h, j));
        gathered.position(l, h, j) = t;
      }
    gathered.set_length(l, budgets[static_cast<std::size_t>(l)]);
  }
  gathered.next_position = full.next_position;
  EXPECT_TRUE(heads_differ) << "every KV head kept the same tokens: per-head selection untested";
  EXPECT_LT(compact.bytes_in_use(), full.bytes_in_use() * 31 / 100 + 1);

  std::vector<std::vector<float>> a, b;
  const auto ta = engine::greedy(*L->model, logits, kSteps, compact, ws, kThreads, {}, &a);
  const auto tb = engine::greedy(*L->model, logits, kSteps, gathered, ws, kThreads, {}, &b);
  EXPECT_EQ(ta, tb);
  // The caches hold bit-identical rows, but Eigen's vectorised sums start at
  // each buffer's alignment, so the order of additions (and the last bits of
  // the logits) may differ between two allocations.
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].size(), b[i].size());
    for (std::size_t j = 0; j < a[i].size(); ++j)
      ASSERT_NEAR(a[i][j], b[i][j], 1e-4f * (1.0f + std::fabs(a[i][j]))) << "step " << i << " logit " << j;
  }
}

// Layers scored on several threads keep the same budgets and tokens as on one.
TEST(EngineModel, CompressionThreadsKeepTheSameTokens) {
  REQUIRE_MODEL();
  const engine::KVCache& full = prefilled(*L).cache;
  engine::CompressSettings s;
  s.keep_ratio = 0.3;
  engine::KVCache one = full;
  const auto budgets = engine::compress_cache(one, s);
  for (int threads : {2, 3}) {
    s.threads = threads;
    engine::KVCache many = full;
    EXPECT_EQ(engine::compress_cache(many, s), budgets) << threads << " threads";
    for (int l = 0; l < full.layers(); ++l)
      for (int h = 0; h < full.kv_heads(); ++h)
        for (std::int64_t j = 0; j < budgets[static_cast<std::size_t>(l)]; ++j)
          ASSERT_EQ(many.position(l, h, j), one.position(l, h, j)) << threads << " threads, layer " << l;
  }
}

// Query tails gathered during a chunked prefill (PromptTails as the forward pass's observer)
// are the tails of the whole prompt's queries at once, recomputed here from a second forward
// pass that keeps every layer's queries; compressing with them changes what is kept.
TEST(EngineModel, PrefillQueryTailsMatchTheWholePromptAndChangeTheKeepSet) {
  REQUIRE_MODEL();
  auto ids = prompt_ids(*L);
  ids.resize(std::min<std::size_t>(ids.size(), 150));  // two prefills of this: keep sanitizer builds quick
  const auto n = static_cast<std::int64_t>(ids.size());
  const engine::ModelConfig& c = L->model->config();
  struct Keep : engine::QueryObserver {  // every layer's queries of one whole-prompt pass
    std::vector<std::vector<float>> q;
    void layer_queries(int l, const float* qp, std::int64_t rows, const engine::KVCache& cache) override {
      if (q.size() <= static_cast<std::size_t>(l)) q.resize(static_cast<std::size_t>(l) + 1);
      q[static_cast<std::size_t>(l)].assign(qp, qp + rows * cache.config().heads * cache.config().head_dim);
    }
  } keep;
  engine::Workspace ws;
  engine::KVCache whole(c, n + kRoom), chunked(c, n + kRoom);
  std::vector<float> logits(static_cast<std::size_t>(c.vocab));
  L->model->forward(ids.data(), n, whole, ws, kThreads, logits.data(), false, &keep);
  engine::PromptTails tails;
  (void)engine::prefill(*L->model, ids, chunked, ws, kThreads, 37, {}, &tails);
  ASSERT_EQ(tails.layers(), c.layers);
  flashcache::TailAccumulator acc;
  for (int l = 0; l < c.layers; ++l) {
    std::vector<float> want(static_cast<std::size_t>(c.kv_heads * (n + kRoom)), 0.0f);
    const flashcache::KVView<const float> qv(keep.q[static_cast<std::size_t>(l)].data(), c.heads, n, c.head_dim,
                                             c.head_dim, c.heads * c.head_dim);
    const flashcache::KVView<const float> kv(whole.k(l, 0, 0), c.kv_heads, n, c.head_dim,
                                             whole.capacity(l) * c.head_dim, c.head_dim);
    ASSERT_TRUE(acc.add(qv, 0, kv, nullptr, {want.data(), c.kv_heads, n + kRoom}).ok());
    const auto got = tails.layer(l, c.kv_heads);
    for (int h = 0; h < c.kv_heads; ++h)
      for (std::int64_t j = 0; j < n; ++j)
        ASSERT_NEAR(got(h, j), want[static_cast<std::size_t>(h * (n + kRoom) + j)], 1e-4) << l << " " << h << " " << j;
  }
  engine::CompressSettings s;
  s.keep_ratio = 0.2;
  engine::KVCache with_tails = chunked, without = chunked;
  (void)engine::compress_cache(with_tails, s, &tails);
  (void)engine::compress_cache(without, s);
  bool differ = false;
  for (int l = 0; l < c.layers && !differ; ++l)
    for (std::int64_t j = 0; j < std::min(with_tails.length(l), without.length(l)) && !differ; ++j)
      differ = with_tails.position(l, 0, j) != without.position(l, 0, j);
  EXPECT_TRUE(differ) << "the query tails changed no kept token";
  s.policy = "knorm";
  engine::KVCache other = chunked;
  EXPECT_THROW(engine::compress_cache(other, s, &tails), flashcache::Error);
  tails.reset(flashcache::last_queries(n));  // ready for the next prompt: zeros
  for (int l = 0; l < c.layers; ++l) {
    const auto t = tails.layer(l, c.kv_heads);
    for (std::int64_t j = 0; j < t.heads * t.tokens; ++j) ASSERT_EQ(t.data[j], 0.0f);
  }
}

TEST(EngineModel, TeacherForcedNllEqualsStepwiseDecoding) {
  REQUIRE_MODEL();
  const std::vector<int> ids = {1, 9690, 198, 2683, 359};
  const std::vector<int> cont = {253, 5356, 281, 216};
  engine::KVCache a(L->model->config(), 16), b(L->model->config(), 16);
  engine::Workspace ws;
  const auto logits = engine::prefill(*L->model, ids, a, ws, kThreads);
  engine::prefill(*L->model, ids, b, ws, kThreads);
  const auto nll = engine::continuation_nll(*L->model, logits, cont, a, ws, kThreads);
  std::vector<float> step = logits;
  for (std::size_t i = 0; i < cont.size(); ++i) {
    double sum = 0;
    const float mx = *std::max_element(step.begin(), step.end());
    for (float x : step) sum += std::exp(static_cast<double>(x - mx));
    EXPECT_NEAR(nll[i], std::log(sum) - (step[static_cast<std::size_t>(cont[i])] - mx), 1e-4);
    L->model->forward(&cont[i], 1, b, ws, kThreads, step.data());
  }
}

TEST(EngineModel, FullCacheAndBadRequestsAreRefused) {
  REQUIRE_MODEL();
  engine::KVCache cache(L->model->config(), 2);
  engine::Workspace ws;
  std::vector<float> logits(static_cast<std::size_t>(L->model->config().vocab));
  const int ids[3] = {1, 2, 3};
  EXPECT_THROW(L->model->forward(ids, 3, cache, ws, 1, logits.data()), std::length_error);
  const int bad = L->model->config().vocab;
  EXPECT_THROW(L->model->forward(&bad, 1, cache, ws, 1, logits.data()), std::out_of_range);
  L->model->forward(ids, 2, cache, ws, 1, logits.data());
  engine::CompressSettings s;
  s.policy = "snapkv";
  EXPECT_THROW(engine::compress_cache(cache, s), flashcache::Error);
  s.policy = "nope";
  EXPECT_THROW(engine::compress_cache(cache, s), flashcache::Error);
}

TEST(EngineModel, TruncatedModelFileIsRefusedByName) {
  REQUIRE_MODEL();
  std::ifstream in(flashcache::model_finder::find_default_model(), std::ios::binary);
  std::vector<std::uint8_t> head(1 << 20);
  in.read(reinterpret_cast<char*>(head.data()), static_cast<std::streamsize>(head.size()));
  try {
    engine::parse_gguf(head.data(), head.size());
    FAIL() << "a 1 MiB prefix of the model parsed";
  } catch (const engine::GgufError& e) {
    EXPECT_TRUE(e.code() == engine::GgufErrc::truncated || e.code() == engine::GgufErrc::absurd_count ||
                e.code() == engine::GgufErrc::tensor_out_of_range)
        << e.what();
  }
}

}  // namespace
