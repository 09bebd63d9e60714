#include "input.hpp"

#include <cstring>

#include "cli_error.hpp"

namespace flashcache::cli {

namespace {

DType cache_dtype(const npy::Array& a, const std::string& path) {
  if (a.is<float>()) return DType::f32;
  if (a.is<half_t>()) return DType::f16;
  usage_error(path + ": a KV cache must be float32 or float16, not " + npy::dtype_name(a.dtype));
}

}  // namespace

KVCache load_cache(const std::string& k_path, const std::string& v_path) {
  KVCache c;
  c.k = npy::read(k_path);
  c.v = npy::read(v_path);
  c.dtype = cache_dtype(c.k, k_path);
  if (cache_dtype(c.v, v_path) != c.dtype)
    usage_error(k_path + " is " + npy::dtype_name(c.k.dtype) + " but " + v_path + " is " + npy::dtype_name(c.v.dtype));
  const auto& s = c.k.shape;
  if (s.size() != 3 && s.size() != 4)
    usage_error(k_path + ": expected shape [L, H, N, d] or [H, N, d], got " + npy::shape_string(s));
  if (c.v.shape != s)
    usage_error(k_path + " has shape " + npy::shape_string(s) + " but " + v_path + " has " +
                npy::shape_string(c.v.shape));
  for (std::int64_t dim : s)
    if (dim == 0) usage_error(k_path + ": shape " + npy::shape_string(s) + " has an empty dimension");
  c.file_shape = s;
  const std::size_t o = s.size() - 3;
  c.layers = o ? s[0] : 1;
  c.heads = s[o];
  c.tokens = s[o + 1];
  c.head_dim = s[o + 2];
  return c;
}

Queries load_queries(const std::string& q_path, const std::string& k_path, const KVCache& cache) {
  Queries out;
  out.q = npy::read(q_path);
  if (cache_dtype(out.q, q_path) != cache.dtype)
    usage_error(q_path + " is " + npy::dtype_name(out.q.dtype) + " but " + k_path + " is " + to_string(cache.dtype) +
                " (Q must have K's dtype)");
  const auto& s = out.q.shape;
  const auto& ks = cache.file_shape;
  bool same = s.size() == ks.size();
  for (std::size_t i = 0; same && i < s.size(); ++i)
    if (i != s.size() - 3) same = s[i] == ks[i];  // everything but the heads
  if (!same)
    usage_error(q_path + " has shape " + npy::shape_string(s) + " but " + k_path + " has " + npy::shape_string(ks) +
                " (Q needs K's layers, tokens and head dim)");
  out.heads = s[s.size() - 3];
  if (out.heads == 0 || out.heads % cache.heads != 0)
    usage_error(q_path + " has " + std::to_string(out.heads) + " query heads, not a multiple of the " +
                std::to_string(cache.heads) + " KV heads of " + k_path);
  out.file_shape = s;
  return out;
}

std::vector<std::uint8_t> load_mask(const std::string& path, std::int64_t tokens) {
  const npy::Array m = npy::read(path);
  if (!m.is<std::uint8_t>() && !m.is<bool>())
    usage_error(path + ": a protect mask must be bool or uint8, not " + npy::dtype_name(m.dtype));
  if (m.shape.size() != 1 || m.shape[0] != tokens)
    usage_error(path + ": a protect mask must have shape [" + std::to_string(tokens) + "] (one entry per token), got " +
                npy::shape_string(m.shape));
  std::vector<std::uint8_t> mask(m.bytes.size());
  std::memcpy(mask.data(), m.bytes.data(), mask.size());
  return mask;
}

}  // namespace flashcache::cli
