#pragma once
// What the adapter compacts, checked by name before anything is touched: the
// llama.cpp it reads the state format of, the model and the context, a sequence
// of it, and a sequence's parsed state against the model and a query capture.
#include <llama.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "flashcache/error.hpp"
#include "flashcache/llama/queries.hpp"
#include "flashcache/llama/state.hpp"

#ifndef FLASHCACHE_LLAMA_BUILD_COMMIT
#define FLASHCACHE_LLAMA_BUILD_COMMIT "unknown"  // set by the flashcache::llama_cpp target
#endif

namespace flashcache {
namespace llama {

// The llama.cpp whose state format llama/state/format.hpp reads. The loaded library
// reports only its version, which every development build shares; the commit
// checked is the one of the llama.cpp package this adapter was built against.
inline Status check_llama_version() {
  const char* v = llama_version();
  if (v == nullptr || std::strcmp(v, kPinnedLlamaVersion) != 0 ||
      std::strcmp(FLASHCACHE_LLAMA_BUILD_COMMIT, kPinnedLlamaCommit) != 0)
    return make_error(Errc::unsupported, "llama.cpp ", v == nullptr ? "(unknown)" : v, " (loaded), built against ",
                      FLASHCACHE_LLAMA_BUILD_COMMIT, ": this adapter reads the sequence state format of llama.cpp ",
                      kPinnedLlamaVersion, " ", kPinnedLlamaCommit, " (llama-cpp-python ", kPinnedLlamaCppPython, ")");
  return Status::success();
}

namespace detail {

inline bool has_meta(const llama_model* model, const std::string& key) {
  char value[64];
  return llama_model_meta_val_str(model, key.c_str(), value, sizeof value) >= 0;
}

inline std::string architecture(const llama_model* model) {
  char arch[64] = {0};
  if (llama_model_meta_val_str(model, "general.architecture", arch, sizeof arch) < 0) return std::string();
  return arch;
}

}  // namespace detail

// What the model and context are, before any sequence is looked at.
inline Status check_supported_context(llama_context* ctx) {
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
  const std::string arch = detail::architecture(model);
  if (llama_model_n_swa(model) > 0 && arch != "gemma2" && arch != "gemma3")
    return make_error(Errc::unsupported, "llama: sliding-window attention of architecture ", arch, " (n_swa ",
                      llama_model_n_swa(model),
                      "): the standard window of gemma2 and gemma3 is handled, other windows (chunked, "
                      "symmetric) are not");
  if (!arch.empty() && detail::has_meta(model, arch + ".attention.kv_lora_rank"))
    return make_error(Errc::unsupported, "llama: ", arch, " keeps an MLA cache (latent K, no per-head V; ", arch,
                      ".attention.kv_lora_rank)");
  if (!arch.empty() && detail::has_meta(model, arch + ".attention.indexer.head_count"))
    return make_error(Errc::unsupported, "llama: ", arch,
                      " keeps an indexer cache beside its KV cache (DSA / MSA sparse attention)");
  if (llama_get_memory(ctx) == nullptr) return make_error(Errc::unsupported, "llama: context without memory");
  return Status::success();
}

// The checks that need no state: the context, and a sequence of it with cells.
inline Status check_supported(llama_context* ctx, llama_seq_id seq) {
  FLASHCACHE_RETURN_IF_ERROR(check_supported_context(ctx));
  if (seq < 0 || static_cast<std::uint32_t>(seq) >= llama_n_seq_max(ctx))
    return make_error(Errc::invalid_option, "llama: sequence ", seq, " outside [0, ", llama_n_seq_max(ctx), ")");
  if (llama_memory_seq_pos_min(llama_get_memory(ctx), seq) < 0)
    return make_error(Errc::invalid_option, "llama: sequence ", seq, " has no cells");
  return Status::success();
}

namespace detail {

// Which caches the model's sequence state holds: a sliding-window model's two
// (the global layers', then the sliding layers'), or one.
inline StateSections state_sections(const llama_model* model) {
  return llama_model_n_swa(model) > 0 ? StateSections::global_then_sliding : StateSections::one;
}

// The model layer of each layer of the state's (global) section: every layer,
// or for a sliding-window model the dense layers of llama.cpp's pattern (gemma2:
// every 2nd, gemma3: every 6th, the last of each period; a period in
// <arch>.attention.sliding_window_pattern overrides), checked against the state.
inline Status state_layers(const llama_model* model, const SeqState& s, std::vector<int>* out) {
  out->clear();
  const int n = llama_model_n_layer(model);
  if (s.sliding.size == 0) {
    for (int l = 0; l < n; ++l) out->push_back(l);
    return Status::success();
  }
  const std::string arch = architecture(model);
  long period = arch == "gemma2" ? 2 : arch == "gemma3" ? 6 : 0;
  char value[64];
  const std::string key = arch + ".attention.sliding_window_pattern";
  if (llama_model_meta_val_str(model, key.c_str(), value, sizeof value) >= 0) {
    char* end = nullptr;
    period = std::strtol(value, &end, 10);
    if (end == value || *end != '\0' || period < 1)
      return make_error(Errc::unsupported, "llama: ", key, " = ", value, ": a per-layer pattern is not handled");
  }
  if (period == 0) return make_error(Errc::unsupported, "llama: no sliding-window pattern known for ", arch);
  for (int l = 0; l < n; ++l)
    if (l % period >= period - 1) out->push_back(l);
  if (out->size() != s.layers.size())
    return make_error(Errc::unsupported, "llama: ", arch, "'s pattern (a dense layer every ", period, ") gives ",
                      out->size(), " global layers, the state holds ", s.layers.size());
  return Status::success();
}

// The parsed state must be the model's: its layers, its KV heads, the
// sequence's positions, and no other sequence that may share its cells.
inline Status check_against_model(llama_context* ctx, const llama_model* model, llama_seq_id seq, const SeqState& s,
                                  llama_pos pos_min, llama_pos pos_max) {
  if (s.cell_count == 0 || s.layers.empty())
    return make_error(Errc::invalid_option, "llama: sequence ", seq, " has no cells in its state");
  if (static_cast<std::int64_t>(s.layers.size() + s.sliding.layers) != llama_model_n_layer(model))
    return make_error(Errc::unsupported, "llama: the state has ", s.layers.size(), " layers",
                      s.sliding.size > 0 ? " (and " + std::to_string(s.sliding.layers) + " sliding-window ones)" : "",
                      ", the model ", llama_model_n_layer(model));
  const std::int64_t heads = llama_model_n_head_kv(model);
  if (heads <= 0) return make_error(Errc::unsupported, "llama: the model has ", heads, " KV heads");
  for (std::size_t l = 0; l < s.layers.size(); ++l) {
    const LayerState& L = s.layers[l];
    if (L.k_embd != L.v_embd || L.k_embd % static_cast<std::uint64_t>(heads) != 0)
      return make_error(Errc::unsupported, "llama: layer ", l, " has K rows of ", L.k_embd, " and V rows of ", L.v_embd,
                        " elements for ", heads, " KV heads (equal K and V head dims are handled)");
  }
  const auto mm = std::minmax_element(s.pos.begin(), s.pos.end());
  // A sliding-window model's memory reports the sliding cache's lowest position,
  // which may still count cells outside the window: its highest is compared.
  const bool sliding = s.sliding.size > 0;
  if ((!sliding && *mm.first != pos_min) || *mm.second != pos_max || (sliding && s.sliding.pos_max != pos_max))
    return make_error(Errc::invalid_shape, "llama: the state holds positions [", *mm.first, ", ", *mm.second,
                      "] but the memory reports [", pos_min, ", ", pos_max, "]");
  if (s.n_stream == 1) {
    // One stream takes any sequence id below LLAMA_MAX_SEQ, not only below n_seq_max:
    // a llama_memory_seq_cp to a higher id shares cells too.
    llama_memory_t mem = llama_get_memory(ctx);
    for (llama_seq_id o = 0; o < static_cast<llama_seq_id>(kMaxStreams); ++o) {
      if (o == seq) continue;
      const llama_pos lo = llama_memory_seq_pos_min(mem, o), hi = llama_memory_seq_pos_max(mem, o);
      if (lo >= 0 && lo <= pos_max && hi >= pos_min)
        return make_error(Errc::unsupported, "llama: sequence ", o, " holds positions [", lo, ", ", hi,
                          "] in the same unified cache as sequence ", seq, " [", pos_min, ", ", pos_max,
                          "]: they may share cells, which the public API cannot tell (kv_unified = false "
                          "gives each sequence its own stream)");
    }
  }
  return Status::success();
}

// Captured queries fit this sequence: complete and of its positions. After
// begin(), the same prompt (cells at positions 0..N-1, as prefilled); after
// follow(), cells at consecutive positions whose last is the last query's.
inline Status check_queries(const QueryCapture& q, const SeqState& s, int model_layers, std::int64_t heads,
                            std::int64_t dim) {
  FLASHCACHE_RETURN_IF_ERROR(q.status());
  const auto mm = std::minmax_element(s.pos.begin(), s.pos.end());
  const bool consecutive = static_cast<std::int64_t>(*mm.second) - *mm.first + 1 == s.cell_count;
  if (q.running()) {
    if (!q.complete() || q.layers() != model_layers || q.end_position() != *mm.second + 1)
      return make_error(Errc::invalid_option, "llama: the QueryCapture followed ", q.tokens_seen(), " tokens in ",
                        q.layers(), " layers from position ", q.end_position() - q.tokens_seen(),
                        ", but the sequence's last position is ", *mm.second, " in ", model_layers,
                        " layers: the context decoded something the capture did not follow");
    if (!consecutive || q.first_position() < *mm.first)
      return make_error(Errc::invalid_option,
                        "llama: query tails need the cells at consecutive positions (the "
                        "sequence holds ",
                        s.cell_count, " cells at [", *mm.first, ", ", *mm.second, "])");
  } else {
    if (!q.complete() || q.layers() != model_layers)
      return make_error(Errc::invalid_option, "llama: the QueryCapture saw ", q.tokens_seen(), " tokens in ",
                        q.layers(), " layers since begin() for a ", q.prompt_tokens(),
                        "-token prompt: begin() it right before the prompt is decoded, and compress with query "
                        "tails once, right after the prefill");
    if (static_cast<std::int64_t>(s.cell_count) != q.prompt_tokens() || *mm.first != 0 || !consecutive)
      return make_error(Errc::invalid_option, "llama: the captured queries are of a ", q.prompt_tokens(),
                        "-token prompt, but the sequence holds ", s.cell_count, " cells at positions [", *mm.first,
                        ", ", *mm.second, "]: compress with query tails once, right after the prefill");
  }
  const QueryWindow& q0 = q.window(0);
  if (q0.kept() > 0 && (q0.head_dim() != dim || q0.heads() % heads != 0))
    return make_error(Errc::unsupported, "llama: captured queries of ", q0.heads(), " heads of ", q0.head_dim(),
                      " for ", heads, " KV heads of ", dim);
  if (s.layers[0].k_type == GgmlType::q8_0)
    return make_error(Errc::unsupported,
                      "llama: query tails with a q8_0 K cache (its keys are stored Hadamard-rotated, the "
                      "queries are not)");
  return Status::success();
}

// Tails are attention probabilities at the logit scale 1/sqrt(head_dim): a model
// whose metadata sets another scale, or softcaps the logits, is refused by name.
inline Status check_logit_scale(const llama_model* model) {
  const std::string a = architecture(model);
  if (a.empty())
    return make_error(Errc::unsupported, "llama: the model names no architecture (query tails need its logit scale)");
  char value[64];
  for (const char* key : {".attention.scale", ".attn_logit_softcapping", ".attention.query_pre_attn_scalar"})
    if (llama_model_meta_val_str(model, (a + key).c_str(), value, sizeof value) >= 0)
      return make_error(Errc::unsupported, "llama: ", a, key, " = ", value,
                        ": query tails assume the logit scale 1/sqrt(head_dim) without softcapping");
  // gemma3 scales its queries by 1/sqrt(head_dim) after the captured Qcur node (llama.cpp's
  // models/gemma3.cpp), but for the 27B model (62 layers): 1/sqrt(n_embd / n_head).
  if (a.rfind("gemma", 0) == 0 && (a != "gemma3" || llama_model_n_layer(model) == 62))
    return make_error(Errc::unsupported, "llama: architecture ", a,
                      a == "gemma3" ? " 27B scales its queries by 1/sqrt(n_embd / n_head)"
                                    : " scales its queries by its own rule: query tails assume 1/sqrt(head_dim)");
  return Status::success();
}

}  // namespace detail
}  // namespace llama
}  // namespace flashcache
