#pragma once
// FlashCache inside llama.cpp through its public API: evict AND compact one
// sequence, then keep decoding.
//
// llama.cpp's KV cells are shared by all layers and KV heads, and a decode
// step attends to n_kv cells: the highest used cell, padded to 256. Removing
// positions (llama_memory_seq_rm) leaves holes that still cost time. This
// adapter instead reads the sequence's state (llama_state_seq_get_data),
// scores every layer, keeps one token set for the whole sequence
// (select_shared_tokens), writes a state blob of the kept cells only, with
// their positions unchanged (so RoPE of later tokens stays right), removes
// the sequence and restores that blob (llama_state_seq_set_data). A lone
// sequence's cells then start at cell 0, so n_kv falls to the kept count
// padded to 256 (examples/llama_cpp measures it).
//
//   #include <flashcache/llama_cpp.hpp>   // needs llama.h; link flashcache::llama_cpp
//   flashcache::llama::Stats st;
//   auto s = flashcache::llama::compress_sequence(ctx, 0, flashcache::Budget::ratio(0.2), {}, {}, &st);
//
// Refused before anything is touched, by name: a llama.cpp other than the
// pinned one (the state format is not versioned), recurrent or hybrid memory,
// M-RoPE / vision RoPE, SWA models (their cache writes another format), an
// empty sequence, a sequence that may share cells with another one (a
// unified cache holding another sequence over overlapping positions), and
// any state the parser (llama_state.hpp) or the model's shape does not match.
// After the removal, any failure restores the original blob: nothing is lost.
//
// Query tails (Options::with_query_tail()): a QueryCapture (llama/queries.hpp)
// takes the prompt's last queries during its prefill through cb_eval, and
// compress() scores with them against the state's keys. It needs the sequence
// as prefilled (positions 0..N-1) and a K cache of f32, f16 or bf16.
//
// The newest cell is always kept (Options::window is raised to at least 1):
// llama.cpp requires a new token's position to follow the sequence's last.
// K and V bytes are copied as they are (f32, f16, bf16, q8_0), never
// requantized; scoring reads them as float. A q8_0 K cache is stored
// Hadamard-rotated along the head dim; the score (residual energies along the
// token axis) does not change under a rotation of the head dim.
#include <llama.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "error.hpp"
#include "llama/queries.hpp"
#include "llama_state.hpp"
#include "mask.hpp"
#include "options.hpp"
#include "score.hpp"
#include "shared_keep.hpp"
#include "view.hpp"

namespace flashcache {
namespace llama {

struct Stats {
  std::int64_t cells_before = 0, cells_after = 0;          // cells of the sequence
  std::uint64_t kv_bytes_before = 0, kv_bytes_after = 0;   // K and V of those cells, all layers
  std::size_t state_bytes_before = 0, state_bytes_after = 0;
  llama_pos pos_min_before = -1, pos_min_after = -1, pos_max = -1;
  std::int64_t layers = 0, kv_heads = 0, head_dim = 0;
  bool v_trans = false;
  std::string k_type, v_type;
  double read_ms = 0, score_ms = 0, select_ms = 0, write_ms = 0;  // get_data + parse, score, select, rm + set_data + verify
  double compress_ms = 0;                                          // all of it
  bool query_tails = false;  // scored with the prompt's query tails (Options::query = tail)
};

// Whether llama.cpp's version is the one whose state format llama_state.hpp reads.
inline Status check_llama_version() {
  const char* v = llama_version();
  if (v == nullptr || std::strcmp(v, kPinnedLlamaVersion) != 0)
    return make_error(Errc::unsupported, "llama.cpp ", v == nullptr ? "(unknown)" : v,
                      ": this adapter reads the sequence state format of llama.cpp ", kPinnedLlamaVersion, " (",
                      kPinnedLlamaCommit, ", llama-cpp-python ", kPinnedLlamaCppPython, ")");
  return Status::success();
}

// The checks that need no state: what the model and context are.
inline Status check_supported(llama_context* ctx, llama_seq_id seq) {
  if (ctx == nullptr) return make_error(Errc::invalid_option, "llama: null context");
  FLASHCACHE_RETURN_IF_ERROR(check_llama_version());
  const llama_model* model = llama_get_model(ctx);
  if (model == nullptr) return make_error(Errc::invalid_option, "llama: context without a model");
  if (llama_model_is_recurrent(model))
    return make_error(Errc::unsupported, "llama: recurrent memory (its state is not a KV cache)");
  if (llama_model_is_hybrid(model))
    return make_error(Errc::unsupported, "llama: hybrid memory (attention and recurrent layers)");
  const llama_rope_type rope = llama_model_rope_type(model);
  if (rope == LLAMA_ROPE_TYPE_MROPE || rope == LLAMA_ROPE_TYPE_IMROPE || rope == LLAMA_ROPE_TYPE_VISION)
    return make_error(Errc::unsupported, "llama: M-RoPE / vision RoPE (cells carry 2D positions)");
  if (llama_model_n_swa(model) > 0)
    return make_error(Errc::unsupported, "llama: sliding-window attention (n_swa ", llama_model_n_swa(model),
                      "; its cache writes two caches and masks cells)");
  if (llama_get_memory(ctx) == nullptr) return make_error(Errc::unsupported, "llama: context without memory");
  if (seq < 0 || static_cast<std::uint32_t>(seq) >= llama_n_seq_max(ctx))
    return make_error(Errc::invalid_option, "llama: sequence ", seq, " outside [0, ", llama_n_seq_max(ctx), ")");
  if (llama_memory_seq_pos_min(llama_get_memory(ctx), seq) < 0)
    return make_error(Errc::invalid_option, "llama: sequence ", seq, " has no cells");
  return Status::success();
}

// Compresses sequences one after another, keeping its buffers between calls.
class SequenceCompressor {
 public:
  // With Options::query = tail, `queries` holds the prompt's queries captured
  // during its prefill (flashcache/llama/queries.hpp): the sequence must be that
  // prompt as prefilled, cells at positions 0..N-1, not compressed since.
  Status compress(llama_context* ctx, llama_seq_id seq, Budget budget, const Options& opt,
                  const SharedKeepOptions& shared, Stats* stats, const QueryCapture* queries = nullptr) {
    const auto t0 = std::chrono::steady_clock::now();
    FLASHCACHE_RETURN_IF_ERROR(check_supported(ctx, seq));
    const std::size_t size = llama_state_seq_get_size(ctx, seq);
    if (size == 0) return make_error(Errc::unsupported, "llama: llama_state_seq_get_size failed for sequence ", seq);
    blob_.resize(size);
    const std::size_t got = llama_state_seq_get_data(ctx, blob_.data(), blob_.size(), seq);
    if (got != size)
      return make_error(Errc::unsupported, "llama: llama_state_seq_get_data wrote ", got, " of ", size, " bytes");
    return compress_blob(ctx, seq, budget, opt, shared, stats, t0, queries);
  }

  // The same from a state the caller holds: `data` must be the sequence's
  // current state as llama_state_seq_get_data wrote it (it is also what a
  // failure restores). A blob the parser or the model refuses leaves the
  // sequence untouched.
  Status compress_state(llama_context* ctx, llama_seq_id seq, const std::uint8_t* data, std::size_t size,
                        Budget budget, const Options& opt, const SharedKeepOptions& shared, Stats* stats,
                        const QueryCapture* queries = nullptr) {
    const auto t0 = std::chrono::steady_clock::now();
    FLASHCACHE_RETURN_IF_ERROR(check_supported(ctx, seq));
    if (data == nullptr || size == 0) return make_error(Errc::invalid_shape, "llama: empty state");
    blob_.assign(data, data + size);
    return compress_blob(ctx, seq, budget, opt, shared, stats, t0, queries);
  }

  // The positions of the cells the last successful compress() kept, ascending.
  const std::vector<llama_pos>& kept_positions() const { return kept_pos_; }

 private:
  Status compress_blob(llama_context* ctx, llama_seq_id seq, Budget budget, const Options& opt,
                       const SharedKeepOptions& shared, Stats* stats, std::chrono::steady_clock::time_point t0,
                       const QueryCapture* queries) {
    using clock = std::chrono::steady_clock;
    auto ms = [](clock::time_point a, clock::time_point b) {
      return std::chrono::duration<double, std::milli>(b - a).count();
    };
    Stats st;
    FLASHCACHE_RETURN_IF_ERROR(check_options(opt));
    FLASHCACHE_RETURN_IF_ERROR(check_shared_options(shared));
    if (opt.query != QueryInput::none && queries == nullptr)  // before anything is read or removed
      return make_error(Errc::invalid_option, "llama: Options::query is ", to_string(opt.query),
                        " but no QueryCapture was given (flashcache/llama/queries.hpp)");
    if (opt.query == QueryInput::none && queries != nullptr)
      return make_error(Errc::invalid_option, "llama: a QueryCapture was given but Options::query is none");
    const llama_model* model = llama_get_model(ctx);
    llama_memory_t mem = llama_get_memory(ctx);
    st.pos_min_before = llama_memory_seq_pos_min(mem, seq);
    st.pos_max = llama_memory_seq_pos_max(mem, seq);
    const std::size_t size = blob_.size();

    SeqState s;
    FLASHCACHE_RETURN_IF_ERROR(parse_seq_state(blob_.data(), blob_.size(), &s));
    FLASHCACHE_RETURN_IF_ERROR(check_against_model(ctx, model, seq, s, st.pos_min_before, st.pos_max));
    const std::uint32_t n = s.cell_count;
    const auto layers = static_cast<std::int64_t>(s.layers.size());
    const std::int64_t heads = llama_model_n_head_kv(model);
    st.cells_before = n;
    st.kv_bytes_before = s.kv_bytes();
    st.state_bytes_before = size;
    st.layers = layers;
    st.kv_heads = heads;
    st.head_dim = static_cast<std::int64_t>(s.layers[0].k_embd) / heads;
    st.v_trans = s.v_trans;
    st.k_type = type_name(s.layers[0].k_type);
    st.v_type = type_name(s.layers[0].v_type);
    if (queries != nullptr) {
      FLASHCACHE_RETURN_IF_ERROR(check_queries(*queries, s, heads, st.head_dim));
      FLASHCACHE_RETURN_IF_ERROR(check_logit_scale(model));
    }
    const auto t1 = clock::now();
    st.read_ms = ms(t0, t1);

    // 2. Score every layer over the cells in position order; 3. one keep-set.
    std::int64_t keep = 0;
    FLASHCACHE_RETURN_IF_ERROR(budget.resolve(n, &keep));
    Options o = opt;
    o.window = std::max<std::int64_t>(o.window, 1);  // the newest cell: decoding continues after it
    if (keep < std::min<std::int64_t>(n, 1))
      return make_error(Errc::invalid_budget, "llama: keep budget ", keep, " drops the newest cell");
    const std::vector<std::int32_t> order = cells_by_position(s);
    kept_.resize(static_cast<std::size_t>(keep));
    auto t2 = clock::now();
    if (keep == static_cast<std::int64_t>(n)) {
      for (std::int64_t i = 0; i < keep; ++i) kept_[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
    } else {
      scores_.resize(static_cast<std::size_t>(layers * heads) * n);
      energy_.resize(static_cast<std::size_t>(heads));
      views_.resize(static_cast<std::size_t>(layers));
      for (std::int64_t l = 0; l < layers; ++l) {
        const LayerState& L = s.layers[static_cast<std::size_t>(l)];
        const std::int64_t dim = static_cast<std::int64_t>(L.k_embd) / heads;
        k_.resize(static_cast<std::size_t>(n) * L.k_embd);
        v_.resize(static_cast<std::size_t>(n) * L.v_embd);
        layer_to_float(blob_.data(), s, static_cast<std::size_t>(l), false, order.data(), n, k_.data());
        layer_to_float(blob_.data(), s, static_cast<std::size_t>(l), true, order.data(), n, v_.data());
        const KVView<const float> k = nhd(static_cast<const float*>(k_.data()), Tokens(n), Heads(heads), HeadDim(dim));
        const KVView<const float> v = nhd(static_cast<const float*>(v_.data()), Tokens(n), Heads(heads), HeadDim(dim));
        float* score = scores_.data() + static_cast<std::size_t>(l * heads) * n;
        TailView<const float> tails;
        if (queries != nullptr) {  // the captured queries against this layer's keys, in position order
          tails_.assign(static_cast<std::size_t>(heads) * n, 0.0f);
          const TailView<float> out{tails_.data(), heads, static_cast<std::int64_t>(n)};
          FLASHCACHE_RETURN_IF_ERROR(tail_.add(queries->layer(static_cast<int>(l)), queries->first_position(), k,
                                               nullptr, out));
          tails = out;
        }
        FLASHCACHE_RETURN_IF_ERROR(scorer_.score(k, v, tails, o, score, energy_.data()));
        views_[static_cast<std::size_t>(l)] = ScoreView{score, heads, n};
      }
      t2 = clock::now();
      FLASHCACHE_RETURN_IF_ERROR(
          select_shared_tokens(views_.data(), layers, keep, o, ProtectMask{}, shared, &ws_, kept_.data()));
    }
    st.score_ms = ms(t1, t2);
    cells_.resize(kept_.size());
    for (std::size_t i = 0; i < kept_.size(); ++i) cells_[i] = order[static_cast<std::size_t>(kept_[i])];
    FLASHCACHE_RETURN_IF_ERROR(
        write_seq_state(blob_.data(), s, cells_.data(), static_cast<std::uint32_t>(keep), &out_));
    const auto t3 = clock::now();
    st.select_ms = ms(t2, t3);

    // 4. Replace the sequence by its kept cells; restore the original on any failure.
    const llama_pos want_min = s.pos[static_cast<std::size_t>(cells_.front())];
    if (!llama_memory_seq_rm(mem, seq, -1, -1))
      return make_error(Errc::unsupported, "llama: llama_memory_seq_rm refused to remove sequence ", seq);
    Status failed = Status::success();
    const std::size_t set = llama_state_seq_set_data(ctx, out_.data(), out_.size(), seq);
    if (set != out_.size()) {
      failed = make_error(Errc::unsupported, "llama: llama_state_seq_set_data read ", set, " of ", out_.size(),
                          " bytes");
    } else if (llama_memory_seq_pos_max(mem, seq) != st.pos_max || llama_memory_seq_pos_min(mem, seq) != want_min) {
      failed = make_error(Errc::unsupported, "llama: after compaction positions are [",
                          llama_memory_seq_pos_min(mem, seq), ", ", llama_memory_seq_pos_max(mem, seq),
                          "], expected [", want_min, ", ", st.pos_max, "]");
    } else if (llama_state_seq_get_size(ctx, seq) != out_.size()) {
      failed = make_error(Errc::unsupported, "llama: after compaction the sequence's state is ",
                          llama_state_seq_get_size(ctx, seq), " bytes, expected ", out_.size(), " (", keep,
                          " cells)");
    }
    if (!failed.ok()) {
      llama_memory_seq_rm(mem, seq, -1, -1);
      const std::size_t back = llama_state_seq_set_data(ctx, blob_.data(), blob_.size(), seq);
      if (back != blob_.size() || llama_memory_seq_pos_max(mem, seq) != st.pos_max)
        return make_error(Errc::unsupported, failed.message(), "; restoring the original state failed too (",
                          back, " of ", blob_.size(), " bytes): sequence ", seq, " is lost");
      return make_error(failed.code(), failed.message(), "; the original state is restored");
    }
    st.query_tails = queries != nullptr && keep < static_cast<std::int64_t>(n);  // scored with them
    st.cells_after = keep;
    st.kv_bytes_after = n == 0 ? 0 : st.kv_bytes_before / n * static_cast<std::uint64_t>(keep);
    st.state_bytes_after = out_.size();
    st.pos_min_after = want_min;
    kept_pos_.resize(cells_.size());
    for (std::size_t i = 0; i < cells_.size(); ++i) kept_pos_[i] = s.pos[static_cast<std::size_t>(cells_[i])];
    const auto t4 = clock::now();
    st.write_ms = ms(t3, t4);
    st.compress_ms = ms(t0, t4);
    if (stats != nullptr) *stats = st;
    return Status::success();
  }

  // Captured queries fit this sequence: complete, the same prompt (cells at
  // positions 0..N-1, as prefilled), a cache whose keys are stored as computed.
  static Status check_queries(const QueryCapture& q, const SeqState& s, std::int64_t heads, std::int64_t dim) {
    FLASHCACHE_RETURN_IF_ERROR(q.status());
    if (!q.complete() || q.layers() != static_cast<int>(s.layers.size()))
      return make_error(Errc::invalid_option, "llama: the QueryCapture saw ", q.tokens_seen(), " tokens in ",
                        q.layers(), " layers since begin() for a ", q.prompt_tokens(),
                        "-token prompt: begin() it right before the prompt is decoded, and compress with query tails "
                        "once, right after the prefill");
    const auto mm = std::minmax_element(s.pos.begin(), s.pos.end());
    if (static_cast<std::int64_t>(s.cell_count) != q.prompt_tokens() || *mm.first != 0 ||
        *mm.second != static_cast<llama_pos>(s.cell_count) - 1)
      return make_error(Errc::invalid_option, "llama: the captured queries are of a ", q.prompt_tokens(),
                        "-token prompt, but the sequence holds ", s.cell_count, " cells at positions [", *mm.first,
                        ", ", *mm.second, "]: compress with query tails once, right after the prefill");
    const KVView<const float> q0 = q.layer(0);
    if (q0.head_dim != dim || q0.heads % heads != 0)
      return make_error(Errc::unsupported, "llama: captured queries of ", q0.heads, " heads of ", q0.head_dim,
                        " for ", heads, " KV heads of ", dim);
    if (s.layers[0].k_type == static_cast<std::int32_t>(GgmlType::q8_0))
      return make_error(Errc::unsupported,
                        "llama: query tails with a q8_0 K cache (its keys are stored Hadamard-rotated, the "
                        "queries are not)");
    return Status::success();
  }

  // Tails are attention probabilities at the logit scale 1/sqrt(head_dim): a model
  // whose metadata sets another scale, or softcaps the logits, is refused by name.
  static Status check_logit_scale(const llama_model* model) {
    char arch[64] = {0}, value[64];
    if (llama_model_meta_val_str(model, "general.architecture", arch, sizeof arch) < 0)
      return make_error(Errc::unsupported, "llama: the model names no architecture (query tails need its logit scale)");
    const std::string a = arch;
    for (const char* key : {".attention.scale", ".attn_logit_softcapping", ".attention.query_pre_attn_scalar"})
      if (llama_model_meta_val_str(model, (a + key).c_str(), value, sizeof value) >= 0)
        return make_error(Errc::unsupported, "llama: ", a, key, " = ", value,
                          ": query tails assume the logit scale 1/sqrt(head_dim) without softcapping");
    if (a.rfind("gemma", 0) == 0)
      return make_error(Errc::unsupported, "llama: architecture ", a,
                        " scales its queries by its own rule: query tails assume 1/sqrt(head_dim)");
    return Status::success();
  }

  // The parsed state must be the model's: its layers, its KV heads, the
  // sequence's positions, and no other sequence that may share its cells.
  static Status check_against_model(llama_context* ctx, const llama_model* model, llama_seq_id seq,
                                    const SeqState& s, llama_pos pos_min, llama_pos pos_max) {
    if (s.cell_count == 0 || s.layers.empty())
      return make_error(Errc::invalid_option, "llama: sequence ", seq, " has no cells in its state");
    if (static_cast<std::int64_t>(s.layers.size()) != llama_model_n_layer(model))
      return make_error(Errc::unsupported, "llama: the state has ", s.layers.size(), " layers, the model ",
                        llama_model_n_layer(model));
    const std::int64_t heads = llama_model_n_head_kv(model);
    if (heads <= 0) return make_error(Errc::unsupported, "llama: the model has ", heads, " KV heads");
    for (std::size_t l = 0; l < s.layers.size(); ++l) {
      const LayerState& L = s.layers[l];
      if (L.k_embd != L.v_embd || L.k_embd % static_cast<std::uint64_t>(heads) != 0)
        return make_error(Errc::unsupported, "llama: layer ", l, " has K rows of ", L.k_embd, " and V rows of ",
                          L.v_embd, " elements for ", heads, " KV heads (equal K and V head dims are handled)");
    }
    const auto mm = std::minmax_element(s.pos.begin(), s.pos.end());
    if (*mm.first != pos_min || *mm.second != pos_max)
      return make_error(Errc::invalid_shape, "llama: the state holds positions [", *mm.first, ", ", *mm.second,
                        "] but the memory reports [", pos_min, ", ", pos_max, "]");
    if (s.n_stream == 1) {
      llama_memory_t mem = llama_get_memory(ctx);
      for (llama_seq_id o = 0; o < static_cast<llama_seq_id>(llama_n_seq_max(ctx)); ++o) {
        if (o == seq) continue;
        const llama_pos lo = llama_memory_seq_pos_min(mem, o), hi = llama_memory_seq_pos_max(mem, o);
        if (lo >= 0 && lo <= pos_max && hi >= pos_min)
          return make_error(Errc::unsupported, "llama: sequence ", o, " holds positions [", lo, ", ", hi,
                            "] in the same unified cache as sequence ", seq, " [", pos_min, ", ", pos_max,
                            "]: they may share cells, which the public API cannot tell");
      }
    }
    return Status::success();
  }

  Scorer<float> scorer_;
  TailAccumulator tail_;
  SharedKeepWorkspace ws_;
  std::vector<std::uint8_t> blob_, out_;
  std::vector<float> k_, v_, scores_, tails_;
  std::vector<HeadEnergy> energy_;
  std::vector<ScoreView> views_;
  std::vector<std::int32_t> kept_, cells_;
  std::vector<llama_pos> kept_pos_;
};

// One-shot form of SequenceCompressor::compress.
inline Status compress_sequence(llama_context* ctx, llama_seq_id seq, Budget budget, const Options& opt,
                                const SharedKeepOptions& shared, Stats* stats, const QueryCapture* queries = nullptr) {
  SequenceCompressor c;
  return c.compress(ctx, seq, budget, opt, shared, stats, queries);
}

}  // namespace llama
}  // namespace flashcache
