// flashcache_chat: a chat over llama.cpp that never hits the wall, measured (greedy
// by default, every event and the stream's NLL in --json; the chat to read first is
// examples/llama_cpp/simple_chat.cpp). The context
// holds -c cells; whenever the next tokens would not fit, a ContextManager
// (flashcache/llama/context.hpp) makes room by --when-full:
//   flashcache  compact the sequence to --target of the cells (the default),
//   shift       llama.cpp's context shift (keep --keep, drop half of the rest),
//   streaming   StreamingLLM (keep --keep, drop the oldest just as needed),
//   none        stop, as llama.cpp does.
//
// Chat (the default): one user turn per line of standard input, with the
// model's chat template; the reply is printed as it comes.
//   flashcache_chat -m MODEL.gguf -c 1024
// A model whose GGUF has no template (a base model) takes one of llama.cpp's
// built-in ones by name: --chat-template gemma.
// File: FILE goes through the bounded context in chunks of -b tokens, then N
// tokens are generated greedily, the policy still applying.
//   flashcache_chat -m MODEL.gguf -f FILE -c 1024 --when-full flashcache -n 32 --json
// --json prints one object at the end (the fields: docs/LLAMA_CPP.md).
//
// Archive and recall (flashcache, on by default): each compaction's evicted cells
// are archived (positions kept, so no renumbering until the model's training
// length, where the archive is dropped, counted, and the cells renumbered), and
// each new turn brings back up to --recall N (64) archived cells with its own
// queries (flashcache/llama/recall.hpp). --no-recall: compaction alone, renumbered.
// --ask TEXT (with -f): after FILE, TEXT arrives as a new turn, then -n tokens
// are generated: a question asked after the context was compressed.
//   flashcache_chat -f FILE -c 1024 --recall 32 --ask "What is the code?" -n 12
#include <flashcache/llama.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "find_model/find_model.hpp"
#include "llama_session/session.hpp"
#include "text_io.hpp"
#include "token_nll.hpp"

namespace fc = flashcache;
namespace fl = flashcache::llama;
namespace ls = llama_session;

namespace {

const char* kUsage =
    "usage: flashcache_chat [-m MODEL.gguf] [-c CELLS] [-n N] [-t THREADS] [--keep N] [--temp T] [--top-p P]\n"
    "         [--seed S] [--when-full flashcache|shift|streaming|none] [--target SHARE] [--no-renumber]\n"
    "         [--window-share SHARE] [--paper | --query-tail] [--archive] [--recall N | --no-recall]\n"
    "         [--archive-block N] [--archive-order eviction|position] [--redo turn|last]\n"
    "         [--recall-score exact|digest] [--chat-template NAME] [--turn-end close|open]\n"
    "         [-s SYSTEM] [-f FILE [-b CHUNK] [--max-tokens N] [--nll-from TOKEN] [--ask TEXT]] [--json] [--quiet]\n"
    "  without -f: a chat, one user turn per line of standard input\n";

// flashcache mode recalls by default: up to 64 cells in blocks of 32 neighbouring archived
// positions at each new turn, the turn decoded again (chosen on dev by bench/stream/RULE.md
// stages 4 and 5).
constexpr int kDefaultRecall = 64;

struct Args {
  std::string model, file, system, ask, redo = "turn", recall_score = "exact", archive_order = "position";
  std::string chat_template;            // empty: the GGUF's
  std::string turn_end = "close";       // open: a reply's end-of-turn tokens are never decoded
  int recall = -1, archive_block = 32;  // recall -1: kDefaultRecall in flashcache mode, else 0
  bool archive = false;
  int cells = 1024, n_predict = -1, threads = 2, chunk = 128, max_tokens = 0, nll_from = -1;
  long long keep = -1;  // -1: the system prompt's tokens, or 4
  double temp = 0.0, top_p = 1.0, target = -1, window_share = -1;
  unsigned seed = 0;
  std::string when_full = "flashcache";
  bool renumber = true, json = false, quiet = false, paper = false, query_tail = false;
};

bool parse_args(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--json") {
      a->json = true;
      continue;
    }
    if (k == "--quiet") {
      a->quiet = true;
      continue;
    }
    if (k == "--no-renumber") {
      a->renumber = false;
      continue;
    }
    if (k == "--paper") {
      a->paper = true;
      continue;
    }
    if (k == "--query-tail") {
      a->query_tail = true;
      continue;
    }
    if (k == "--archive") {
      a->archive = true;
      continue;
    }
    if (k == "--no-recall") {
      a->recall = 0;
      continue;
    }
    if (k == "-h" || k == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "flashcache_chat: %s needs a value\n%s", k.c_str(), kUsage);
      return false;
    }
    const std::string v = argv[++i];
    char* end = nullptr;
    auto number = [&](double* out) {
      *out = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end != '\0') {
        std::fprintf(stderr, "flashcache_chat: %s takes a number, not '%s'\n", k.c_str(), v.c_str());
        return false;
      }
      return true;
    };
    double x = 0;
    if (k == "-m" || k == "--model") {
      a->model = v;
    } else if (k == "-f" || k == "--file") {
      a->file = v;
    } else if (k == "-s" || k == "--system") {
      a->system = v;
    } else if (k == "--when-full") {
      a->when_full = v;
    } else if (k == "--ask") {
      a->ask = v;
    } else if (k == "--redo") {
      a->redo = v;
    } else if (k == "--recall-score") {
      a->recall_score = v;
    } else if (k == "--archive-order") {
      a->archive_order = v;
    } else if (k == "--chat-template") {
      a->chat_template = v;
    } else if (k == "--turn-end") {
      a->turn_end = v;
    } else if (!number(&x)) {
      return false;
    } else if (k == "-c" || k == "--ctx-size") {
      a->cells = static_cast<int>(x);
    } else if (k == "-n" || k == "--n-predict") {
      a->n_predict = static_cast<int>(x);
    } else if (k == "-t" || k == "--threads") {
      a->threads = static_cast<int>(x);
    } else if (k == "-b" || k == "--batch-size") {
      a->chunk = static_cast<int>(x);
    } else if (k == "--nll-from") {
      a->nll_from = static_cast<int>(x);
    } else if (k == "--max-tokens") {
      a->max_tokens = static_cast<int>(x);
    } else if (k == "--keep") {
      a->keep = static_cast<long long>(x);
    } else if (k == "--temp") {
      a->temp = x;
    } else if (k == "--top-p") {
      a->top_p = x;
    } else if (k == "--seed") {
      a->seed = static_cast<unsigned>(x);
    } else if (k == "--recall") {
      a->recall = static_cast<int>(x);
    } else if (k == "--archive-block") {
      a->archive_block = static_cast<int>(x);
    } else if (k == "--target") {
      a->target = x;
    } else if (k == "--window-share") {
      a->window_share = x;
    } else {
      std::fprintf(stderr, "flashcache_chat: unknown option %s\n%s", k.c_str(), kUsage);
      return false;
    }
  }
  if (a->paper && a->query_tail) {
    std::fprintf(stderr, "flashcache_chat: --paper is the paper's query-free score; --query-tail adds queries\n");
    return false;
  }
  if (a->recall < 0) a->recall = a->when_full == "flashcache" && !a->query_tail ? kDefaultRecall : 0;
  if (a->recall > 0) a->archive = true;
  if (a->archive && a->query_tail) {
    std::fprintf(stderr, "flashcache_chat: --archive keeps positions, --query-tail renumbers them: one or the other\n");
    return false;
  }
  if (a->redo != "turn" && a->redo != "last") {
    std::fprintf(stderr, "flashcache_chat: --redo turn or last, not '%s'\n", a->redo.c_str());
    return false;
  }
  if (a->recall_score != "exact" && a->recall_score != "digest") {
    std::fprintf(stderr, "flashcache_chat: --recall-score exact or digest, not '%s'\n", a->recall_score.c_str());
    return false;
  }
  if (a->archive_order != "eviction" && a->archive_order != "position") {
    std::fprintf(stderr, "flashcache_chat: --archive-order eviction or position, not '%s'\n", a->archive_order.c_str());
    return false;
  }
  if (a->turn_end != "close" && a->turn_end != "open") {
    std::fprintf(stderr, "flashcache_chat: --turn-end close or open, not '%s'\n", a->turn_end.c_str());
    return false;
  }
  if (!a->ask.empty() && a->file.empty()) {
    std::fprintf(stderr, "flashcache_chat: --ask follows a -f FILE\n");
    return false;
  }
  if (a->recall < 0 || a->archive_block < 1) {
    std::fprintf(stderr, "flashcache_chat: --recall not negative, --archive-block at least 1\n");
    return false;
  }
  if (a->cells < 16 || a->threads < 1 || a->chunk < 1 || a->max_tokens < 0) {
    std::fprintf(stderr, "flashcache_chat: -c at least 16, -t and -b at least 1, --max-tokens not negative\n");
    return false;
  }
  return true;
}

using text_io::json_string;
using text_io::read_file;

// The sequence, its context manager and what happened: decodes go through here.
struct Session {
  llama_context* ctx = nullptr;
  const llama_vocab* vocab = nullptr;
  int n_vocab = 0;
  fl::ContextManager manager;
  llama_batch batch{};
  std::vector<std::string> events;   // one JSON object each
  std::vector<std::string> recalls;  // one JSON object per turn recall
  bool verbose = false;
  std::int64_t tokens = 0;  // decoded so far
  llama_pos max_pos = -1;   // the highest position ever used
  double decode_ms = 0, cells_sum = 0;
  std::int64_t cells_count = 0;

  // Decodes tokens[0..n) (n <= the chunk size), making room first. With
  // `logits`, every token's logits are kept there; else only the last one's.
  bool decode(const llama_token* toks, int n, std::vector<float>* logits) {
    llama_pos pos = 0;
    fl::RoomEvent ev;
    if (auto s = manager.make_room(n, &pos, &ev); !s) {
      std::fprintf(stderr, "flashcache_chat: %s\n", s.message().c_str());
      return false;
    }
    if (ev.policy != fl::WhenFull::none) {
      char buf[1024];
      const fl::CompactionStats& c = ev.compaction;
      std::snprintf(buf, sizeof buf,
                    "{\"policy\": \"%s\", \"at_token\": %lld, \"cells_before\": %lld, \"cells_after\": %lld, "
                    "\"pos_max_after\": %d, \"ms\": %.3f, \"compress_ms\": %.3f, \"read_ms\": %.3f, "
                    "\"score_ms\": %.3f, \"select_ms\": %.3f, \"write_ms\": %.3f, \"query_tails\": %s, "
                    "\"archived\": %lld, \"restarted\": %s, \"restart_dropped\": %lld, \"decode_ms_before\": %.3f}",
                    fl::to_string(ev.policy), static_cast<long long>(tokens), static_cast<long long>(ev.cells_before),
                    static_cast<long long>(ev.cells_after), static_cast<int>(ev.pos_max_after), ev.ms, c.compress_ms,
                    c.read_ms, c.score_ms, c.select_ms, c.write_ms, c.query_tails ? "true" : "false",
                    static_cast<long long>(c.archived), ev.restarted ? "true" : "false",
                    static_cast<long long>(ev.restart_dropped), decode_ms);
      events.emplace_back(buf);
    }
    const std::int64_t cells_before = manager.cells();
    batch.n_tokens = n;
    for (int i = 0; i < n; ++i) {
      batch.token[i] = toks[i];
      batch.pos[i] = pos + i;
      batch.n_seq_id[i] = 1;
      batch.seq_id[i][0] = 0;
      batch.logits[i] = logits != nullptr || i == n - 1;
    }
    const double t0 = ls::now_ms();
    if (const int rc = llama_decode(ctx, batch); rc != 0) {
      std::fprintf(stderr, "flashcache_chat: llama_decode returned %d\n", rc);
      return false;
    }
    decode_ms += ls::now_ms() - t0;
    if (logits != nullptr) {
      logits->resize(static_cast<std::size_t>(n) * static_cast<std::size_t>(n_vocab));
      for (int i = 0; i < n; ++i) {
        const float* l = llama_get_logits_ith(ctx, i);
        std::copy(l, l + n_vocab, logits->data() + static_cast<std::size_t>(i) * static_cast<std::size_t>(n_vocab));
      }
    }
    for (int i = 0; i < n; ++i) cells_sum += static_cast<double>(cells_before + i + 1);
    cells_count += n;
    tokens += n;
    max_pos = std::max(max_pos, pos + n - 1);
    return true;
  }

  // Decodes a prompt of any length in chunks.
  bool feed(const std::vector<llama_token>& toks, int chunk) {
    for (std::size_t i = 0; i < toks.size(); i += static_cast<std::size_t>(chunk)) {
      const int m = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(chunk), toks.size() - i));
      if (!decode(toks.data() + i, m, nullptr)) return false;
    }
    return true;
  }

  // A new turn: decoded, then its recall (with --recall; else nothing happens there).
  bool turn(const std::vector<llama_token>& toks, int chunk) {
    manager.begin_turn();
    const double d0 = decode_ms;
    if (!feed(toks, chunk)) return false;
    const double turn_ms = decode_ms - d0;
    fl::RecallStats r;
    if (auto st = manager.recall_turn(toks.data(), static_cast<std::int64_t>(toks.size()), &r); !st) {
      std::fprintf(stderr, "flashcache_chat: %s\n", st.message().c_str());
      return false;
    }
    if (manager.params().recall.budget == 0) return true;
    std::string spans = "[";  // the recalled positions as runs
    const std::vector<llama_pos>& p = manager.recalled();
    for (std::size_t i = 0; i < p.size();) {
      std::size_t j = i + 1;
      while (j < p.size() && p[j] == p[j - 1] + 1) ++j;
      spans += (i ? ", [" : "[") + std::to_string(p[i]) + ", " + std::to_string(p[j - 1]) + "]";
      i = j;
    }
    spans += "]";
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "{\"at_token\": %lld, \"turn_tokens\": %zu, \"archive_tokens\": %lld, \"recalled\": %lld, "
                  "\"displaced\": %lld, \"redecoded\": %lld, \"ms\": %.3f, \"score_ms\": %.3f, \"write_ms\": %.3f, "
                  "\"redo_ms\": %.3f, \"turn_decode_ms\": %.3f, \"archive_bytes\": %lld, \"archive_dropped\": %lld, ",
                  static_cast<long long>(tokens), toks.size(), static_cast<long long>(r.archive_tokens),
                  static_cast<long long>(r.recalled), static_cast<long long>(r.displaced),
                  static_cast<long long>(r.redecoded), r.ms, r.score_ms, r.write_ms, r.redo_ms, turn_ms,
                  static_cast<long long>(manager.archive().bytes()),
                  static_cast<long long>(manager.archive().dropped_tokens()));
    recalls.push_back(buf + std::string("\"positions\": ") + spans + "}");
    if (verbose)
      std::fprintf(stderr, "[recall: %lld of %lld archived cells back at %s, %lld displaced, %.1f ms]\n",
                   static_cast<long long>(r.recalled), static_cast<long long>(r.archive_tokens), spans.c_str(),
                   static_cast<long long>(r.displaced), r.ms);
    return true;
  }
};

llama_sampler* make_sampler(const Args& a) {
  llama_sampler* s = llama_sampler_chain_init(llama_sampler_chain_default_params());
  if (a.temp <= 0) {
    llama_sampler_chain_add(s, llama_sampler_init_greedy());
    return s;
  }
  if (a.top_p < 1.0) llama_sampler_chain_add(s, llama_sampler_init_top_p(static_cast<float>(a.top_p), 1));
  llama_sampler_chain_add(s, llama_sampler_init_temp(static_cast<float>(a.temp)));
  llama_sampler_chain_add(s, llama_sampler_init_dist(a.seed));
  return s;
}

// The chat so far with the model's template; add_assistant opens the reply.
std::string format_chat(const char* tmpl, const std::vector<llama_chat_message>& msgs, bool add_assistant) {
  std::vector<char> buf(4096);
  int n = llama_chat_apply_template(tmpl, msgs.data(), msgs.size(), add_assistant, buf.data(),
                                    static_cast<int32_t>(buf.size()));
  if (n > static_cast<int>(buf.size())) {
    buf.resize(static_cast<std::size_t>(n));
    n = llama_chat_apply_template(tmpl, msgs.data(), msgs.size(), add_assistant, buf.data(),
                                  static_cast<int32_t>(buf.size()));
  }
  return n > 0 ? std::string(buf.data(), static_cast<std::size_t>(n)) : std::string();
}

// Whether llama.cpp formats a chat with `tmpl` (a built-in name or a template it recognises).
bool known_template(const char* tmpl) {
  const llama_chat_message hello{"user", "hello"};
  char c = 0;
  return llama_chat_apply_template(tmpl, &hello, 1, true, &c, 1) > 0;
}

std::string builtin_templates() {
  std::vector<const char*> names(static_cast<std::size_t>(llama_chat_builtin_templates(nullptr, 0)));
  llama_chat_builtin_templates(names.data(), names.size());
  std::string out;
  for (const char* n : names) out += (out.empty() ? "" : ", ") + std::string(n);
  return out;
}

// The tokens the system prompt takes at the chat's start, which the manager keeps (n_keep). Most
// templates give the system prompt a turn of its own; some (gemma) put it inside the first user
// turn, and then it is the start that every first turn shares.
std::int64_t system_prompt_tokens(const llama_vocab* vocab, const char* tmpl,
                                  const std::vector<llama_chat_message>& system) {
  const std::string alone = format_chat(tmpl, system, false);
  if (!alone.empty()) return static_cast<std::int64_t>(ls::tokenize(vocab, alone, true).size());
  auto first_turn = [&](const char* text) {
    std::vector<llama_chat_message> m = system;
    m.push_back({"user", text});
    return ls::tokenize(vocab, format_chat(tmpl, m, false), true);
  };
  const std::vector<llama_token> x = first_turn("x"), y = first_turn("y");
  return std::mismatch(x.begin(), x.end(), y.begin(), y.end()).first - x.begin();
}

// Where the reply ends in the chat formatted with it: the template's end-of-turn tokens after it
// go in with the next turn, as the model saw them in training and as a server that re-reads the
// whole chat decodes them. (llama.cpp's simple-chat example skips them: --turn-end open.)
std::size_t reply_end(const std::string& prompt, const std::string& reply, const std::string& closed) {
  if (closed.compare(0, prompt.size(), prompt) == 0 && closed.compare(prompt.size(), reply.size(), reply) == 0)
    return prompt.size() + reply.size();
  // A template that trims the reply (Gemma's): from the end of what is left of it.
  const std::size_t a = reply.find_first_not_of(" \t\n\r"), b = reply.find_last_not_of(" \t\n\r");
  if (a == std::string::npos) return prompt.size() <= closed.size() ? prompt.size() : closed.size();
  const std::size_t at = closed.rfind(reply.substr(a, b + 1 - a));
  return at == std::string::npos ? closed.size() : at + (b + 1 - a);
}

// Generates up to n tokens after the sequence's last (whose logits are the
// context's last), printing them when `echo`; stops at an end-of-generation token.
bool generate(Session* s, llama_sampler* sampler, int n, bool echo, std::string* text) {
  for (int i = 0; i < n; ++i) {
    const llama_token t = llama_sampler_sample(sampler, s->ctx, -1);
    if (llama_vocab_is_eog(s->vocab, t)) break;
    const std::string p = ls::piece(s->vocab, t);
    *text += p;
    if (echo) {
      std::fputs(p.c_str(), stdout);
      std::fflush(stdout);
    }
    if (!s->decode(&t, 1, nullptr)) return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!parse_args(argc, argv, &a)) return 2;
  if (a.model.empty()) a.model = fc::model_finder::find_default_model();
  if (a.model.empty()) {
    std::fprintf(stderr, "flashcache_chat: no model; %s\n", fc::model_finder::model_install_hint().c_str());
    return 2;
  }
  fl::ContextParams cp = fl::context_default_params();
  if (auto s = fl::parse_when_full(a.when_full, &cp.when_full); !s) {
    std::fprintf(stderr, "flashcache_chat: %s\n", s.message().c_str());
    return 2;
  }
  std::string text;
  if (!a.file.empty() && !read_file(a.file, &text)) {
    std::fprintf(stderr, "flashcache_chat: cannot read %s\n", a.file.c_str());
    return 2;
  }

  ls::init(a.quiet || a.json);
  llama_model* model = llama_model_load_from_file(a.model.c_str(), ls::model_params());
  if (model == nullptr) {
    std::fprintf(stderr, "flashcache_chat: cannot load %s\n", a.model.c_str());
    return 1;
  }
  llama_context_params lp = llama_context_default_params();
  lp.n_ctx = static_cast<uint32_t>(a.cells);
  lp.n_batch = lp.n_ubatch = static_cast<uint32_t>(std::min(a.chunk, a.cells));
  lp.n_seq_max = 1;
  lp.n_threads = lp.n_threads_batch = a.threads;
  fl::QueryCapture capture;  // --query-tail: the queries decoded since the last compaction; --recall: the turn's
  if (a.query_tail || a.recall > 0) {
    lp.cb_eval = fl::QueryCapture::eval;
    lp.cb_eval_user_data = &capture;
  }
  llama_context* ctx = llama_init_from_model(model, lp);
  if (ctx == nullptr) {
    std::fprintf(stderr, "flashcache_chat: cannot make a context of %d cells\n", a.cells);
    llama_model_free(model);
    return 1;
  }
  Session s;
  s.ctx = ctx;
  s.vocab = llama_model_get_vocab(model);
  s.n_vocab = llama_vocab_n_tokens(s.vocab);
  s.batch = llama_batch_init(a.chunk, 0, 1);
  const char* tmpl = a.chat_template.empty() ? llama_model_chat_template(model, nullptr) : a.chat_template.c_str();
  if (!a.chat_template.empty() && !known_template(tmpl)) {
    std::fprintf(stderr, "flashcache_chat: llama.cpp has no chat template '%s' (built in: %s)\n", tmpl,
                 builtin_templates().c_str());
    llama_free(ctx);
    llama_model_free(model);
    return 2;
  }

  std::vector<llama_chat_message> msgs;
  if (!a.system.empty()) msgs.push_back({"system", a.system.c_str()});
  const std::int64_t system_tokens =
      a.system.empty() || tmpl == nullptr ? 0 : system_prompt_tokens(s.vocab, tmpl, msgs);
  cp.n_cells = std::min<std::int64_t>(a.cells, llama_n_ctx_seq(ctx));
  cp.n_keep = a.keep >= 0 ? a.keep : (system_tokens > 0 ? system_tokens : 4);
  if (a.target > 0) cp.target = a.target;
  cp.after_compaction = a.archive    ? fl::AfterCompaction::archive  // an archived cell keeps its position
                        : a.renumber ? fl::AfterCompaction::renumber
                                     : fl::AfterCompaction::keep_positions;
  if (a.paper) cp.compress.options = fc::Options::paper();  // the paper's score (positions still renumbered)
  if (a.window_share >= 0) cp.compress.options.select.window_share = a.window_share;
  if (a.query_tail) {
    cp.compress.options = fc::Options::with_query_tail(cp.compress.options);
    cp.queries = &capture;
  }
  if (a.archive) {
    cp.archive_options.block_size = a.archive_block;
    cp.archive_options.order = a.archive_order == "position" ? fc::ArchiveOrder::position : fc::ArchiveOrder::eviction;
    cp.at_max_pos = fl::AtMaxPos::restart;  // a chat never hits the wall
  }
  if (a.recall > 0) {
    cp.recall.budget = a.recall;
    cp.recall.redo = a.redo == "turn" ? fl::RecallRedo::turn : fl::RecallRedo::last_token;
    cp.recall.capture = &capture;
    cp.recall.score = a.recall_score == "digest" ? fc::RecallScore::digest : fc::RecallScore::exact;
  }
  cp.compress.n_threads = a.threads;
  s.verbose = !a.json && !a.quiet;
  int rc = 0;
  if (auto st = s.manager.init(ctx, 0, cp); !st) {
    std::fprintf(stderr, "flashcache_chat: %s\n", st.message().c_str());
    rc = 2;
  }
  llama_sampler* sampler = make_sampler(a);
  std::string out_text;
  std::vector<std::string> replies;
  double nll_sum = 0;
  std::int64_t nll_count = 0, stream_tokens = 0;

  if (rc == 0 && !a.file.empty()) {
    // File mode: teacher-forced through the bounded context, then greedy generation.
    std::vector<llama_token> toks = ls::tokenize(s.vocab, text, true);
    if (a.max_tokens > 0 && static_cast<int>(toks.size()) > a.max_tokens)
      toks.resize(static_cast<std::size_t>(a.max_tokens));
    stream_tokens = static_cast<std::int64_t>(toks.size());
    const int nll_from = a.nll_from >= 0 ? a.nll_from : a.cells;  // by default the tokens after the first fill
    std::vector<float> logits;
    for (std::size_t i = 0; i < toks.size() && rc == 0; i += static_cast<std::size_t>(a.chunk)) {
      const int m = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(a.chunk), toks.size() - i));
      if (!s.decode(toks.data() + i, m, &logits)) {
        rc = 1;
        break;
      }
      for (int j = 0; j < m; ++j) {  // logits of token i + j predict token i + j + 1
        const std::size_t next = i + static_cast<std::size_t>(j) + 1;
        if (next >= toks.size() || next < static_cast<std::size_t>(nll_from)) continue;
        const float* row = logits.data() + static_cast<std::size_t>(j) * static_cast<std::size_t>(s.n_vocab);
        nll_sum += token_nll::of(row, s.n_vocab, toks[next]);
        ++nll_count;
      }
    }
    if (rc == 0 && !a.ask.empty() && !s.turn(ls::tokenize(s.vocab, a.ask, false), a.chunk)) rc = 1;
    if (rc == 0 && !generate(&s, sampler, a.n_predict < 0 ? 32 : a.n_predict, !a.json, &out_text)) rc = 1;
    if (!a.json) std::fputc('\n', stdout);
  } else if (rc == 0) {
    // Chat mode: each line a user turn; the reply is generated after it.
    if (tmpl == nullptr) {
      std::fprintf(stderr,
                   "flashcache_chat: the model has no chat template: name one of llama.cpp's with --chat-template "
                   "(built in: %s), or use -f FILE\n",
                   builtin_templates().c_str());
      rc = 2;
    }
    std::vector<std::string> turns;  // llama_chat_message points into these
    turns.reserve(4096);
    std::string line;
    std::size_t prev_len = 0;
    while (rc == 0 && turns.size() + 1 < turns.capacity() && std::getline(std::cin, line)) {
      if (line.empty()) continue;
      turns.push_back(line);
      msgs.push_back({"user", turns.back().c_str()});
      const std::string formatted = format_chat(tmpl, msgs, true);
      const std::vector<llama_token> toks =
          ls::tokenize(s.vocab, formatted.substr(std::min(prev_len, formatted.size())), prev_len == 0);
      if (!a.json && !a.quiet) std::fputs("> ", stdout);
      std::string reply;
      if (!s.turn(toks, a.chunk) || !generate(&s, sampler, a.n_predict < 0 ? 256 : a.n_predict, !a.json, &reply)) {
        rc = 1;
        break;
      }
      if (!a.json) std::fputc('\n', stdout);
      turns.push_back(reply);
      msgs.push_back({"assistant", turns.back().c_str()});
      replies.push_back(reply);
      const std::string closed = format_chat(tmpl, msgs, false);
      prev_len = a.turn_end == "open" ? closed.size() : reply_end(formatted, reply, closed);
    }
  }

  if (a.json) {
    std::string ev = "[";
    for (std::size_t i = 0; i < s.events.size(); ++i) ev += (i ? ", " : "") + s.events[i];
    ev += "]";
    std::string rec = "[";
    for (std::size_t i = 0; i < s.recalls.size(); ++i) rec += (i ? ", " : "") + s.recalls[i];
    rec += "]";
    std::string rep = "[";
    for (std::size_t i = 0; i < replies.size(); ++i) rep += (i ? ", " : "") + json_string(replies[i]);
    rep += "]";
    std::printf(
        "{\"ok\": %s, \"when_full\": \"%s\", \"n_ctx\": %d, \"n_keep\": %lld, \"target\": %.4f, \"renumber\": %s, "
        "\"window_share\": %.4f, \"paper\": %s, \"query_tail\": %s, "
        "\"threads\": %d, \"text\": %s, \"replies\": %s, \"events\": %s, \"recalls\": %s, \"archive\": %s, \"recall\": "
        "%d, \"stream_tokens\": %lld, "
        "\"stream_nll\": %.6f, \"nll_tokens\": %lld, \"avg_cells\": %.2f, \"max_position\": %d, "
        "\"decode_ms\": %.3f, \"event_ms\": %.3f, \"tokens\": %lld, \"tokens_per_s\": %.3f}\n",
        rc == 0 ? "true" : "false", fl::to_string(cp.when_full), a.cells, static_cast<long long>(cp.n_keep), cp.target,
        cp.renumbers() ? "true" : "false", cp.compress.options.select.window_share, a.paper ? "true" : "false",
        a.query_tail ? "true" : "false", a.threads, json_string(out_text).c_str(), rep.c_str(), ev.c_str(), rec.c_str(),
        a.archive ? "true" : "false", a.recall, static_cast<long long>(stream_tokens),
        nll_count > 0 ? nll_sum / static_cast<double>(nll_count) : 0.0, static_cast<long long>(nll_count),
        s.cells_count > 0 ? s.cells_sum / static_cast<double>(s.cells_count) : 0.0, static_cast<int>(s.max_pos),
        s.decode_ms, s.manager.event_ms(), static_cast<long long>(s.tokens),
        s.decode_ms + s.manager.event_ms() > 0
            ? 1000.0 * static_cast<double>(s.tokens) / (s.decode_ms + s.manager.event_ms())
            : 0.0);
  }
  llama_sampler_free(sampler);
  llama_batch_free(s.batch);
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return rc;
}
