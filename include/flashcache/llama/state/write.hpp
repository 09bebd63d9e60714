#pragma once
// A llama.cpp sequence-state blob holding only some of a parsed blob's cells
// (format.hpp), for llama_state_seq_set_data: the compaction's output.
#include <cstdint>
#include <cstring>
#include <vector>

#include "flashcache/error.hpp"
#include "flashcache/llama/state/format.hpp"

namespace flashcache {
namespace llama {

// Size of the blob write_seq_state() writes for `count` cells of s (and its
// sliding-window section, unchanged).
inline std::size_t seq_state_size(const SeqState& s, std::uint32_t count) {
  std::size_t n = 12 + 4 * static_cast<std::size_t>(s.n_stream) + s.sliding.size;
  if (count == 0 || s.layers.empty()) return n;
  n += 12 * static_cast<std::size_t>(count) + 8;
  for (const LayerState& l : s.layers) {
    n += 12 + static_cast<std::size_t>(count * l.k_row_bytes);
    n += 12 + static_cast<std::size_t>(count * l.v_row_bytes);  // type, row size (or element size, rows)
  }
  return n;
}

namespace detail {

// Writes a blob of `count` cells for s's sequence and stream, where `src` says
// where cell i's data lies: src.pos(i), layer l's K row src.k(l, i), and its V:
// the row src.v(l, i), or with a transposed V cache element j at
// src.v(l, i) + j * src.v_step(l, i). Positions and bytes are copied unchanged;
// a sliding-window section (s.sliding) follows as it is in src.blob, the parsed blob.
template <class Source>
Status write_cells(const SeqState& s, std::uint32_t count, const Source& src, std::vector<std::uint8_t>* out) {
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
      const std::int32_t pos = src.pos(i);
      put(&pos, 4);
      put(&one, 4);
      put(&s.seq_id, 4);
    }
    const std::uint32_t v_trans = s.v_trans ? 1 : 0, n_layer = static_cast<std::uint32_t>(s.layers.size());
    put(&v_trans, 4);
    put(&n_layer, 4);
    for (std::size_t l = 0; l < s.layers.size(); ++l) {
      const LayerState& L = s.layers[l];
      put(&L.k_type, 4);
      put(&L.k_row_bytes, 8);
      for (std::uint32_t i = 0; i < count; ++i) put(src.k(l, i), L.k_row_bytes);
    }
    for (std::size_t l = 0; l < s.layers.size(); ++l) {
      const LayerState& L = s.layers[l];
      put(&L.v_type, 4);
      if (!s.v_trans) {
        put(&L.v_row_bytes, 8);
        for (std::uint32_t i = 0; i < count; ++i) put(src.v(l, i), L.v_row_bytes);
      } else {
        const auto embd = static_cast<std::uint32_t>(L.v_embd);
        put(&L.v_elem_bytes, 4);
        put(&embd, 4);
        for (std::uint32_t j = 0; j < embd; ++j)
          for (std::uint32_t i = 0; i < count; ++i) put(src.v(l, i) + j * src.v_step(l, i), L.v_elem_bytes);
      }
    }
  }
  if (s.sliding.size > 0) put(src.blob + s.sliding.offset, s.sliding.size);
  if (w != out->data() + out->size())
    return make_error(Errc::invalid_shape, "llama state: wrote ", w - out->data(), " bytes, sized ", out->size());
  return Status::success();
}

// Where a cell's data lies in a parsed blob: layer l's K row, and its V row or,
// with a transposed V cache, its element 0, the next ones cell_v_step bytes apart.
inline const std::uint8_t* cell_k(const std::uint8_t* blob, const SeqState& s, std::size_t l, std::size_t cell) {
  return blob + s.layers[l].k_offset + cell * s.layers[l].k_row_bytes;
}
inline const std::uint8_t* cell_v(const std::uint8_t* blob, const SeqState& s, std::size_t l, std::size_t cell) {
  const LayerState& L = s.layers[l];
  return blob + L.v_offset + cell * (s.v_trans ? L.v_elem_bytes : L.v_row_bytes);
}
inline std::size_t cell_v_step(const SeqState& s, std::size_t l) {
  return static_cast<std::size_t>(s.cell_count) * s.layers[l].v_elem_bytes;
}

// Cell i of a parsed blob, by its blob index.
struct BlobCell {
  const std::uint8_t* blob;
  const SeqState& s;
  const std::int32_t* cells;
  std::int32_t pos(std::uint32_t i) const { return s.pos[at(i)]; }
  const std::uint8_t* k(std::size_t l, std::uint32_t i) const { return cell_k(blob, s, l, at(i)); }
  const std::uint8_t* v(std::size_t l, std::uint32_t i) const { return cell_v(blob, s, l, at(i)); }
  std::size_t v_step(std::size_t l, std::uint32_t) const { return cell_v_step(s, l); }
  std::size_t at(std::uint32_t i) const { return static_cast<std::size_t>(cells[i]); }
};

// Checks that cells[0..count) are distinct blob indices of s.
inline Status check_cells(const SeqState& s, const std::int32_t* cells, std::uint32_t count) {
  if (count > s.cell_count)
    return make_error(Errc::invalid_shape, "llama state: ", count, " cells asked of ", s.cell_count);
  std::vector<std::uint8_t> seen(s.cell_count, 0);
  for (std::uint32_t i = 0; i < count; ++i) {
    if (cells[i] < 0 || static_cast<std::uint32_t>(cells[i]) >= s.cell_count ||
        seen[static_cast<std::size_t>(cells[i])])
      return make_error(Errc::invalid_shape, "llama state: kept cell ", cells[i], " is out of range or repeated");
    seen[static_cast<std::size_t>(cells[i])] = 1;
  }
  return Status::success();
}

}  // namespace detail

// Writes a blob holding only the cells cells[0..count) of the parsed `blob`
// (blob indices, distinct, in the order they are to be restored), with their
// positions, K and V bytes unchanged. set_data of it restores those cells.
inline Status write_seq_state(const std::uint8_t* blob, const SeqState& s, const std::int32_t* cells,
                              std::uint32_t count, std::vector<std::uint8_t>* out) {
  FLASHCACHE_RETURN_IF_ERROR(detail::check_cells(s, cells, count));
  return detail::write_cells(s, count, detail::BlobCell{blob, s, cells}, out);
}

}  // namespace llama
}  // namespace flashcache
