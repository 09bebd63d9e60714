#pragma once
// One sequence's state as a transaction: the level between the state's bytes
// (llama/state/format.hpp parses them, rows.hpp reads rows, write.hpp writes cells)
// and the operations on a sequence (compress.hpp, recall.hpp).
//
//   read    the blob once (llama_state_seq_get_data, or the caller's copy),
//           parsed with the model's sections, checked against the model and
//           the memory, its cells by position, its layers mapped to the model's
//   write   the kept cells, or any merge of them with archived rows
//   replace remove the sequence, set the written state, verify, and put the
//           original state back on any failure: nothing is lost
//   archive hand the cells it evicted to an Archive, after a successful
//           replace, straight from the original rows (one copy)
//
// A sliding-window model (gemma2, gemma3) writes the global layers' section,
// then the sliding layers'; its memory reports the sliding cache's lowest
// position. What follows from that lives here: the window's cells (positions
// above pos_max - n_swa), the sequence's lowest position.
#include <llama.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "flashcache/archive.hpp"
#include "flashcache/error.hpp"
#include "flashcache/llama/checks.hpp"
#include "flashcache/llama/state.hpp"
#include "flashcache/llama/state/evict.hpp"

namespace flashcache {
namespace llama {
namespace detail {

// Sequence `seq`'s state as llama_state_seq_get_data writes it, into *blob.
inline Status read_state_blob(llama_context* ctx, llama_seq_id seq, std::vector<std::uint8_t>* blob) {
  const std::size_t size = llama_state_seq_get_size(ctx, seq);
  if (size == 0) return make_error(Errc::unsupported, "llama: llama_state_seq_get_size failed for sequence ", seq);
  blob->resize(size);
  const std::size_t got = llama_state_seq_get_data(ctx, blob->data(), blob->size(), seq);
  if (got != size)
    return make_error(Errc::unsupported, "llama: llama_state_seq_get_data wrote ", got, " of ", size, " bytes");
  return Status::success();
}

// After `failed` struck past the sequence's removal: puts `blob` (its state
// before, whose last position is pos_max) back, and returns `failed` saying
// what became of the sequence (`also` follows "the original state is restored").
inline Status restore_state(llama_context* ctx, llama_seq_id seq, const std::vector<std::uint8_t>& blob,
                            llama_pos pos_max, const Status& failed, const char* also = "") {
  llama_memory_t mem = llama_get_memory(ctx);
  llama_memory_seq_rm(mem, seq, -1, -1);
  const std::size_t back = llama_state_seq_set_data(ctx, blob.data(), blob.size(), seq);
  if (back != blob.size() || llama_memory_seq_pos_max(mem, seq) != pos_max)
    return make_error(Errc::unsupported, failed.message(), "; restoring the original state failed too (", back, " of ",
                      blob.size(), " bytes): sequence ", seq, " is lost");
  return make_error(failed.code(), failed.message(), "; the original state is restored", also);
}

}  // namespace detail

class SequenceState {
 public:
  // Reads sequence `seq`'s state through llama.cpp and checks it (parse_and_check).
  Status read(llama_context* ctx, llama_seq_id seq) {
    FLASHCACHE_RETURN_IF_ERROR(detail::read_state_blob(ctx, seq, &blob_));
    return parse_and_check(ctx, seq);
  }
  // The same from the caller's copy of the current state (what a failure restores).
  Status adopt(llama_context* ctx, llama_seq_id seq, const std::uint8_t* data, std::size_t size) {
    if (data == nullptr || size == 0) return make_error(Errc::invalid_shape, "llama: empty state");
    blob_.assign(data, data + size);
    return parse_and_check(ctx, seq);
  }
  // Only parsed, with the given sections, unchecked: for counting a sequence's cells.
  Status read_unchecked(llama_context* ctx, llama_seq_id seq, StateSections sections) {
    ctx_ = ctx;
    seq_ = seq;
    FLASHCACHE_RETURN_IF_ERROR(detail::read_state_blob(ctx, seq, &blob_));
    return parse_seq_state(blob_.data(), blob_.size(), &s_, sections);
  }
  // The model layer of each state layer (detail::state_layers): after the caller's own checks,
  // whose refusals come first.
  Status map_layers() { return detail::state_layers(llama_get_model(ctx_), s_, &model_layers_); }

  llama_seq_id id() const { return seq_; }
  const SeqState& state() const { return s_; }
  const std::uint8_t* blob() const { return blob_.data(); }
  std::size_t blob_size() const { return blob_.size(); }
  const std::vector<int>& model_layers() const { return model_layers_; }
  const std::vector<std::int32_t>& order() const { return order_; }  // blob cells by position
  std::int64_t kv_heads() const { return llama_model_n_head_kv(llama_get_model(ctx_)); }
  std::int64_t head_dim() const { return static_cast<std::int64_t>(s_.layers[0].k_embd) / kv_heads(); }
  llama_pos position(std::int32_t cell) const { return s_.pos[static_cast<std::size_t>(cell)]; }

  // The memory's positions as read (for a sliding-window model its lowest is the sliding cache's),
  // and the sequence's own lowest (its global section's).
  llama_pos memory_pos_min() const { return mem_min_; }
  llama_pos pos_max() const { return mem_max_; }
  llama_pos pos_min() const { return sliding() ? *std::min_element(s_.pos.begin(), s_.pos.end()) : mem_min_; }

  // The sliding window: the cells the sliding layers still see, which the global layers keep too.
  bool sliding() const { return s_.sliding.size > 0; }
  llama_pos n_swa() const { return sliding() ? llama_model_n_swa(llama_get_model(ctx_)) : 0; }
  bool in_window(llama_pos pos) const { return n_swa() > 0 && pos > mem_max_ - n_swa(); }
  std::int64_t window_cells() const {
    if (n_swa() == 0) return 0;
    return static_cast<std::int64_t>(
        std::count_if(s_.pos.begin(), s_.pos.end(), [&](std::int32_t pos) { return in_window(pos); }));
  }

  // The archive this state's evicted cells go to: an empty one of another shape is set to this
  // state's (with `opt`), a non-empty one of another shape is refused by name. Before a replace.
  Status prepare_archive(Archive* archive, const ArchiveOptions& opt) const {
    ArchiveShape shape;
    FLASHCACHE_RETURN_IF_ERROR(archive_shape(s_, kv_heads(), &shape));
    FLASHCACHE_RETURN_IF_ERROR(check_archive(shape, opt));
    const ArchiveShape& has = archive->shape();
    if (same_shape(has, shape)) return Status::success();
    if (archive->tokens() > 0)
      return make_error(Errc::invalid_shape, "llama archive: it holds ", has.layers, " layers x ", has.kv_heads, " x ",
                        has.head_dim, " (K ", to_string(has.k_type), ", V ", to_string(has.v_type),
                        ") but this sequence's cells are ", shape.layers, " x ", shape.kv_heads, " x ", shape.head_dim,
                        " (K ", to_string(shape.k_type), ", V ", to_string(shape.v_type), ")");
    return archive->reset(shape, opt);
  }
  // Whether `archive` holds rows of this state's shape (recall reads them into it).
  Status archive_matches(const Archive& archive) const {
    ArchiveShape shape;
    FLASHCACHE_RETURN_IF_ERROR(archive_shape(s_, kv_heads(), &shape));
    if (!same_shape(archive.shape(), shape))
      return make_error(Errc::invalid_shape, "llama recall: the archive's rows are not this sequence's");
    return Status::success();
  }

  // The new state: the cells `cells[0..n)` (blob indices, in the order they are written).
  Status write_cells(const std::int32_t* cells, std::uint32_t n) {
    return write_seq_state(blob_.data(), s_, cells, n, &out_);
  }
  // Or any source of cells (detail::write_cells: a merge of residents and archived rows).
  template <class Cells>
  Status write(std::uint32_t n, const Cells& cells) {
    return detail::write_cells(s_, n, cells, &out_);
  }
  const std::vector<std::uint8_t>& written() const { return out_; }

  // Replaces the sequence by the written state, then runs after() (its checks, a decode again):
  // any failure once the sequence is removed puts the original state back (`also` follows
  // "the original state is restored"). `who` begins the messages.
  template <class After>
  Status replace(const char* who, After&& after, const char* also = "") {
    llama_memory_t mem = llama_get_memory(ctx_);
    if (!llama_memory_seq_rm(mem, seq_, -1, -1))
      return make_error(Errc::unsupported, who, ": llama_memory_seq_rm refused to remove sequence ", seq_);
    const std::size_t set = llama_state_seq_set_data(ctx_, out_.data(), out_.size(), seq_);
    const Status failed = set != out_.size() ? make_error(Errc::unsupported, who, ": llama_state_seq_set_data read ",
                                                          set, " of ", out_.size(), " bytes")
                                             : after();
    return failed.ok() ? failed : detail::restore_state(ctx_, seq_, blob_, mem_max_, failed, also);
  }

  // Cells `cells[0..n)` (blob indices) into `archive`, their rows straight from the original state
  // (a transposed V gathered into rows). After prepare_archive() or archive_matches().
  Status archive_cells(const std::int32_t* cells, std::int64_t n, Archive* archive) {
    positions_.resize(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) positions_[static_cast<std::size_t>(i)] = position(cells[i]);
    const ArchiveShape& shape = archive->shape();
    const CellRows rows{blob_.data(), s_, cells, static_cast<std::size_t>(shape.k_row_bytes()),
                        static_cast<std::size_t>(shape.v_row_bytes())};
    return archive->append_from(positions_.data(), n, rows);
  }

 private:
  static bool same_shape(const ArchiveShape& a, const ArchiveShape& b) {
    return a.layers == b.layers && a.kv_heads == b.kv_heads && a.head_dim == b.head_dim && a.k_type == b.k_type &&
           a.v_type == b.v_type;
  }

  // Parses blob_ with the model's sections and checks it against the model and the memory.
  Status parse_and_check(llama_context* ctx, llama_seq_id seq) {
    ctx_ = ctx;
    seq_ = seq;
    llama_memory_t mem = llama_get_memory(ctx);
    mem_min_ = llama_memory_seq_pos_min(mem, seq);
    mem_max_ = llama_memory_seq_pos_max(mem, seq);
    const llama_model* model = llama_get_model(ctx);
    FLASHCACHE_RETURN_IF_ERROR(parse_seq_state(blob_.data(), blob_.size(), &s_, detail::state_sections(model)));
    FLASHCACHE_RETURN_IF_ERROR(detail::check_against_model(ctx, model, seq, s_, mem_min_, mem_max_));
    order_ = cells_by_position(s_);
    return Status::success();
  }

  // An archive's rows from the state's cells: one row each, a transposed V gathered element by element.
  struct CellRows {
    const std::uint8_t* blob;
    const SeqState& s;
    const std::int32_t* cells;
    std::size_t k_row, v_row;  // the archive's row bytes
    void k(int l, std::int64_t i, unsigned char* dst) const {
      std::memcpy(dst, detail::cell_k(blob, s, static_cast<std::size_t>(l), cell(i)), k_row);
    }
    void v(int l, std::int64_t i, unsigned char* dst) const {
      const auto layer = static_cast<std::size_t>(l);
      const LayerState& L = s.layers[layer];
      const std::uint8_t* from = detail::cell_v(blob, s, layer, cell(i));
      if (!s.v_trans) {
        std::memcpy(dst, from, v_row);
        return;
      }
      for (std::uint64_t j = 0; j < L.v_embd; ++j)
        std::memcpy(dst + j * L.v_elem_bytes, from + j * detail::cell_v_step(s, layer), L.v_elem_bytes);
    }
    std::size_t cell(std::int64_t i) const { return static_cast<std::size_t>(cells[i]); }
  };

  llama_context* ctx_ = nullptr;
  llama_seq_id seq_ = 0;
  std::vector<std::uint8_t> blob_, out_;
  SeqState s_;
  std::vector<std::int32_t> order_, positions_;
  std::vector<int> model_layers_;
  llama_pos mem_min_ = -1, mem_max_ = -1;
};

}  // namespace llama
}  // namespace flashcache
