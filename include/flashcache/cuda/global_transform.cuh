#pragma once
// GlobalTransform: the cuFFT plans of Transform::global, created up front and
// owned by the caller (no hidden handles, no allocation in the run path). In
// flashcache's own names "plan" means the budget plan (plan.hpp); here it is
// cuFFT's word for a prepared transform.
//
// One batched C2C plan per distinct sequence length (batch = heads x
// head_dim columns, K in the real part and V in the imaginary part). Plans
// are made with auto-allocation off: their work area is a region of the
// caller's workspace.
//
// cuFFT keeps the stream and the work area inside each plan, so one plan
// shared by two streams (or by two captured graphs over two workspaces)
// would run on whichever was set last. A GlobalTransform therefore serves one
// (stream, workspace) pair: the first run binds it, and a run with another
// stream or workspace is refused with a message. Create one per stream;
// release_binding() rebinds, once no run that uses it is in flight.
#include <cuda_runtime.h>
#include <cufft.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "flashcache/cuda/status.cuh"
#include "flashcache/error.hpp"
#ifdef FLASHCACHE_GPU_SIM
#include "flashcache/cuda/sim_fft.cuh"
#endif

namespace flashcache::gpu {

class GlobalTransform {
 public:
  GlobalTransform() = default;
  GlobalTransform(const GlobalTransform&) = delete;
  GlobalTransform& operator=(const GlobalTransform&) = delete;
  GlobalTransform(GlobalTransform&& o) noexcept { *this = std::move(o); }
  GlobalTransform& operator=(GlobalTransform&& o) noexcept {
    if (this != &o) {
      release();
      lengths_ = std::move(o.lengths_);
      plans_ = std::move(o.plans_);
      heads_ = o.heads_;
      head_dim_ = o.head_dim_;
      work_bytes_ = o.work_bytes_;
      o.plans_.clear();
      bound_ = o.bound_;
      stream_ = o.stream_;
      work_ = o.work_;
      o.bound_ = false;
    }
    return *this;
  }
  ~GlobalTransform() { release(); }

  // `lengths` is a host copy of every sequence's token count, the same the
  // device sees through the cache's indptr / page table (a run checks it).
  static Status create(const std::int64_t* lengths, int sequences, std::int64_t heads, std::int64_t head_dim,
                       GlobalTransform* out) {
    if (sequences < 1 || heads < 1 || head_dim < 1)
      return make_error(Errc::invalid_shape, "GlobalTransform: sequences ", sequences, ", heads ", heads, ", head_dim ",
                        head_dim, " must all be >= 1");
    if (lengths == nullptr) return make_error(Errc::invalid_shape, "GlobalTransform: null lengths");
    GlobalTransform t;
    t.heads_ = heads;
    t.head_dim_ = head_dim;
    t.lengths_.assign(lengths, lengths + sequences);
    for (const std::int64_t n : t.lengths_) {
      if (n < 0 || n >= (std::int64_t{1} << 24))
        return make_error(Errc::unsupported, "GlobalTransform: sequence length ", n, " is outside [0, 2^24)");
      // Length 0 needs nothing; length 1 is the identity (no cuFFT plan, see launch/score_global.cuh).
      if (n <= 1 || t.plans_.count(n)) continue;
#ifdef FLASHCACHE_GPU_SIM
      t.plans_.emplace(n, cufftHandle{});  // the host stands in for cuFFT (sim_fft.cuh): no plan, no work area
      continue;
#endif
      cufftHandle handle = 0;
      FLASHCACHE_RETURN_IF_ERROR(cufft_status(cufftCreate(&handle), "cufftCreate"));
      t.plans_.emplace(n, handle);  // owned from here on, destroyed by release()
      FLASHCACHE_RETURN_IF_ERROR(cufft_status(cufftSetAutoAllocation(handle, 0), "cufftSetAutoAllocation"));
      long long size = n;
      std::size_t work = 0;
      FLASHCACHE_RETURN_IF_ERROR(cufft_status(
          cufftMakePlanMany64(handle, 1, &size, nullptr, 1, size, nullptr, 1, size, CUFFT_C2C, heads * head_dim, &work),
          "cufftMakePlanMany64"));
      if (work > t.work_bytes_) t.work_bytes_ = work;
    }
    *out = std::move(t);
    return Status::success();
  }

  const std::vector<std::int64_t>& lengths() const { return lengths_; }
  std::int64_t heads() const { return heads_; }
  std::int64_t head_dim() const { return head_dim_; }
  std::size_t work_bytes() const { return work_bytes_; }
  std::int64_t max_length() const {
    std::int64_t m = 0;
    for (auto n : lengths_) m = n > m ? n : m;
    return m;
  }
  // The plan for sequences of n tokens (n must be one of lengths()).
  cufftHandle handle(std::int64_t n) const { return plans_.at(n); }

  // One in-place C2C transform of every column of a sequence of n > 1 tokens
  // (heads x head_dim contiguous columns of n points): cuFFT's forward, or its
  // unscaled inverse. Only after bind(), on the bound stream.
  Status execute(std::int64_t n, cufftComplex* z, bool inverse) const {
#ifdef FLASHCACHE_GPU_SIM
    return detail::host_fft_columns(z, n, heads_ * head_dim_, inverse, stream_);
#else
    return cufft_status(cufftExecC2C(handle(n), z, z, inverse ? CUFFT_INVERSE : CUFFT_FORWARD),
                        inverse ? "cufftExecC2C inverse" : "cufftExecC2C forward");
#endif
  }

  // Binds every cuFFT plan to `stream` and the work area `work` on first use;
  // later calls must pass the same pair. Thread-safe.
  Status bind(cudaStream_t stream, void* work) const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (bound_) {
      if (stream == stream_ && work == work_) return Status::success();
      return make_error(Errc::invalid_option, "GlobalTransform is bound to another ",
                        stream != stream_ ? "stream" : "workspace",
                        ": cuFFT keeps one stream and work area per plan, so use one GlobalTransform per stream and "
                        "workspace (or release_binding() once its runs have finished)");
    }
#ifndef FLASHCACHE_GPU_SIM
    for (const auto& entry : plans_) {
      FLASHCACHE_RETURN_IF_ERROR(cufft_status(cufftSetStream(entry.second, stream), "cufftSetStream"));
      FLASHCACHE_RETURN_IF_ERROR(cufft_status(cufftSetWorkArea(entry.second, work), "cufftSetWorkArea"));
    }
#endif
    bound_ = true;
    stream_ = stream;
    work_ = work;
    return Status::success();
  }
  // Forgets the binding. Only when no run that uses this plan is in flight.
  void release_binding() const {
    std::lock_guard<std::mutex> lock(mutex_);
    bound_ = false;
  }

 private:
  void release() {
#ifndef FLASHCACHE_GPU_SIM
    for (auto& entry : plans_) cufftDestroy(entry.second);
#endif
    plans_.clear();
  }
  std::vector<std::int64_t> lengths_;
  std::map<std::int64_t, cufftHandle> plans_;
  std::int64_t heads_ = 0, head_dim_ = 0;
  std::size_t work_bytes_ = 0;
  // The binding: what cuFFT holds inside the plans (see bind()).
  mutable std::mutex mutex_;
  mutable bool bound_ = false;
  mutable cudaStream_t stream_ = nullptr;
  mutable void* work_ = nullptr;
};

}  // namespace flashcache::gpu
