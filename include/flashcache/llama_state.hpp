#pragma once
// llama.cpp's state blob of one sequence (llama_state_seq_get_data), read and
// written on bytes, without llama.h: the parser is what tests and fuzzers
// exercise, and what flashcache/llama_cpp.hpp uses to compact a sequence.
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
// The cell ext (2D M-RoPE position and token id) is there only for M-RoPE and
// per-layer-embedding models; this parser takes cells without it and refuses
// what then does not add up. Anything else it refuses by name: a foreign or
// truncated blob, cells of the sequence in two streams, a cell of several
// sequences, duplicate or negative positions, element types other than f32,
// f16, bf16 and q8_0, layers of different cache types, row sizes that are
// not whole elements, trailing bytes.
// A new llama.cpp may change the format without changing the magic: the
// adapter checks the library's version against kPinnedLlamaVersion.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "error.hpp"
#include "types.hpp"

namespace flashcache {
namespace llama {

// The llama.cpp whose format this file reads (llama_version(), llama-config.cmake).
inline constexpr const char* kPinnedLlamaCppPython = "0.3.36";
inline constexpr const char* kPinnedLlamaVersion = "0.5.0-dev";
inline constexpr const char* kPinnedLlamaCommit = "0c1e570";

inline constexpr std::uint32_t kSeqStateMagic = 0xaf143cd8u;
inline constexpr std::uint32_t kMaxStreams = 256;  // LLAMA_MAX_SEQ
inline constexpr std::uint32_t kMaxLayers = 1u << 16;

// ggml_type values of the element types handled here (ggml.h).
enum class GgmlType : std::int32_t { f32 = 0, f16 = 1, q8_0 = 8, bf16 = 30 };
inline constexpr std::int64_t kQ8Block = 32;       // elements per q8_0 block
inline constexpr std::int64_t kQ8BlockBytes = 34;  // f16 scale + 32 int8

inline bool is_known_type(std::int32_t t) {
  return t == static_cast<std::int32_t>(GgmlType::f32) || t == static_cast<std::int32_t>(GgmlType::f16) ||
         t == static_cast<std::int32_t>(GgmlType::q8_0) || t == static_cast<std::int32_t>(GgmlType::bf16);
}

inline std::string type_name(std::int32_t t) {
  switch (t) {
    case 0:
      return "f32";
    case 1:
      return "f16";
    case 8:
      return "q8_0";
    case 30:
      return "bf16";
    default:
      return "ggml type " + std::to_string(t);
  }
}

// Elements in a row of `bytes` bytes of type t, or 0 when that is not whole elements (blocks).
inline std::uint64_t row_elements(std::int32_t t, std::uint64_t bytes) {
  switch (static_cast<GgmlType>(t)) {
    case GgmlType::f32:
      return bytes % 4 == 0 ? bytes / 4 : 0;
    case GgmlType::f16:
    case GgmlType::bf16:
      return bytes % 2 == 0 ? bytes / 2 : 0;
    case GgmlType::q8_0:
      return bytes % kQ8BlockBytes == 0 ? bytes / kQ8BlockBytes * kQ8Block : 0;
  }
  return 0;
}

// Bytes of one element of a plain (not block-quantized) type, 0 otherwise.
inline std::uint32_t element_bytes(std::int32_t t) {
  return t == static_cast<std::int32_t>(GgmlType::f32) ? 4u
         : (t == static_cast<std::int32_t>(GgmlType::f16) || t == static_cast<std::int32_t>(GgmlType::bf16)) ? 2u
                                                                                                             : 0u;
}

// One layer's K and V sections, as offsets into the blob.
struct LayerState {
  std::int32_t k_type = 0;
  std::uint64_t k_row_bytes = 0;  // one cell's K row
  std::uint64_t k_embd = 0;       // elements per K row (heads x head_dim)
  std::size_t k_offset = 0;       // first K row
  std::int32_t v_type = 0;
  std::uint64_t v_row_bytes = 0;   // v_trans 0: one cell's V row
  std::uint32_t v_elem_bytes = 0;  // v_trans 1: one element
  std::uint64_t v_embd = 0;        // elements per cell
  std::size_t v_offset = 0;        // first V byte
};

struct SeqState {
  std::int32_t seq_id = 0;
  std::uint32_t n_stream = 0;
  std::uint32_t stream = 0;      // the stream holding the cells (n_stream when there are none)
  std::uint32_t cell_count = 0;  // cells of the sequence
  std::vector<std::int32_t> pos;  // position of each cell, in blob order
  bool v_trans = false;
  std::vector<LayerState> layers;
  std::size_t size = 0;         // bytes of the blob
  std::size_t meta_offset = 0;  // first cell's metadata
  std::size_t data_offset = 0;  // the v_trans field

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

}  // namespace detail

// Parses a blob of llama_state_seq_get_data. On success *out describes it
// (offsets into `data`, which must outlive their use); on failure the Status
// names what is wrong and *out is unspecified.
inline Status parse_seq_state(const std::uint8_t* data, std::size_t size, SeqState* out) {
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
  FLASHCACHE_RETURN_IF_ERROR(r.read(&out->n_stream, "stream count"));
  if (out->n_stream == 0 || out->n_stream > kMaxStreams)
    return make_error(Errc::invalid_shape, "llama state: ", out->n_stream, " streams (1 to ", kMaxStreams,
                      "); a recurrent, hybrid or SWA cache writes another format");
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
    FLASHCACHE_RETURN_IF_ERROR(detail::parse_layer_data(r, cells, out));
  }
  if (r.left() != 0)
    return make_error(Errc::invalid_shape, "llama state: ", r.left(), " trailing bytes after byte ", r.offset(),
                      " (a format this parser does not know)");
  std::vector<std::int32_t> sorted(out->pos);
  std::sort(sorted.begin(), sorted.end());
  const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  if (dup != sorted.end())
    return make_error(Errc::unsupported, "llama state: position ", *dup,
                      " is held by two cells (several tokens at one position are not handled)");
  return Status::success();
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

// Size of the blob write_seq_state() writes for `count` cells of s.
inline std::size_t seq_state_size(const SeqState& s, std::uint32_t count) {
  std::size_t n = 12 + 4 * static_cast<std::size_t>(s.n_stream);
  if (count == 0 || s.layers.empty()) return n;
  n += 12 * static_cast<std::size_t>(count) + 8;
  for (const LayerState& l : s.layers) {
    n += 12 + static_cast<std::size_t>(count * l.k_row_bytes);
    n += 12 + static_cast<std::size_t>(count * l.v_row_bytes);  // type, row size (or element size, rows)
  }
  return n;
}

// Writes a blob holding only the cells cells[0..count) of the parsed `blob`
// (blob indices, distinct, in the order they are to be restored), with their
// positions, K and V bytes unchanged. set_data of it restores those cells.
inline Status write_seq_state(const std::uint8_t* blob, const SeqState& s, const std::int32_t* cells,
                              std::uint32_t count, std::vector<std::uint8_t>* out) {
  if (count > s.cell_count)
    return make_error(Errc::invalid_shape, "llama state: ", count, " cells asked of ", s.cell_count);
  std::vector<std::uint8_t> seen(s.cell_count, 0);
  for (std::uint32_t i = 0; i < count; ++i) {
    if (cells[i] < 0 || static_cast<std::uint32_t>(cells[i]) >= s.cell_count || seen[static_cast<std::size_t>(cells[i])])
      return make_error(Errc::invalid_shape, "llama state: kept cell ", cells[i], " is out of range or repeated");
    seen[static_cast<std::size_t>(cells[i])] = 1;
  }
  const bool any = count > 0 && !s.layers.empty();
  out->resize(seq_state_size(s, any ? count : 0));
  std::uint8_t* w = out->data();
  auto put = [&w](const void* p, std::size_t n) {
    std::memcpy(w, p, n);
    w += n;
  };
  const std::uint32_t magic = kSeqStateMagic, none = 0, one = 1;
  put(&magic, 4);
  put(&s.seq_id, 4);
  put(&s.n_stream, 4);
  for (std::uint32_t st = 0; st < s.n_stream; ++st) {
    if (st != s.stream || !any) {
      put(&none, 4);
      continue;
    }
    put(&count, 4);
    for (std::uint32_t i = 0; i < count; ++i) {
      put(&s.pos[static_cast<std::size_t>(cells[i])], 4);
      put(&one, 4);
      put(&s.seq_id, 4);
    }
    const std::uint32_t v_trans = s.v_trans ? 1 : 0, n_layer = static_cast<std::uint32_t>(s.layers.size());
    put(&v_trans, 4);
    put(&n_layer, 4);
    for (const LayerState& l : s.layers) {
      put(&l.k_type, 4);
      put(&l.k_row_bytes, 8);
      for (std::uint32_t i = 0; i < count; ++i)
        put(blob + l.k_offset + static_cast<std::size_t>(cells[i]) * l.k_row_bytes, l.k_row_bytes);
    }
    for (const LayerState& l : s.layers) {
      put(&l.v_type, 4);
      if (!s.v_trans) {
        put(&l.v_row_bytes, 8);
        for (std::uint32_t i = 0; i < count; ++i)
          put(blob + l.v_offset + static_cast<std::size_t>(cells[i]) * l.v_row_bytes, l.v_row_bytes);
      } else {
        const auto embd = static_cast<std::uint32_t>(l.v_embd);
        put(&l.v_elem_bytes, 4);
        put(&embd, 4);
        const std::size_t row = static_cast<std::size_t>(s.cell_count) * l.v_elem_bytes;
        for (std::uint32_t j = 0; j < embd; ++j)
          for (std::uint32_t i = 0; i < count; ++i)
            put(blob + l.v_offset + j * row + static_cast<std::size_t>(cells[i]) * l.v_elem_bytes, l.v_elem_bytes);
      }
    }
  }
  if (w != out->data() + out->size())
    return make_error(Errc::invalid_shape, "llama state: wrote ", w - out->data(), " bytes, sized ", out->size());
  return Status::success();
}

// Converts `n` elements of type t at src to float.
inline void to_float_row(std::int32_t t, const std::uint8_t* src, std::uint64_t n, float* dst) {
  switch (static_cast<GgmlType>(t)) {
    case GgmlType::f32:
      std::memcpy(dst, src, static_cast<std::size_t>(n) * 4);
      return;
    case GgmlType::f16:
      for (std::uint64_t i = 0; i < n; ++i) {
        std::uint16_t b;
        std::memcpy(&b, src + 2 * i, 2);
        dst[i] = half_t::to_float(b);
      }
      return;
    case GgmlType::bf16:
      for (std::uint64_t i = 0; i < n; ++i) {
        std::uint16_t b;
        std::memcpy(&b, src + 2 * i, 2);
        dst[i] = bfloat16_t::to_float(b);
      }
      return;
    case GgmlType::q8_0:
      for (std::uint64_t blk = 0; blk < n / kQ8Block; ++blk) {
        const std::uint8_t* p = src + blk * kQ8BlockBytes;
        std::uint16_t b;
        std::memcpy(&b, p, 2);
        const float d = half_t::to_float(b);
        for (std::int64_t i = 0; i < kQ8Block; ++i)
          dst[blk * kQ8Block + static_cast<std::uint64_t>(i)] = d * static_cast<float>(static_cast<std::int8_t>(p[2 + i]));
      }
      return;
  }
}

// Layer l's K (or V) as float, one row of embd elements per cell, the cells
// in the order of `cells` (count of them): out[i * embd + c].
inline void layer_to_float(const std::uint8_t* blob, const SeqState& s, std::size_t l, bool v,
                           const std::int32_t* cells, std::uint32_t count, float* out) {
  const LayerState& L = s.layers[l];
  if (!v) {
    for (std::uint32_t i = 0; i < count; ++i)
      to_float_row(L.k_type, blob + L.k_offset + static_cast<std::size_t>(cells[i]) * L.k_row_bytes, L.k_embd,
                   out + static_cast<std::size_t>(i) * L.k_embd);
    return;
  }
  if (!s.v_trans) {
    for (std::uint32_t i = 0; i < count; ++i)
      to_float_row(L.v_type, blob + L.v_offset + static_cast<std::size_t>(cells[i]) * L.v_row_bytes, L.v_embd,
                   out + static_cast<std::size_t>(i) * L.v_embd);
    return;
  }
  // Transposed: row j holds element j of every cell.
  const std::size_t row = static_cast<std::size_t>(s.cell_count) * L.v_elem_bytes;
  for (std::uint64_t j = 0; j < L.v_embd; ++j)
    for (std::uint32_t i = 0; i < count; ++i)
      to_float_row(L.v_type, blob + L.v_offset + j * row + static_cast<std::size_t>(cells[i]) * L.v_elem_bytes, 1,
                   out + static_cast<std::size_t>(i) * L.v_embd + j);
}

}  // namespace llama
}  // namespace flashcache
