#pragma once
// The model the llama.cpp tests share: SmolLM2-135M loaded once per test suite,
// each test skipped with an install hint without it (or without llama.cpp).
#include <gtest/gtest.h>

#define FLASHCACHE_LLAMA_INSTALL_HINT                                                           \
  "llama.cpp not found at configure time: CMAKE_ARGS=-DLLAVA_BUILD=OFF python3 -m pip install " \
  "llama-cpp-python==0.3.36, then configure again (docs/LLAMA_CPP.md)"

#if FLASHCACHE_HAVE_LLAMA
#include <llama.h>

#include <flashcache/llama.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "find_model/find_model.hpp"
#include "llama_session/session.hpp"

// The names every llama test file uses.
namespace fc = flashcache;
namespace fl = flashcache::llama;
namespace ls = llama_session;

namespace llama_test {

inline llama_model* g_model = nullptr;

// A llama.cpp context the test owns.
struct Ctx {
  llama_context* ctx = nullptr;
  Ctx() = default;
  Ctx(const Ctx&) = delete;
  Ctx& operator=(const Ctx&) = delete;
  ~Ctx() {
    if (ctx != nullptr) llama_free(ctx);
  }
  llama_memory_t mem() const { return llama_get_memory(ctx); }
};

// Sequence seq's state, as llama_state_seq_get_data writes it.
inline std::vector<std::uint8_t> state_of(const Ctx& c, llama_seq_id seq = 0) {
  std::vector<std::uint8_t> b(llama_state_seq_get_size(c.ctx, seq));
  EXPECT_EQ(llama_state_seq_get_data(c.ctx, b.data(), b.size(), seq), b.size());
  return b;
}

// Running text of about `sentences` x 22 tokens (a ledger of shipments), different per seed.
inline std::vector<llama_token> ledger_tokens(int sentences, int seed = 0) {
  std::string p;
  for (int i = 0; i < sentences; ++i)
    p += "Note " + std::to_string((i * 7 + seed * 3) % 31) + " of the ledger says that shipment " +
         std::to_string(i + 100 * seed) + " left the harbour on day " + std::to_string((i * 5 + seed) % 29) + ". ";
  return llama_session::tokenize(llama_model_get_vocab(g_model), p, true);
}

// Rows of K and V by position: each layer's K row, then its V row (a transposed V
// gathered element by element).
using Rows = std::map<std::int32_t, std::vector<std::uint8_t>>;

// An archive's rows by position.
inline Rows archived_rows(const flashcache::Archive& a) {
  Rows out;
  const auto k = static_cast<std::size_t>(a.shape().k_row_bytes()),
             v = static_cast<std::size_t>(a.shape().v_row_bytes());
  for (std::int64_t t = 0; t < a.tokens(); ++t) {
    std::vector<std::uint8_t>& r = out[a.positions()[t]];
    for (int l = 0; l < a.shape().layers; ++l) {
      r.insert(r.end(), a.k_row(l, t), a.k_row(l, t) + k);
      r.insert(r.end(), a.v_row(l, t), a.v_row(l, t) + v);
    }
  }
  return out;
}

// A state's cells' rows by position (a sliding-window model's: its global layers').
inline Rows state_rows(const std::vector<std::uint8_t>& blob,
                       flashcache::llama::StateSections sections = flashcache::llama::StateSections::one) {
  flashcache::llama::SeqState s;
  EXPECT_TRUE(flashcache::llama::parse_seq_state(blob.data(), blob.size(), &s, sections).ok());
  Rows out;
  for (std::uint32_t i = 0; i < s.cell_count; ++i) {
    std::vector<std::uint8_t>& r = out[s.pos[i]];
    for (std::size_t l = 0; l < s.layers.size(); ++l) {
      const flashcache::llama::LayerState& L = s.layers[l];
      const std::uint8_t* k = flashcache::llama::detail::cell_k(blob.data(), s, l, i);
      const std::uint8_t* v = flashcache::llama::detail::cell_v(blob.data(), s, l, i);
      r.insert(r.end(), k, k + L.k_row_bytes);
      if (!s.v_trans) {
        r.insert(r.end(), v, v + L.v_row_bytes);
        continue;
      }
      for (std::uint64_t j = 0; j < L.v_embd; ++j, v += flashcache::llama::detail::cell_v_step(s, l))
        r.insert(r.end(), v, v + L.v_elem_bytes);
    }
  }
  return out;
}

// Derive a suite from it: class LlamaXyz : public llama_test::ModelTest {};
class ModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = flashcache::model_finder::find_default_model();
    if (path.empty()) return;
    llama_session::init(true, /*watch_n_kv=*/true);  // some tests read the highest used cell
    g_model = llama_model_load_from_file(path.c_str(), llama_session::model_params());
  }
  static void TearDownTestSuite() {
    if (g_model != nullptr) llama_model_free(g_model);
    g_model = nullptr;
  }
  void SetUp() override {
    if (g_model == nullptr) GTEST_SKIP() << "no SmolLM2 GGUF: " << flashcache::model_finder::model_install_hint();
  }
};

}  // namespace llama_test
#endif
