#pragma once
// The GPU front door (flashcache/cuda/compress.cuh) behind a plain C++ interface: nvcc
// compiles its side (gpu_door.cu) and nanobind's side (bind_cuda.cpp) never sees CUDA.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <flashcache/error.hpp>
#include <flashcache/options.hpp>
#include <flashcache/types.hpp>

namespace flashcache::python {

// One sequence's dense cache on one device: every layer has the same shape and strides,
// only its K and V pointers differ (gpu::Cache's own rule).
struct GpuCache {
  DType dtype = DType::f32;
  std::vector<const void*> k, v;  // device pointers, one per layer (read only)
  std::int64_t heads = 0, tokens = 0, head_dim = 0;
  std::int64_t head_stride = 0, token_stride = 0;  // elements
};

// Where the results go (device arrays the caller allocated).
struct GpuResults {
  std::int32_t* kept = nullptr;         // [layers][heads][tokens]
  std::int32_t* kept_indptr = nullptr;  // [layers][2]
  float* energy_ratio = nullptr;        // [layers]
};

// One call in two steps, so that the workspace comes from the caller's allocator in between.
class GpuRun {
 public:
  // Checks everything the host can (can_implement) and makes the global transform's cuFFT
  // plans; nothing is enqueued. `stream` is a cudaStream_t as an integer (0: the legacy stream).
  static Status prepare(const GpuCache& cache, const Budget& budget, const Options& options,
                        const GpuResults& results, std::uintptr_t stream, std::unique_ptr<GpuRun>* out);
  ~GpuRun();
  std::size_t workspace_bytes() const;
  // Runs on `workspace` and waits for the stream (gpu::compress_and_wait).
  Status run(void* workspace, std::size_t bytes);

  struct Impl;

 private:
  explicit GpuRun(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// CUDA devices this process sees; 0 without a driver or a device (never an error).
int gpu_device_count();
// The calling thread's current CUDA device, or -1 when there is none.
int gpu_current_device();

}  // namespace flashcache::python
