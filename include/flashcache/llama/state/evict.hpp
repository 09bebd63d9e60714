#pragma once
// The archive's view of a sequence's state (flashcache/archive.hpp): which row
// types it holds, and the shape a state's rows ask for. SequenceState
// (llama/sequence.hpp) hands the evicted cells to the archive with them.
#include <cstdint>

#include "flashcache/archive.hpp"
#include "flashcache/error.hpp"
#include "flashcache/llama/state/format.hpp"

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
  return Status::success();  // SequenceState::prepare_archive checks it with the archive's options
}

}  // namespace llama
}  // namespace flashcache
