#pragma once
// The last queries of a running sequence, one layer's: the feed for query tails
// when a context is compacted again and again (llama/context.hpp), not once
// after a prompt.
//
// Rows arrive in position order, one per token (heads x head_dim floats), from
// position `origin` on; the window keeps the last `capacity` of them in a ring.
// The kept rows are then one or two runs of consecutive positions (pieces), each
// a KVView the tail accumulator takes as it is: tails merge by the maximum, so
// feeding the pieces one after the other gives the tails of the whole window.
//
// The buffer is sized on the first row of a shape and kept across reset():
// nothing is allocated warm.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "view.hpp"

namespace flashcache {

// Queries of positions first .. first + q.tokens - 1: [heads][tokens][head_dim] as a view.
struct QueryPiece {
  std::int64_t first = 0;
  KVView<const float> q;
};

class QueryWindow {
 public:
  // Forgets every row; the next row pushed is position `origin`. capacity < 1 keeps none.
  void reset(std::int64_t origin, std::int64_t capacity) {
    origin_ = end_ = origin;
    capacity_ = std::max<std::int64_t>(capacity, 0);
  }

  // The rows' shape. Returns false when it differs from the rows already kept.
  bool shape(std::int64_t heads, std::int64_t head_dim) {
    if (end_ > origin_ && (heads != heads_ || head_dim != dim_)) return false;
    heads_ = heads;
    dim_ = head_dim;
    const std::size_t need = static_cast<std::size_t>(capacity_ * heads_ * dim_);
    if (rows_.size() < need) rows_.resize(need);
    return true;
  }

  // Where position end_position()'s row goes (heads x head_dim floats), then
  // counts it. Null when the window keeps no rows (the position is counted still).
  float* append() {
    const std::int64_t slot = capacity_ > 0 ? (end_ - origin_) % capacity_ : -1;
    ++end_;
    return slot < 0 ? nullptr : rows_.data() + slot * heads_ * dim_;
  }

  std::int64_t end_position() const { return end_; }  // one past the last row pushed
  std::int64_t kept() const { return std::min(end_ - origin_, capacity_); }
  std::int64_t first_kept() const { return end_ - kept(); }
  std::int64_t heads() const { return heads_; }
  std::int64_t head_dim() const { return dim_; }

  // The kept rows as 0, 1 or 2 runs of consecutive positions, oldest first.
  int pieces() const {
    if (kept() == 0) return 0;
    const std::int64_t start = (first_kept() - origin_) % capacity_;
    return start + kept() > capacity_ ? 2 : 1;
  }
  QueryPiece piece(int i) const {
    const std::int64_t start = (first_kept() - origin_) % capacity_;
    const std::int64_t head = std::min(kept(), capacity_ - start);  // rows before the ring wraps
    const std::int64_t slot = i == 0 ? start : 0, count = i == 0 ? head : kept() - head;
    const std::int64_t first = i == 0 ? first_kept() : first_kept() + head;
    return {first, {rows_.data() + slot * heads_ * dim_, heads_, count, dim_, dim_, heads_ * dim_}};
  }

 private:
  std::int64_t origin_ = 0, end_ = 0, capacity_ = 0, heads_ = 0, dim_ = 0;
  std::vector<float> rows_;  // [capacity][heads][head_dim], position p at slot (p - origin) % capacity
};

}  // namespace flashcache
