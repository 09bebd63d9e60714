// GPU benchmarks: the whole Qwen2.5-VL-7B KV cache (28 layers, 4 KV heads,
// head dim 128, bf16) at 8K and 64K tokens, keep ratio 0.2, blocked and
// global transforms, beside a device-to-device copy of the same bytes (the
// bandwidth reference, measured in the same run); both again with four
// 24 x 24 image spans (Cache::spans, 8 x 8 tiles with blocked): the cost
// of the 2D pass.
//
// A plain CUDA program, so that it builds with nothing but the toolkit (the
// GPU machine may lack Google Benchmark). It writes Google-Benchmark-shaped
// JSON to the path given as the first argument (default: stdout only) and
// prints a note and exits 0 when there is no device.
//
// Bytes moved, per run: compress = K and V read once + kept rows written;
// copy = the same K and V bytes read and written.
//
// Decode attention (decode_attention.cuh, FlashDecoding-style split-K) over
// one layer of the same model (28 query heads over its 4 KV heads), batch
// {1, 16} x tokens {8K, 32K, 64K}, on the full cache and on a compressed one
// at keep 0.2 and 0.1 (a dense cache of round(keep * tokens) rows): what the
// attention step alone gains, beside the KV bytes it reads (and saves).
//
// Query tails (query_tails.cuh) over one layer of the same model: the last 256
// queries of a prompt of 8K and 64K tokens against its keys, with FLOPs.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "cuda_check.cuh"
#include "decode_attention.cuh"
#include "flashcache/cuda/compress.cuh"

namespace {

namespace fcc = flashcache::gpu;
using flashcache::bfloat16_t;

constexpr int kLayers = 28, kHeads = 4, kHeadDim = 128;
constexpr double kKeep = 0.2;

// Smooth-plus-noise bf16 values from a hash, so that no host upload is needed.
__global__ void fill_kernel(std::uint16_t* out, std::int64_t n, std::uint32_t seed) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float noise = static_cast<float>(h & 0xffff) / 65536.0f - 0.5f;
    const float smooth =
        __sinf(0.001f * static_cast<float>(i / (kHeads * kHeadDim)) + static_cast<float>(i % kHeadDim));
    out[i] = static_cast<std::uint16_t>(__float_as_uint(smooth + noise) >> 16);
  }
}

struct Result {
  std::string name;
  std::int64_t tokens;
  double ms;
  double bytes;
  std::string extra;  // more JSON members, each as ', "key": value'
};

// Median of `reps` timed runs after `warmup` untimed ones.
template <class F>
double time_ms(F&& run, int warmup, int reps) {
  cudaEvent_t a, b;
  BENCH_CHECK(cudaEventCreate(&a));
  BENCH_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < warmup; ++i) run();
  std::vector<float> times;
  for (int i = 0; i < reps; ++i) {
    BENCH_CHECK(cudaEventRecord(a));
    run();
    BENCH_CHECK(cudaEventRecord(b));
    BENCH_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    BENCH_CHECK(cudaEventElapsedTime(&ms, a, b));
    times.push_back(ms);
  }
  BENCH_CHECK(cudaEventDestroy(a));
  BENCH_CHECK(cudaEventDestroy(b));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

std::vector<Result> bench_tokens(std::int64_t tokens) {
  std::vector<Result> results;
  const std::int64_t per_layer = tokens * kHeads * kHeadDim;  // elements of K (or V) per layer
  const std::int64_t kept_rows = std::llround(kKeep * static_cast<double>(tokens));
  // One allocation per role keeps the layers contiguous, so one memcpy moves them all.
  std::uint16_t *k = nullptr, *v = nullptr, *k_out = nullptr, *v_out = nullptr, *copy = nullptr;
  const std::size_t cache_bytes = static_cast<std::size_t>(per_layer) * kLayers * 2;
  const std::size_t out_bytes = static_cast<std::size_t>(kept_rows) * kHeads * kHeadDim * kLayers * 2;  // written
  // Dynamic allocation moves budget between layers, so each layer's output
  // can hold all its tokens; only the kept rows are written.
  const std::size_t out_alloc = cache_bytes;
  BENCH_CHECK(cudaMalloc(&k, cache_bytes));
  BENCH_CHECK(cudaMalloc(&v, cache_bytes));
  BENCH_CHECK(cudaMalloc(&k_out, out_alloc));
  BENCH_CHECK(cudaMalloc(&v_out, out_alloc));
  BENCH_CHECK(cudaMalloc(&copy, 2 * cache_bytes));
  fill_kernel<<<4096, 256>>>(k, per_layer * kLayers, 1u);
  fill_kernel<<<4096, 256>>>(v, per_layer * kLayers, 2u);
  BENCH_CHECK(cudaGetLastError());

  std::vector<bfloat16_t*> kp, vp, kop, vop;
  for (int l = 0; l < kLayers; ++l) {
    kp.push_back(reinterpret_cast<bfloat16_t*>(k) + l * per_layer);
    vp.push_back(reinterpret_cast<bfloat16_t*>(v) + l * per_layer);
    kop.push_back(reinterpret_cast<bfloat16_t*>(k_out) + l * per_layer);
    vop.push_back(reinterpret_cast<bfloat16_t*>(v_out) + l * per_layer);
  }
  fcc::Cache<bfloat16_t> cache;  // NHD, one sequence
  cache.layers = kLayers;
  cache.k = kp.data();
  cache.v = vp.data();
  cache.heads = kHeads;
  cache.head_dim = kHeadDim;
  cache.head_stride = kHeadDim;
  cache.token_stride = kHeads * kHeadDim;
  cache.capacity = tokens;
  fcc::Outputs<bfloat16_t> out;  // HND compact cache
  out.k_out = kop.data();
  out.v_out = vop.data();
  out.out_head_stride = tokens * kHeadDim;
  out.out_token_stride = kHeadDim;
  out.out_capacity = tokens;
  const double compress_bytes = static_cast<double>(2 * cache_bytes + 2 * out_bytes);

  std::vector<flashcache::GridSpan> spans;  // Cache::spans points here
  for (const bool grids : {false, true}) {
    for (flashcache::Transform transform : {flashcache::Transform::blocked, flashcache::Transform::global}) {
      flashcache::Options opt;
      opt.score.transform = transform;
      opt.score.base = flashcache::Base::lowpass;  // both transforms on one base (the blocked kernel has no other)
      opt.score.block_size = 64;
      opt.allocate.mode = flashcache::Allocation::dynamic;
      spans.clear();
      if (grids)  // four 24 x 24 images (2304 tokens) after a 512-token prompt, 128 text tokens apart
        for (std::int64_t i = 0; i < 4; ++i) spans.push_back({512 + i * (576 + 128), 24, 24});
      cache.spans = spans;
      fcc::GlobalTransform plan;
      const fcc::GlobalTransform* plan_ptr = nullptr;
      if (transform == flashcache::Transform::global) {
        const std::int64_t lengths[1] = {tokens};
        const flashcache::Status s = fcc::GlobalTransform::create(lengths, 1, kHeads, kHeadDim, &plan);
        if (!s.ok()) {
          std::fprintf(stderr, "GlobalTransform: %s\n", s.message().c_str());
          continue;
        }
        plan_ptr = &plan;
      }
      std::size_t ws_bytes = 0;
      flashcache::Status s = fcc::workspace_size(cache, opt, &ws_bytes, plan_ptr);
      if (!s.ok()) {
        std::fprintf(stderr, "workspace_size: %s\n", s.message().c_str());
        continue;
      }
      void* ws = nullptr;
      BENCH_CHECK(cudaMalloc(&ws, ws_bytes));
      const flashcache::Budget budget = flashcache::Budget::ratio(kKeep);
      bool ok = true;
      auto run = [&] {
        const flashcache::Status r = fcc::compress_async(cache, budget, opt, out, ws, ws_bytes, nullptr, plan_ptr);
        if (!r.ok() && ok) {
          std::fprintf(stderr, "compress_async: %s\n", r.message().c_str());
          ok = false;
        }
      };
      const double ms = time_ms(run, 2, transform == flashcache::Transform::blocked ? 20 : 5);
      const flashcache::Status device = fcc::device_status(
          ws,
          [&] {
            fcc::WorkspaceLayout layout;
            (void)fcc::workspace_layout(cache, opt, plan_ptr, &layout);
            return layout;
          }(),
          nullptr);
      if (!device.ok()) std::fprintf(stderr, "device status: %s\n", device.message().c_str());
      const std::string name = std::string("compress_") + flashcache::to_string(transform) + (grids ? "_grids" : "");
      if (ok && device.ok()) results.push_back({name, tokens, ms, compress_bytes, ""});
      BENCH_CHECK(cudaFree(ws));
    }
  }

  cache.spans = {};

  // The bandwidth reference: the same K and V bytes, device to device.
  const double copy_ms = time_ms(
      [&] {
        BENCH_CHECK(cudaMemcpyAsync(copy, k, cache_bytes, cudaMemcpyDeviceToDevice));
        BENCH_CHECK(cudaMemcpyAsync(copy + cache_bytes / 2, v, cache_bytes, cudaMemcpyDeviceToDevice));
      },
      2, 20);
  results.push_back({"memcpy_d2d", tokens, copy_ms, static_cast<double>(4 * cache_bytes), ""});

  BENCH_CHECK(cudaFree(k));
  BENCH_CHECK(cudaFree(v));
  BENCH_CHECK(cudaFree(k_out));
  BENCH_CHECK(cudaFree(v_out));
  BENCH_CHECK(cudaFree(copy));
  return results;
}

// ---- decode attention: full cache vs compressed ------------------------------------------------------------

constexpr int kQueryHeads = 28;

// Decode attention over one layer at each batch, length and keep ratio. The
// caches are carved out of one pool of random bf16 values; a cache smaller
// than 4x the L2 cache rotates over enough copies of itself that each timed
// launch reads from device memory, as a real decode step does.
std::vector<Result> bench_decode(const cudaDeviceProp& prop) {
  namespace fg = flashcache::bench::gpu;
  const std::int64_t batches[] = {1, 16}, lengths[] = {8192, 32768, 65536};
  const double keeps[] = {1.0, 0.2, 0.1};
  const std::size_t row_bytes = kHeadDim * sizeof(std::uint16_t);
  auto kv_bytes = [&](std::int64_t batch, std::int64_t rows) {  // K and V
    return static_cast<std::size_t>(2 * batch * kHeads * rows) * row_bytes;
  };
  const std::size_t rotate = 4 * static_cast<std::size_t>(std::max(prop.l2CacheSize, 1 << 20));
  const std::size_t pool_bytes = std::max(kv_bytes(16, 65536), rotate);
  std::uint16_t* pool = nullptr;
  float *q = nullptr, *out = nullptr;
  BENCH_CHECK(cudaMalloc(&pool, pool_bytes));
  fill_kernel<<<4096, 256>>>(pool, static_cast<std::int64_t>(pool_bytes / 2), 3u);
  BENCH_CHECK(cudaGetLastError());
  const std::size_t q_elems = static_cast<std::size_t>(16) * kQueryHeads * kHeadDim;
  std::vector<float> q_host(q_elems);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : q_host) x = normal(rng);
  BENCH_CHECK(cudaMalloc(&q, q_elems * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&out, q_elems * sizeof(float)));
  BENCH_CHECK(cudaMemcpy(q, q_host.data(), q_elems * sizeof(float), cudaMemcpyHostToDevice));

  struct Case {
    std::int64_t batch, tokens, kept;
    double keep;
    fg::DecodeShape shape;
    int splits;
    std::size_t ws_bytes;
  };
  std::vector<Case> cases;
  std::size_t ws_max = 0;
  for (std::int64_t batch : batches)
    for (std::int64_t tokens : lengths)
      for (double keep : keeps) {
        const std::int64_t kept =
            keep == 1.0 ? tokens : static_cast<std::int64_t>(std::llround(keep * static_cast<double>(tokens)));
        Case c{batch, tokens, kept, keep, {}, 1, 0};
        c.shape.batch = static_cast<int>(batch);
        c.shape.query_heads = kQueryHeads;
        c.shape.kv_heads = kHeads;
        c.shape.head_dim = kHeadDim;
        c.shape.tokens = c.kept;
        BENCH_CHECK(fg::decode_splits<bfloat16_t>(c.shape, 0, &c.splits));
        c.ws_bytes = fg::decode_workspace_bytes(c.shape, c.splits);
        ws_max = std::max(ws_max, c.ws_bytes);
        cases.push_back(c);
      }
  void* ws = nullptr;
  BENCH_CHECK(cudaMalloc(&ws, ws_max));

  std::vector<Result> results;
  double full_ms = 0;
  std::size_t full_bytes = 0;
  for (const Case& c : cases) {
    const std::size_t bytes = kv_bytes(c.batch, c.kept);
    const std::size_t stride = (bytes + 255) / 256 * 256;
    const std::size_t copies = std::min(std::max<std::size_t>(1, (rotate + bytes - 1) / bytes), pool_bytes / stride);
    std::vector<fg::DecodeArgs<bfloat16_t>> args(copies);
    for (std::size_t i = 0; i < copies; ++i) {
      fg::DecodeArgs<bfloat16_t>& a = args[i];
      a.shape = c.shape;
      a.q = q;
      a.out = out;
      a.k = reinterpret_cast<const bfloat16_t*>(reinterpret_cast<const unsigned char*>(pool) + i * stride);
      a.v = a.k + bytes / 2 / sizeof(std::uint16_t);
      a.head_stride = c.kept * kHeadDim;
      a.seq_stride = kHeads * a.head_stride;
      a.splits = c.splits;
    }
    std::size_t next = 0;
    const int inner = static_cast<int>(std::max<std::size_t>(copies, 4));  // launches per timed run
    auto run = [&] {
      for (int i = 0; i < inner; ++i) {
        BENCH_CHECK(fg::decode_attention_async(args[next], ws, c.ws_bytes, nullptr));
        next = (next + 1) % copies;
      }
    };
    BENCH_CHECK(cudaMemset(out, 0xff, q_elems * sizeof(float)));  // NaN: every output must be written
    const double ms = time_ms(run, 2, 25) / inner;
    BENCH_CHECK(cudaDeviceSynchronize());
    std::vector<float> host(static_cast<std::size_t>(c.batch) * kQueryHeads * kHeadDim);
    BENCH_CHECK(cudaMemcpy(host.data(), out, host.size() * sizeof(float), cudaMemcpyDeviceToHost));
    const bool finite = std::all_of(host.begin(), host.end(), [](float x) { return std::isfinite(x); });
    if (c.keep == 1.0) {  // the baseline of the rows that follow
      full_ms = finite ? ms : 0.0;
      full_bytes = bytes;
    }
    if (!finite) {
      std::fprintf(stderr, "decode attention batch %lld, %lld of %lld tokens: non-finite output\n",
                   static_cast<long long>(c.batch), static_cast<long long>(c.kept), static_cast<long long>(c.tokens));
      continue;
    }
    char name[96], extra[512], speedup[32] = "null";
    if (full_ms > 0) std::snprintf(speedup, sizeof speedup, "%.4f", full_ms / ms);
    std::snprintf(name, sizeof name, "decode_attention/batch:%lld/keep:%g", static_cast<long long>(c.batch), c.keep);
    std::snprintf(extra, sizeof extra,
                  ", \"batch\": %lld, \"tokens\": %lld, \"keep_ratio\": %g, \"kept_tokens\": %lld, \"splits\": %d, "
                  "\"kv_bytes\": %zu, \"kv_bytes_full\": %zu, \"kv_bytes_saved\": %zu, \"speedup_vs_full\": %s, "
                  "\"rotated_copies\": %zu",
                  static_cast<long long>(c.batch), static_cast<long long>(c.tokens), c.keep,
                  static_cast<long long>(c.kept), c.splits, bytes, full_bytes, full_bytes - bytes, speedup, copies);
    results.push_back({name, c.tokens, ms, static_cast<double>(bytes), extra});
  }
  BENCH_CHECK(cudaFree(ws));
  BENCH_CHECK(cudaFree(q));
  BENCH_CHECK(cudaFree(out));
  BENCH_CHECK(cudaFree(pool));
  return results;
}

// Query tails (query_tails_async) over one layer: the chosen feed, the last 256
// queries of a prompt of `tokens` (28 query heads over 4 KV heads, bf16), as an
// engine raises them once per prompt. FLOPs: 2 x 28 x 256 x tokens x 128 (each
// fed query against nearly every key); bytes: K read once, Q and the tails.
std::vector<Result> bench_tails() {
  namespace fl = flashcache;
  std::vector<Result> results;
  const std::int64_t queries = fl::kTailLastQueries;
  for (std::int64_t tokens : {std::int64_t{8192}, std::int64_t{65536}}) {
    const std::int64_t k_elems = tokens * kHeads * kHeadDim, q_elems = queries * kQueryHeads * kHeadDim;
    std::uint16_t *k = nullptr, *q = nullptr;
    float *lse = nullptr, *tails = nullptr;
    BENCH_CHECK(cudaMalloc(&k, static_cast<std::size_t>(k_elems) * 2));
    BENCH_CHECK(cudaMalloc(&q, static_cast<std::size_t>(q_elems) * 2));
    BENCH_CHECK(cudaMalloc(&lse, static_cast<std::size_t>(kQueryHeads * queries) * sizeof(float)));
    BENCH_CHECK(cudaMalloc(&tails, static_cast<std::size_t>(kHeads * tokens) * sizeof(float)));
    fill_kernel<<<1024, 256>>>(k, k_elems, 11u);
    fill_kernel<<<256, 256>>>(q, q_elems, 12u);
    BENCH_CHECK(cudaGetLastError());
    std::vector<float> lse_host(static_cast<std::size_t>(kQueryHeads * queries), 12.0f);
    BENCH_CHECK(cudaMemcpy(lse, lse_host.data(), lse_host.size() * sizeof(float), cudaMemcpyHostToDevice));
    const auto* kb = reinterpret_cast<const bfloat16_t*>(k);
    const auto* qb = reinterpret_cast<const bfloat16_t*>(q);
    const fl::KVView<const bfloat16_t> qv = fl::nhd(qb, fl::Tokens(queries), fl::Heads(kQueryHeads), fl::HeadDim(kHeadDim));
    const fl::KVView<const bfloat16_t> kv = fl::nhd(kb, fl::Tokens(tokens), fl::Heads(kHeads), fl::HeadDim(kHeadDim));
    const fl::TailView<float> tv{tails, kHeads, tokens};
    const fl::QueryTailOptions o = fl::last_queries(tokens);
    auto run = [&] {
      const fl::Status st = fcc::query_tails_async(qv, tokens - queries, kv, lse, tv, o, nullptr);
      if (!st.ok()) {
        std::fprintf(stderr, "query tails: %s\n", st.message().c_str());
        std::exit(1);
      }
    };
    BENCH_CHECK(cudaMemset(tails, 0, static_cast<std::size_t>(kHeads * tokens) * sizeof(float)));
    const double ms = time_ms(run, 2, 10);
    const double flops = 2.0 * kQueryHeads * static_cast<double>(queries) * static_cast<double>(tokens) * kHeadDim;
    const double bytes = 2.0 * static_cast<double>(k_elems + q_elems) + 4.0 * static_cast<double>(kHeads * tokens);
    char extra[256];
    std::snprintf(extra, sizeof extra, ", \"queries\": %lld, \"flops\": %.0f, \"flops_per_second\": %.6e",
                  static_cast<long long>(queries), flops, flops / (ms * 1e-3));
    results.push_back({"query_tails/layer", tokens, ms, bytes, extra});
    BENCH_CHECK(cudaFree(k));
    BENCH_CHECK(cudaFree(q));
    BENCH_CHECK(cudaFree(lse));
    BENCH_CHECK(cudaFree(tails));
  }
  return results;
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("flashcache GPU benchmarks: no CUDA device, nothing measured\n");
    return 0;
  }
  cudaDeviceProp prop{};
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::vector<Result> all;
  for (std::int64_t tokens : {std::int64_t{8192}, std::int64_t{65536}}) {
    const std::vector<Result> r = bench_tokens(tokens);
    all.insert(all.end(), r.begin(), r.end());
  }
  {
    const std::vector<Result> r = bench_decode(prop);
    all.insert(all.end(), r.begin(), r.end());
  }
  {
    const std::vector<Result> r = bench_tails();
    all.insert(all.end(), r.begin(), r.end());
  }
  std::string json =
      "{\n  \"context\": {\"device\": \"" + std::string(prop.name) +
      "\", \"model\": \"Qwen2.5-VL-7B cache: 28 layers, 4 KV heads, head dim 128, bf16\", "
      "\"keep_ratio\": 0.2, \"decode_attention\": \"one layer: 28 query heads over 4 KV heads, head dim 128, "
      "bf16, one query token per sequence; keep < 1: a dense cache of round(keep * tokens) rows\"},\n"
      "  \"benchmarks\": [\n";
  for (std::size_t i = 0; i < all.size(); ++i) {
    const Result& r = all[i];
    char line[1024];
    std::snprintf(
        line, sizeof line,
        "    {\"name\": \"%s/%lld\", \"run_type\": \"iteration\", \"real_time\": %.6f, \"time_unit\": \"ms\", "
        "\"bytes\": %.0f, \"bytes_per_second\": %.6e%s}%s\n",
        r.name.c_str(), static_cast<long long>(r.tokens), r.ms, r.bytes, r.bytes / (r.ms * 1e-3), r.extra.c_str(),
        i + 1 < all.size() ? "," : "");
    json += line;
  }
  json += "  ]\n}\n";
  std::printf("%s", json.c_str());
  if (argc > 1) {
    FILE* f = std::fopen(argv[1], "w");
    if (f == nullptr) {
      std::fprintf(stderr, "cannot write %s\n", argv[1]);
      return 1;
    }
    std::fputs(json.c_str(), f);
    std::fclose(f);
  }
  return 0;
}
