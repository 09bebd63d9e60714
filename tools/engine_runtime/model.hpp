#pragma once
// A Llama-architecture decoder on the CPU (float, Eigen, OpenMP): RMSNorm,
// RoPE, grouped-query attention, SwiGLU, tied or separate output head; weights
// dequantised from a GGUF file at load.
//
//   engine::Model model(engine::load_gguf(path));
//   engine::KVCache cache(model.config(), prompt.size() + max_new);
//   engine::Workspace ws;
//   model.forward(prompt, cache, ws, threads, logits);   // prefill (GEMM)
//   model.forward({next}, cache, ws, threads, logits);   // one decode step
//
// Keys and queries are in the Hugging Face layout: llama.cpp's converter permutes
// the q/k rows so that RoPE rotates adjacent pairs, and load undoes that, as
// tools/smollm2/model.py does (dimension i pairs with i + d/2).
#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "gguf.hpp"

namespace engine {

struct ModelConfig {
  int layers = 0, d_model = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn = 0, vocab = 0;
  double rope_theta = 10000.0;
  float eps = 1e-5f;
  int group() const { return heads / kv_heads; }  // query head h reads KV head h / group
};

// Per layer: K (after RoPE) and V as [kv_heads][capacity][head_dim], of which the
// first length(l) tokens are in use. After compression each KV head holds its own
// tokens; position(l, h, j) is the RoPE position the token had in the prompt.
// New tokens continue at next_position, the uncompressed length.
class KVCache {
 public:
  KVCache() = default;
  KVCache(const ModelConfig& c, std::int64_t capacity) : KVCache(c, std::vector<std::int64_t>(c.layers, capacity)) {}
  KVCache(const ModelConfig& c, const std::vector<std::int64_t>& capacity)
      : config_(c), kv_heads_(c.kv_heads), head_dim_(c.head_dim), capacity_(capacity), length_(capacity.size(), 0) {
    for (auto cap : capacity) {
      const auto rows = static_cast<std::size_t>(c.kv_heads * cap);
      k_.emplace_back(rows * static_cast<std::size_t>(c.head_dim));
      v_.emplace_back(rows * static_cast<std::size_t>(c.head_dim));
      pos_.emplace_back(rows);
    }
  }

  const ModelConfig& config() const { return config_; }
  int layers() const { return static_cast<int>(capacity_.size()); }
  int kv_heads() const { return kv_heads_; }
  int head_dim() const { return head_dim_; }
  std::int64_t length(int l) const { return length_[l]; }
  std::int64_t capacity(int l) const { return capacity_[l]; }
  std::int64_t next_position = 0;

  float* k(int l, int h, std::int64_t j) { return k_[l].data() + (h * capacity_[l] + j) * head_dim_; }
  float* v(int l, int h, std::int64_t j) { return v_[l].data() + (h * capacity_[l] + j) * head_dim_; }
  const float* k(int l, int h, std::int64_t j) const { return k_[l].data() + (h * capacity_[l] + j) * head_dim_; }
  const float* v(int l, int h, std::int64_t j) const { return v_[l].data() + (h * capacity_[l] + j) * head_dim_; }
  std::int32_t& position(int l, int h, std::int64_t j) { return pos_[l][static_cast<std::size_t>(h * capacity_[l] + j)]; }
  std::int32_t position(int l, int h, std::int64_t j) const {
    return pos_[l][static_cast<std::size_t>(h * capacity_[l] + j)];
  }
  void set_length(int l, std::int64_t n) {
    if (n < 0 || n > capacity_[l])
      throw std::length_error("KV cache layer " + std::to_string(l) + ": " + std::to_string(n) +
                              " tokens exceed its capacity " + std::to_string(capacity_[l]));
    length_[l] = n;
  }
  // Bytes of the K and V rows in use (float).
  std::int64_t bytes_in_use() const {
    std::int64_t s = 0;
    for (auto n : length_) s += 2 * n * kv_heads_ * head_dim_ * static_cast<std::int64_t>(sizeof(float));
    return s;
  }

 private:
  ModelConfig config_;
  int kv_heads_ = 0, head_dim_ = 0;
  std::vector<std::int64_t> capacity_, length_;
  std::vector<std::vector<float>> k_, v_;
  std::vector<std::vector<std::int32_t>> pos_;
};

// Scratch buffers of the forward pass, grown on demand and then reused, so that
// decode steps allocate nothing.
// Sees the queries of each layer during a forward pass: q [n][heads][head_dim]
// after RoPE, the new tokens' K and V already appended to layer l of the cache
// (slots length(l) - n .. length(l) - 1).
struct QueryObserver {
  virtual ~QueryObserver() = default;
  virtual void layer_queries(int l, const float* q, std::int64_t n, const KVCache& cache) = 0;
};

struct Workspace {
  std::vector<float> x, h, q, k, v, attn, gate, up, cos, sin, scores;
  std::int64_t score_stride = 0;
  template <class... V>
  static void grow(std::size_t n, V&... vs) {
    ((vs.size() < n ? vs.resize(n) : void()), ...);
  }
};

class Model {
 public:
  explicit Model(const GgufFile& f) {
    Eigen::setNbThreads(1);  // the engine splits its products over threads itself (OpenMP)
    if (f.get_string("general.architecture") != "llama")
      throw std::invalid_argument("architecture '" + f.get_string("general.architecture") + "' is not llama");
    c_.layers = static_cast<int>(f.get_int("llama.block_count"));
    c_.d_model = static_cast<int>(f.get_int("llama.embedding_length"));
    c_.heads = static_cast<int>(f.get_int("llama.attention.head_count"));
    c_.kv_heads = static_cast<int>(f.get_int("llama.attention.head_count_kv"));
    c_.ffn = static_cast<int>(f.get_int("llama.feed_forward_length"));
    c_.rope_theta = f.find("llama.rope.freq_base") ? f.get_float("llama.rope.freq_base") : 10000.0;
    c_.eps = static_cast<float>(f.get_float("llama.attention.layer_norm_rms_epsilon"));
    if (c_.layers <= 0 || c_.heads <= 0 || c_.kv_heads <= 0 || c_.heads % c_.kv_heads != 0 ||
        c_.d_model % c_.heads != 0 || (c_.d_model / c_.heads) % 2 != 0 || c_.ffn <= 0)
      throw std::invalid_argument("inconsistent llama metadata (layers, heads, kv heads, embedding length)");
    c_.head_dim = c_.d_model / c_.heads;
    if (f.find("llama.rope.dimension_count") && f.get_int("llama.rope.dimension_count") != c_.head_dim)
      throw std::invalid_argument("partial RoPE (rope.dimension_count != head dim) is not supported");

    embed_ = weight(f, "token_embd.weight", -1, c_.d_model);
    c_.vocab = static_cast<int>(embed_.size() / static_cast<std::size_t>(c_.d_model));
    if (f.find_tensor("output.weight") != nullptr) lm_head_ = weight(f, "output.weight", c_.vocab, c_.d_model);
    final_norm_ = weight(f, "output_norm.weight", 1, c_.d_model);
    const int qd = c_.heads * c_.head_dim, kvd = c_.kv_heads * c_.head_dim;
    for (int l = 0; l < c_.layers; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      Layer w;
      w.attn_norm = weight(f, p + "attn_norm.weight", 1, c_.d_model);
      w.wq = unpermute(weight(f, p + "attn_q.weight", qd, c_.d_model), c_.heads);
      w.wk = unpermute(weight(f, p + "attn_k.weight", kvd, c_.d_model), c_.kv_heads);
      w.wv = weight(f, p + "attn_v.weight", kvd, c_.d_model);
      w.wo = weight(f, p + "attn_output.weight", c_.d_model, qd);
      w.ffn_norm = weight(f, p + "ffn_norm.weight", 1, c_.d_model);
      w.gate = weight(f, p + "ffn_gate.weight", c_.ffn, c_.d_model);
      w.up = weight(f, p + "ffn_up.weight", c_.ffn, c_.d_model);
      w.down = weight(f, p + "ffn_down.weight", c_.d_model, c_.ffn);
      layers_.push_back(std::move(w));
    }
    const int half = c_.head_dim / 2;
    for (int i = 0; i < half; ++i) inv_freq_.push_back(std::pow(c_.rope_theta, -static_cast<double>(i) / half));
  }

  const ModelConfig& config() const { return c_; }
  std::int64_t weight_bytes() const {
    std::size_t n = embed_.size() + lm_head_.size() + final_norm_.size();
    for (const auto& w : layers_)
      n += w.attn_norm.size() + w.wq.size() + w.wk.size() + w.wv.size() + w.wo.size() + w.ffn_norm.size() +
           w.gate.size() + w.up.size() + w.down.size();
    return static_cast<std::int64_t>(n * sizeof(float));
  }

  // Runs `n` new tokens on top of `cache` and appends their K/V (each layer needs
  // room for n more). Writes the logits of every new token ([n][vocab]) when
  // all_logits, else of the last one only ([vocab]). An observer sees each
  // layer's queries as they are computed (for the query tails of a prefill).
  void forward(const int* ids, std::int64_t n, KVCache& cache, Workspace& ws, int threads, float* logits,
               bool all_logits = false, QueryObserver* observer = nullptr) const {
    if (n <= 0) return;
    if (cache.layers() != c_.layers) throw std::invalid_argument("KV cache has the wrong number of layers");
    for (std::int64_t i = 0; i < n; ++i)
      if (ids[i] < 0 || ids[i] >= c_.vocab) throw std::out_of_range("token id " + std::to_string(ids[i]) + " out of range");
    for (int l = 0; l < c_.layers; ++l)
      if (cache.length(l) + n > cache.capacity(l))
        throw std::length_error("KV cache layer " + std::to_string(l) + " is full (" + std::to_string(cache.length(l)) +
                                " + " + std::to_string(n) + " > " + std::to_string(cache.capacity(l)) + ")");
    threads = std::max(1, threads);
    const int D = c_.d_model, qd = c_.heads * c_.head_dim, kvd = c_.kv_heads * c_.head_dim, half = c_.head_dim / 2;
    const auto N = static_cast<std::size_t>(n);
    Workspace::grow(N * static_cast<std::size_t>(D), ws.x, ws.h);
    Workspace::grow(N * static_cast<std::size_t>(qd), ws.q, ws.attn);
    Workspace::grow(N * static_cast<std::size_t>(kvd), ws.k, ws.v);
    Workspace::grow(N * static_cast<std::size_t>(c_.ffn), ws.gate, ws.up);
    Workspace::grow(N * static_cast<std::size_t>(half), ws.cos, ws.sin);

    for (std::int64_t i = 0; i < n; ++i) {
      std::copy_n(embed_.data() + static_cast<std::size_t>(ids[i]) * D, D, ws.x.data() + i * D);
      const double pos = static_cast<double>(cache.next_position + i);
      for (int j = 0; j < half; ++j) {
        const double angle = pos * inv_freq_[static_cast<std::size_t>(j)];
        ws.cos[static_cast<std::size_t>(i * half + j)] = static_cast<float>(std::cos(angle));
        ws.sin[static_cast<std::size_t>(i * half + j)] = static_cast<float>(std::sin(angle));
      }
    }
    for (int l = 0; l < c_.layers; ++l) {
      const Layer& w = layers_[static_cast<std::size_t>(l)];
      rms_norm(ws.x.data(), w.attn_norm.data(), n, ws.h.data());
      matmul(ws.h.data(), n, D, w.wq.data(), qd, ws.q.data(), threads);
      matmul(ws.h.data(), n, D, w.wk.data(), kvd, ws.k.data(), threads);
      matmul(ws.h.data(), n, D, w.wv.data(), kvd, ws.v.data(), threads);
      rope(ws.q.data(), n, c_.heads, ws);
      rope(ws.k.data(), n, c_.kv_heads, ws);
      append(l, n, cache, ws);
      if (observer != nullptr) observer->layer_queries(l, ws.q.data(), n, cache);
      attention(l, n, cache, ws, threads);
      matmul(ws.attn.data(), n, qd, w.wo.data(), D, ws.h.data(), threads);
      add(ws.x.data(), ws.h.data(), N * static_cast<std::size_t>(D));
      rms_norm(ws.x.data(), w.ffn_norm.data(), n, ws.h.data());
      matmul(ws.h.data(), n, D, w.gate.data(), c_.ffn, ws.gate.data(), threads);
      matmul(ws.h.data(), n, D, w.up.data(), c_.ffn, ws.up.data(), threads);
      for (std::size_t j = 0; j < N * static_cast<std::size_t>(c_.ffn); ++j) {
        const float g = ws.gate[j];
        ws.gate[j] = g / (1.0f + std::exp(-g)) * ws.up[j];
      }
      matmul(ws.gate.data(), n, c_.ffn, w.down.data(), D, ws.h.data(), threads);
      add(ws.x.data(), ws.h.data(), N * static_cast<std::size_t>(D));
    }
    cache.next_position += n;
    const std::int64_t first = all_logits ? 0 : n - 1, rows = n - first;
    rms_norm(ws.x.data() + first * D, final_norm_.data(), rows, ws.h.data());
    const auto& head = lm_head_.empty() ? embed_ : lm_head_;
    matmul(ws.h.data(), rows, D, head.data(), c_.vocab, logits, threads);
  }

 private:
  struct Layer {
    std::vector<float> attn_norm, wq, wk, wv, wo, ffn_norm, gate, up, down;  // matrices [out][in]
  };
  using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

  static std::vector<float> weight(const GgufFile& f, const std::string& name, std::int64_t rows, std::int64_t cols) {
    const TensorInfo& t = f.tensor(name);
    const bool shape_ok = t.dims[0] == static_cast<std::uint64_t>(cols) &&
                          (rows < 0 || t.rows() == static_cast<std::uint64_t>(rows)) &&
                          (t.dims.size() <= 2);
    if (!shape_ok)
      throw std::invalid_argument("tensor '" + name + "' has an unexpected shape (want " + std::to_string(rows) +
                                  " rows of " + std::to_string(cols) + ")");
    return f.to_float(t);
  }

  // Within each head, GGUF row 2i + j holds Hugging Face row j * d/2 + i.
  std::vector<float> unpermute(std::vector<float> w, int heads) const {
    const int d = c_.head_dim, half = d / 2, in = c_.d_model;
    std::vector<float> out(w.size());
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < half; ++i)
        for (int j = 0; j < 2; ++j)
          std::copy_n(w.data() + static_cast<std::size_t>((h * d + 2 * i + j)) * in, in,
                      out.data() + static_cast<std::size_t>((h * d + j * half + i)) * in);
    return out;
  }

  void rms_norm(const float* x, const float* w, std::int64_t n, float* out) const {
    const int D = c_.d_model;
    for (std::int64_t i = 0; i < n; ++i) {
      const float* r = x + i * D;
      float ss = 0;
      for (int j = 0; j < D; ++j) ss += r[j] * r[j];
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(D) + c_.eps);
      for (int j = 0; j < D; ++j) out[i * D + j] = r[j] * inv * w[j];
    }
  }

  static void add(float* x, const float* y, std::size_t n) {
    for (std::size_t j = 0; j < n; ++j) x[j] += y[j];
  }

  // y[n][out] = x[n][in] * W^T, W row-major [out][in]; the output columns are split over threads.
  static void matmul(const float* x, std::int64_t n, int in, const float* w, int out, float* y, int threads) {
    Eigen::Map<const RowMajor> X(x, n, in);
    Eigen::Map<const RowMajor> W(w, out, in);
    Eigen::Map<RowMajor> Y(y, n, out);
    const int parts = std::min(threads, std::max(1, out / 64));
#pragma omp parallel for num_threads(parts) schedule(static)
    for (int p = 0; p < parts; ++p) {
      const int o0 = static_cast<int>(static_cast<std::int64_t>(out) * p / parts / 16 * 16);
      const int o1 = p + 1 == parts ? out : static_cast<int>(static_cast<std::int64_t>(out) * (p + 1) / parts / 16 * 16);
      Y.middleCols(o0, o1 - o0).noalias() = X * W.middleRows(o0, o1 - o0).transpose();
    }
  }

  // Rotates pairs (i, i + d/2) of every head of x [n][heads][d].
  void rope(float* x, std::int64_t n, int heads, const Workspace& ws) const {
    const int d = c_.head_dim, half = d / 2;
    for (std::int64_t i = 0; i < n; ++i)
      for (int h = 0; h < heads; ++h) {
        float* r = x + (i * heads + h) * d;
        const float* cs = ws.cos.data() + i * half;
        const float* sn = ws.sin.data() + i * half;
        for (int j = 0; j < half; ++j) {
          const float a = r[j], b = r[j + half];
          r[j] = a * cs[j] - b * sn[j];
          r[j + half] = b * cs[j] + a * sn[j];
        }
      }
  }

  void append(int l, std::int64_t n, KVCache& cache, const Workspace& ws) const {
    const int d = c_.head_dim;
    const std::int64_t m = cache.length(l);
    for (std::int64_t i = 0; i < n; ++i)
      for (int h = 0; h < c_.kv_heads; ++h) {
        std::copy_n(ws.k.data() + (i * c_.kv_heads + h) * d, d, cache.k(l, h, m + i));
        std::copy_n(ws.v.data() + (i * c_.kv_heads + h) * d, d, cache.v(l, h, m + i));
        cache.position(l, h, m + i) = static_cast<std::int32_t>(cache.next_position + i);
      }
    cache.set_length(l, m + n);
  }

  // ws.attn[i][h] = softmax(q_i K^T / sqrt(d)) V over the cached tokens and new tokens up to i.
  void attention(int l, std::int64_t n, const KVCache& cache, Workspace& ws, int threads) const {
    constexpr std::int64_t kBlock = 32;  // query rows per work item
    const int d = c_.head_dim, H = c_.heads, group = c_.group();
    const std::int64_t total = cache.length(l), before = total - n;
    const std::int64_t blocks = (n + kBlock - 1) / kBlock;
    const std::int64_t stride = cache.capacity(l);  // fixed while decoding, so the buffer is allocated once
    Workspace::grow(static_cast<std::size_t>(threads * kBlock * stride), ws.scores);
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    using Strided = Eigen::Map<const RowMajor, 0, Eigen::OuterStride<>>;
#pragma omp parallel for num_threads(threads) schedule(dynamic)
    for (std::int64_t item = 0; item < H * blocks; ++item) {
      const int h = static_cast<int>(item / blocks), g = h / group;
      const std::int64_t r0 = (item % blocks) * kBlock, rows = std::min(kBlock, n - r0);
      const std::int64_t visible = before + r0 + rows;  // keys the last row of the block sees
      Strided Q(ws.q.data() + (r0 * H + h) * d, rows, d, Eigen::OuterStride<>(H * d));
      Eigen::Map<const RowMajor> K(cache.k(l, g, 0), visible, d), V(cache.v(l, g, 0), visible, d);
      Eigen::Map<RowMajor, 0, Eigen::OuterStride<>> S(ws.scores.data() + omp_get_thread_num() * kBlock * stride, rows,
                                                     visible, Eigen::OuterStride<>(stride));
      S.noalias() = (Q * K.transpose()) * scale;
      for (std::int64_t r = 0; r < rows; ++r) {
        const std::int64_t seen = before + r0 + r + 1;
        auto row = S.row(r);
        const float mx = row.head(seen).maxCoeff();
        row.head(seen) = (row.head(seen).array() - mx).exp();
        row.head(seen) /= row.head(seen).sum();
        row.tail(visible - seen).setZero();
      }
      Eigen::Map<RowMajor, 0, Eigen::OuterStride<>> O(ws.attn.data() + (r0 * H + h) * d, rows, d,
                                                     Eigen::OuterStride<>(H * d));
      O.noalias() = S * V;
    }
  }

  ModelConfig c_;
  std::vector<float> embed_, lm_head_, final_norm_;
  std::vector<Layer> layers_;
  std::vector<double> inv_freq_;
};

}  // namespace engine
