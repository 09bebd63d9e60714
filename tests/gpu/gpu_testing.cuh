#pragma once
// Shared machinery of the GPU tests: device buffers, random caches (dense or
// paged, NHD or HND, ragged), the CPU reference per sequence, and the checks
// each stage's output must pass against it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "flashcache/cuda/compress.cuh"
#include "flashcache/flashcache.hpp"

namespace flashcache::gpu_testing {

namespace fcc = flashcache::gpu;

inline bool device_available() {
  int count = 0;
  const bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  if (!ok) (void)cudaGetLastError();  // clear the sticky "no device" error
  return ok;
}

#define FLASHCACHE_REQUIRE_DEVICE() \
  if (!::flashcache::gpu_testing::device_available()) GTEST_SKIP() << "no CUDA device"

// CUDA graphs: GPGPU-Sim does not simulate them (stream capture fails there), and
// a simulator build's global transform waits for its stream (sim_fft.cuh).
#ifdef FLASHCACHE_GPU_SIM
#define FLASHCACHE_REQUIRE_GRAPHS() GTEST_SKIP() << "CUDA graphs are not simulated (FLASHCACHE_GPU_SIM build)"
#else
#define FLASHCACHE_REQUIRE_GRAPHS() static_cast<void>(0)
#endif

#define FLASHCACHE_CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr
#define FLASHCACHE_OK(expr)                     \
  do {                                          \
    const ::flashcache::Status fc_s_ = (expr);  \
    ASSERT_TRUE(fc_s_.ok()) << fc_s_.message(); \
  } while (0)

// Owning device array, for tests only.
template <class U>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(std::size_t n) { resize(n); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept : ptr_(o.ptr_), n_(o.n_) { o.ptr_ = nullptr; }
  ~DeviceArray() {
    if (ptr_) cudaFree(ptr_);
  }
  void resize(std::size_t n) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    n_ = n;
    if (cudaMalloc(&ptr_, std::max<std::size_t>(n, 1) * sizeof(U)) != cudaSuccess) ptr_ = nullptr;
  }
  void upload(const std::vector<U>& host) {
    resize(host.size());
    if (!host.empty()) cudaMemcpy(ptr_, host.data(), host.size() * sizeof(U), cudaMemcpyHostToDevice);
  }
  std::vector<U> download() const {
    std::vector<U> host(n_);
    if (n_) cudaMemcpy(host.data(), ptr_, n_ * sizeof(U), cudaMemcpyDeviceToHost);
    return host;
  }
  U* get() const { return ptr_; }
  std::size_t size() const { return n_; }

 private:
  U* ptr_ = nullptr;
  std::size_t n_ = 0;
};

// One test problem.
struct Case {
  std::string name;
  int layers = 1;
  std::int64_t heads = 2;
  std::int64_t head_dim = 64;
  std::vector<std::int64_t> lengths{64};
  bool nhd = true;
  std::int64_t page_size = 0;  // 0: dense
  // The paper's rules unless a case says otherwise; the defaults (sink 4, recent
  // window share) have their own case, DefaultOptionsKeepTheRecentWindowShare.
  Options opt = Options::paper();
  Budget budget = Budget::ratio(0.2);
  int nan_tokens = 0;  // (layer, head, token) rows given a NaN, per layer
  int mask_every = 0;  // protect every k-th packed token
  bool gather = true;
  bool compact = false;  // paged only
  std::uint64_t seed = 1;
  // Fixed non-finite placements: K[column 0] of (sequence, head, token) set to value.
  struct BadRow {
    int sequence = 0;
    std::int64_t head = 0, first = 0, last = 0;  // tokens [first, last]
    float value = std::numeric_limits<float>::quiet_NaN();
    bool whole_key = false;  // every element of the key row, not only its first
  };
  std::vector<BadRow> bad_rows;
  std::int64_t token_pad = 0;  // dense only: elements of padding after each token row (unaligned strides)
  bool all_zero = false;       // every K and V value 0: every score ties
  // K and V of each (layer, sequence, head) built from DCT-II basis vectors of
  // distinct strengths (spectral_rows below), plus a little noise and no
  // outliers: a base chosen by energy (ScoreOptions::base) then has a clear choice,
  // so the GPU's float energies and the CPU's double ones cannot part at a near tie.
  bool spectral = false;
  std::vector<GridSpan> spans;  // image spans, the same in every sequence (Cache::spans)
};

inline Options blocked(std::int64_t block) {
  Options o = Options::paper();
  o.score.transform = Transform::blocked;
  o.score.block_size = block;
  return o;
}
inline Options global_transform() {
  Options o = Options::paper();
  o.score.transform = Transform::global;
  return o;
}

// One sequence of n tokens, 2 heads of 64, with the given non-finite rows.
inline Case one_sequence(std::int64_t n, Options opt, std::vector<Case::BadRow> bad,
                         Budget budget = Budget::ratio(0.8)) {
  Case c;
  c.lengths = {n};
  c.heads = 2;
  c.head_dim = 64;
  c.opt = opt;
  c.bad_rows = std::move(bad);
  c.budget = budget;
  return c;
}

template <class T>
struct HostCache {
  Case c;
  std::int64_t capacity = 0;
  std::int64_t head_stride = 0, token_stride = 0, page_stride = 0, num_pages = 0;
  std::vector<std::vector<T>> k, v;  // per layer storage
  std::vector<std::int32_t> indptr, page_indices, last_page_len;
  std::vector<std::int64_t> packed;  // packed offset per sequence
  std::vector<std::uint8_t> mask;    // packed order

  bool paged() const { return c.page_size > 0; }
  std::int64_t row(int b, std::int64_t h, std::int64_t t) const {
    if (paged()) {
      const std::int64_t page = page_indices[static_cast<std::size_t>(indptr[b] + t / c.page_size)];
      return page * page_stride + (t % c.page_size) * token_stride + h * head_stride;
    }
    return (indptr[b] + t) * token_stride + h * head_stride;
  }
  std::int64_t total_tokens() const { return std::accumulate(c.lengths.begin(), c.lengths.end(), std::int64_t{0}); }

  // Sequence b of layer l as a dense HND copy: what the CPU reference reads.
  std::vector<T> sequence(const std::vector<T>& storage, int b) const {
    const std::int64_t n = c.lengths[b], d = c.head_dim;
    std::vector<T> out(static_cast<std::size_t>(c.heads * n * d));
    for (std::int64_t h = 0; h < c.heads; ++h)
      for (std::int64_t t = 0; t < n; ++t) std::copy_n(storage.data() + row(b, h, t), d, out.data() + (h * n + t) * d);
    return out;
  }
};

// One head's K (or V) of n tokens for Case::spectral, [n][d]: every frequency
// below the base's forced low ones (mixed: ceil(m / 2), lowpass: m) at strength
// 1, and rest + 3 of the others (random ones) at strengths 1.5, 1.6, ... in a
// random order, so that the m-th and the (m+1)-th strongest differ by more
// than 1% of their energy, far above float rounding; each head-dim column
// scales the whole spectrum by its own weight (the order over frequencies is
// the same in every column), plus noise of 0.05. Frequencies outside the
// design carry only that noise and are never chosen.
inline std::vector<double> spectral_rows(std::int64_t n, std::int64_t d, const Options& opt, std::mt19937_64& rng) {
  std::vector<double> x(static_cast<std::size_t>(n * d), 0.0);
  if (n == 0) return x;
  const std::int64_t m = lowpass_cutoff(n, opt.score.gamma);
  const std::int64_t low = std::min(fcc::kernels::base_low_count(opt.score.base, m), n);
  std::vector<std::int64_t> others(static_cast<std::size_t>(n - low));
  std::iota(others.begin(), others.end(), low);
  std::shuffle(others.begin(), others.end(), rng);
  const std::int64_t designed = std::min<std::int64_t>(n - low, std::min(m, n) - low + 3);
  std::vector<std::pair<std::int64_t, double>> strengths;  // (frequency, orthonormal coefficient)
  for (std::int64_t f = 0; f < low; ++f) strengths.push_back({f, 1.0});
  for (std::int64_t i = 0; i < designed; ++i)
    strengths.push_back({others[static_cast<std::size_t>(i)], 1.5 + 0.1 * static_cast<double>(i)});
  std::uniform_real_distribution<double> weight(0.5, 1.5);
  std::normal_distribution<double> noise(0.0, 0.05);
  const double pi = 3.14159265358979323846;
  for (std::int64_t j = 0; j < d; ++j) {
    const double w = weight(rng);
    for (const auto& [f, a] : strengths) {
      const double scale = w * a * std::sqrt((f == 0 ? 1.0 : 2.0) / static_cast<double>(n));
      for (std::int64_t t = 0; t < n; ++t)
        x[static_cast<std::size_t>(t * d + j)] +=
            scale * std::cos(pi * static_cast<double>(f) * static_cast<double>(2 * t + 1) / static_cast<double>(2 * n));
    }
    for (std::int64_t t = 0; t < n; ++t) x[static_cast<std::size_t>(t * d + j)] += noise(rng);
  }
  return x;
}

template <class T>
HostCache<T> make_cache(const Case& c) {
  HostCache<T> hc;
  hc.c = c;
  const auto B = static_cast<int>(c.lengths.size());
  const std::int64_t H = c.heads, d = c.head_dim;
  std::mt19937_64 rng(c.seed);
  hc.packed.assign(static_cast<std::size_t>(B), 0);
  for (int b = 1; b < B; ++b) hc.packed[b] = hc.packed[b - 1] + c.lengths[b - 1];
  std::int64_t storage = 0;
  if (c.page_size > 0) {
    hc.indptr.assign(1, 0);
    for (int b = 0; b < B; ++b) {
      const std::int64_t pages = (c.lengths[b] + c.page_size - 1) / c.page_size;
      hc.indptr.push_back(static_cast<std::int32_t>(hc.indptr.back() + pages));
      hc.last_page_len.push_back(static_cast<std::int32_t>(pages ? c.lengths[b] - (pages - 1) * c.page_size : 0));
    }
    hc.num_pages = hc.indptr.back() + 3;  // spare pages nobody uses
    std::vector<std::int32_t> ids(static_cast<std::size_t>(hc.num_pages));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    hc.page_indices.assign(ids.begin(), ids.begin() + hc.indptr.back());
    hc.capacity = std::max<std::int64_t>(hc.indptr.back() * c.page_size, 1);
    hc.head_stride = c.nhd ? d : c.page_size * d;
    hc.token_stride = c.nhd ? H * d : d;
    hc.page_stride = c.page_size * H * d;
    storage = hc.num_pages * hc.page_stride;
  } else {
    hc.indptr.assign(1, 0);
    for (int b = 0; b < B; ++b) hc.indptr.push_back(static_cast<std::int32_t>(hc.indptr.back() + c.lengths[b]));
    hc.capacity = hc.indptr.back() + 5;  // slack rows after the batch
    hc.head_stride = c.nhd ? d : hc.capacity * (d + c.token_pad);
    hc.token_stride = c.nhd ? H * d + c.token_pad : d + c.token_pad;
    storage = hc.capacity * H * (d + c.token_pad) + c.token_pad;
  }
  // Smooth along tokens plus noise, so that scores spread out; a few outliers.
  std::normal_distribution<double> noise(0.0, 0.3);
  std::uniform_real_distribution<double> phase(0.0, 6.28);
  for (int l = 0; l < c.layers; ++l) {
    std::vector<T> ks(static_cast<std::size_t>(storage), from_float<T>(0.0f)), vs = ks;
    for (int b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < H; ++h) {
        if (c.spectral) {
          const std::vector<double> sk = spectral_rows(c.lengths[b], d, c.opt, rng);
          const std::vector<double> sv = spectral_rows(c.lengths[b], d, c.opt, rng);
          for (std::int64_t t = 0; t < c.lengths[b]; ++t)
            for (std::int64_t j = 0; j < d; ++j) {
              ks[hc.row(b, h, t) + j] = from_float<T>(static_cast<float>(sk[static_cast<std::size_t>(t * d + j)]));
              vs[hc.row(b, h, t) + j] = from_float<T>(static_cast<float>(sv[static_cast<std::size_t>(t * d + j)]));
            }
          continue;
        }
        const double pk = phase(rng), pv = phase(rng);
        for (std::int64_t t = 0; t < c.lengths[b]; ++t) {
          const double outlier = (t % 37 == 11) ? 2.0 : 0.0;
          for (std::int64_t j = 0; j < d; ++j) {
            const double base = std::sin(0.03 * static_cast<double>(t) + 0.7 * static_cast<double>(j));
            ks[hc.row(b, h, t) + j] = from_float<T>(static_cast<float>(base + pk * 0.1 + noise(rng) + outlier));
            vs[hc.row(b, h, t) + j] = from_float<T>(static_cast<float>(0.5 * base - pv * 0.1 + noise(rng)));
          }
        }
      }
    // NaN rows: a random (sequence, head, token, column) per injection.
    for (int i = 0; i < c.nan_tokens; ++i) {
      const int b = static_cast<int>(rng() % static_cast<std::uint64_t>(B));
      if (c.lengths[b] == 0) continue;
      const std::int64_t h = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(H));
      const std::int64_t t = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(c.lengths[b]));
      const std::int64_t j = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(d));
      (i % 2 ? vs : ks)[hc.row(b, h, t) + j] = from_float<T>(std::numeric_limits<float>::quiet_NaN());
    }
    if (c.all_zero) {
      std::fill(ks.begin(), ks.end(), from_float<T>(0.0f));
      std::fill(vs.begin(), vs.end(), from_float<T>(0.0f));
    }
    for (const Case::BadRow& r : c.bad_rows)
      for (std::int64_t t = r.first; t <= r.last; ++t)
        for (std::int64_t j = 0; j < (r.whole_key ? d : 1); ++j)
          ks[hc.row(r.sequence, r.head, t) + j] = from_float<T>(r.value);
    hc.k.push_back(std::move(ks));
    hc.v.push_back(std::move(vs));
  }
  hc.mask.assign(static_cast<std::size_t>(hc.capacity), 0);
  if (c.mask_every > 0)
    for (std::int64_t i = 0; i < hc.total_tokens(); i += c.mask_every) hc.mask[static_cast<std::size_t>(i)] = 1;
  return hc;
}

// The CPU result for one sequence: per layer kept indices, scores, budgets.
template <class T>
struct Reference {
  std::vector<std::int64_t> budgets;  // per layer
  std::vector<std::vector<std::int32_t>> kept;
  std::vector<LayerScores> scores;
  std::vector<double> ratio;
};

template <class T>
Reference<T> cpu_reference(const HostCache<T>& hc, int b) {
  const Case& c = hc.c;
  const std::int64_t n = c.lengths[b];
  std::vector<std::vector<T>> ks, vs;
  std::vector<KVView<const T>> kv, vv;
  for (int l = 0; l < c.layers; ++l) {
    ks.push_back(hc.sequence(hc.k[l], b));
    vs.push_back(hc.sequence(hc.v[l], b));
  }
  for (int l = 0; l < c.layers; ++l) {
    kv.push_back(hnd<const T>(ks[l].data(), Heads(c.heads), Tokens(n), HeadDim(c.head_dim)));
    vv.push_back(hnd<const T>(vs[l].data(), Heads(c.heads), Tokens(n), HeadDim(c.head_dim)));
  }
  const Options& opt = c.opt;
  const std::vector<std::uint8_t> bytes(hc.mask.begin() + hc.packed[b], hc.mask.begin() + hc.packed[b] + n);
  const ProtectMask mask = c.mask_every > 0 ? ProtectMask(bytes) : ProtectMask{};
  Reference<T> ref;
  if (c.layers == 1) {
    auto layer = compress<double>(kv[0], vv[0], c.budget, opt, mask, c.spans);
    ref.budgets.push_back(layer.budget);
    ref.kept.push_back(layer.kept);
    ref.ratio.push_back(layer.scores.energy_ratio());
    ref.scores.push_back(std::move(layer.scores));
  } else {
    const std::vector<ProtectMask> masks(mask.empty() ? 0 : static_cast<std::size_t>(c.layers), mask);
    auto model = compress_model<double>(kv, vv, c.budget, opt, masks, c.spans);
    ref.budgets = model.budgets;
    ref.ratio = model.energy_ratio;
    for (auto& layer : model.layers) {
      ref.kept.push_back(layer.kept);
      ref.scores.push_back(std::move(layer.scores));
    }
  }
  return ref;
}

// Everything uploaded, the API descriptions filled in.
template <class T>
struct DeviceCache {
  std::vector<DeviceArray<T>> k, v, k_out, v_out;
  std::vector<T*> k_ptr, v_ptr, k_out_ptr, v_out_ptr;
  DeviceArray<std::int32_t> indptr, page_indices, last_page_len, kept, kept_indptr, new_len, pages_freed;
  DeviceArray<std::uint8_t> mask;
  DeviceArray<float> ratio;
  fcc::Cache<T> cache;
  fcc::Outputs<T> out;
  Options opt;
  std::vector<GridSpan> spans;

  explicit DeviceCache(const HostCache<T>& hc) {
    const Case& c = hc.c;
    for (int l = 0; l < c.layers; ++l) {
      k.emplace_back();
      v.emplace_back();
      k.back().upload(hc.k[l]);
      v.back().upload(hc.v[l]);
      k_ptr.push_back(k.back().get());
      v_ptr.push_back(v.back().get());
    }
    indptr.upload(hc.indptr);
    cache.layers = c.layers;
    cache.k = k_ptr.data();
    cache.v = v_ptr.data();
    cache.heads = c.heads;
    cache.head_dim = c.head_dim;
    cache.head_stride = hc.head_stride;
    cache.token_stride = hc.token_stride;
    cache.sequences = static_cast<int>(c.lengths.size());
    cache.capacity = hc.capacity;
    if (hc.paged()) {
      page_indices.upload(hc.page_indices.empty() ? std::vector<std::int32_t>{0} : hc.page_indices);
      last_page_len.upload(hc.last_page_len);
      cache.pages.indptr = indptr.get();
      cache.pages.indices = page_indices.get();
      cache.pages.last_page_len = last_page_len.get();
      cache.pages.page_size = c.page_size;
      cache.pages.page_stride = hc.page_stride;
      cache.pages.num_pages = hc.num_pages;
    } else {
      cache.indptr = indptr.get();
    }
    opt = c.opt;
    spans = c.spans;
    cache.spans = spans;
    if (c.mask_every > 0) {
      mask.upload(hc.mask);
      cache.protect = mask.get();
    }
    const auto L = static_cast<std::size_t>(c.layers), B = c.lengths.size();
    kept.resize(L * static_cast<std::size_t>(c.heads * hc.capacity));
    kept_indptr.resize(L * (B + 1));
    ratio.resize(L * B);
    out.kept = kept.get();
    out.kept_indptr = kept_indptr.get();
    out.energy_ratio = ratio.get();
    if (c.gather) {  // dense HND outputs, as many rows as the batch has tokens
      const std::int64_t rows = std::max<std::int64_t>(hc.total_tokens(), 1);
      for (int l = 0; l < c.layers; ++l) {
        k_out.emplace_back(static_cast<std::size_t>(c.heads * rows * c.head_dim));
        v_out.emplace_back(static_cast<std::size_t>(c.heads * rows * c.head_dim));
        k_out_ptr.push_back(k_out.back().get());
        v_out_ptr.push_back(v_out.back().get());
      }
      out.k_out = k_out_ptr.data();
      out.v_out = v_out_ptr.data();
      out.out_head_stride = rows * c.head_dim;
      out.out_token_stride = c.head_dim;
      out.out_capacity = rows;
    }
    if (c.compact) {
      new_len.resize(L * B);
      pages_freed.resize(L * B);
      out.compact_in_place = true;
      out.new_len = new_len.get();
      out.pages_freed = pages_freed.get();
    }
  }
};

inline double tolerance_for(DType t) { return t == DType::f32 ? 1e-4 : 1e-3; }

// What one run left on the device, downloaded.
struct RunResult {
  std::vector<float> scores;
  std::vector<std::int32_t> kept, kept_indptr;
  std::vector<float> ratio;
};

// Runs the case on the device, then checks every stage against the CPU.
template <class T>
void run_and_check(const Case& c) {
  SCOPED_TRACE(c.name);
  const HostCache<T> hc = make_cache<T>(c);
  DeviceCache<T> dc(hc);
  const int B = static_cast<int>(c.lengths.size());
  const std::int64_t H = c.heads, d = c.head_dim;

  fcc::GlobalTransform plan;
  const fcc::GlobalTransform* plan_ptr = nullptr;
  if (c.opt.score.transform == Transform::global) {
    FLASHCACHE_OK(fcc::GlobalTransform::create(c.lengths.data(), B, H, d, &plan));
    plan_ptr = &plan;
  }
  std::size_t bytes = 0;
  FLASHCACHE_OK(fcc::workspace_size(dc.cache, dc.opt, &bytes, plan_ptr));
  DeviceArray<unsigned char> ws(bytes);
  cudaStream_t stream = nullptr;
  FLASHCACHE_CUDA_OK(cudaStreamCreate(&stream));
  FLASHCACHE_OK(fcc::compress_async(dc.cache, c.budget, dc.opt, dc.out, ws.get(), bytes, stream, plan_ptr));
  const Status device = fcc::device_status(dc.cache, dc.opt, ws.get(), stream, plan_ptr);
  FLASHCACHE_CUDA_OK(cudaStreamDestroy(stream));
  ASSERT_TRUE(device.ok()) << device.message();
  FLASHCACHE_CUDA_OK(cudaDeviceSynchronize());

  fcc::WorkspaceLayout layout;
  FLASHCACHE_OK(fcc::workspace_layout(dc.cache, dc.opt, plan_ptr, &layout));
  std::vector<float> scores(static_cast<std::size_t>(c.layers * H * hc.capacity));
  FLASHCACHE_CUDA_OK(cudaMemcpy(scores.data(),
                                static_cast<unsigned char*>(static_cast<void*>(ws.get())) + layout.scores,
                                scores.size() * sizeof(float), cudaMemcpyDeviceToHost));
  const std::vector<std::int32_t> kept = dc.kept.download(), kept_indptr = dc.kept_indptr.download();
  const std::vector<float> ratio = dc.ratio.download();
  const double tol = tolerance_for(dtype_of<T>::value);

  std::int64_t agree = 0, compared = 0;
  for (int b = 0; b < B; ++b) {
    SCOPED_TRACE("sequence " + std::to_string(b));
    const std::int64_t n = c.lengths[b];
    const Reference<T> ref = cpu_reference(hc, b);
    for (int l = 0; l < c.layers; ++l) {
      SCOPED_TRACE("layer " + std::to_string(l));
      // Energy ratio R_l.
      EXPECT_NEAR(ratio[static_cast<std::size_t>(l * B + b)], ref.ratio[l], tol * std::max(1.0, ref.ratio[l]));
      // Budget: exact for one layer or uniform; dynamic may move one token at a near-tie of R.
      const std::int64_t budget = kept_indptr[static_cast<std::size_t>(l * (B + 1) + b + 1)] -
                                  kept_indptr[static_cast<std::size_t>(l * (B + 1) + b)];
      if (c.layers == 1 || c.opt.allocate.mode == Allocation::uniform)
        EXPECT_EQ(budget, ref.budgets[l]);
      else
        EXPECT_LE(std::abs(budget - ref.budgets[l]), 1);
      const std::vector<std::uint8_t> base = protected_tokens(n, c.opt.select);
      for (std::int64_t h = 0; h < H; ++h) {
        // Scores, relative to the largest finite score of the head.
        double largest = 0;
        for (std::int64_t t = 0; t < n; ++t)
          if (std::isfinite(ref.scores[l](h, t))) largest = std::max(largest, static_cast<double>(ref.scores[l](h, t)));
        const float* gpu = scores.data() + (l * H + h) * hc.capacity + hc.packed[b];
        int bad_scores = 0;
        for (std::int64_t t = 0; t < n; ++t) {
          const float want = ref.scores[l](h, t);
          if (std::isinf(want)) {
            if (!std::isinf(gpu[t]) && bad_scores++ < 5)
              ADD_FAILURE() << "token " << t << " head " << h << ": inf expected, got " << gpu[t];
          } else if (!(std::abs(gpu[t] - want) <= tol * largest + 1e-30) && bad_scores++ < 5) {
            ADD_FAILURE() << "token " << t << " head " << h << ": score " << gpu[t] << " vs CPU " << want
                          << " (largest " << largest << ")";
          }
        }
        // Kept set: the guarantees, then agreement with the CPU.
        const std::int32_t* got =
            kept.data() + (l * H + h) * hc.capacity + kept_indptr[static_cast<std::size_t>(l * (B + 1) + b)];
        std::set<std::int32_t> got_set(got, got + budget);
        for (std::int64_t i = 1; i < budget; ++i) ASSERT_LT(got[i - 1], got[i]) << "ascending, head " << h;
        for (std::int64_t i = 0; i < budget; ++i) ASSERT_TRUE(got[i] >= 0 && got[i] < n) << "index in range";
        for (std::int64_t t = 0; t < n; ++t) {
          const bool forced = base[static_cast<std::size_t>(t)] ||
                              (hc.mask[static_cast<std::size_t>(hc.packed[b] + t)] != 0) ||
                              std::isinf(ref.scores[l](h, t));
          if (forced) EXPECT_TRUE(got_set.count(static_cast<std::int32_t>(t))) << "protected token " << t << " kept";
        }
        const std::vector<std::int32_t>& want = ref.kept[l];
        for (std::int64_t i = 0; i < ref.budgets[l]; ++i)
          agree += got_set.count(want[static_cast<std::size_t>(h * ref.budgets[l] + i)]);
        compared += std::max<std::int64_t>(budget, ref.budgets[l]);
      }
      // Gather: each output row is the source row the GPU kept.
      if (c.gather) {
        const std::vector<T> ko = dc.k_out[l].download(), vo = dc.v_out[l].download();
        const std::int64_t first = kept_indptr[static_cast<std::size_t>(l * (B + 1) + b)];
        for (std::int64_t h = 0; h < H; ++h)
          for (std::int64_t i = 0; i < budget; ++i) {
            const std::int32_t t = kept[static_cast<std::size_t>((l * H + h) * hc.capacity + first + i)];
            const std::int64_t to = h * dc.out.out_head_stride + (first + i) * d;
            ASSERT_EQ(0, std::memcmp(ko.data() + to, hc.k[l].data() + hc.row(b, h, t), d * sizeof(T)))
                << "gathered K row";
            ASSERT_EQ(0, std::memcmp(vo.data() + to, hc.v[l].data() + hc.row(b, h, t), d * sizeof(T)))
                << "gathered V row";
          }
      }
    }
  }
  if (compared > 0)
    EXPECT_GE(static_cast<double>(agree) / static_cast<double>(compared), 0.995) << agree << " of " << compared;

  // Paged compaction: rows moved to the front, new lengths, freed pages.
  if (c.compact) {
    const std::vector<std::int32_t> new_len = dc.new_len.download(), freed = dc.pages_freed.download();
    for (int l = 0; l < c.layers; ++l) {
      const std::vector<T> kc = dc.k[l].download(), vc = dc.v[l].download();
      for (int b = 0; b < B; ++b) {
        const std::int64_t first = kept_indptr[static_cast<std::size_t>(l * (B + 1) + b)];
        const std::int64_t budget = kept_indptr[static_cast<std::size_t>(l * (B + 1) + b + 1)] - first;
        EXPECT_EQ(new_len[static_cast<std::size_t>(l * B + b)], budget);
        const std::int64_t pages = hc.indptr[b + 1] - hc.indptr[b];
        EXPECT_EQ(freed[static_cast<std::size_t>(l * B + b)], pages - (budget + c.page_size - 1) / c.page_size);
        for (std::int64_t h = 0; h < H; ++h)
          for (std::int64_t i = 0; i < budget; ++i) {
            const std::int32_t t = kept[static_cast<std::size_t>((l * H + h) * hc.capacity + first + i)];
            ASSERT_EQ(0, std::memcmp(kc.data() + hc.row(b, h, i), hc.k[l].data() + hc.row(b, h, t), d * sizeof(T)))
                << "compacted K row " << i << " of sequence " << b;
            ASSERT_EQ(0, std::memcmp(vc.data() + hc.row(b, h, i), hc.v[l].data() + hc.row(b, h, t), d * sizeof(T)))
                << "compacted V row " << i << " of sequence " << b;
          }
      }
    }
  }
}

// compress_async on a test cache, for the tests that drive the run themselves.
template <class T>
Status compress_on(const DeviceCache<T>& dc, const Budget& budget, void* ws, std::size_t bytes, cudaStream_t stream,
                   const fcc::GlobalTransform* plan = nullptr) {
  return fcc::compress_async(dc.cache, budget, dc.opt, dc.out, ws, bytes, stream, plan);
}

// Runs a case that must fail on the device; returns the device's status.
template <class T>
Status run_expecting_device_failure(const Case& c) {
  const HostCache<T> hc = make_cache<T>(c);
  DeviceCache<T> dc(hc);
  std::size_t bytes = 0;
  const Status sized = fcc::workspace_size(dc.cache, dc.opt, &bytes);
  if (!sized.ok()) return sized;
  DeviceArray<unsigned char> ws(bytes);
  const Status ran = fcc::compress_async(dc.cache, c.budget, dc.opt, dc.out, ws.get(), bytes, nullptr);
  if (!ran.ok()) return ran;
  return fcc::device_status(dc.cache, dc.opt, ws.get(), nullptr);
}

// The scores of one blocked run, for the reproducibility check.
template <class T>
std::vector<float> blocked_scores(const Case& c) {
  const HostCache<T> hc = make_cache<T>(c);
  DeviceCache<T> dc(hc);
  std::size_t bytes = 0;
  if (!fcc::workspace_size(dc.cache, dc.opt, &bytes).ok()) return {};
  DeviceArray<unsigned char> ws(bytes);
  if (!fcc::compress_async(dc.cache, c.budget, dc.opt, dc.out, ws.get(), bytes, nullptr).ok()) return {};
  fcc::WorkspaceLayout layout;
  if (!fcc::workspace_layout(dc.cache, dc.opt, nullptr, &layout).ok()) return {};
  std::vector<float> scores(static_cast<std::size_t>(c.layers * c.heads * hc.capacity));
  cudaMemcpy(scores.data(), static_cast<unsigned char*>(static_cast<void*>(ws.get())) + layout.scores,
             scores.size() * sizeof(float), cudaMemcpyDeviceToHost);
  return scores;
}

// Captures compress_async in a CUDA graph, replays it, and compares the kept
// indices with a direct run: the run path must be capturable (no sync, no
// allocation). Returns an empty string on success, else what went wrong.
template <class T>
std::string graph_matches_direct(const Case& c) {
  const HostCache<T> hc = make_cache<T>(c);
  DeviceCache<T> direct(hc), captured(hc);
  std::size_t bytes = 0;
  if (!fcc::workspace_size(direct.cache, direct.opt, &bytes).ok()) return "workspace_size";
  DeviceArray<unsigned char> ws_graph(bytes);
  if (!fcc::compress(direct.cache, c.budget, direct.opt, direct.out).ok()) return "direct run";
  cudaStream_t stream = nullptr;
  if (cudaStreamCreate(&stream) != cudaSuccess) return "stream";
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::string error;
  if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) error = "begin capture";
  if (error.empty()) {
    const Status s =
        fcc::compress_async(captured.cache, c.budget, captured.opt, captured.out, ws_graph.get(), bytes, stream);
    const cudaError_t end = cudaStreamEndCapture(stream, &graph);
    if (!s.ok())
      error = "compress_async under capture: " + s.message();
    else if (end != cudaSuccess)
      error = std::string("end capture: ") + cudaGetErrorString(end);
  }
  if (error.empty() && cudaGraphInstantiateWithFlags(&exec, graph, 0) != cudaSuccess) error = "instantiate";
  for (int replay = 0; error.empty() && replay < 2; ++replay)
    if (cudaGraphLaunch(exec, stream) != cudaSuccess) error = "launch";
  if (error.empty()) {
    const Status device = fcc::device_status(captured.cache, captured.opt, ws_graph.get(), stream);
    if (!device.ok()) error = "device status: " + device.message();
  }
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  if (!error.empty()) return error;
  if (direct.kept_indptr.download() != captured.kept_indptr.download()) return "kept_indptr differs";
  const std::vector<std::int32_t> a = direct.kept.download(), b = captured.kept.download();
  const std::int64_t rows = direct.kept_indptr.download().back();
  for (std::int64_t h = 0; h < c.heads; ++h)
    for (std::int64_t i = 0; i < rows; ++i)
      if (a[static_cast<std::size_t>(h * hc.capacity + i)] != b[static_cast<std::size_t>(h * hc.capacity + i)])
        return "kept indices differ";
  return "";
}

// Every runner above instantiates the whole pipeline for its element type: they
// are compiled once, in runners.cu, and the suites only call them.
#define FLASHCACHE_GPU_TESTING_RUNNERS(PREFIX, T)                                                      \
  PREFIX void run_and_check<T>(const Case&);                                                           \
  PREFIX Status run_expecting_device_failure<T>(const Case&);                                          \
  PREFIX std::vector<float> blocked_scores<T>(const Case&);                                            \
  PREFIX std::string graph_matches_direct<T>(const Case&);                                             \
  PREFIX Status compress_on<T>(const DeviceCache<T>&, const Budget&, void*, std::size_t, cudaStream_t, \
                               const fcc::GlobalTransform*);
#ifndef FLASHCACHE_GPU_TESTING_COMPILE_RUNNERS
FLASHCACHE_GPU_TESTING_RUNNERS(extern template, float)
FLASHCACHE_GPU_TESTING_RUNNERS(extern template, half_t)
FLASHCACHE_GPU_TESTING_RUNNERS(extern template, bfloat16_t)
#endif

}  // namespace flashcache::gpu_testing
