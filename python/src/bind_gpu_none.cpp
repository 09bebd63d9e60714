// Built without CUDA: the GPU door says so by name instead of being absent.
#include <nanobind/nanobind.h>

#include "bind.hpp"

namespace flashcache::python {

void bind_gpu(nanobind::module_& m) { m.attr("has_cuda") = false; }

}  // namespace flashcache::python
