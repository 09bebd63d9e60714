// The keys' tails (query_tail.hpp): a prompt's queries, fed in chunks as an
// engine prefills, raise each key's largest attention probability in place.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>

#include <optional>

#include <flashcache/query_tail.hpp>

#include "arrays.hpp"
#include "bind.hpp"

namespace flashcache::python {

namespace {

// Raises `tails` [Hkv][>= first + chunk] (float32, C-contiguous, written in place)
// from the queries q of positions [first, first + chunk) against the keys k.
void add(TailAccumulator& acc, const AnyArray& q, std::int64_t first, const AnyArray& k, nb::ndarray<> tails,
         const std::optional<AnyArray>& lse, const QueryTailOptions& opt, Layout layout) {
  const DType dq = kv_dtype(q, "q"), dk = kv_dtype(k, "k");
  if (dq != dk) type_error(std::string("q is ") + to_string(dq) + " but k is " + to_string(dk) + " (one dtype for both)");
  const AnyArray tails_ro(tails);
  auto* out = const_cast<float*>(dense_input<float>(tails_ro, 2, "tails", "float32"));
  const float* lse_data = nullptr;
  if (lse) lse_data = dense_input<float>(*lse, 2, "lse", "float32");
  with_dtype(dq, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const auto qv = kv_view<T>(q, layout, "q"), kv = kv_view<T>(k, layout, "k");
    if (lse && (static_cast<std::int64_t>(lse->shape(0)) != qv.heads ||
                static_cast<std::int64_t>(lse->shape(1)) != qv.tokens))
      value_error("lse: shape " + shape_string(*lse) + ", expected (query heads, chunk) = (" +
                  std::to_string(qv.heads) + ", " + std::to_string(qv.tokens) + ")");
    const TailView<float> view{out, static_cast<std::int64_t>(tails.shape(0)), static_cast<std::int64_t>(tails.shape(1))};
    nb::gil_scoped_release release;
    throw_if_error(acc.add(qv, first, kv, lse_data, view, opt));
  });
}

}  // namespace

void bind_tails(nb::module_& m) {
  nb::class_<TailAccumulator>(m, "TailAccumulator")
      .def(nb::init<>())
      .def("add", &add, nb::arg("q"), nb::arg("first"), nb::arg("k"), nb::arg("tails"), nb::arg("lse").none(),
           nb::arg("options"), nb::arg("layout"));
}

}  // namespace flashcache::python
