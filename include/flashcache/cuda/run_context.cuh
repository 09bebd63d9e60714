#pragma once
// What every launch of one call reads, worked out once per call: the layers,
// the row map, the sequence table, the image spans, the protected set, the
// vector-load decision and the status word. Each launch header
// (launch/) fills its kernel's Params from it.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "flashcache/cuda/kernels/common.cuh"
#include "flashcache/cuda/cache.cuh"
#include "flashcache/cuda/checked_call.cuh"
#include "flashcache/cuda/limits.cuh"
#include "flashcache/cuda/status.cuh"
#include "flashcache/cuda/workspace.cuh"
#include "flashcache/options.hpp"
#include "flashcache/types.hpp"

namespace flashcache::gpu::detail {

inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// Can every row be moved with 16-byte accesses?
template <class T>
bool rows_vectorizable(const Cache<T>& c) {
  const auto e = static_cast<std::int64_t>(sizeof(T));
  if ((c.head_dim * e) % 16 || (c.head_stride * e) % 16 || (c.token_stride * e) % 16) return false;
  if (c.paged() && (c.pages.page_stride * e) % 16) return false;
  for (int l = 0; l < c.layers; ++l)
    if (!aligned16(c.k[l]) || !aligned16(c.v[l])) return false;
  return true;
}

template <class T>
kernels::RowMap row_map(const Cache<T>& c) {
  kernels::RowMap r;
  r.head_stride = c.head_stride;
  r.token_stride = c.token_stride;
  r.indptr = c.sequence_indptr();
  if (c.paged()) {
    r.page_indices = c.pages.indices;
    r.page_size = c.pages.page_size;
    r.page_stride = c.pages.page_stride;
  }
  return r;
}

// The first fields of every per-layer pass's Params (kernels::LayerRows).
template <class T>
kernels::LayerRows<T> layer_rows(const Cache<T>& c, const Workspace& ws) {
  kernels::LayerRows<T> r{};
  for (int l = 0; l < c.layers; ++l) {
    r.k[l] = c.k[l];
    r.v[l] = c.v[l];
  }
  r.rows = row_map(c);
  r.seq = {ws.seq_len(), ws.seq_offset(), ws.seq_slots()};
  r.sequences = c.sequences;
  r.head_dim = static_cast<int>(c.head_dim);
  return r;
}

inline Status launched(const char* kernel) { return cuda_status(cudaGetLastError(), kernel); }

template <class T>
struct RunContext {
  // Sets the LayerRows prefix of a per-layer pass's Params.
  template <class Params>
  void set_layer_rows(Params* p) const {
    static_cast<kernels::LayerRows<T>&>(*p) = layers;
  }

  RunContext(const Cache<T>& cache_, const Options& opt_, const Workspace& ws_, const CheckedCall& checked_)
      : cache(cache_),
        opt(opt_),
        ws(ws_),
        checked(&checked_),
        layers(layer_rows(cache_, ws_)),
        grids(grid_spans(cache_.spans, opt_.score)),
        protect{opt_.select.sink, opt_.select.window, cache_.protect},
        vector_ok(rows_vectorizable(cache_)),
        status(ws_.status()) {}

  const Cache<T>& cache;
  const Options& opt;
  const Workspace& ws;
  const CheckedCall* checked;  // what the call's checks worked out (checked_call.cuh)
  // K and V of each layer, the row map and the sequence table (written by
  // stage 0, launch/sequence_table.cuh, read by every later one): the first
  // fields of the per-layer passes' Params.
  kernels::LayerRows<T> layers;
  kernels::GridSpans grids;
  kernels::ProtectRule protect;
  bool vector_ok;  // every row of the cache moves in 16-byte accesses
  int* status;
};

}  // namespace flashcache::gpu::detail
