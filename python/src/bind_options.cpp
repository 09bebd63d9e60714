// The library's enumerations and option structs, field for field, so that the
// Python dataclasses (flashcache/options.py) read their defaults from the C++
// ones and hand their values back through these.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <flashcache/archive.hpp>
#include <flashcache/options.hpp>
#include <flashcache/query_tail.hpp>
#include <flashcache/recall.hpp>
#include <flashcache/shared_keep.hpp>

#include "arrays.hpp"
#include "bind.hpp"

namespace flashcache::python {

namespace {

// Members by the library's names; a Python keyword gets PEP 8's trailing underscore (Transform.global_).
template <class E>
void bind_enum(nb::module_& m, const char* name, std::initializer_list<E> values) {
  nb::enum_<E> e(m, name);
  for (E v : values) e.value(std::string(to_string(v)) == "global" ? "global_" : to_string(v), v);
}

// A struct whose fields Python reads and writes by name; the dataclasses do the rest.
template <class S>
nb::class_<S> bind_struct(nb::module_& m, const char* name) {
  return nb::class_<S>(m, name).def(nb::init<>());
}

}  // namespace

void bind_options(nb::module_& m) {
  bind_enum<Transform>(m, "Transform", {Transform::global, Transform::blocked});
  bind_enum<Base>(m, "Base", {Base::lowpass, Base::peak, Base::mixed});
  bind_enum<Allocation>(m, "Allocation", {Allocation::dynamic, Allocation::uniform});
  bind_enum<QueryInput>(m, "QueryInput", {QueryInput::none, QueryInput::tail});
  bind_enum<TailMix>(m, "TailMix", {TailMix::sum, TailMix::max});
  bind_enum<MeanDistance>(m, "MeanDistance", {MeanDistance::kv_squared, MeanDistance::key_cosine});
  bind_enum<RopeLayout>(m, "RopeLayout", {RopeLayout::half, RopeLayout::interleaved});
  bind_enum<GridZone>(m, "GridZone", {GridZone::rectangle, GridZone::triangle});
  bind_enum<KeepSet>(m, "KeepSet", {KeepSet::per_head, KeepSet::per_layer, KeepSet::per_sequence});
  bind_enum<HeadCombine>(m, "HeadCombine",
                         {HeadCombine::mean_normalized, HeadCombine::max_normalized, HeadCombine::votes});
  nb::enum_<ArchiveOrder>(m, "ArchiveOrder")
      .value("eviction", ArchiveOrder::eviction)
      .value("position", ArchiveOrder::position);
  bind_enum<RecallScope>(m, "RecallScope", {RecallScope::shared, RecallScope::per_head});
  bind_enum<RecallScore>(m, "RecallScore", {RecallScore::exact, RecallScore::digest});

  bind_struct<RopeOptions>(m, "RopeOptions")
      .def_rw("derotate", &RopeOptions::derotate)
      .def_rw("theta", &RopeOptions::theta)
      .def_rw("layout", &RopeOptions::layout)
      .def_rw("first_position", &RopeOptions::first_position);
  bind_struct<ScoreOptions>(m, "ScoreOptions")
      .def_rw("gamma", &ScoreOptions::gamma)
      .def_rw("base", &ScoreOptions::base)
      .def_rw("transform", &ScoreOptions::transform)
      .def_rw("block_size", &ScoreOptions::block_size)
      .def_rw("normalize_terms", &ScoreOptions::normalize_terms)
      .def_rw("rope", &ScoreOptions::rope)
      .def_rw("query", &ScoreOptions::query)
      .def_rw("tail_weight", &ScoreOptions::tail_weight)
      .def_rw("tail_mix", &ScoreOptions::tail_mix)
      .def_rw("mean_weight", &ScoreOptions::mean_weight)
      .def_rw("mean_mix", &ScoreOptions::mean_mix)
      .def_rw("mean_distance", &ScoreOptions::mean_distance)
      .def_rw("mean_full_keep", &ScoreOptions::mean_full_keep)
      .def_rw("mean_zero_keep", &ScoreOptions::mean_zero_keep)
      .def_rw("bridge", &ScoreOptions::bridge)
      .def_rw("grid_zone", &ScoreOptions::grid_zone)
      .def_rw("grid_tile", &ScoreOptions::grid_tile);
  bind_struct<SelectOptions>(m, "SelectOptions")
      .def_rw("sink", &SelectOptions::sink)
      .def_rw("window", &SelectOptions::window)
      .def_rw("window_share", &SelectOptions::window_share)
      .def_rw("base_share", &SelectOptions::base_share)
      .def_rw("grid_base_share", &SelectOptions::grid_base_share);
  bind_struct<AllocateOptions>(m, "AllocateOptions")
      .def_rw("mode", &AllocateOptions::mode)
      .def_rw("min_layer_ratio", &AllocateOptions::min_layer_ratio);
  bind_struct<Options>(m, "Options")
      .def_rw("score", &Options::score)
      .def_rw("select", &Options::select)
      .def_rw("allocate", &Options::allocate)
      .def_static("paper", &Options::paper)
      .def_static("with_query_tail", &Options::with_query_tail, nb::arg("base"));
  bind_struct<SharedKeepOptions>(m, "SharedKeepOptions")
      .def_rw("keep_set", &SharedKeepOptions::keep_set)
      .def_rw("combine", &SharedKeepOptions::combine)
      .def_rw("page", &SharedKeepOptions::page);
  bind_struct<QueryTailOptions>(m, "QueryTailOptions")
      .def_rw("stride", &QueryTailOptions::stride)
      .def_rw("from_position", &QueryTailOptions::from_position)
      .def_rw("min_distance", &QueryTailOptions::min_distance)
      .def_rw("scale", &QueryTailOptions::scale);
  bind_struct<ArchiveOptions>(m, "ArchiveOptions")
      .def_rw("block_size", &ArchiveOptions::block_size)
      .def_rw("byte_cap", &ArchiveOptions::byte_cap)
      .def_rw("order", &ArchiveOptions::order);

  m.def("last_queries", &last_queries, nb::arg("prompt_tokens"), nb::arg("count") = kTailLastQueries);
  m.attr("TAIL_LAST_QUERIES") = kTailLastQueries;
  m.attr("TAIL_MIN_DISTANCE") = kTailMinDistance;

  // The checks a call makes before any work, callable on their own.
  m.def("check_options", [](const Options& o) { throw_if_error(check_options(o)); });
  m.def("check_shared_options", [](const SharedKeepOptions& o) { throw_if_error(check_shared_options(o)); });
  m.def("check_tail_options", [](const QueryTailOptions& o) { throw_if_error(check_tail_options(o)); });
  m.def("check_archive_options", [](const ArchiveOptions& o) { throw_if_error(check_archive_options(o)); });
}

}  // namespace flashcache::python
