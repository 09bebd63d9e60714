// flashcache._core: the C++ library behind the Python package. The package's
// modules (flashcache/*.py) are the public face; this module is its engine.
#include <nanobind/nanobind.h>

#include <flashcache/error.hpp>
#include <flashcache/version.hpp>

#include "bind.hpp"

namespace nb = nanobind;

NB_MODULE(_core, m) {
  m.doc() = "flashcache's C++ library (FlashCache KV cache compression); use the flashcache package";
  // flashcache::Error carries the library's own message; a ValueError, since every
  // Status the library returns names a bad argument, shape or option.
  nb::exception<flashcache::Error>(m, "Error", PyExc_ValueError);
  m.attr("__version__") = FLASHCACHE_VERSION_STRING;
  flashcache::python::bind_options(m);
  flashcache::python::bind_compress(m);
  flashcache::python::bind_tails(m);
  flashcache::python::bind_recall(m);
}
