#pragma once
// The parts of the extension module flashcache._core, one file each.
#include <nanobind/nanobind.h>

namespace flashcache::python {

void bind_options(nanobind::module_& m);   // enumerations and option structs
void bind_compress(nanobind::module_& m);  // score, compress, compress_model
void bind_tails(nanobind::module_& m);     // the prompt's queries: keys' tails
void bind_recall(nanobind::module_& m);    // the archive of evicted tokens and recall

}  // namespace flashcache::python
