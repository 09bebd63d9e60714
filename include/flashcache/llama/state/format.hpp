#pragma once
// llama.cpp's state blob of one sequence (llama_state_seq_get_data): its
// format and the parser, on bytes, without llama.h. Writing a compacted blob:
// write.hpp; K and V rows as float: rows.hpp; all three: flashcache/llama/state.hpp.
//
// The format is the one of llama.cpp as vendored by llama-cpp-python 0.3.36
// (llama.cpp 0.5.0-dev, commit 0c1e570; llama-context.cpp state_seq_get_data,
// llama-kv-cache.cpp state_write / state_write_meta / state_write_data), read
// from those sources, host byte order (little-endian), no padding:
//
//   u32 magic 0xaf143cd8, i32 seq_id                     (llama_context)
//   u32 n_stream                                          (llama_kv_cache)
//   per stream: u32 cell_count; when cell_count > 0:
//     meta, per cell: i32 pos, u32 n_seq_id, [cell ext], n_seq_id x i32 seq_id
//     data: u32 v_trans, u32 n_layer,
//       per layer:  i32 k_type, u64 k_row_bytes, cell_count rows of K
//       v_trans 0, per layer: i32 v_type, u64 v_row_bytes, cell_count rows of V
//       v_trans 1, per layer: i32 v_type, u32 v_elem_bytes, u32 n_embd_v,
//                             n_embd_v rows of cell_count elements
//
// A model with interleaved sliding-window attention (Gemma 2 and 3, ...) has
// two caches (llama-kv-cache-iswa.cpp state_write): the blob holds the global
// layers' section, as above from n_stream on, then the sliding layers' section
// in the same form. parse_seq_state(..., StateSections::global_then_sliding)
// describes the first as the state's cells and layers and the second as
// SeqState::sliding, which a compaction keeps byte for byte.
//
// The cell ext (2D M-RoPE position and token id) is there only for M-RoPE and
// per-layer-embedding models; this parser takes cells without it and refuses
// what then does not add up. Anything else it refuses by name: a foreign or
// truncated blob, cells of the sequence in two streams, a cell of several
// sequences, duplicate or negative positions, element types other than f32,
// f16, bf16 and q8_0, layers of different cache types, row sizes that are
// not whole elements, trailing bytes.
// A new llama.cpp may change the format without changing the magic: the
// adapter checks the loaded library's version against kPinnedLlamaVersion and
// the commit of the llama.cpp it was built against against kPinnedLlamaCommit
// (flashcache/llama/compress.hpp, check_llama_version).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "flashcache/error.hpp"
#include "flashcache/types.hpp"

namespace flashcache {
namespace llama {

// The llama.cpp whose format this file reads (llama_version(), llama-config.cmake).
inline constexpr const char* kPinnedLlamaCppPython = "0.3.36";
inline constexpr const char* kPinnedLlamaVersion = "0.5.0-dev";
inline constexpr const char* kPinnedLlamaCommit = "0c1e570";

inline constexpr std::uint32_t kSeqStateMagic = 0xaf143cd8u;
inline constexpr std::uint32_t kMaxStreams = 256;  // LLAMA_MAX_SEQ
inline constexpr std::uint32_t kMaxLayers = 1u << 16;

// ggml_type values (ggml.h): the element types handled here, and the other
// cache types llama.cpp accepts (--cache-type-k), named so that a refusal says which.
enum class GgmlType : std::int32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  iq4_nl = 20,
  bf16 = 30
};
// q8_0's block: flashcache::kQ8Block elements in kQ8BlockBytes bytes (types.hpp).

inline bool is_known_type(GgmlType t) {
  switch (t) {
    case GgmlType::f32:
    case GgmlType::f16:
    case GgmlType::q8_0:
    case GgmlType::bf16:
      return true;
    default:
      return false;
  }
}

inline std::string type_name(GgmlType t) {
  switch (t) {
    case GgmlType::f32:
      return "f32";
    case GgmlType::f16:
      return "f16";
    case GgmlType::q4_0:
      return "q4_0";
    case GgmlType::q4_1:
      return "q4_1";
    case GgmlType::q5_0:
      return "q5_0";
    case GgmlType::q5_1:
      return "q5_1";
    case GgmlType::q8_0:
      return "q8_0";
    case GgmlType::iq4_nl:
      return "iq4_nl";
    case GgmlType::bf16:
      return "bf16";
  }
  return "ggml type " + std::to_string(static_cast<std::int32_t>(t));
}

// Elements in a row of `bytes` bytes of type t, or 0 when that is not whole elements (blocks).
inline std::uint64_t row_elements(GgmlType t, std::uint64_t bytes) {
  switch (t) {
    case GgmlType::f32:
      return bytes % 4 == 0 ? bytes / 4 : 0;
    case GgmlType::f16:
    case GgmlType::bf16:
      return bytes % 2 == 0 ? bytes / 2 : 0;
    case GgmlType::q8_0:
      return bytes % kQ8BlockBytes == 0 ? bytes / kQ8BlockBytes * kQ8Block : 0;
    default:
      return 0;
  }
}

// Bytes of one element of a plain (not block-quantized) type, 0 otherwise.
inline std::uint32_t element_bytes(GgmlType t) {
  return t == GgmlType::f32 ? 4u : (t == GgmlType::f16 || t == GgmlType::bf16) ? 2u : 0u;
}

// One layer's K and V sections, as offsets into the blob.
struct LayerState {
  GgmlType k_type = GgmlType::f32;  // as stored: any int32, named or not (is_known_type)
  std::uint64_t k_row_bytes = 0;    // one cell's K row
  std::uint64_t k_embd = 0;         // elements per K row (heads x head_dim)
  std::size_t k_offset = 0;         // first K row
  GgmlType v_type = GgmlType::f32;
  std::uint64_t v_row_bytes = 0;   // v_trans 0: one cell's V row
  std::uint32_t v_elem_bytes = 0;  // v_trans 1: one element
  std::uint64_t v_embd = 0;        // elements per cell
  std::size_t v_offset = 0;        // first V byte
};

// Which caches a blob holds: one, or a sliding-window model's two.
enum class StateSections { one, global_then_sliding };

// The sliding-window layers' section of a two-cache blob: its bytes
// [offset, offset + size), its cells and their positions' range.
struct SlidingSection {
  std::size_t offset = 0;
  std::size_t size = 0;  // 0: the blob has no such section
  std::uint32_t cell_count = 0;
  std::uint32_t layers = 0;
  std::int32_t pos_min = -1, pos_max = -1;
};

struct SeqState {
  std::int32_t seq_id = 0;
  std::uint32_t n_stream = 0;
  std::uint32_t stream = 0;       // the stream holding the cells (n_stream when there are none)
  std::uint32_t cell_count = 0;   // cells of the sequence
  std::vector<std::int32_t> pos;  // position of each cell, in blob order
  bool v_trans = false;
  std::vector<LayerState> layers;
  std::size_t size = 0;         // bytes of the blob
  std::size_t meta_offset = 0;  // first cell's metadata
  std::size_t data_offset = 0;  // the v_trans field
  SlidingSection sliding;       // a sliding-window model's second section (StateSections::global_then_sliding)

  // Bytes of K and V of every layer (the cache memory the cells take).
  std::uint64_t kv_bytes() const {
    std::uint64_t b = 0;
    for (const LayerState& l : layers)
      b += static_cast<std::uint64_t>(cell_count) *
           (l.k_row_bytes + (v_trans ? l.v_embd * l.v_elem_bytes : l.v_row_bytes));
    return b;
  }
};

namespace detail {

// A bounds-checked little reader; every failure names the field.
class BlobReader {
 public:
  BlobReader(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  std::size_t offset() const { return at_; }
  std::size_t left() const { return size_ - at_; }

  template <class T>
  Status read(T* out, const char* what) {
    if (left() < sizeof(T))
      return make_error(Errc::invalid_shape, "llama state truncated: ", what, " at byte ", at_, " needs ", sizeof(T),
                        " bytes, ", left(), " left");
    std::memcpy(out, data_ + at_, sizeof(T));
    at_ += sizeof(T);
    return Status::success();
  }
  // Skips count x each bytes (overflow-safe).
  Status skip(std::uint64_t count, std::uint64_t each, const char* what, std::uint32_t layer) {
    if (each != 0 && count > left() / each)
      return make_error(Errc::invalid_shape, "llama state truncated: ", what, " of layer ", layer, " needs ", count,
                        " x ", each, " bytes, ", left(), " left at byte ", at_);
    at_ += static_cast<std::size_t>(count * each);
    return Status::success();
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t at_ = 0;
};

inline Status parse_layer_data(BlobReader& r, std::uint32_t cells, SeqState* s) {
  std::uint32_t v_trans = 0, n_layer = 0;
  FLASHCACHE_RETURN_IF_ERROR(r.read(&v_trans, "v_trans"));
  if (v_trans > 1) return make_error(Errc::invalid_shape, "llama state: v_trans is ", v_trans, " (0 or 1)");
  FLASHCACHE_RETURN_IF_ERROR(r.read(&n_layer, "layer count"));
  if (n_layer == 0 || n_layer > kMaxLayers)
    return make_error(Errc::invalid_shape, "llama state: ", n_layer, " layers (1 to ", kMaxLayers, ")");
  // Each layer takes at least 24 bytes: bound the allocation by what is there.
  if (n_layer > r.left() / 24)
    return make_error(Errc::invalid_shape, "llama state truncated: ", n_layer, " layers in ", r.left(), " bytes");
  s->v_trans = v_trans == 1;
  s->layers.assign(n_layer, LayerState{});
  for (std::uint32_t l = 0; l < n_layer; ++l) {
    LayerState& L = s->layers[l];
    FLASHCACHE_RETURN_IF_ERROR(r.read(&L.k_type, "K type"));
    if (!is_known_type(L.k_type))
      return make_error(Errc::unsupported, "llama state: K of layer ", l, " is ", type_name(L.k_type),
                        " (f32, f16, bf16 and q8_0 are handled)");
    if (l > 0 && L.k_type != s->layers[0].k_type)
      return make_error(Errc::invalid_shape, "llama state: K of layer ", l, " is ", type_name(L.k_type),
                        ", of layer 0 ", type_name(s->layers[0].k_type), " (a context has one K cache type)");
    FLASHCACHE_RETURN_IF_ERROR(r.read(&L.k_row_bytes, "K row size"));
    L.k_embd = row_elements(L.k_type, L.k_row_bytes);
    if (L.k_embd == 0)
      return make_error(Errc::invalid_shape, "llama state: K row of layer ", l, " is ", L.k_row_bytes,
                        " bytes, not whole ", type_name(L.k_type), " elements");
    L.k_offset = r.offset();
    FLASHCACHE_RETURN_IF_ERROR(r.skip(cells, L.k_row_bytes, "K rows", l));
  }
  for (std::uint32_t l = 0; l < n_layer; ++l) {
    LayerState& L = s->layers[l];
    FLASHCACHE_RETURN_IF_ERROR(r.read(&L.v_type, "V type"));
    if (!is_known_type(L.v_type))
      return make_error(Errc::unsupported, "llama state: V of layer ", l, " is ", type_name(L.v_type),
                        " (f32, f16, bf16 and q8_0 are handled)");
    if (l > 0 && L.v_type != s->layers[0].v_type)
      return make_error(Errc::invalid_shape, "llama state: V of layer ", l, " is ", type_name(L.v_type),
                        ", of layer 0 ", type_name(s->layers[0].v_type), " (a context has one V cache type)");
    if (!s->v_trans) {
      FLASHCACHE_RETURN_IF_ERROR(r.read(&L.v_row_bytes, "V row size"));
      L.v_embd = row_elements(L.v_type, L.v_row_bytes);
      if (L.v_embd == 0)
        return make_error(Errc::invalid_shape, "llama state: V row of layer ", l, " is ", L.v_row_bytes,
                          " bytes, not whole ", type_name(L.v_type), " elements");
      L.v_offset = r.offset();
      FLASHCACHE_RETURN_IF_ERROR(r.skip(cells, L.v_row_bytes, "V rows", l));
    } else {
      std::uint32_t embd = 0;
      FLASHCACHE_RETURN_IF_ERROR(r.read(&L.v_elem_bytes, "V element size"));
      if (element_bytes(L.v_type) == 0 || L.v_elem_bytes != element_bytes(L.v_type))
        return make_error(Errc::invalid_shape, "llama state: transposed V of layer ", l, " is ", type_name(L.v_type),
                          " with ", L.v_elem_bytes, "-byte elements (f32, f16 or bf16 with their own size)");
      FLASHCACHE_RETURN_IF_ERROR(r.read(&embd, "V embedding size"));
      if (embd == 0) return make_error(Errc::invalid_shape, "llama state: transposed V of layer ", l, " has 0 rows");
      L.v_embd = embd;
      L.v_row_bytes = static_cast<std::uint64_t>(embd) * L.v_elem_bytes;  // per cell, summed over rows
      L.v_offset = r.offset();
      FLASHCACHE_RETURN_IF_ERROR(r.skip(static_cast<std::uint64_t>(embd) * cells, L.v_elem_bytes, "V elements", l));
    }
  }
  return Status::success();
}

// One cache's section, from n_stream on, into s (its seq_id set).
inline Status parse_cache_section(BlobReader& r, SeqState* out) {
  FLASHCACHE_RETURN_IF_ERROR(r.read(&out->n_stream, "stream count"));
  if (out->n_stream == 0 || out->n_stream > kMaxStreams)
    return make_error(Errc::invalid_shape, "llama state: ", out->n_stream, " streams (1 to ", kMaxStreams,
                      "); a recurrent or hybrid cache writes another format");
  out->stream = out->n_stream;
  for (std::uint32_t s = 0; s < out->n_stream; ++s) {
    std::uint32_t cells = 0;
    FLASHCACHE_RETURN_IF_ERROR(r.read(&cells, "cell count"));
    if (cells == 0) continue;
    if (out->stream != out->n_stream)
      return make_error(Errc::unsupported, "llama state: the sequence has cells in streams ", out->stream, " and ", s);
    // A cell's metadata takes at least 12 bytes: bound the allocation by what is there.
    if (cells > r.left() / 12)
      return make_error(Errc::invalid_shape, "llama state truncated: ", cells, " cells in ", r.left(), " bytes");
    out->stream = s;
    out->cell_count = cells;
    out->meta_offset = r.offset();
    out->pos.resize(cells);
    for (std::uint32_t i = 0; i < cells; ++i) {
      std::uint32_t n_seq = 0;
      std::int32_t seq = 0;
      FLASHCACHE_RETURN_IF_ERROR(r.read(&out->pos[i], "cell position"));
      FLASHCACHE_RETURN_IF_ERROR(r.read(&n_seq, "cell sequence count"));
      if (n_seq != 1)
        return make_error(Errc::unsupported, "llama state: cell ", i, " lists ", n_seq,
                          " sequences (a sequence's own state lists exactly one)");
      FLASHCACHE_RETURN_IF_ERROR(r.read(&seq, "cell sequence id"));
      if (seq != out->seq_id)
        return make_error(Errc::invalid_shape, "llama state: cell ", i, " belongs to sequence ", seq, ", the blob to ",
                          out->seq_id, " (cell ext present? M-RoPE and per-layer-embedding models are refused)");
      if (out->pos[i] < 0)
        return make_error(Errc::invalid_shape, "llama state: cell ", i, " has position ", out->pos[i]);
    }
    out->data_offset = r.offset();
    FLASHCACHE_RETURN_IF_ERROR(parse_layer_data(r, cells, out));
  }
  return Status::success();
}

inline Status check_distinct_positions(const std::vector<std::int32_t>& pos, const char* section) {
  std::vector<std::int32_t> sorted(pos);
  std::sort(sorted.begin(), sorted.end());
  const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  if (dup != sorted.end())
    return make_error(Errc::unsupported, "llama state: position ", *dup, " is held by two cells", section,
                      " (several tokens at one position are not handled)");
  return Status::success();
}

}  // namespace detail

// Parses a blob of llama_state_seq_get_data. On success *out describes it
// (offsets into `data`, which must outlive their use); on failure the Status
// names what is wrong and *out is unspecified. A sliding-window model's blob
// (two caches) parses with StateSections::global_then_sliding only.
inline Status parse_seq_state(const std::uint8_t* data, std::size_t size, SeqState* out,
                              StateSections sections = StateSections::one) {
  if (data == nullptr && size > 0) return make_error(Errc::invalid_shape, "llama state: null data");
  *out = SeqState{};
  out->size = size;
  detail::BlobReader r(data, size);
  std::uint32_t magic = 0;
  FLASHCACHE_RETURN_IF_ERROR(r.read(&magic, "magic"));
  if (magic != kSeqStateMagic) {
    char hex[2][16];
    std::snprintf(hex[0], sizeof hex[0], "0x%08x", magic);
    std::snprintf(hex[1], sizeof hex[1], "0x%08x", kSeqStateMagic);
    return make_error(Errc::invalid_shape, "not a llama.cpp sequence state: magic ", hex[0], ", expected ", hex[1]);
  }
  FLASHCACHE_RETURN_IF_ERROR(r.read(&out->seq_id, "sequence id"));
  if (out->seq_id < 0 || static_cast<std::uint32_t>(out->seq_id) >= kMaxStreams)
    return make_error(Errc::invalid_shape, "llama state: sequence id ", out->seq_id, " outside [0, ", kMaxStreams, ")");
  FLASHCACHE_RETURN_IF_ERROR(detail::parse_cache_section(r, out));
  SeqState sliding;
  if (sections == StateSections::global_then_sliding) {
    out->sliding.offset = r.offset();
    sliding.seq_id = out->seq_id;
    const Status st = detail::parse_cache_section(r, &sliding);
    if (!st.ok()) return make_error(st.code(), "the sliding-window section: ", st.message());
    if (sliding.n_stream != out->n_stream)
      return make_error(Errc::invalid_shape, "llama state: the sliding-window section has ", sliding.n_stream,
                        " streams, the global one ", out->n_stream);
    out->sliding.size = r.offset() - out->sliding.offset;
    out->sliding.cell_count = sliding.cell_count;
    out->sliding.layers = static_cast<std::uint32_t>(sliding.layers.size());
    if (!sliding.pos.empty()) {
      const auto [lo, hi] = std::minmax_element(sliding.pos.begin(), sliding.pos.end());
      out->sliding.pos_min = *lo;
      out->sliding.pos_max = *hi;
    }
  }
  if (r.left() != 0)
    return make_error(Errc::invalid_shape, "llama state: ", r.left(), " trailing bytes after byte ", r.offset(),
                      sections == StateSections::one ? " (a format this parser does not know; a sliding-window "
                                                       "model's second cache parses with StateSections::"
                                                       "global_then_sliding)"
                                                     : " (a format this parser does not know)");
  FLASHCACHE_RETURN_IF_ERROR(detail::check_distinct_positions(out->pos, ""));
  return detail::check_distinct_positions(sliding.pos, " of the sliding-window section");
}

// The cells in position order: order[i] is the cell (blob index) of the i-th lowest position.
inline std::vector<std::int32_t> cells_by_position(const SeqState& s) {
  std::vector<std::int32_t> order(s.cell_count);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&s](std::int32_t a, std::int32_t b) {
    return s.pos[static_cast<std::size_t>(a)] < s.pos[static_cast<std::size_t>(b)];
  });
  return order;
}

}  // namespace llama
}  // namespace flashcache
