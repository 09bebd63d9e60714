#pragma once
// The caller's protect mask: one byte per token, nonzero = always kept (e.g.
// text tokens, so that only visual tokens are compressed). It travels as an
// argument of its own, with its length, so that it can be checked against the
// layer and can differ between layers and sequences.
#include <cstdint>
#include <vector>

#include "error.hpp"

namespace flashcache {

struct ProtectMask {
  const std::uint8_t* data = nullptr;  // null: no mask
  std::int64_t tokens = 0;             // bytes at data

  ProtectMask() = default;
  ProtectMask(const std::uint8_t* bytes, std::int64_t count) : data(bytes), tokens(count) {}
  // NOLINTNEXTLINE(google-explicit-constructor): a vector of bytes is the usual mask
  ProtectMask(const std::vector<std::uint8_t>& bytes)
      : data(bytes.data()), tokens(static_cast<std::int64_t>(bytes.size())) {}

  bool empty() const { return data == nullptr; }
  bool operator[](std::int64_t t) const { return data != nullptr && data[t] != 0; }
  // Tokens [first, first + count): the mask of one sequence of a packed batch.
  ProtectMask slice(std::int64_t first, std::int64_t count) const {
    return data == nullptr ? ProtectMask{} : ProtectMask{data + first, count};
  }
};

// A mask, when given, must cover exactly the layer's tokens.
inline Status check_mask(ProtectMask mask, std::int64_t tokens) {
  if (mask.data == nullptr) return Status::success();
  if (mask.tokens != tokens)
    return make_error(Errc::invalid_option, "protect mask has ", mask.tokens, " tokens but the layer has ", tokens);
  return Status::success();
}

}  // namespace flashcache
