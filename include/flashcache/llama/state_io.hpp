#pragma once
// A sequence's state blob through llama.cpp's API, for the calls that replace a
// sequence (compress.hpp, recall.hpp): read it, and put it back after a failure.
#include <llama.h>

#include <cstdint>
#include <vector>

#include "flashcache/error.hpp"

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
}  // namespace llama
}  // namespace flashcache
