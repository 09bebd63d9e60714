#pragma once
// The cells a compaction evicts, for an Archive (flashcache/archive.hpp): their
// positions and every layer's K and V rows as stored, read from the sequence's
// state blob before the sequence is replaced, and handed to the archive only
// after the replacement succeeded, so a failed compaction archives nothing and
// loses nothing.
//
// The archive holds one row per cell for V too: a transposed V cache (v_trans,
// llama.cpp without flash attention) is gathered into rows here.
#include <cstdint>
#include <cstring>
#include <vector>

#include "flashcache/archive.hpp"
#include "flashcache/error.hpp"
#include "flashcache/llama/format.hpp"
#include "flashcache/llama/write.hpp"

namespace flashcache {
namespace llama {

// The archive's row type for a cache type; false for a type it cannot hold.
inline bool archive_row_type(GgmlType t, RowType* out) {
  switch (t) {
    case GgmlType::f32:
      *out = RowType::f32;
      return true;
    case GgmlType::f16:
      *out = RowType::f16;
      return true;
    case GgmlType::bf16:
      *out = RowType::bf16;
      return true;
    case GgmlType::q8_0:
      *out = RowType::q8_0;
      return true;
    default:
      return false;
  }
}

// The archive shape a sequence's state asks for: every layer like the first,
// K and V rows of one width (kv_heads x head_dim), types an archive holds.
inline Status archive_shape(const SeqState& s, std::int64_t kv_heads, ArchiveShape* out) {
  if (s.layers.empty() || kv_heads < 1) return make_error(Errc::invalid_shape, "llama archive: no layers or heads");
  const LayerState& first = s.layers[0];
  ArchiveShape shape;
  shape.layers = static_cast<int>(s.layers.size());
  shape.kv_heads = kv_heads;
  shape.head_dim = static_cast<std::int64_t>(first.k_embd) / kv_heads;
  if (!archive_row_type(first.k_type, &shape.k_type) || !archive_row_type(first.v_type, &shape.v_type))
    return make_error(Errc::unsupported, "llama archive: K ", type_name(first.k_type), " / V ", type_name(first.v_type),
                      " (an archive holds f32, f16, bf16 and q8_0 rows)");
  for (std::size_t l = 0; l < s.layers.size(); ++l) {
    const LayerState& L = s.layers[l];
    if (L.k_embd != first.k_embd || L.v_embd != first.k_embd || L.k_type != first.k_type || L.v_type != first.v_type)
      return make_error(Errc::unsupported, "llama archive: layer ", l, " has K ", L.k_embd, " x ", type_name(L.k_type),
                        " and V ", L.v_embd, " x ", type_name(L.v_type), ", layer 0 K ", first.k_embd, " x ",
                        type_name(first.k_type), ": an archive holds one K and V width and type for every layer");
  }
  if (s.v_trans && shape.v_type == RowType::q8_0)
    return make_error(Errc::unsupported, "llama archive: a transposed q8_0 V cache");
  *out = shape;
  return Status::success();  // stage() checks it with the archive's options
}

class EvictedCells {
 public:
  // Reads the cells of `order` (the sequence's cells, by position) that are not
  // among the keep kept indices into order, with their positions and rows.
  // `archive` must take this state's rows: an empty one is reset to its shape
  // (with `opt`), a non-empty one of another shape is refused by name. Nothing
  // is written to the archive here.
  Status stage(const std::uint8_t* blob, const SeqState& s, std::int64_t kv_heads, const std::int32_t* order,
               const std::int32_t* kept, std::int64_t keep, Archive* archive, const ArchiveOptions& opt) {
    const std::uint32_t n = s.cell_count;
    keep_mask_.assign(n, 0);
    for (std::int64_t i = 0; i < keep; ++i) keep_mask_[static_cast<std::size_t>(kept[i])] = 1;
    evicted_.clear();
    for (std::uint32_t i = 0; i < n; ++i)
      if (!keep_mask_[i]) evicted_.push_back(order[i]);
    return stage_cells(blob, s, kv_heads, evicted_.data(), static_cast<std::int64_t>(evicted_.size()), archive, opt);
  }

  // The same for the given cells (blob indices, in the order they are to be archived).
  Status stage_cells(const std::uint8_t* blob, const SeqState& s, std::int64_t kv_heads, const std::int32_t* cells,
                     std::int64_t n, Archive* archive, const ArchiveOptions& opt) {
    ArchiveShape shape;
    FLASHCACHE_RETURN_IF_ERROR(archive_shape(s, kv_heads, &shape));
    FLASHCACHE_RETURN_IF_ERROR(check_archive(shape, opt));
    const ArchiveShape& has = archive->shape();
    const bool same = has.layers == shape.layers && has.kv_heads == shape.kv_heads && has.head_dim == shape.head_dim &&
                      has.k_type == shape.k_type && has.v_type == shape.v_type;
    if (!same && archive->tokens() > 0)
      return make_error(Errc::invalid_shape, "llama archive: it holds ", has.layers, " layers x ", has.kv_heads, " x ",
                        has.head_dim, " (K ", to_string(has.k_type), ", V ", to_string(has.v_type),
                        ") but this sequence's cells are ", shape.layers, " x ", shape.kv_heads, " x ", shape.head_dim,
                        " (K ", to_string(shape.k_type), ", V ", to_string(shape.v_type), ")");
    if (!same) FLASHCACHE_RETURN_IF_ERROR(archive->reset(shape, opt));

    positions_.clear();
    for (std::int64_t i = 0; i < n; ++i) positions_.push_back(s.pos[static_cast<std::size_t>(cells[i])]);
    const auto k_row = static_cast<std::size_t>(shape.k_row_bytes());
    const auto v_row = static_cast<std::size_t>(shape.v_row_bytes());
    const auto count = static_cast<std::size_t>(n);
    k_.resize(s.layers.size());
    v_.resize(s.layers.size());
    k_ptr_.resize(s.layers.size());
    v_ptr_.resize(s.layers.size());
    for (std::size_t l = 0; l < s.layers.size(); ++l) {
      const LayerState& L = s.layers[l];
      std::vector<std::uint8_t>& k = k_[l];
      std::vector<std::uint8_t>& v = v_[l];
      k.resize(count * k_row);
      v.resize(count * v_row);
      for (std::size_t i = 0; i < count; ++i) {
        const auto cell = static_cast<std::size_t>(cells[i]);
        std::memcpy(k.data() + i * k_row, detail::cell_k(blob, s, l, cell), k_row);
        const std::uint8_t* from = detail::cell_v(blob, s, l, cell);
        if (!s.v_trans) {
          std::memcpy(v.data() + i * v_row, from, v_row);
          continue;
        }
        // Transposed: gathered into a row, element by element.
        for (std::uint64_t j = 0; j < L.v_embd; ++j)
          std::memcpy(v.data() + i * v_row + j * L.v_elem_bytes, from + j * detail::cell_v_step(s, l), L.v_elem_bytes);
      }
      k_ptr_[l] = k.data();
      v_ptr_[l] = v.data();
    }
    return Status::success();
  }

  // The staged cells into the archive (after the sequence was replaced).
  Status append_to(Archive* archive) const {
    const ArchiveShape& shape = archive->shape();
    return archive->append(positions_.data(), count(), k_ptr_.data(), shape.k_row_bytes(), v_ptr_.data(),
                           shape.v_row_bytes());
  }

  std::int64_t count() const { return static_cast<std::int64_t>(positions_.size()); }
  const std::vector<std::int32_t>& positions() const { return positions_; }

 private:
  std::vector<std::uint8_t> keep_mask_;            // [cells]: kept
  std::vector<std::int32_t> evicted_, positions_;  // stage(): the evicted cells (blob indices); the staged positions
  std::vector<std::vector<std::uint8_t>> k_, v_;   // per layer: evicted x a row's bytes
  std::vector<const void*> k_ptr_, v_ptr_;
};

}  // namespace llama
}  // namespace flashcache
