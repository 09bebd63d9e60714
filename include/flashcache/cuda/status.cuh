#pragma once
// Turning CUDA results and the device's status word into flashcache::Status.
//
// A run on a stream cannot return what the device finds later (a budget below
// the protected set in one sequence, a page id out of range ...). Kernels
// record the first such failure in the workspace; device_status() waits for
// the stream and turns it into a Status with a message, when the caller
// chooses to look.
#include <cuda_runtime.h>
#include <cufft.h>

#include "flashcache/cuda/kernels/common.cuh"  // the status word
#include "flashcache/cuda/workspace.cuh"
#include "flashcache/error.hpp"

namespace flashcache::gpu {

inline Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::success();
  return make_error(Errc::cuda_error, what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

inline Status cufft_status(cufftResult r, const char* what) {
  if (r == CUFFT_SUCCESS) return Status::success();
  return make_error(Errc::cuda_error, what, ": cuFFT error ", static_cast<int>(r));
}

// The message for a status word read back from the device.
inline Status describe_device_status(const int* w) {
  using kernels::DeviceErrc;
  switch (static_cast<DeviceErrc>(w[0])) {
    case DeviceErrc::ok:
      return Status::success();
    case DeviceErrc::bad_indptr:
      return make_error(Errc::invalid_shape, "sequence ", w[1], ": indptr runs from ", w[2], " to ", w[3],
                        " (must be >= 0 and non-decreasing; paged: start at 0, and no sequence may hold more pages "
                        "than the capacity fills)");
    case DeviceErrc::bad_page:
      if (w[1] < 0) return make_error(Errc::invalid_shape, "page id ", w[2], " is outside [0, ", w[3], ") pages");
      return make_error(Errc::invalid_shape, "sequence ", w[1], ": last_page_len ", w[2], " is outside [1, page_size ",
                        w[3], "]");
    case DeviceErrc::capacity_exceeded:
      return make_error(Errc::invalid_shape, "the batch holds ", w[1], " tokens but capacity is ", w[2]);
    case DeviceErrc::budget_exceeds_tokens:
      return make_error(Errc::invalid_budget, "sequence ", w[1], ": keep budget ", w[2], " > ", w[3], " tokens");
    case DeviceErrc::budget_below_always_kept:
      return make_error(Errc::invalid_budget, "layer ", w[1], ", sequence ", w[2], ": keep budget ", w[4], " < ", w[5],
                        " always-kept tokens in head ", w[3], " (protected: sink, window, mask; and non-finite)");
    case DeviceErrc::total_below_floors:
      return make_error(Errc::invalid_budget, "sequence ", w[1], ": total budget ", w[2], " < ", w[3],
                        " always-kept tokens over the layers");
    case DeviceErrc::bad_energy_ratio:
      return make_error(Errc::invalid_option, "layer ", w[1], ", sequence ", w[2],
                        ": the energy ratio is not finite (overflowing K or V values?)");
    case DeviceErrc::output_capacity:
      return make_error(Errc::invalid_shape, "layer ", w[1], ": ", w[2], " kept rows do not fit out_capacity ", w[3]);
    case DeviceErrc::shared_page:
      return make_error(Errc::unsupported, "page id ", w[1], " appears again at position ", w[2],
                        " of the page table (a shared prefix or beam?): compact_in_place needs every page owned by "
                        "one sequence; copy shared pages first, or use a dense output");
    case DeviceErrc::grid_past_sequence:
      return make_error(Errc::invalid_shape, "grid span ", w[3], " [", w[4], ", ", w[5], ") reaches past the ", w[2],
                        " tokens of sequence ", w[1], " (Cache::spans are positions in every sequence of the batch)");
    case DeviceErrc::length_mismatch:
      return make_error(Errc::invalid_shape, "sequence ", w[1], " has ", w[2], " tokens on the device but ", w[3],
                        " in the GlobalTransform");
  }
  return make_error(Errc::cuda_error, "unknown device status ", w[0]);
}

// Waits for `stream`, then reads the status word of the last run on `workspace`.
inline Status device_status(const void* workspace, const WorkspaceLayout& layout, cudaStream_t stream) {
  int words[kernels::kStatusWords] = {};
  const auto* src = static_cast<const unsigned char*>(workspace) + layout.status;
  FLASHCACHE_RETURN_IF_ERROR(
      cuda_status(cudaMemcpyAsync(words, src, sizeof words, cudaMemcpyDeviceToHost, stream), "reading the status"));
  FLASHCACHE_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(stream), "waiting for the run"));
  return describe_device_status(words);
}

}  // namespace flashcache::gpu
