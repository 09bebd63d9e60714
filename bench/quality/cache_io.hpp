#pragma once
// The one reader of the evaluations' KV caches (quality_eval, grid_eval,
// select_configs): a folder with k.npy, v.npy [L, H, N, d] and q.npy
// [L, Hq, N, d] (float16 or float32, C order), and usually meta.json.
//
// The arrays must agree with one another (k and v the same shape; q the same
// layers, tokens and head dim; Hq a multiple of H) and with what meta.json says
// of them ("shapes", "num_tokens", "num_kv_heads", "num_q_heads", "head_dim",
// "layers"); every refusal names the file.
#include <flashcache/flashcache.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "npy/npy.hpp"

namespace flashcache::quality {

// A JSON file, or a refusal that names it: "<path>: cannot open" or "<path>: not JSON (...)".
inline nlohmann::ordered_json read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open");
  try {
    return nlohmann::ordered_json::parse(in);
  } catch (const std::exception& x) {
    throw std::runtime_error(path + ": not JSON (" + x.what() + ")");
  }
}

// A 4-d float16 or float32 array as float (float32 only when float32_only); a NaN
// or infinity is refused (the caches are finite, so one is a broken file).
inline std::vector<float> load_floats(const std::string& path, std::vector<std::int64_t>* shape,
                                      bool float32_only = false) {
  const npy::Array a = npy::read(path);
  if (float32_only && (!a.is<float>() || a.shape.size() != 4))
    throw std::runtime_error(path + ": expected float32 [L, H, N, d], got " + npy::shape_string(a.shape));
  if (a.shape.size() != 4) throw std::runtime_error(path + ": expected a 4-d array [L, H, N, d]");
  *shape = a.shape;
  const auto n = static_cast<std::size_t>(npy::element_count(a.shape));
  std::vector<float> out(n);
  if (a.is<half_t>()) {
    for (std::size_t i = 0; i < n; ++i) out[i] = to_float(a.data<half_t>()[i]);
  } else if (a.is<float>()) {
    std::copy_n(a.data<float>(), n, out.begin());
  } else {
    throw std::runtime_error(path + ": expected float16 or float32");
  }
  for (float x : out)
    if (!std::isfinite(x)) throw std::runtime_error(path + ": holds a NaN or infinity");
  return out;
}

// What to read besides k.npy and v.npy.
struct CacheRead {
  bool meta = true;           // meta.json (false: the cache has none; meta stays an empty object)
  bool queries = true;        // q.npy
  bool float32_only = false;  // refuse float16 arrays
};

struct Cache {
  std::string dir;
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  std::int64_t layers = 0, heads = 0, q_heads = 0, tokens = 0, head_dim = 0;
  double scale = 0;               // meta's softmax_scale, else 1 / sqrt(head_dim)
  std::vector<int> model_layers;  // meta's "layers" (the model's layer numbers), or empty
  std::vector<float> k, v, q;     // [L][H][N][d], [L][Hq][N][d]

  const float* k_layer(std::int64_t l) const { return k.data() + l * heads * tokens * head_dim; }
  const float* v_layer(std::int64_t l) const { return v.data() + l * heads * tokens * head_dim; }
  const float* q_layer(std::int64_t l) const { return q.data() + l * q_heads * tokens * head_dim; }
  // The model's number of array layer l (l itself when meta lists none).
  int model_layer(std::int64_t l) const {
    return static_cast<std::size_t>(l) < model_layers.size() ? model_layers[static_cast<std::size_t>(l)]
                                                             : static_cast<int>(l);
  }
  // Views of the first `first` tokens of every layer (all tokens when first < 0).
  std::vector<KVView<const float>> k_views(std::int64_t first = -1) const { return views(k, heads, first); }
  std::vector<KVView<const float>> v_views(std::int64_t first = -1) const { return views(v, heads, first); }
  std::vector<KVView<const float>> q_views(std::int64_t first = -1) const { return views(q, q_heads, first); }
  void drop_arrays() {
    for (auto* x : {&k, &v, &q}) {
      x->clear();
      x->shrink_to_fit();
    }
  }

 private:
  std::vector<KVView<const float>> views(const std::vector<float>& x, std::int64_t h, std::int64_t first) const {
    std::vector<KVView<const float>> out;
    const std::int64_t n = tokens, d = head_dim;
    for (std::int64_t l = 0; l < layers; ++l)
      out.emplace_back(x.data() + l * h * n * d, h, first < 0 ? n : first, d, n * d, d);
    return out;
  }
};

// meta.json of a cache folder.
inline nlohmann::ordered_json read_cache_meta(const std::string& dir) {
  return read_json_file((std::filesystem::path(dir) / "meta.json").string());
}

// The arrays of `dir`, checked against `meta` (that folder's meta.json, already read).
inline Cache read_cache_with_meta(const std::string& dir, nlohmann::ordered_json meta, const CacheRead& what = {}) {
  using npy::shape_string;
  const auto fail = [](const std::string& m) { throw std::runtime_error(m); };
  Cache c;
  c.dir = dir;
  c.meta = std::move(meta);
  const auto& m = c.meta;
  const std::string where = dir + "/meta.json";

  std::vector<std::int64_t> ks, vs, qs;
  c.k = load_floats(dir + "/k.npy", &ks, what.float32_only);
  c.v = load_floats(dir + "/v.npy", &vs, what.float32_only);
  if (what.queries) {
    c.q = load_floats(dir + "/q.npy", &qs, what.float32_only);
    if (ks != vs || qs[0] != ks[0] || qs[2] != ks[2] || qs[3] != ks[3])
      fail(dir + ": k " + shape_string(ks) + ", v " + shape_string(vs) + ", q " + shape_string(qs) + " disagree");
  } else if (ks != vs) {
    fail(dir + ": k " + shape_string(ks) + ", v " + shape_string(vs) + " disagree");
  }
  if (m.contains("shapes"))
    for (const auto& [key, s] :
         std::vector<std::pair<std::string, std::vector<std::int64_t>*>>{{"k", &ks}, {"v", &vs}, {"q", &qs}})
      if ((key != "q" || what.queries) && m["shapes"].contains(key) &&
          m["shapes"][key].get<std::vector<std::int64_t>>() != *s)
        fail(where + ": shapes." + key + " " + m["shapes"][key].dump() + " but " + key + ".npy is " + shape_string(*s));
  c.layers = ks[0];
  c.heads = ks[1];
  c.tokens = ks[2];
  c.head_dim = ks[3];
  if (what.queries) {
    c.q_heads = qs[1];
    if (c.q_heads % c.heads != 0) fail(dir + ": query heads are not a multiple of KV heads");
  }
  const auto check_count = [&](const char* key, std::int64_t have) {
    if (m.contains(key) && m[key].get<std::int64_t>() != have)
      fail(where + ": " + key + " " + m[key].dump() + " but the arrays have " + std::to_string(have));
  };
  check_count("num_tokens", c.tokens);
  check_count("num_kv_heads", c.heads);
  if (what.queries) check_count("num_q_heads", c.q_heads);
  check_count("head_dim", c.head_dim);
  c.model_layers = m.value("layers", std::vector<int>{});
  if (!c.model_layers.empty() && static_cast<std::int64_t>(c.model_layers.size()) != c.layers)
    fail(where + ": lists " + std::to_string(c.model_layers.size()) + " layers, the arrays have " +
         std::to_string(c.layers));
  c.scale = m.value("softmax_scale", 1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  return c;
}

// The arrays of `dir` and, unless what.meta is false, its meta.json.
inline Cache read_cache(const std::string& dir, const CacheRead& what = {}) {
  return read_cache_with_meta(dir, what.meta ? read_cache_meta(dir) : nlohmann::ordered_json::object(), what);
}

}  // namespace flashcache::quality
