// The archive of evicted tokens and its recall (archive.hpp, recall.hpp): rows
// go in as [tokens, kv_heads, head_dim] per layer, blocks come back the same way.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <vector>

#include <flashcache/archive.hpp>
#include <flashcache/recall.hpp>
#include <flashcache/recall_pool.hpp>

#include "arrays.hpp"
#include "bind.hpp"

namespace flashcache::python {

namespace {

RowType row_type(DType t) { return t == DType::f32 ? RowType::f32 : t == DType::f16 ? RowType::f16 : RowType::bf16; }

DType row_dtype(RowType t) { return t == RowType::f32 ? DType::f32 : t == RowType::f16 ? DType::f16 : DType::bf16; }

Archive make_archive(int layers, std::int64_t kv_heads, std::int64_t head_dim, const std::string& dtype,
                     const ArchiveOptions& opt) {
  DType t;
  if (dtype == "float32")
    t = DType::f32;
  else if (dtype == "float16")
    t = DType::f16;
  else if (dtype == "bfloat16")
    t = DType::bf16;
  else
    type_error("archive dtype '" + dtype + "' is not float32, float16 or bfloat16");
  Archive a;
  throw_if_error(a.reset(ArchiveShape{layers, kv_heads, head_dim, row_type(t), row_type(t)}, opt));
  return a;
}

// One layer's rows [n][kv_heads][head_dim] of the archive's dtype, each token's row
// contiguous (any token stride): the row pointer and the stride in bytes.
const void* layer_rows(const Archive& a, const AnyArray& rows, std::int64_t n, std::int64_t* stride, const char* name) {
  const ArchiveShape& s = a.shape();
  if (kv_dtype(rows, name) != row_dtype(s.k_type))
    type_error(std::string(name) + ": dtype " + to_string(kv_dtype(rows, name)) + " but the archive holds " +
               to_string(row_dtype(s.k_type)));
  require_cpu(rows, name);
  if (rows.ndim() != 3 || static_cast<std::int64_t>(rows.shape(0)) != n ||
      static_cast<std::int64_t>(rows.shape(1)) != s.kv_heads || static_cast<std::int64_t>(rows.shape(2)) != s.head_dim)
    value_error(std::string(name) + ": shape " + shape_string(rows) + ", expected (" + std::to_string(n) + ", " +
                std::to_string(s.kv_heads) + ", " + std::to_string(s.head_dim) + ") = (tokens, kv_heads, head_dim)");
  if ((s.head_dim > 1 && rows.stride(2) != 1) || (s.kv_heads > 1 && rows.stride(1) != s.head_dim))
    value_error(std::string(name) + ": each token's kv_heads x head_dim row must be contiguous");
  *stride = (n > 1 ? rows.stride(0) : s.kv_heads * s.head_dim) * size_of(row_dtype(s.k_type));
  if (n > 1 && rows.stride(0) < s.kv_heads * s.head_dim) value_error(std::string(name) + ": token rows overlap");
  return rows.data();
}

void append(Archive& a, const AnyArray& positions, const std::vector<AnyArray>& k, const std::vector<AnyArray>& v) {
  const std::int32_t* pos = dense_input<std::int32_t>(positions, 1, "positions", "int32");
  const auto n = static_cast<std::int64_t>(positions.shape(0));
  const auto layers = static_cast<std::size_t>(a.shape().layers);
  if (k.size() != layers || v.size() != layers)
    value_error(std::to_string(k.size()) + " K and " + std::to_string(v.size()) + " V layers for an archive of " +
                std::to_string(layers));
  std::vector<const void*> kp(layers), vp(layers);
  std::int64_t ks = 0, vs = 0;
  for (std::size_t l = 0; l < layers; ++l) {
    std::int64_t s = 0;
    kp[l] = layer_rows(a, k[l], n, &s, "k");
    if (l > 0 && s != ks) value_error("k: every layer's rows need the same token stride");
    ks = s;
    vp[l] = layer_rows(a, v[l], n, &s, "v");
    if (l > 0 && s != vs) value_error("v: every layer's rows need the same token stride");
    vs = s;
  }
  throw_if_error(a.append(pos, n, kp.data(), ks, vp.data(), vs));
}

std::vector<std::int64_t> block_list(const AnyArray& blocks) {
  const std::int64_t* b = dense_input<std::int64_t>(blocks, 1, "blocks", "int64");
  return {b, b + blocks.shape(0)};
}

// The blocks' tokens: (positions [n], K [layers][n][kv_heads][head_dim], V likewise); `erase` takes them out.
nb::tuple blocks_out(Archive& a, const AnyArray& blocks_in, bool erase) {
  const std::vector<std::int64_t> blocks = block_list(blocks_in);
  const ArchiveShape& s = a.shape();
  std::int64_t n = 0;
  for (const std::int64_t b : blocks)
    if (b >= 0 && b < a.blocks()) n += a.block_tokens(b);
  return with_dtype(row_dtype(s.k_type), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const auto layer_elements = static_cast<std::size_t>(n * s.kv_heads * s.head_dim);
    std::vector<std::int32_t> positions(static_cast<std::size_t>(n));
    std::vector<T> k(layer_elements * static_cast<std::size_t>(s.layers)), v(k.size());
    std::vector<void*> kp(static_cast<std::size_t>(s.layers)), vp(kp.size());
    for (std::size_t l = 0; l < kp.size(); ++l) {
      kp[l] = k.data() + l * layer_elements;
      vp[l] = v.data() + l * layer_elements;
    }
    std::int64_t got = 0;
    const auto count = static_cast<std::int64_t>(blocks.size());
    throw_if_error(erase ? a.take(blocks.data(), count, positions.data(), kp.data(), vp.data(), &got)
                         : a.copy_blocks(blocks.data(), count, positions.data(), kp.data(), vp.data(), &got));
    const std::initializer_list<std::size_t> shape = {static_cast<std::size_t>(s.layers), static_cast<std::size_t>(n),
                                                      static_cast<std::size_t>(s.kv_heads),
                                                      static_cast<std::size_t>(s.head_dim)};
    const Framework fw = std::is_same_v<T, bfloat16_t> ? Framework::torch : Framework::numpy;
    return nb::make_tuple(to_array(std::move(positions), {static_cast<std::size_t>(n)}, Framework::numpy),
                          to_array(std::move(k), shape, fw), to_array(std::move(v), shape, fw));
  });
}

// Layers (their indices, queries, resident and question keys; one dtype) scored on
// the pool's threads; the views are made with the GIL held, the scoring without it.
void add_layers(RecallScorerPool& r, const std::vector<int>& layers, const std::vector<AnyArray>& q,
                const std::vector<AnyArray>& resident, const std::vector<AnyArray>& question, Layout layout) {
  if (q.size() != layers.size() || resident.size() != layers.size() || question.size() != layers.size())
    value_error(std::to_string(layers.size()) + " layers but " + std::to_string(q.size()) + " q, " +
                std::to_string(resident.size()) + " resident and " + std::to_string(question.size()) +
                " question arrays");
  if (layers.empty()) return;
  const DType t = kv_dtype(q[0], "q");
  for (std::size_t i = 0; i < layers.size(); ++i)
    if (kv_dtype(q[i], "q") != t || kv_dtype(resident[i], "resident") != t || kv_dtype(question[i], "question") != t)
      type_error("q, resident and question keys need one dtype in every layer (layer " + std::to_string(layers[i]) +
                 ")");
  with_dtype(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    struct Views {
      KVView<const T> q, resident, question;
    };
    std::vector<Views> views;
    views.reserve(layers.size());
    for (std::size_t i = 0; i < layers.size(); ++i)
      views.push_back({kv_view<T>(q[i], layout, "q"), kv_view<T>(resident[i], layout, "resident"),
                       kv_view<T>(question[i], layout, "question")});
    auto one = [&](std::int64_t i, RecallScorer& scorer, int) {
      const Views& v = views[static_cast<std::size_t>(i)];
      return scorer.add_layer(layers[static_cast<std::size_t>(i)], v.q, v.resident, v.question);
    };
    nb::gil_scoped_release release;
    throw_if_error(r.run(static_cast<std::int64_t>(layers.size()), one));
  });
}

}  // namespace

void bind_recall(nb::module_& m) {
  nb::class_<Archive>(m, "Archive")
      .def("__init__",
           [](Archive* self, int layers, std::int64_t kv_heads, std::int64_t head_dim, const std::string& dtype,
              const ArchiveOptions& opt) { new (self) Archive(make_archive(layers, kv_heads, head_dim, dtype, opt)); },
           nb::arg("layers"), nb::arg("kv_heads"), nb::arg("head_dim"), nb::arg("dtype"), nb::arg("options"))
      .def("append", &append, nb::arg("positions"), nb::arg("k"), nb::arg("v"))
      .def("reserve", &Archive::reserve, nb::arg("tokens"))
      .def("copy_blocks", [](Archive& a, const AnyArray& b) { return blocks_out(a, b, false); }, nb::arg("blocks"))
      .def("take", [](Archive& a, const AnyArray& b) { return blocks_out(a, b, true); }, nb::arg("blocks"))
      .def("drop_all", &Archive::drop_all)
      .def_prop_ro("tokens", &Archive::tokens)
      .def_prop_ro("blocks", &Archive::blocks)
      .def_prop_ro("bytes", &Archive::bytes)
      .def_prop_ro("dropped_tokens", &Archive::dropped_tokens)
      .def("block_tokens", &Archive::block_tokens, nb::arg("block"))
      .def_prop_ro("positions", [](const Archive& a) {
        return to_array(std::vector<std::int32_t>(a.positions(), a.positions() + a.tokens()),
                        {static_cast<std::size_t>(a.tokens())}, Framework::numpy);
      });

  nb::class_<RecallScorerPool>(m, "RecallScorer")
      .def(nb::init<>())
      .def("reset", [](RecallScorerPool& r, const Archive& a, RecallScope scope, RecallScore score,
                       int threads) { throw_if_error(r.reset(a, scope, score, threads)); },
           nb::arg("archive"), nb::arg("scope"), nb::arg("score"), nb::arg("threads"), nb::keep_alive<1, 2>())
      .def("add_layers", &add_layers, nb::arg("layers"), nb::arg("q"), nb::arg("resident"), nb::arg("question"),
           nb::arg("layout"))
      .def_prop_ro("rankings", &RecallScorerPool::rankings)
      .def_prop_ro("threads", &RecallScorerPool::threads)
      .def("block_scores", [](const RecallScorerPool& r, std::int64_t blocks, std::int64_t ranking) {
        if (ranking < 0 || ranking >= r.rankings())
          value_error("ranking " + std::to_string(ranking) + " of " + std::to_string(r.rankings()));
        std::vector<float> out(static_cast<std::size_t>(blocks));
        throw_if_error(r.block_scores(out.data(), blocks, ranking));
        return to_array(std::move(out), {static_cast<std::size_t>(blocks)}, Framework::numpy);
      }, nb::arg("blocks"), nb::arg("ranking"));

  m.def("select_recall", [](const Archive& a, const AnyArray& scores, std::int64_t budget) {
    const float* s = dense_input<float>(scores, 1, "scores", "float32");
    if (static_cast<std::int64_t>(scores.shape(0)) != a.blocks())
      value_error("scores: " + std::to_string(scores.shape(0)) + " for " + std::to_string(a.blocks()) + " blocks");
    std::vector<std::int64_t> chosen, order;
    throw_if_error(select_recall(a, s, budget, &chosen, &order));
    return to_array(std::move(chosen), {chosen.size()}, Framework::numpy);
  }, nb::arg("archive"), nb::arg("scores"), nb::arg("budget"));
}

}  // namespace flashcache::python
