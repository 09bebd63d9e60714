// The CUDA side of the Python module's GPU door (gpu_door.hpp): typed gpu::Cache and
// gpu::Outputs over the caller's device arrays, the global transform's plans, one run.
#include "gpu_door.hpp"

#include <cuda_runtime.h>

#include <flashcache/cuda/compress.cuh>

namespace flashcache::python {

struct GpuRun::Impl {
  virtual ~Impl() = default;
  virtual Status run(void* workspace, std::size_t bytes) = 0;
  std::size_t bytes = 0;
};

namespace {

template <class T>
struct TypedRun final : GpuRun::Impl {
  std::vector<T*> k, v;  // gpu::Cache reads the layers' pointers from host arrays it does not own
  gpu::Cache<T> cache;
  gpu::Outputs<T> outputs;
  gpu::GlobalTransform global;
  Budget budget = Budget::ratio(0.0);
  Options options;
  cudaStream_t stream = nullptr;

  const gpu::GlobalTransform* global_or_null() const {
    return options.score.transform == Transform::global ? &global : nullptr;
  }
  Status run(void* workspace, std::size_t workspace_bytes) override {
    return gpu::compress_and_wait(cache, budget, options, outputs, workspace, workspace_bytes, stream,
                                  global_or_null());
  }
};

template <class T>
Status prepare_typed(const GpuCache& c, const Budget& budget, const Options& options, const GpuResults& results,
                     std::uintptr_t stream, std::unique_ptr<GpuRun::Impl>* out) {
  auto run = std::make_unique<TypedRun<T>>();
  // gpu::Cache holds T* for compact_in_place; this run only reads K and V (no compaction).
  for (const void* p : c.k) run->k.push_back(const_cast<T*>(static_cast<const T*>(p)));
  for (const void* p : c.v) run->v.push_back(const_cast<T*>(static_cast<const T*>(p)));
  gpu::Cache<T>& cache = run->cache;
  cache.layers = static_cast<int>(c.k.size());
  cache.k = run->k.data();
  cache.v = run->v.data();
  cache.heads = c.heads;
  cache.head_dim = c.head_dim;
  cache.head_stride = c.head_stride;
  cache.token_stride = c.token_stride;
  cache.capacity = c.tokens;  // one sequence of every row (indptr stays null)
  run->outputs.kept = results.kept;
  run->outputs.kept_indptr = results.kept_indptr;
  run->outputs.energy_ratio = results.energy_ratio;
  run->budget = budget;
  run->options = options;
  run->stream = reinterpret_cast<cudaStream_t>(stream);
  if (options.score.transform == Transform::global)
    FLASHCACHE_RETURN_IF_ERROR(gpu::GlobalTransform::create(&c.tokens, 1, c.heads, c.head_dim, &run->global));
  FLASHCACHE_RETURN_IF_ERROR(gpu::can_implement(cache, budget, options, run->outputs, run->global_or_null()));
  FLASHCACHE_RETURN_IF_ERROR(gpu::workspace_size(cache, options, &run->bytes, run->global_or_null()));
  *out = std::move(run);
  return Status::success();
}

}  // namespace

GpuRun::GpuRun(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuRun::~GpuRun() = default;

Status GpuRun::prepare(const GpuCache& cache, const Budget& budget, const Options& options,
                       const GpuResults& results, std::uintptr_t stream, std::unique_ptr<GpuRun>* out) {
  std::unique_ptr<Impl> impl;
  FLASHCACHE_RETURN_IF_ERROR(cache.dtype == DType::f16 ? prepare_typed<half_t>(cache, budget, options, results, stream, &impl)
                             : cache.dtype == DType::bf16
                                 ? prepare_typed<bfloat16_t>(cache, budget, options, results, stream, &impl)
                                 : prepare_typed<float>(cache, budget, options, results, stream, &impl));
  out->reset(new GpuRun(std::move(impl)));
  return Status::success();
}

std::size_t GpuRun::workspace_bytes() const { return impl_->bytes; }

Status GpuRun::run(void* workspace, std::size_t bytes) { return impl_->run(workspace, bytes); }

int gpu_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: clear the sticky error, report none
    return 0;
  }
  return n;
}

int gpu_current_device() {
  int d = -1;
  if (cudaGetDevice(&d) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return d;
}

}  // namespace flashcache::python
