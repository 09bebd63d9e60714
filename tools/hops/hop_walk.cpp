// One call of flashcache::llama::compress_sequence, walked: every function the
// call enters is logged by -finstrument-functions (the project's headers only,
// see hops.sh), as a (call site, function) pair with how often it ran; hops.py
// maps both to files and counts the calls that cross from one file into another.
//
//   hop_walk OUT.txt [prompt tokens, default 256]
#include <flashcache/llama.hpp>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "find_model/find_model.hpp"
#include "llama_session/session.hpp"

namespace {

bool g_recording = false;
std::map<std::pair<void*, void*>, unsigned long long>* g_edges = nullptr;  // (call site, function): calls

}  // namespace

extern "C" {
__attribute__((no_instrument_function)) void __cyg_profile_func_enter(void* fn, void* call_site) {
  if (g_recording && g_edges != nullptr) ++(*g_edges)[{call_site, fn}];
}
__attribute__((no_instrument_function)) void __cyg_profile_func_exit(void*, void*) {}
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: hop_walk OUT.txt [prompt tokens]\n");
    return 2;
  }
  const int n = argc > 2 ? std::atoi(argv[2]) : 256;
  const std::string path = flashcache::model_finder::find_default_model();
  if (path.empty()) {
    std::fprintf(stderr, "hop_walk: no model; %s\n", flashcache::model_finder::model_install_hint().c_str());
    return 2;
  }
  llama_session::init(true);
  llama_model* model = llama_model_load_from_file(path.c_str(), llama_session::model_params());
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = 512;
  cp.n_batch = cp.n_ubatch = 512;
  cp.n_seq_max = 1;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (model == nullptr || ctx == nullptr) return 1;
  std::vector<llama_token> prompt(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) prompt[static_cast<std::size_t>(i)] = 100 + (i * 37) % 5000;
  if (llama_session::decode(ctx, prompt.data(), n, 0, 0, false) != 0) return 1;

  std::map<std::pair<void*, void*>, unsigned long long> edges;
  g_edges = &edges;
  flashcache::llama::CompressParams p = flashcache::llama::compress_default_params();
  flashcache::llama::CompactionStats st;
  g_recording = true;
  const flashcache::Status s = flashcache::llama::compress_sequence(ctx, 0, p, &st);
  g_recording = false;
  if (!s) {
    std::fprintf(stderr, "hop_walk: %s\n", s.message().c_str());
    return 1;
  }
  std::FILE* f = std::fopen(argv[1], "w");
  if (f == nullptr) return 1;
  for (const auto& e : edges) std::fprintf(f, "%p %p %llu\n", e.first.first, e.first.second, e.second);
  std::fclose(f);
  std::printf("%zu call edges, %lld layers, %lld -> %lld cells\n", edges.size(), static_cast<long long>(st.layers),
              static_cast<long long>(st.cells_before), static_cast<long long>(st.cells_after));
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
