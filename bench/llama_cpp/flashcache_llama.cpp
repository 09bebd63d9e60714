// flashcache_llama: llama.cpp prefills a prompt, FlashCache evicts and compacts
// the sequence's KV cells through llama.cpp's public API
// (flashcache/llama.hpp), and decoding goes on greedily over the kept cells,
// measured: n_kv, the times, the continuation's NLL (docs/LLAMA_CPP.md).
//
//   flashcache_llama --prompt-file FILE --keep-ratio 0.2 --max-new 64 --json
//
// Without --keep-ratio nothing is compressed (the baseline). --json prints one
// object: prompt_tokens, cells_before, cells_after, n_kv_after, prefill_ms,
// compress_ms, decode_tokens_per_s, kv_bytes_before, kv_bytes_after, tokens,
// text (and nll when --nll-file is given).
#include <flashcache/llama.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "find_model/find_model.hpp"
#include "measure.hpp"
#include "run_report.hpp"
#include "llama_session/session.hpp"
#include "text_io.hpp"

namespace fc = flashcache;
namespace ls = llama_session;

namespace {

struct Args {
  std::string model, prompt, prompt_file, nll_file, cache_type = "f16", flash_attn = "auto";
  bool chat = false, json = false, quiet = false, extra_bufts = false, query_tail = false;
  int max_new = 32, threads = 2, recompress_every = 0;
  double keep_ratio = -1;
  long long sink = -1, window = -1;
  std::string combine = "mean_normalized";
};

const char* kUsage =
    "usage: flashcache_llama [--model FILE.gguf] (--prompt TEXT | --prompt-file FILE) [--chat]\n"
    "         [--max-new N] [--keep-ratio R] [--sink N] [--window N] [--recompress-every N]\n"
    "         [--combine mean_normalized|max_normalized|votes] [--cache-type f16|f32|bf16|q8_0]\n"
    "         [--flash-attn auto|on|off] [--threads N] [--nll-file FILE] [--extra-bufts] [--json] [--quiet]\n"
    "         [--query-tail]   (score the first compression with the prompt's query tails)\n";

bool parse_args(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= argc) return false;
      *out = argv[++i];
      return true;
    };
    std::string v;
    if (k == "--chat") {
      a->chat = true;
    } else if (k == "--extra-bufts") {
      a->extra_bufts = true;
    } else if (k == "--json") {
      a->json = true;
    } else if (k == "--query-tail") {
      a->query_tail = true;
    } else if (k == "--quiet") {
      a->quiet = true;
    } else if (k == "-h" || k == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (!value(&v)) {
      std::fprintf(stderr, "flashcache_llama: %s needs a value (or is unknown)\n%s", k.c_str(), kUsage);
      return false;
    } else if (k == "--model") {
      a->model = v;
    } else if (k == "--prompt") {
      a->prompt = v;
    } else if (k == "--prompt-file") {
      a->prompt_file = v;
    } else if (k == "--nll-file") {
      a->nll_file = v;
    } else if (k == "--cache-type") {
      a->cache_type = v;
    } else if (k == "--flash-attn") {
      a->flash_attn = v;
    } else if (k == "--combine") {
      a->combine = v;
    } else if (k == "--max-new") {
      a->max_new = std::atoi(v.c_str());
    } else if (k == "--threads") {
      a->threads = std::atoi(v.c_str());
    } else if (k == "--recompress-every") {
      a->recompress_every = std::atoi(v.c_str());
    } else if (k == "--keep-ratio") {
      a->keep_ratio = std::atof(v.c_str());
    } else if (k == "--sink") {
      a->sink = std::atoll(v.c_str());
    } else if (k == "--window") {
      a->window = std::atoll(v.c_str());
    } else {
      std::fprintf(stderr, "flashcache_llama: unknown option %s\n%s", k.c_str(), kUsage);
      return false;
    }
  }
  return true;
}

using text_io::read_file;

// The cache types the adapter handles; false for any other name.
bool cache_type(const std::string& name, ggml_type* out) {
  const struct {
    const char* name;
    ggml_type type;
  } kTypes[] = {{"f16", GGML_TYPE_F16}, {"f32", GGML_TYPE_F32}, {"bf16", GGML_TYPE_BF16}, {"q8_0", GGML_TYPE_Q8_0}};
  for (const auto& t : kTypes)
    if (name == t.name) {
      *out = t.type;
      return true;
    }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!parse_args(argc, argv, &a)) return 2;
  ggml_type kv_type = GGML_TYPE_F16;
  if (!cache_type(a.cache_type, &kv_type)) {
    std::fprintf(stderr, "flashcache_llama: --cache-type %s: the adapter handles f16, f32, bf16 and q8_0\n",
                 a.cache_type.c_str());
    return 2;
  }
  if (a.model.empty()) a.model = fc::model_finder::find_default_model();
  if (a.model.empty()) {
    std::fprintf(stderr, "flashcache_llama: no model; %s\n", fc::model_finder::model_install_hint().c_str());
    return 2;
  }
  std::string text = a.prompt;
  if (!a.prompt_file.empty() && !read_file(a.prompt_file, &text)) {
    std::fprintf(stderr, "flashcache_llama: cannot read %s\n", a.prompt_file.c_str());
    return 2;
  }
  if (text.empty()) text = "Explain in two sentences why the sky is blue.";
  fc::llama::CompressParams params = fc::llama::compress_default_params();
  if (auto s = fc::parse_head_combine(a.combine, &params.combine); !s) {
    std::fprintf(stderr, "flashcache_llama: %s\n", s.message().c_str());
    return 2;
  }

  ls::init(a.quiet || a.json, /*watch_n_kv=*/true);  // n_kv_after is reported
  llama_model* model = llama_model_load_from_file(a.model.c_str(), ls::model_params(a.extra_bufts));
  if (model == nullptr) {
    std::fprintf(stderr, "flashcache_llama: cannot load %s\n", a.model.c_str());
    return 1;
  }
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const int n_vocab = llama_vocab_n_tokens(vocab);
  const std::vector<llama_token> prompt =
      ls::tokenize(vocab, a.chat ? ls::chat_prompt(model, text) : text, /*add_special=*/true);
  std::vector<llama_token> cont;
  if (!a.nll_file.empty()) {
    std::string c;
    if (!read_file(a.nll_file, &c)) {
      std::fprintf(stderr, "flashcache_llama: cannot read %s\n", a.nll_file.c_str());
      return 2;
    }
    cont = ls::tokenize(vocab, c, false);
  }
  const int n_prompt = static_cast<int>(prompt.size());
  if (n_prompt == 0) {
    std::fprintf(stderr, "flashcache_llama: empty prompt\n");
    return 2;
  }

  llama_context_params cp = llama_context_default_params();
  const long need = n_prompt + a.max_new + static_cast<long>(cont.size()) + 8;
  cp.n_ctx = static_cast<uint32_t>((need + 255) / 256 * 256);
  cp.n_batch = 2048;
  cp.n_ubatch = 512;
  cp.n_seq_max = 1;
  cp.n_threads = cp.n_threads_batch = a.threads;
  cp.type_k = cp.type_v = kv_type;
  cp.flash_attn_type = a.flash_attn == "on"    ? LLAMA_FLASH_ATTN_TYPE_ENABLED
                       : a.flash_attn == "off" ? LLAMA_FLASH_ATTN_TYPE_DISABLED
                                               : LLAMA_FLASH_ATTN_TYPE_AUTO;
  // --query-tail: the prompt's last queries, captured while llama.cpp prefills it.
  fc::llama::QueryCapture capture;
  if (a.query_tail) {
    capture.begin(n_prompt);
    cp.cb_eval = fc::llama::QueryCapture::eval;
    cp.cb_eval_user_data = &capture;
  }
  llama_context* ctx = llama_init_from_model(model, cp);
  if (ctx == nullptr) {
    std::fprintf(stderr, "flashcache_llama: cannot make a context (cache type %s, flash attention %s)\n",
                 a.cache_type.c_str(), a.flash_attn.c_str());
    return 1;
  }

  // Prefill.
  std::vector<float> logits;
  double t = ls::now_ms();
  if (ls::decode(ctx, prompt.data(), n_prompt, 0, 0, false, &logits) != 0) {
    std::fprintf(stderr, "flashcache_llama: prefill failed\n");
    return 1;
  }
  const double prefill_ms = ls::now_ms() - t;
  llama_token next = ls::argmax(logits.data(), n_vocab);

  // Compress.
  if (a.sink >= 0) params.options.select.sink = a.sink;
  if (a.window >= 0) params.options.select.window = a.window;
  fc::llama::SequenceCompressor compressor;
  fc::llama::CompactionStats st;
  bool compressed = false;
  double compress_ms = 0;
  int recompressions = 0;
  if (a.keep_ratio >= 0) {
    // The first compression reads the captured queries; later ones cannot.
    fc::llama::CompressParams first = params;
    first.budget = fc::Budget::ratio(a.keep_ratio);
    if (a.query_tail) {
      first.options = fc::Options::with_query_tail(params.options);
      first.queries = &capture;
    }
    if (auto s = compressor.compress(ctx, 0, first, &st); !s) {
      std::fprintf(stderr, "flashcache_llama: %s\n", s.message().c_str());
      return 1;
    }
    compressed = true;
    compress_ms = st.compress_ms;
  }
  if (!compressed && measure::state_bytes(ctx, &st.kv_bytes_before, &st.v_trans))  // the full cache's bytes
    st.kv_bytes_after = st.kv_bytes_before;
  const std::int64_t bound = compressed ? st.cells_after : n_prompt;  // the size recompression returns to
  llama_memory_t mem = llama_get_memory(ctx);

  // The continuation's NLL over the (compressed) cache.
  double nll = 0;
  int nll_tokens = 0;
  if (measure::continuation_nll(ctx, cont, &nll, &nll_tokens) != 0) {
    std::fprintf(stderr, "flashcache_llama: decoding the continuation failed\n");
    return 1;
  }

  // Decode greedily; recompress when the sequence has grown recompress_every past the bound.
  std::string out_text;
  std::vector<llama_token> generated;
  long n_kv_after = -1, used_after = -1;
  double decode_ms = 0;
  for (int i = 0; i < a.max_new; ++i) {
    if (llama_vocab_is_eog(vocab, next)) break;
    generated.push_back(next);
    out_text += ls::piece(vocab, next);
    if (compressed && a.recompress_every > 0) {
      const std::int64_t cells = st.cells_after + (llama_memory_seq_pos_max(mem, 0) - st.pos_max);
      if (cells >= bound + a.recompress_every) {
        fc::llama::CompactionStats again;
        fc::llama::CompressParams back_to_bound = params;
        back_to_bound.budget = fc::Budget::tokens(bound);
        if (auto s = compressor.compress(ctx, 0, back_to_bound, &again); !s) {
          std::fprintf(stderr, "flashcache_llama: recompression: %s\n", s.message().c_str());
          return 1;
        }
        st.cells_after = again.cells_after;
        st.pos_max = again.pos_max;
        st.kv_bytes_after = again.kv_bytes_after;
        compress_ms += again.compress_ms;
        ++recompressions;
      }
    }
    const llama_pos pos = llama_memory_seq_pos_max(mem, 0) + 1;
    t = ls::now_ms();
    const measure::Step step = measure::decode_watching(ctx, next, pos, &logits);
    if (step.rc != 0) {
      std::fprintf(stderr, "flashcache_llama: decode failed at position %d\n", pos);
      return 1;
    }
    decode_ms += ls::now_ms() - t;
    if (i == 0) used_after = step.used_before, n_kv_after = step.n_kv;
    next = ls::argmax(logits.data(), n_vocab);
  }
  run_report::RunReport r;
  r.prompt_tokens = n_prompt;
  r.compressed = compressed;
  r.stats = st;
  r.n_kv_after = n_kv_after;
  r.used_after = used_after;
  r.n_ctx = llama_n_ctx(ctx);
  r.prefill_ms = prefill_ms;
  r.compress_ms = compress_ms;
  r.recompressions = recompressions;
  r.decode_tokens_per_s = generated.empty() || decode_ms <= 0 ? 0.0 : 1000.0 * generated.size() / decode_ms;
  r.keep_ratio = a.keep_ratio;
  r.threads = a.threads;
  r.cache_type = a.cache_type;
  r.tokens = generated.size();
  r.nll = nll;
  r.nll_tokens = nll_tokens;
  r.text = out_text;
  if (a.json) {
    run_report::print_json(r);
  } else {
    if (!a.quiet) run_report::print_summary(r);
    std::printf("%s\n", out_text.c_str());
  }
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
