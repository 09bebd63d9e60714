// flashcache._cuda: CUDA tensors (DLPack, torch) through the GPU front door
// (gpu_door.hpp), built only with FLASHCACHE_PYTHON_CUDA. A module of its own, so
// that `import flashcache` never needs the CUDA libraries; flashcache/cuda.py is its face.
//
// The caller (flashcache/cuda.py) allocates every device array with its framework's
// allocator, the workspace too (through `allocate`), and passes the stream explicitly;
// this module only checks, views and runs, and waits for the run before it returns.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "gpu_door.hpp"

namespace nb = nanobind;

namespace flashcache::python {

namespace {

// The library's Status as flashcache.Error (flashcache._core's), like every other call of the package.
void raise_if_error(const Status& s) {
  if (s.ok()) return;
  nb::object error = nb::module_::import_("flashcache._core").attr("Error");
  PyErr_SetString(error.ptr(), ("flashcache: " + s.message()).c_str());
  throw nb::python_error();
}

template <class A>
void require_cuda(const A& a, const std::string& name, int device) {
  if (a.device_type() != nb::device::cuda::value)
    value_error(name + ": expected a CUDA tensor (device type " + std::to_string(a.device_type()) + ")");
  if (a.device_id() != device)
    value_error(name + ": on cuda:" + std::to_string(a.device_id()) + ", the call runs on cuda:" +
                std::to_string(device) + " (every tensor on one device)");
}

// An array the run writes: results and the workspace.
using OutArray = nb::ndarray<>;

// A result array: the dtype, the shape and C-contiguity the run writes.
template <class T>
T* output(const OutArray& a, const std::string& name, std::initializer_list<std::int64_t> shape, int device) {
  require_cuda(a, name, device);
  if (a.dtype() != nb::dtype<T>()) type_error(name + ": dtype " + dtype_name(a.dtype()));
  std::vector<std::int64_t> want(shape);
  bool same = a.ndim() == want.size();
  std::int64_t expect = 1;
  for (std::size_t i = want.size(); same && i-- > 0;) {
    same = static_cast<std::int64_t>(a.shape(i)) == want[i] && (want[i] <= 1 || a.stride(i) == expect);
    expect *= want[i];
  }
  if (!same) value_error(name + ": shape " + shape_string(a) + " is not the C-contiguous one the run writes");
  return static_cast<T*>(a.data());
}

// Every layer's K and V as one GpuCache: one dtype, one device, one shape, one set of strides.
GpuCache gpu_cache(const std::vector<AnyArray>& k, const std::vector<AnyArray>& v, Layout layout, int device) {
  if (k.empty()) value_error("compress_model: no layers");
  if (k.size() != v.size())
    value_error(std::to_string(k.size()) + " K layers but " + std::to_string(v.size()) + " V layers");
  GpuCache c;
  c.dtype = kv_dtype(k[0], "k[0]");
  const int h = layout == Layout::hnd ? 0 : 1, n = layout == Layout::hnd ? 1 : 0;
  for (std::size_t l = 0; l < k.size(); ++l) {
    for (const auto* a : {&k[l], &v[l]}) {
      const std::string name = std::string(a == &k[l] ? "k[" : "v[") + std::to_string(l) + "]";
      require_cuda(*a, name, device);
      if (kv_dtype(*a, name.c_str()) != c.dtype)
        type_error(name + " is " + to_string(kv_dtype(*a, name.c_str())) + ", k[0] " + to_string(c.dtype) +
                   " (one dtype for the model)");
      if (a->ndim() != 3)
        value_error(name + ": expected 3 dimensions " +
                    (layout == Layout::hnd ? "[heads, tokens, head_dim]" : "[tokens, heads, head_dim]") +
                    ", got shape " + shape_string(*a));
      if (a->shape(2) > 1 && a->stride(2) != 1)
        value_error(name + ": the head dim must be contiguous (stride 1); pass .contiguous()");
      const std::int64_t shape[3] = {static_cast<std::int64_t>(a->shape(h)), static_cast<std::int64_t>(a->shape(n)),
                                     static_cast<std::int64_t>(a->shape(2))};
      const std::int64_t strides[2] = {a->stride(h), a->stride(n)};
      if (c.k.empty() && c.v.empty()) {
        c.heads = shape[0], c.tokens = shape[1], c.head_dim = shape[2];
        c.head_stride = strides[0], c.token_stride = strides[1];
      } else if (shape[0] != c.heads || shape[1] != c.tokens || shape[2] != c.head_dim) {
        value_error(name + ": shape " + shape_string(*a) + " differs from k[0]'s " + shape_string(k[0]) +
                    " (one shape for every layer)");
      } else if (strides[0] != c.head_stride || strides[1] != c.token_stride) {
        value_error(name + ": its strides differ from k[0]'s (every layer one layout; pass .contiguous())");
      }
      (a == &k[l] ? c.k : c.v).push_back(a->data());
    }
  }
  return c;
}

Layout layout_named(const std::string& name) {
  if (name == "hnd") return Layout::hnd;
  if (name == "nhd") return Layout::nhd;
  value_error("layout '" + name + "' is not 'hnd' or 'nhd'");
}

// The run: check and plan, take the workspace from `allocate(bytes)` (a uint8 device
// tensor, kept alive here until the run has finished), run without the GIL, wait.
void compress_model(const std::vector<AnyArray>& k, const std::vector<AnyArray>& v, const std::string& layout,
                    const Budget& budget, const Options& options, std::uintptr_t stream, int device,
                    const nb::callable& allocate, const OutArray& kept, const OutArray& kept_indptr,
                    const OutArray& energy_ratio) {
  const GpuCache cache = gpu_cache(k, v, layout_named(layout), device);
  const auto layers = static_cast<std::int64_t>(k.size());
  GpuResults results;
  results.kept = output<std::int32_t>(kept, "kept", {layers, cache.heads, cache.tokens}, device);
  results.kept_indptr = output<std::int32_t>(kept_indptr, "kept_indptr", {layers, 2}, device);
  results.energy_ratio = output<float>(energy_ratio, "energy_ratio", {layers}, device);
  if (gpu_current_device() != device)
    value_error("the current CUDA device is " + std::to_string(gpu_current_device()) + ", the tensors are on cuda:" +
                std::to_string(device) + " (flashcache.cuda sets it; call through it)");
  std::unique_ptr<GpuRun> run;
  raise_if_error(GpuRun::prepare(cache, budget, options, results, stream, &run));
  const std::size_t bytes = run->workspace_bytes();
  const nb::object workspace_owner = allocate(bytes);
  const OutArray workspace = nb::cast<OutArray>(workspace_owner);
  require_cuda(workspace, "workspace", device);
  if (workspace.itemsize() * workspace.size() < bytes)
    value_error("workspace: " + std::to_string(workspace.itemsize() * workspace.size()) + " bytes, the run needs " +
                std::to_string(bytes));
  Status s;
  {
    nb::gil_scoped_release release;
    s = run->run(workspace.data(), bytes);
  }
  raise_if_error(s);
}

}  // namespace

}  // namespace flashcache::python

NB_MODULE(_cuda, m) {
  using namespace flashcache::python;
  m.doc() = "flashcache's GPU front door for CUDA tensors; use flashcache.cuda";
  nb::module_::import_("flashcache._core");  // the option and budget types bound there
  m.def("device_count", &gpu_device_count, "CUDA devices this process sees (0 without a driver)");
  m.def("compress_model", &compress_model, nb::arg("k"), nb::arg("v"), nb::arg("layout"), nb::arg("budget"),
        nb::arg("options"), nb::arg("stream"), nb::arg("device"), nb::arg("allocate"), nb::arg("kept"),
        nb::arg("kept_indptr"), nb::arg("energy_ratio"));
}
