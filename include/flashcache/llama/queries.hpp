#pragma once
// The prompt's queries for the query-informed score (flashcache/query_tail.hpp),
// captured while llama.cpp prefills, through llama_context_params.cb_eval.
//
// llama.cpp names each layer's queries "Qcur-<layer>", before RoPE and after it;
// the one after is the GGML_OP_ROPE node, [head_dim][n_head][n_tokens] float,
// in the frame the cache's keys are in. QueryCapture asks for those nodes only,
// and only in the ubatches that hold the positions it keeps (the prompt's last
// kTailLastQueries, the chosen feed), so earlier ubatches run unsplit.
//
//   flashcache::llama::QueryCapture capture;
//   capture.begin(prompt_tokens);                       // before the prompt is decoded
//   llama_context_params cp = llama_context_default_params();
//   cp.cb_eval = flashcache::llama::QueryCapture::eval;
//   cp.cb_eval_user_data = &capture;
//   ... decode the prompt into an empty sequence ...
//   flashcache::llama::CompressParams p = flashcache::llama::compress_default_params();
//   p.options = flashcache::Options::with_query_tail();
//   p.queries = &capture;
//   flashcache::llama::compress_sequence(ctx, seq, p, &stats);
//
// It counts the tokens each layer's Qcur node has seen since begin(): one
// sequence prefilled from empty, in order (llama.cpp's ubatches of one sequence
// keep the token order), and nothing else decoded between begin() and the
// compression (compress() refuses a count other than the prompt's). The tails
// assume llama.cpp's default logit scale 1/sqrt(head_dim) without softcapping:
// the adapter refuses models whose metadata sets another.
//
// A running sequence (a ContextManager compacting whenever the context fills):
// follow(first) instead of begin(), and the capture keeps the last queries of
// whatever is decoded from position `first` on (a QueryWindow per layer). The
// manager calls it at init and after each compaction, whose renumbering leaves
// older queries in another frame than the keys. The context must decode that
// sequence only: each Qcur row counts as the sequence's next position.
#include <llama.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "flashcache/error.hpp"
#include "flashcache/query_tail.hpp"
#include "flashcache/query_window.hpp"
#include "flashcache/view.hpp"

namespace flashcache {
namespace llama {

class QueryCapture {
 public:
  // Keeps the queries of positions [prompt_tokens - count, prompt_tokens) of
  // the next prompt (all of them when count >= prompt_tokens); forgets the last.
  void begin(std::int64_t prompt_tokens, std::int64_t count = kTailLastQueries) {
    running_ = false;
    prompt_ = prompt_tokens < 0 ? 0 : prompt_tokens;
    const std::int64_t first = count < prompt_ ? prompt_ - count : 0;
    start(0, first, prompt_ - first);
    if (prompt_tokens < 0 || count < 0)
      status_ = make_error(Errc::invalid_option, "llama: QueryCapture::begin(", prompt_tokens, ", ", count, ")");
  }

  // Keeps the last `count` queries of the tokens decoded from position `first`
  // on, one after another, with no end: a running sequence (ContextManager).
  void follow(std::int64_t first, std::int64_t count = kTailLastQueries) {
    running_ = true;
    prompt_ = 0;
    start(first < 0 ? 0 : first, first < 0 ? 0 : first, count < 0 ? 0 : count);
    if (first < 0 || count < 0)
      status_ = make_error(Errc::invalid_option, "llama: QueryCapture::follow(", first, ", ", count, ")");
  }

  // Keeps nothing and asks llama.cpp for nothing until the next begin() or
  // follow(): decodes run as without a capture.
  void pause() {
    running_ = false;
    prompt_ = 0;
    start(0, 0, 0);
  }

  // llama_context_params::cb_eval, with cb_eval_user_data = the QueryCapture.
  static bool eval(ggml_tensor* t, bool ask, void* user) {
    auto* self = static_cast<QueryCapture*>(user);
    const int layer = queries_layer(t);
    if (self == nullptr || layer < 0) return ask ? false : true;
    return ask ? self->wants(layer, t) : self->take(layer, t);
  }

  // The first problem met while capturing (a type, shape or count off), or success.
  const Status& status() const { return status_; }
  bool running() const { return running_; }  // follow(), not begin()
  std::int64_t prompt_tokens() const { return prompt_; }
  std::int64_t first_position() const { return windows_.empty() ? first_ : windows_[0].first_kept(); }
  int layers() const { return static_cast<int>(seen_.size()); }
  // Every layer saw exactly the prompt's tokens since begin(), and at least one
  // layer exists: fewer means the prefill is not done, more that something else
  // was decoded before or after it (its positions would not be the cells').
  // After follow(): every layer saw the same tokens.
  bool complete() const {
    if (seen_.empty()) return false;
    for (std::int64_t s : seen_)
      if (s != (running_ ? seen_[0] : prompt_)) return false;
    return true;
  }
  // Tokens layer 0 saw since begin() or follow() (the others see the same).
  std::int64_t tokens_seen() const { return seen_.empty() ? 0 : seen_[0]; }
  // One past the position of the last token seen.
  std::int64_t end_position() const { return origin_ + tokens_seen(); }
  // Layer l's kept queries, oldest first, as runs of consecutive positions.
  const QueryWindow& window(int l) const { return windows_[static_cast<std::size_t>(l)]; }
  // After begin(): layer l's kept queries, positions first_position()..,
  // [query heads][kept][head_dim] (one run: a prompt's window never wraps).
  KVView<const float> layer(int l) const {
    const QueryWindow& w = window(l);
    return w.pieces() == 0 ? KVView<const float>{} : w.piece(0).q;
  }

 private:
  // Positions from `origin` are counted; those from `first` on are kept, the last `count`.
  void start(std::int64_t origin, std::int64_t first, std::int64_t count) {
    origin_ = origin;
    first_ = first;
    count_ = count;
    heads_ = dim_ = 0;
    seen_.clear();
    for (QueryWindow& w : windows_) w.reset(first_, count_);
    status_ = Status::success();
  }

  // The layer of a post-RoPE "Qcur-<l>" node, else -1.
  static int queries_layer(const ggml_tensor* t) {
    if (t == nullptr || t->op != GGML_OP_ROPE || std::strncmp(t->name, "Qcur-", 5) != 0) return -1;
    char* end = nullptr;
    const long l = std::strtol(t->name + 5, &end, 10);
    return end != t->name + 5 && *end == '\0' && l >= 0 && l < 4096 ? static_cast<int>(l) : -1;
  }

  void reach(int layer) {
    if (seen_.size() <= static_cast<std::size_t>(layer)) seen_.resize(static_cast<std::size_t>(layer) + 1, 0);
    if (windows_.size() <= static_cast<std::size_t>(layer)) {
      const std::size_t had = windows_.size();
      windows_.resize(static_cast<std::size_t>(layer) + 1);
      for (std::size_t w = had; w < windows_.size(); ++w) windows_[w].reset(first_, count_);
    }
  }

  // Asked before the node is computed: only ubatches with kept positions need its data;
  // the others are counted here, since no second call follows.
  bool wants(int layer, const ggml_tensor* t) {
    reach(layer);
    std::int64_t& seen = seen_[static_cast<std::size_t>(layer)];
    const std::int64_t n = t->ne[2], pos = origin_ + seen;
    if (!status_.ok() || (!running_ && (seen >= prompt_ || pos + n <= first_))) {
      seen += n;
      return false;
    }
    return true;
  }

  // The node computed: copy its kept rows (one per token: n_head x head_dim floats).
  bool take(int layer, const ggml_tensor* t) {
    std::int64_t& seen = seen_[static_cast<std::size_t>(layer)];
    QueryWindow& w = windows_[static_cast<std::size_t>(layer)];
    const std::int64_t d = t->ne[0], h = t->ne[1], n = t->ne[2];
    if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t) || t->ne[3] != 1) {
      status_ =
          make_error(Errc::unsupported, "llama: ", t->name, " is not a contiguous float [d][heads][tokens] tensor");
    } else if ((heads_ != 0 && (h != heads_ || d != dim_)) || !w.shape(h, d)) {
      status_ = make_error(Errc::unsupported, "llama: ", t->name, " has ", h, " heads of ", d, ", layer 0 ", heads_,
                           " of ", dim_);
    } else {
      heads_ = h;
      dim_ = d;
      for (std::int64_t r = 0; r < n; ++r) {
        const std::int64_t pos = origin_ + seen + r;
        if (pos < first_ || (!running_ && pos >= prompt_)) continue;
        float* row = w.append();  // the window's next position is pos: rows arrive in order from first_
        if (row != nullptr)
          ggml_backend_tensor_get(t, row, static_cast<std::size_t>(r) * t->nb[2],
                                  static_cast<std::size_t>(h * d) * sizeof(float));
      }
    }
    seen += n;
    return true;  // false would stop llama.cpp's compute
  }

  bool running_ = false;
  std::int64_t prompt_ = 0, origin_ = 0, first_ = 0, count_ = 0, heads_ = 0, dim_ = 0;
  std::vector<std::int64_t> seen_;    // tokens each layer's node has seen
  std::vector<QueryWindow> windows_;  // [layer]: the kept queries
  Status status_;
};

}  // namespace llama
}  // namespace flashcache
