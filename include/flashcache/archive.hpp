#pragma once
// Evicted tokens kept aside, so that a later question can bring back what it
// needs (recall.hpp scores them with its queries).
//
// A compaction decides before the question is known; what it drops is gone. An
// Archive keeps every evicted token instead: its position and, for every layer,
// its K and V rows as they were stored (f32, f16, bf16 or q8_0 bytes, all KV
// heads of the token in one row, as llama.cpp's cells hold them). Tokens are kept in
// eviction order (ArchiveOrder::eviction) or by position (ArchiveOrder::position)
// and grouped in blocks of `block_size` consecutive archive tokens: a block is what
// a recall scores and brings back.
//
// A byte cap bounds the archive: when an append passes it, the first whole blocks
// (the earliest evicted, or the lowest positions) are dropped and counted
// (dropped_tokens()), never silently. reserve() sizes the buffers once; after it,
// append and take allocate nothing.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "archive_options.hpp"
#include "error.hpp"

namespace flashcache {

class Archive {
 public:
  Archive() = default;

  // Empties the archive and sets its shape and options.
  Status reset(const ArchiveShape& shape, const ArchiveOptions& opt = {}) {
    FLASHCACHE_RETURN_IF_ERROR(check_archive(shape, opt));
    shape_ = shape;
    opt_ = opt;
    positions_.clear();
    k_.assign(static_cast<std::size_t>(shape.layers), {});
    v_.assign(static_cast<std::size_t>(shape.layers), {});
    dropped_ = 0;
    return Status::success();
  }

  // Sizes the buffers for `tokens` archived tokens at once (the cap's worth,
  // when there is a cap), so that later appends do not allocate.
  void reserve(std::int64_t tokens) {
    const auto n = static_cast<std::size_t>(std::max<std::int64_t>(tokens, 0));
    positions_.reserve(n);
    if (opt_.order == ArchiveOrder::position) {  // the merge's scratch
      order_.reserve(n);
      merged_.reserve(n);
      pos_scratch_.reserve(n);
      row_scratch_.reserve(n * static_cast<std::size_t>(std::max(shape_.k_row_bytes(), shape_.v_row_bytes())));
    }
    for (int l = 0; l < shape_.layers; ++l) {
      k_[static_cast<std::size_t>(l)].reserve(n * static_cast<std::size_t>(shape_.k_row_bytes()));
      v_[static_cast<std::size_t>(l)].reserve(n * static_cast<std::size_t>(shape_.v_row_bytes()));
    }
  }

  // Appends n evicted tokens: positions[n], and per layer l the rows
  // k[l] + i * k_stride and v[l] + i * v_stride (bytes, at least a row's).
  // Then drops the oldest whole blocks while the cap is passed.
  Status append(const std::int32_t* positions, std::int64_t n, const void* const* k, std::int64_t k_stride,
                const void* const* v, std::int64_t v_stride) {
    if (n < 0) return make_error(Errc::invalid_shape, "archive append: ", n, " tokens");
    if (n == 0) return Status::success();
    if (shape_.layers < 1) return make_error(Errc::invalid_shape, "archive append: reset() the archive first");
    if (positions == nullptr || k == nullptr || v == nullptr)
      return make_error(Errc::invalid_shape, "archive append: null positions or row tables");
    if (k_stride < shape_.k_row_bytes() || v_stride < shape_.v_row_bytes())
      return make_error(Errc::invalid_shape, "archive append: row strides ", k_stride, " (K) and ", v_stride,
                        " (V) bytes; a row is ", shape_.k_row_bytes(), " and ", shape_.v_row_bytes());
    for (int l = 0; l < shape_.layers; ++l)
      if (k[l] == nullptr || v[l] == nullptr)
        return make_error(Errc::invalid_shape, "archive append: layer ", l, ": null K or V rows");
    const StridedRows rows{k,
                           k_stride,
                           v,
                           v_stride,
                           static_cast<std::size_t>(shape_.k_row_bytes()),
                           static_cast<std::size_t>(shape_.v_row_bytes())};
    return append_from(positions, n, rows);
  }

  // The same from any source of rows, copied once, straight into the archive:
  // rows.k(l, i, dst) and rows.v(l, i, dst) write token i's K and V row of
  // layer l (a row's bytes of the archive's shape) to dst. The caller checks
  // what it passes (an engine's state parser, or append() above).
  template <class Rows>
  Status append_from(const std::int32_t* positions, std::int64_t n, const Rows& rows) {
    if (n < 0) return make_error(Errc::invalid_shape, "archive append: ", n, " tokens");
    if (n == 0) return Status::success();
    if (shape_.layers < 1) return make_error(Errc::invalid_shape, "archive append: reset() the archive first");
    positions_.insert(positions_.end(), positions, positions + n);
    const auto k_row_size = static_cast<std::size_t>(shape_.k_row_bytes());
    const auto v_row_size = static_cast<std::size_t>(shape_.v_row_bytes());
    const auto count = static_cast<std::size_t>(n);
    for (int l = 0; l < shape_.layers; ++l) {
      std::vector<unsigned char>& k = k_[static_cast<std::size_t>(l)];
      std::vector<unsigned char>& v = v_[static_cast<std::size_t>(l)];
      const std::size_t k_at = k.size(), v_at = v.size();
      k.resize(k_at + count * k_row_size);
      v.resize(v_at + count * v_row_size);
      for (std::size_t i = 0; i < count; ++i) {
        rows.k(l, static_cast<std::int64_t>(i), k.data() + k_at + i * k_row_size);
        rows.v(l, static_cast<std::int64_t>(i), v.data() + v_at + i * v_row_size);
      }
    }
    if (opt_.order == ArchiveOrder::position) merge_by_position(tokens() - n);
    drop_to_cap();
    return Status::success();
  }

  // Drops every token, counted with the cap's drops (dropped_tokens()): for when
  // the archived positions are no longer the sequence's (a renumbering).
  void drop_all() {
    dropped_ += tokens();
    resize(0);
  }

  const ArchiveShape& shape() const { return shape_; }
  const ArchiveOptions& options() const { return opt_; }
  std::int64_t tokens() const { return static_cast<std::int64_t>(positions_.size()); }
  std::int64_t blocks() const { return (tokens() + opt_.block_size - 1) / opt_.block_size; }
  std::int64_t block_first(std::int64_t b) const { return b * opt_.block_size; }
  std::int64_t block_tokens(std::int64_t b) const { return std::min(opt_.block_size, tokens() - b * opt_.block_size); }
  std::int64_t bytes() const { return tokens() * shape_.token_bytes(); }
  // Tokens the cap has dropped since reset().
  std::int64_t dropped_tokens() const { return dropped_; }

  const std::int32_t* positions() const { return positions_.data(); }
  // Layer l's K (or V) row of archive token i.
  const unsigned char* k_row(int l, std::int64_t i) const {
    return k_[static_cast<std::size_t>(l)].data() + i * shape_.k_row_bytes();
  }
  const unsigned char* v_row(int l, std::int64_t i) const {
    return v_[static_cast<std::size_t>(l)].data() + i * shape_.v_row_bytes();
  }

  // Copies the given blocks (ascending, distinct) out: their positions to
  // positions_out, layer l's rows to k_out[l] / v_out[l] (a row's bytes apart), in
  // archive order; *copied counts the tokens written. The archive is unchanged.
  Status copy_blocks(const std::int64_t* blocks, std::int64_t count, std::int32_t* positions_out, void* const* k_out,
                     void* const* v_out, std::int64_t* copied) const {
    if (copied == nullptr) return make_error(Errc::invalid_shape, "archive copy: null count");
    *copied = 0;
    if (count == 0) return Status::success();
    FLASHCACHE_RETURN_IF_ERROR(check_blocks(blocks, count));
    if (positions_out == nullptr || k_out == nullptr || v_out == nullptr)
      return make_error(Errc::invalid_shape, "archive copy: null outputs");
    for (int l = 0; l < shape_.layers; ++l)
      if (k_out[l] == nullptr || v_out[l] == nullptr)
        return make_error(Errc::invalid_shape, "archive copy: layer ", l, ": null K or V output");
    const auto k_row_size = static_cast<std::size_t>(shape_.k_row_bytes());
    const auto v_row_size = static_cast<std::size_t>(shape_.v_row_bytes());
    std::int64_t out = 0;
    for (std::int64_t i = 0; i < count; ++i) {
      const std::int64_t first = block_first(blocks[i]), n = block_tokens(blocks[i]);
      std::copy(positions_.begin() + first, positions_.begin() + first + n, positions_out + out);
      const auto at = static_cast<std::size_t>(out), rows = static_cast<std::size_t>(n);
      for (int l = 0; l < shape_.layers; ++l) {
        std::memcpy(static_cast<unsigned char*>(k_out[l]) + at * k_row_size, k_row(l, first), rows * k_row_size);
        std::memcpy(static_cast<unsigned char*>(v_out[l]) + at * v_row_size, v_row(l, first), rows * v_row_size);
      }
      out += n;
    }
    *copied = out;
    return Status::success();
  }

  // Removes the given blocks (ascending, distinct); the rest close up, in order.
  Status erase(const std::int64_t* blocks, std::int64_t count) {
    if (count == 0) return Status::success();
    FLASHCACHE_RETURN_IF_ERROR(check_blocks(blocks, count));
    std::int64_t write = 0, next = 0;
    for (std::int64_t b = 0; b < this->blocks(); ++b) {
      if (next < count && blocks[next] == b) {
        ++next;
        continue;
      }
      move_block(b, write);
      write += block_tokens(b);
    }
    resize(write);
    return Status::success();
  }

  // copy_blocks, then erase: the blocks move out of the archive.
  Status take(const std::int64_t* blocks, std::int64_t count, std::int32_t* positions_out, void* const* k_out,
              void* const* v_out, std::int64_t* taken) {
    FLASHCACHE_RETURN_IF_ERROR(copy_blocks(blocks, count, positions_out, k_out, v_out, taken));
    return erase(blocks, count);
  }

 private:
  // Tokens [0, old) are in position order and [old, end) were just appended:
  // moves them all into position order (positions are unique), rewriting only from the first
  // token the new ones precede. Scratch buffers keep their capacity.
  void merge_by_position(std::int64_t old) {
    const std::int64_t end = tokens();
    if (old == end) return;
    order_.resize(static_cast<std::size_t>(end));
    for (std::int64_t i = 0; i < end; ++i) order_[static_cast<std::size_t>(i)] = i;
    const auto by_pos = [this](std::int64_t a, std::int64_t b) {
      return positions_[static_cast<std::size_t>(a)] < positions_[static_cast<std::size_t>(b)];
    };
    std::sort(order_.begin() + old, order_.end(), by_pos);  // (usually sorted already)
    const std::int32_t lowest = positions_[static_cast<std::size_t>(order_[static_cast<std::size_t>(old)])];
    const std::int64_t from =
        std::upper_bound(positions_.begin(), positions_.begin() + old, lowest) - positions_.begin();
    if (from == old && std::is_sorted(positions_.begin() + old, positions_.end())) return;
    merged_.resize(static_cast<std::size_t>(end - from));  // std::merge: inplace_merge would take a heap buffer
    std::merge(order_.begin() + from, order_.begin() + old, order_.begin() + old, order_.end(), merged_.begin(),
               by_pos);
    std::copy(merged_.begin(), merged_.end(), order_.begin() + from);
    const std::size_t count = static_cast<std::size_t>(end - from);
    pos_scratch_.resize(count);
    for (std::size_t i = 0; i < count; ++i)
      pos_scratch_[i] = positions_[static_cast<std::size_t>(order_[static_cast<std::size_t>(from) + i])];
    std::copy(pos_scratch_.begin(), pos_scratch_.end(), positions_.begin() + from);
    for (int l = 0; l < shape_.layers; ++l) {
      reorder_rows(&k_[static_cast<std::size_t>(l)], from, static_cast<std::size_t>(shape_.k_row_bytes()));
      reorder_rows(&v_[static_cast<std::size_t>(l)], from, static_cast<std::size_t>(shape_.v_row_bytes()));
    }
  }

  // Rows from token `from` on into order_'s order.
  void reorder_rows(std::vector<unsigned char>* rows, std::int64_t from, std::size_t row) {
    const std::size_t count = order_.size() - static_cast<std::size_t>(from);
    row_scratch_.resize(count * row);
    for (std::size_t i = 0; i < count; ++i)
      std::memcpy(row_scratch_.data() + i * row,
                  rows->data() + static_cast<std::size_t>(order_[static_cast<std::size_t>(from) + i]) * row, row);
    std::memcpy(rows->data() + static_cast<std::size_t>(from) * row, row_scratch_.data(), count * row);
  }

  Status check_blocks(const std::int64_t* blocks, std::int64_t count) const {
    if (count < 0 || (count > 0 && blocks == nullptr))
      return make_error(Errc::invalid_shape, "archive: ", count, " blocks or a null list");
    for (std::int64_t i = 0; i < count; ++i) {
      if (blocks[i] < 0 || blocks[i] >= this->blocks())
        return make_error(Errc::invalid_shape, "archive: block ", blocks[i], " of ", this->blocks());
      if (i > 0 && blocks[i] <= blocks[i - 1])
        return make_error(Errc::invalid_shape, "archive: blocks must be ascending and distinct (", blocks[i - 1],
                          " then ", blocks[i], ")");
    }
    return Status::success();
  }

  // append()'s rows: evenly spaced in the caller's per-layer buffers.
  struct StridedRows {
    const void* const* k_base;
    std::int64_t k_stride;
    const void* const* v_base;
    std::int64_t v_stride;
    std::size_t k_row, v_row;
    void k(int l, std::int64_t i, unsigned char* dst) const {
      std::memcpy(dst, static_cast<const unsigned char*>(k_base[l]) + i * k_stride, k_row);
    }
    void v(int l, std::int64_t i, unsigned char* dst) const {
      std::memcpy(dst, static_cast<const unsigned char*>(v_base[l]) + i * v_stride, v_row);
    }
  };

  // Archive tokens of block b to start at token `at` (at <= the block's first).
  void move_block(std::int64_t b, std::int64_t at) {
    const std::int64_t first = block_first(b), n = block_tokens(b);
    if (first == at) return;
    std::copy(positions_.begin() + first, positions_.begin() + first + n, positions_.begin() + at);
    const auto k_row_size = static_cast<std::size_t>(shape_.k_row_bytes());
    const auto v_row_size = static_cast<std::size_t>(shape_.v_row_bytes());
    const auto to = static_cast<std::size_t>(at), from = static_cast<std::size_t>(first);
    const auto rows = static_cast<std::size_t>(n);
    for (int l = 0; l < shape_.layers; ++l) {
      auto& k = k_[static_cast<std::size_t>(l)];
      auto& v = v_[static_cast<std::size_t>(l)];
      std::memmove(k.data() + to * k_row_size, k.data() + from * k_row_size, rows * k_row_size);
      std::memmove(v.data() + to * v_row_size, v.data() + from * v_row_size, rows * v_row_size);
    }
  }

  void resize(std::int64_t tokens) {
    positions_.resize(static_cast<std::size_t>(tokens));
    for (int l = 0; l < shape_.layers; ++l) {
      k_[static_cast<std::size_t>(l)].resize(static_cast<std::size_t>(tokens * shape_.k_row_bytes()));
      v_[static_cast<std::size_t>(l)].resize(static_cast<std::size_t>(tokens * shape_.v_row_bytes()));
    }
  }

  // Drops the first whole blocks (earliest evicted, or lowest positions) while the archive passes its cap.
  void drop_to_cap() {
    if (opt_.byte_cap == 0 || bytes() <= opt_.byte_cap) return;
    const std::int64_t keep_tokens = opt_.byte_cap / shape_.token_bytes();
    std::int64_t drop = tokens() - keep_tokens;
    drop = (drop + opt_.block_size - 1) / opt_.block_size * opt_.block_size;  // whole blocks
    drop = std::min(drop, tokens());
    for (std::int64_t b = drop / opt_.block_size; b < blocks(); ++b) move_block(b, block_first(b) - drop);
    dropped_ += drop;
    resize(tokens() - drop);
  }

  ArchiveShape shape_;
  ArchiveOptions opt_;
  std::vector<std::int32_t> positions_;
  std::vector<std::vector<unsigned char>> k_, v_;  // per layer: tokens x a K (V) row's bytes
  std::int64_t dropped_ = 0;
  std::vector<std::int64_t> order_, merged_;  // position order: the merge's permutation
  std::vector<std::int32_t> pos_scratch_;
  std::vector<unsigned char> row_scratch_;
};

}  // namespace flashcache
