#pragma once
// What the GPU API works on: a model's KV cache in device memory, as a ragged
// batch of sequences, dense or paged, and where the results go.
//
// Same vocabulary as the CPU view (view.hpp): the head dim is contiguous, the
// head and token strides are free, so NHD and HND are one description.
//   dense NHD  [tokens][heads][d]: head_stride = d,          token_stride = heads * d
//   dense HND  [heads][tokens][d]: head_stride = tokens * d, token_stride = d
//   paged NHD  [pages][page_size][heads][d]: page_stride = page_size * heads * d
//   paged HND  [pages][heads][page_size][d]: head_stride = page_size * d, token_stride = d
// Every layer shares the shape; only its K and V pointers differ. Heads are KV
// heads: with GQA the scores and the kept sets are per KV head.
#include <cstdint>
#include <type_traits>

#include "flashcache/grid.hpp"
#include "flashcache/types.hpp"

namespace flashcache::gpu {

namespace detail {
// The elements a Cache may hold.
template <class T>
constexpr bool is_element_v = std::is_same_v<T, float> || std::is_same_v<T, half_t> || std::is_same_v<T, bfloat16_t>;
}  // namespace detail

// FlashInfer-style page table, CSR over sequences (device arrays).
struct PageTable {
  const std::int32_t* indptr = nullptr;         // [sequences + 1] offsets into indices
  const std::int32_t* indices = nullptr;        // page ids, [indptr[sequences]]
  const std::int32_t* last_page_len = nullptr;  // [sequences], 1..page_size for a sequence with pages
  std::int64_t page_size = 0;                   // tokens per page
  std::int64_t page_stride = 0;                 // elements from one page to the next
  std::int64_t num_pages = 0;                   // pages in the pool: page ids lie in [0, num_pages)
};

template <class T>
struct Cache {
  int layers = 1;
  T* const* k = nullptr;  // host array of `layers` device pointers (layer l's K base)
  T* const* v = nullptr;
  std::int64_t heads = 0;  // KV heads
  std::int64_t head_dim = 0;
  std::int64_t head_stride = 0;   // elements
  std::int64_t token_stride = 0;  // elements
  // The batch. Tokens of all sequences, packed in order, index the scores, the
  // kept rows and the protect mask.
  int sequences = 1;
  std::int64_t capacity = 0;  // bound on the packed tokens; dense: the token rows of each layer's buffer
  const std::int32_t* indptr =
      nullptr;      // dense: [sequences + 1] token row offsets; null: one sequence of `capacity` tokens
  PageTable pages;  // set pages.indices (and indptr, last_page_len) for a paged cache
  // The caller's protect mask, or null: a device array of one byte per packed
  // token of the batch (token t of sequence b at byte t + the tokens of
  // sequences 0..b-1, as in the scores), nonzero = always kept, shared by every
  // head and layer (the GPU form of the CPU's ProtectMask, mask.hpp). It must
  // cover every token the batch holds; `capacity` bytes always do.
  const std::uint8_t* protect = nullptr;
  // The request's image spans (grid.hpp), or none: the same positions in every
  // sequence of the batch, at most kMaxGridSpans (limits.cuh). Host memory,
  // read when the call is made.
  ImageSpans spans;
  // ScoreOptions::query = tail: the keys' tails (query_tail.hpp), a device array of
  // floats [layers][heads][capacity], token t of sequence b at t + the tokens of
  // sequences 0..b-1 as in the scores; null otherwise. An engine raises them
  // during prefill from each chunk's queries (query_tails_async, query_tails.cuh).
  const float* tails = nullptr;

  bool paged() const { return pages.indices != nullptr; }
  // Where sequence s's rows start: its pages when paged, its tokens when dense.
  const std::int32_t* sequence_indptr() const { return paged() ? pages.indptr : indptr; }

  // The common layouts, every other field at its default. `tokens` rows of
  // each layer's buffer hold the batch, packed in order; `indptr` ([sequences
  // + 1] device offsets) may be null for one sequence.
  static Cache dense_nhd(int layers, T* const* k, T* const* v, std::int64_t heads, std::int64_t head_dim,
                         std::int64_t tokens, int sequences = 1, const std::int32_t* indptr = nullptr) {
    return dense(layers, k, v, heads, head_dim, head_dim, heads * head_dim, tokens, sequences, indptr);
  }
  static Cache dense_hnd(int layers, T* const* k, T* const* v, std::int64_t heads, std::int64_t head_dim,
                         std::int64_t tokens, int sequences = 1, const std::int32_t* indptr = nullptr) {
    return dense(layers, k, v, heads, head_dim, tokens * head_dim, head_dim, tokens, sequences, indptr);
  }
  // A page pool of `table.num_pages` pages of `table.page_size` tokens in each
  // layer's buffer; page_stride is set here. `capacity` bounds the tokens of
  // the batch (the scores and kept arrays hold that many).
  static Cache paged_nhd(int layers, T* const* k, T* const* v, std::int64_t heads, std::int64_t head_dim,
                         PageTable table, int sequences, std::int64_t capacity) {
    return paged(layers, k, v, heads, head_dim, head_dim, heads * head_dim, table, sequences, capacity);
  }
  static Cache paged_hnd(int layers, T* const* k, T* const* v, std::int64_t heads, std::int64_t head_dim,
                         PageTable table, int sequences, std::int64_t capacity) {
    return paged(layers, k, v, heads, head_dim, table.page_size * head_dim, head_dim, table, sequences, capacity);
  }

 private:
  static Cache dense(int layers, T* const* k, T* const* v, std::int64_t heads, std::int64_t head_dim,
                     std::int64_t head_stride, std::int64_t token_stride, std::int64_t tokens, int sequences,
                     const std::int32_t* indptr) {
    Cache c;
    c.layers = layers;
    c.k = k;
    c.v = v;
    c.heads = heads;
    c.head_dim = head_dim;
    c.head_stride = head_stride;
    c.token_stride = token_stride;
    c.sequences = sequences;
    c.capacity = tokens;
    c.indptr = indptr;
    return c;
  }
  static Cache paged(int layers, T* const* k, T* const* v, std::int64_t heads, std::int64_t head_dim,
                     std::int64_t head_stride, std::int64_t token_stride, PageTable table, int sequences,
                     std::int64_t capacity) {
    Cache c = dense(layers, k, v, heads, head_dim, head_stride, token_stride, capacity, sequences, nullptr);
    table.page_stride = table.page_size * heads * head_dim;
    c.pages = table;
    return c;
  }
};

// Where the results go. Everything is optional: without kept / kept_indptr
// they stay in the workspace (see Workspace in workspace.cuh).
template <class T>
struct Outputs {
  // Kept token indices (within each sequence), ascending: for layer l, head h,
  // sequence b, kept[(l * heads + h) * capacity + kept_indptr[l * (sequences + 1) + b] + i].
  std::int32_t* kept = nullptr;         // [layers][heads][capacity]
  std::int32_t* kept_indptr = nullptr;  // [layers][sequences + 1]
  float* energy_ratio = nullptr;        // [layers][sequences]: R_l
  // Dense compact cache: kept row i of layer l (packed over the batch, see
  // kept_indptr) goes to k_out[l] + h * out_head_stride + i * out_token_stride.
  T* const* k_out = nullptr;  // host array of `layers` device pointers, or null
  T* const* v_out = nullptr;
  std::int64_t out_head_stride = 0, out_token_stride = 0;
  std::int64_t out_capacity = 0;  // rows per head in each output buffer
  // Paged caches only: move the kept rows forward in place and report per
  // (layer, sequence) the new length and the trailing pages no longer used.
  bool compact_in_place = false;
  std::int32_t* new_len = nullptr;      // [layers][sequences]
  std::int32_t* pages_freed = nullptr;  // [layers][sequences]
};

}  // namespace flashcache::gpu
