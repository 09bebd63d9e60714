#pragma once
// The model the llama.cpp tests share: SmolLM2-135M loaded once per test suite,
// each test skipped with an install hint without it (or without llama.cpp).
#include <gtest/gtest.h>

#define FLASHCACHE_LLAMA_INSTALL_HINT                                                             \
  "llama.cpp not found at configure time: CMAKE_ARGS=-DLLAVA_BUILD=OFF python3 -m pip install " \
  "llama-cpp-python==0.3.36, then configure again (docs/LLAMA_CPP.md)"

#if FLASHCACHE_HAVE_LLAMA
#include <llama.h>

#include <string>

#include "find_model/find_model.hpp"
#include "session.hpp"

namespace llama_test {

inline llama_model* g_model = nullptr;

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
