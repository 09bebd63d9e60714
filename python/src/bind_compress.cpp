// score, compress and compress_model over caller arrays: the same calls as the
// C++ front door (flashcache.hpp), with the keys' tails as an optional input.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <optional>
#include <tuple>
#include <vector>

#include <flashcache/flashcache.hpp>
#include <flashcache/parallel.hpp>

#include "arrays.hpp"
#include "bind.hpp"

namespace flashcache::python {

namespace {

using Span = std::tuple<std::int64_t, std::int64_t, std::int64_t>;  // first, rows, cols

std::vector<GridSpan> grid_spans(const std::vector<Span>& spans) {
  std::vector<GridSpan> out;
  for (const auto& [first, rows, cols] : spans) out.push_back(GridSpan{first, rows, cols});
  return out;
}

// A protect mask: one byte per token, bool or uint8, read in place.
ProtectMask protect_mask(const std::optional<AnyArray>& mask, const char* name) {
  if (!mask) return {};
  const nb::dlpack::dtype t = mask->dtype();
  const bool bytes = t.bits == 8 && t.lanes == 1 &&
                     (t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bool) ||
                      t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::UInt));
  if (!bytes) type_error(std::string(name) + ": dtype " + dtype_name(t) + ", expected bool or uint8");
  require_cpu(*mask, name);
  if (mask->ndim() != 1) value_error(std::string(name) + ": expected 1 dimension [tokens], got shape " + shape_string(*mask));
  if (mask->shape(0) > 1 && mask->stride(0) != 1) value_error(std::string(name) + ": must be contiguous");
  return ProtectMask(static_cast<const std::uint8_t*>(mask->data()), static_cast<std::int64_t>(mask->shape(0)));
}

// The keys' tails of one layer [heads][tokens], float32, read in place.
TailView<const float> tail_view(const std::optional<AnyArray>& tails, const char* name) {
  if (!tails) return {};
  const float* data = dense_input<float>(*tails, 2, name, "float32");
  return {data, static_cast<std::int64_t>(tails->shape(0)), static_cast<std::int64_t>(tails->shape(1))};
}

DType pair_dtype(const AnyArray& k, const AnyArray& v) {
  const DType dk = kv_dtype(k, "k"), dv = kv_dtype(v, "v");
  if (dk != dv) type_error(std::string("k is ") + to_string(dk) + " but v is " + to_string(dv) + " (one dtype for both)");
  return dk;
}

// Calls f(k view, v view) with the views typed by the pair's one dtype.
template <class F>
decltype(auto) with_kv(const AnyArray& k, const AnyArray& v, Layout layout, F&& f) {
  return with_dtype(pair_dtype(k, v), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const auto kv = kv_view<T>(k, layout, "k");  // k first: its error is the one named
    return f(kv, kv_view<T>(v, layout, "v"));
  });
}

nb::object scores_array(LayerScores& s, Framework fw) {
  return to_array(std::move(s.score), {static_cast<std::size_t>(s.heads), static_cast<std::size_t>(s.tokens)}, fw);
}

// One compressed layer for Python: (kept [H, B], k' [H, B, d], v' [H, B, d], scores [H, N], R_l, non-finite rows).
template <class T>
nb::tuple layer_result(CompressedLayer<T>&& out, Framework fw) {
  const auto h = static_cast<std::size_t>(out.heads), b = static_cast<std::size_t>(out.budget),
             d = static_cast<std::size_t>(out.head_dim);
  const double ratio = out.scores.energy_ratio();
  const std::int64_t nonfinite = out.scores.nonfinite;
  return nb::make_tuple(to_array(std::move(out.kept), {h, b}, fw), to_array(std::move(out.k), {h, b, d}, fw),
                        to_array(std::move(out.v), {h, b, d}, fw), scores_array(out.scores, fw), ratio, nonfinite);
}

// flashcache::compress without the GIL: the library works while Python goes on.
template <class T>
CompressedLayer<T> compress_layer(KVView<const T> k, KVView<const T> v, const Budget& budget, const Options& opt,
                                  ProtectMask mask, const std::vector<GridSpan>& spans, TailView<const float> tails) {
  nb::gil_scoped_release release;
  throw_if_error(check_options(opt));
  return flashcache::compress<float>(k, v, budget, opt, mask, spans, tails);
}

nb::tuple compress(const AnyArray& k, const AnyArray& v, Layout layout, const Budget& budget, const Options& opt,
                   const std::optional<AnyArray>& mask, const std::vector<Span>& spans,
                   const std::optional<AnyArray>& tails, Framework fw) {
  const std::vector<GridSpan> grid = grid_spans(spans);
  const ProtectMask m = protect_mask(mask, "mask");
  const TailView<const float> t = tail_view(tails, "tails");
  return with_kv(k, v, layout, [&](auto kv, auto vv) {
    throw_if_error(check_pair(kv, vv));
    return layer_result(compress_layer(kv, vv, budget, opt, m, grid, t), fw);
  });
}

// compress_model(): every layer scored (with its tails, when given), then the
// planner, the selection and the gather of compress_scored_model.
nb::tuple compress_model(const std::vector<AnyArray>& k, const std::vector<AnyArray>& v, Layout layout,
                         const Budget& budget, const Options& opt, const SharedKeepOptions& shared,
                         const std::vector<std::optional<AnyArray>>& masks, const std::vector<Span>& spans,
                         const std::vector<std::optional<AnyArray>>& tails, int threads, Framework fw) {
  if (threads < 1) value_error("threads " + std::to_string(threads) + " must be at least 1");
  if (k.size() != v.size())
    value_error(std::to_string(k.size()) + " K layers but " + std::to_string(v.size()) + " V layers");
  if (k.empty()) value_error("compress_model: no layers");
  if (!masks.empty() && masks.size() != k.size())
    value_error(std::to_string(masks.size()) + " masks for " + std::to_string(k.size()) + " layers (one each, or none)");
  if (!tails.empty() && tails.size() != k.size())
    value_error(std::to_string(tails.size()) + " tails for " + std::to_string(k.size()) + " layers (one each, or none)");
  const DType dtype = pair_dtype(k[0], v[0]);
  const std::vector<GridSpan> grid = grid_spans(spans);
  std::vector<ProtectMask> mask(masks.size());
  std::vector<TailView<const float>> tail(k.size());
  for (std::size_t l = 0; l < masks.size(); ++l) mask[l] = protect_mask(masks[l], "masks[l]");
  for (std::size_t l = 0; l < tails.size(); ++l) tail[l] = tail_view(tails[l], "tails[l]");
  return with_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    std::vector<KVView<const T>> kv(k.size()), vv(v.size());
    for (std::size_t l = 0; l < k.size(); ++l) {
      if (pair_dtype(k[l], v[l]) != dtype)
        type_error("layer " + std::to_string(l) + " is " + to_string(kv_dtype(k[l], "k")) + ", layer 0 " +
                   to_string(dtype) + " (one dtype for the model)");
      kv[l] = kv_view<T>(k[l], layout, "k");
      vv[l] = kv_view<T>(v[l], layout, "v");
    }
    CompressedModel<T> model;
    {
      nb::gil_scoped_release release;
      throw_if_error(check_options(opt));
      throw_if_error(check_shared_options(shared));
      std::vector<LayerScores> scores(k.size());
      for (std::size_t l = 0; l < k.size(); ++l)
        throw_if_error(detail::at_layer(check_pair(kv[l], vv[l]), 1, 0, static_cast<int>(l)));
      // Layers are scored independently: one Scorer per worker, layer l on worker l % threads, so
      // the scores do not depend on the thread count.
      WorkerPool pool;
      pool.resize(threads);
      std::vector<Scorer<float>> scorers(static_cast<std::size_t>(pool.threads()));
      std::vector<Status> status(k.size());
      auto score_layer = [&](std::int64_t l, int worker) {
        const auto i = static_cast<std::size_t>(l);
        status[i] = scorers[static_cast<std::size_t>(worker)].score(
            kv[i], vv[i], opt.score, &scores[i], ScoreInputs{grid, tail[i], budget.keep_ratio(kv[i].tokens)});
      };
      pool.run(static_cast<std::int64_t>(k.size()), score_layer);
      for (std::size_t l = 0; l < k.size(); ++l)
        throw_if_error(detail::at_layer(status[l], 1, 0, static_cast<int>(l)));
      throw_if_error(compress_scored_model<T>(kv, vv, std::move(scores), budget, opt, shared, mask, grid, &model));
    }
    nb::list layers;
    for (auto& layer : model.layers) layers.append(layer_result(std::move(layer), fw));
    return nb::make_tuple(layers, to_array(std::move(model.budgets), {model.budgets.size()}, fw),
                          to_array(std::move(model.energy_ratio), {model.energy_ratio.size()}, fw), model.nonfinite);
  });
}

// score(): the outlier scores [H, N], per-head energies [H, 4] (E(K), E_high(K), E(V), E_high(V)), R_l, non-finite rows.
nb::tuple score(const AnyArray& k, const AnyArray& v, Layout layout, const ScoreOptions& opt,
                const std::vector<Span>& spans, const std::optional<AnyArray>& tails, double keep, Framework fw) {
  const std::vector<GridSpan> grid = grid_spans(spans);
  const TailView<const float> t = tail_view(tails, "tails");
  return with_kv(k, v, layout, [&](auto kv, auto vv) {
    LayerScores s;
    {
      nb::gil_scoped_release release;
      Scorer<float> scorer;
      throw_if_error(scorer.score(kv, vv, opt, &s, ScoreInputs{grid, t, keep}));
    }
    std::vector<double> energy;
    for (const HeadEnergy& e : s.energy) energy.insert(energy.end(), {e.k_total, e.k_high, e.v_total, e.v_high});
    const double ratio = s.energy_ratio();
    const std::int64_t nonfinite = s.nonfinite;
    const std::size_t heads = static_cast<std::size_t>(s.heads);
    return nb::make_tuple(scores_array(s, fw), to_array(std::move(energy), {heads, 4}, fw), ratio, nonfinite);
  });
}

// flashcache::compress timed inside C++ (bench/python/overhead.py): seconds per call over
// `repeats`, the baseline the Python door's own time is divided by.
double time_compress(const AnyArray& k, const AnyArray& v, Layout layout, const Budget& budget, const Options& opt,
                     int repeats) {
  if (repeats < 1) value_error("repeats must be at least 1");
  return with_kv(k, v, layout, [&](auto kv, auto vv) {
    nb::gil_scoped_release release;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < repeats; ++i) flashcache::compress<float>(kv, vv, budget, opt);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / repeats;
  });
}

}  // namespace

void bind_compress(nb::module_& m) {
  nb::enum_<Layout>(m, "Layout").value("hnd", Layout::hnd).value("nhd", Layout::nhd);
  nb::enum_<Framework>(m, "Framework").value("numpy", Framework::numpy).value("torch", Framework::torch);
  nb::class_<Budget>(m, "Budget")
      .def_static("ratio", &Budget::ratio)
      .def_static("tokens", &Budget::tokens)
      .def_prop_ro("is_ratio", &Budget::is_ratio)
      .def("resolve", [](const Budget& b, std::int64_t available) {
        std::int64_t out = 0;
        throw_if_error(b.resolve(available, &out));
        return out;
      });

  // What a view over `a` sees: (data pointer, heads, tokens, head_dim, head stride, token stride).
  m.def("view_info", [](const AnyArray& a, Layout layout) {
    return with_dtype(kv_dtype(a, "array"), [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      const KVView<const T> view = kv_view<T>(a, layout, "array");
      return nb::make_tuple(reinterpret_cast<std::uintptr_t>(view.data), view.heads, view.tokens, view.head_dim,
                            view.head_stride, view.token_stride);
    });
  });
  m.def("score", &score, nb::arg("k"), nb::arg("v"), nb::arg("layout"), nb::arg("options"), nb::arg("spans"),
        nb::arg("tails").none(), nb::arg("keep"), nb::arg("framework"));
  m.def("compress", &compress, nb::arg("k"), nb::arg("v"), nb::arg("layout"), nb::arg("budget"), nb::arg("options"),
        nb::arg("mask").none(), nb::arg("spans"), nb::arg("tails").none(), nb::arg("framework"));
  m.def("_time_compress", &time_compress, nb::arg("k"), nb::arg("v"), nb::arg("layout"), nb::arg("budget"),
        nb::arg("options"), nb::arg("repeats"));
  m.def("compress_model", &compress_model, nb::arg("k"), nb::arg("v"), nb::arg("layout"), nb::arg("budget"),
        nb::arg("options"), nb::arg("shared"), nb::arg("masks"), nb::arg("spans"), nb::arg("tails"),
        nb::arg("threads"), nb::arg("framework"));
}

}  // namespace flashcache::python
