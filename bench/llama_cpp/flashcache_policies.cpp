// flashcache_policies: one prompt prefilled once by llama.cpp, then every
// policy x keep ratio from that same prefilled sequence: restore the state,
// make the cache smaller, generate greedily. The passkey runs through llama.cpp
// (bench/stream/run_passkey_llama.py) use it: a prefill is most of a run's time.
//
//   flashcache_policies --prompt-file FILE --keep-ratios 0.1,0.2 --max-new 8
//
// Policies (--policies, comma-separated; all by default):
//   full        the prefilled cache as it is (once, whatever the ratios)
//   flashcache  the library's defaults (flashcache::llama::compress_default_params)
//   paper       the paper's algorithm (Options::paper())
//   query-tail  the defaults with the prompt's last queries (Options::with_query_tail)
//   streaming   StreamingLLM: the first --sink cells and the most recent ones, renumbered
// Prints one JSON object: prompt_tokens, prefill_ms, and rows of {policy,
// keep_ratio, cells_after, compress_ms, text} or {policy, keep_ratio, refused}
// (a refusal is reported and the next row goes on from the prefilled state).
#include <flashcache/llama.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "find_model/find_model.hpp"
#include "llama_session/session.hpp"
#include "text_io.hpp"

namespace fc = flashcache;
namespace fl = flashcache::llama;
namespace ls = llama_session;

namespace {

const char* kUsage =
    "usage: flashcache_policies [--model FILE.gguf] --prompt-file FILE --keep-ratios R[,R...]\n"
    "         [--policies full,flashcache,paper,query-tail,streaming] [--max-new N] [--sink N] [--threads N]\n";

const char* const kPolicies[] = {"full", "flashcache", "paper", "query-tail", "streaming"};

struct Args {
  std::string model, prompt_file;
  std::vector<std::string> policies{std::begin(kPolicies), std::end(kPolicies)};
  std::vector<double> ratios;
  int max_new = 8, threads = 2;
  long long sink = 4;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

bool known_policy(const std::string& p) {
  for (const char* k : kPolicies)
    if (p == k) return true;
  return false;
}

bool parse_args(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "-h" || k == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "flashcache_policies: %s needs a value\n%s", k.c_str(), kUsage);
      return false;
    }
    const std::string v = argv[++i];
    if (k == "--model" || k == "-m") {
      a->model = v;
    } else if (k == "--prompt-file") {
      a->prompt_file = v;
    } else if (k == "--policies") {
      a->policies = split(v);
    } else if (k == "--keep-ratios") {
      for (const std::string& r : split(v)) {
        char* end = nullptr;
        const double x = std::strtod(r.c_str(), &end);
        if (end == r.c_str() || *end != '\0' || !(x > 0 && x < 1)) {
          std::fprintf(stderr, "flashcache_policies: --keep-ratios takes ratios in (0, 1), not '%s'\n", r.c_str());
          return false;
        }
        a->ratios.push_back(x);
      }
    } else if (k == "--max-new") {
      a->max_new = std::atoi(v.c_str());
    } else if (k == "--threads" || k == "-t") {
      a->threads = std::atoi(v.c_str());
    } else if (k == "--sink") {
      a->sink = std::atoll(v.c_str());
    } else {
      std::fprintf(stderr, "flashcache_policies: unknown option %s\n%s", k.c_str(), kUsage);
      return false;
    }
  }
  for (const std::string& p : a->policies)
    if (!known_policy(p)) {
      std::fprintf(stderr, "flashcache_policies: unknown policy '%s'\n%s", p.c_str(), kUsage);
      return false;
    }
  if (a->prompt_file.empty() || a->ratios.empty() || a->max_new < 1 || a->threads < 1 || a->sink < 0) {
    std::fprintf(stderr, "flashcache_policies: --prompt-file and --keep-ratios are needed; --max-new and --threads "
                 "at least 1, --sink not negative\n%s", kUsage);
    return false;
  }
  return true;
}

// StreamingLLM on a prefilled sequence: keeps positions [0, sink) and the most
// recent cells up to `budget`, renumbered to follow the sink (a K-shift).
fc::Status streaming(llama_context* ctx, long long sink, long long budget, std::int64_t* cells_after) {
  llama_memory_t mem = llama_get_memory(ctx);
  const llama_pos end = llama_memory_seq_pos_max(mem, 0) + 1;
  if (budget <= sink || budget >= end)
    return fc::make_error(fc::Errc::invalid_budget, "streaming: a budget of ", budget, " cells for ", end,
                          " positions and a sink of ", sink);
  // A sliding-window model's sliding layers read the last n_swa positions: kept, as flashcache keeps them.
  const llama_pos n_swa = llama_model_n_swa(llama_get_model(ctx));
  if (n_swa > 0 && budget - sink < n_swa)
    return fc::make_error(fc::Errc::invalid_budget, "streaming: keep budget ", budget, " cannot hold the sink (",
                          sink, ") and the sliding window's ", n_swa, " cells");
  const llama_pos from = static_cast<llama_pos>(sink), to = end - static_cast<llama_pos>(budget - sink);
  if (!llama_memory_seq_rm(mem, 0, from, to))
    return fc::make_error(fc::Errc::unsupported, "streaming: llama_memory_seq_rm refused [", from, ", ", to, ")");
  llama_memory_seq_add(mem, 0, to, -1, -(to - from));
  *cells_after = budget;
  return fc::Status::success();
}

struct Row {
  std::string policy, text, refused;
  double keep_ratio = 1, compress_ms = 0;
  std::int64_t cells_after = 0;
};

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!parse_args(argc, argv, &a)) return 2;
  if (a.model.empty()) a.model = fc::model_finder::find_default_model();
  if (a.model.empty()) {
    std::fprintf(stderr, "flashcache_policies: no model; %s\n", fc::model_finder::model_install_hint().c_str());
    return 2;
  }
  std::string text;
  if (!text_io::read_file(a.prompt_file, &text) || text.empty()) {
    std::fprintf(stderr, "flashcache_policies: cannot read %s, or it is empty\n", a.prompt_file.c_str());
    return 2;
  }
  ls::init(true);
  llama_model* model = llama_model_load_from_file(a.model.c_str(), ls::model_params());
  if (model == nullptr) {
    std::fprintf(stderr, "flashcache_policies: cannot load %s\n", a.model.c_str());
    return 1;
  }
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const int n_vocab = llama_vocab_n_tokens(vocab);
  const std::vector<llama_token> prompt = ls::tokenize(vocab, text, /*add_special=*/true);
  const int n_prompt = static_cast<int>(prompt.size());

  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>((n_prompt + a.max_new + 8 + 255) / 256 * 256);
  cp.n_batch = 2048;
  cp.n_ubatch = 512;
  cp.n_seq_max = 1;
  cp.n_threads = cp.n_threads_batch = a.threads;
  // The prompt's last queries, for the query-tail rows; without them llama.cpp is asked for nothing.
  const bool tails = std::find(a.policies.begin(), a.policies.end(), "query-tail") != a.policies.end();
  fl::QueryCapture capture;
  if (tails) {
    capture.begin(n_prompt);
    cp.cb_eval = fl::QueryCapture::eval;
    cp.cb_eval_user_data = &capture;
  }
  llama_context* ctx = llama_init_from_model(model, cp);
  if (ctx == nullptr) {
    std::fprintf(stderr, "flashcache_policies: cannot make a context of %u cells\n", cp.n_ctx);
    llama_model_free(model);
    return 1;
  }

  std::vector<float> logits;
  const double t0 = ls::now_ms();
  int rc = ls::decode(ctx, prompt.data(), n_prompt, 0, 0, false, &logits);
  const double prefill_ms = ls::now_ms() - t0;
  const llama_token first = rc == 0 ? ls::argmax(logits.data(), n_vocab) : 0;
  const fl::QueryCapture prefill_queries = capture;  // generation below decodes more queries into `capture`
  std::vector<std::uint8_t> prefilled;
  if (rc == 0 && !fl::detail::read_state_blob(ctx, 0, &prefilled)) rc = 1;
  if (rc != 0) std::fprintf(stderr, "flashcache_policies: the prefill failed\n");

  std::vector<Row> rows;
  llama_memory_t mem = llama_get_memory(ctx);
  for (const std::string& policy : a.policies) {
    for (double ratio : a.ratios) {
      if (rc != 0) break;
      Row row;
      row.policy = policy;
      row.keep_ratio = policy == "full" ? 1.0 : ratio;
      llama_memory_seq_rm(mem, 0, -1, -1);
      if (llama_state_seq_set_data(ctx, prefilled.data(), prefilled.size(), 0) != prefilled.size()) {
        std::fprintf(stderr, "flashcache_policies: restoring the prefilled state failed\n");
        rc = 1;
        break;
      }
      capture = prefill_queries;
      fc::Status st = fc::Status::success();
      const double c0 = ls::now_ms();
      if (policy == "streaming") {
        st = streaming(ctx, a.sink, std::llround(ratio * n_prompt), &row.cells_after);
      } else if (policy != "full") {
        fl::CompressParams params = fl::compress_default_params();
        params.budget = fc::Budget::ratio(ratio);
        if (policy == "paper") params.options = fc::Options::paper();
        if (policy == "query-tail") {
          params.options = fc::Options::with_query_tail(params.options);
          params.queries = &capture;
        }
        fl::CompactionStats stats;
        fl::SequenceCompressor compressor;
        st = compressor.compress(ctx, 0, params, &stats);
        row.cells_after = stats.cells_after;
      } else {
        row.cells_after = n_prompt;
      }
      row.compress_ms = ls::now_ms() - c0;
      if (!st) {
        row.refused = st.message();
        rows.push_back(row);
        continue;
      }
      capture.pause();
      llama_token next = first;
      for (int i = 0; i < a.max_new && !llama_vocab_is_eog(vocab, next); ++i) {
        row.text += ls::piece(vocab, next);
        const llama_pos pos = llama_memory_seq_pos_max(mem, 0) + 1;
        if (ls::decode(ctx, &next, 1, pos, 0, false, &logits) != 0) {
          std::fprintf(stderr, "flashcache_policies: decode failed at position %d\n", pos);
          rc = 1;
          break;
        }
        next = ls::argmax(logits.data(), n_vocab);
      }
      rows.push_back(row);
      if (policy == "full") break;  // one full row, whatever the ratios
    }
  }

  if (rc == 0) {
    std::printf("{\"prompt_tokens\": %d, \"prefill_ms\": %.3f, \"rows\": [", n_prompt, prefill_ms);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::printf("%s{\"policy\": \"%s\", \"keep_ratio\": %.4f, ", i ? ", " : "", r.policy.c_str(), r.keep_ratio);
      if (!r.refused.empty())
        std::printf("\"refused\": %s}", text_io::json_string(r.refused).c_str());
      else
        std::printf("\"cells_after\": %lld, \"compress_ms\": %.3f, \"text\": %s}", static_cast<long long>(r.cells_after),
                    r.compress_ms, text_io::json_string(r.text).c_str());
    }
    std::printf("]}\n");
  }
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return rc;
}
