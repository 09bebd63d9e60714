// GPU benchmarks: the whole Qwen2.5-VL-7B KV cache (28 layers, 4 KV heads,
// head dim 128, bf16) at 8K and 64K tokens, keep ratio 0.2, blocked and
// global transforms, beside a device-to-device copy of the same bytes (the
// bandwidth reference, measured in the same run).
//
// A plain CUDA program, so that it builds with nothing but the toolkit (the
// GPU machine may lack Google Benchmark). It writes Google-Benchmark-shaped
// JSON to the path given as the first argument (default: stdout only) and
// prints a note and exits 0 when there is no device.
//
// Bytes moved, per run: compress = K and V read once + kept rows written;
// copy = the same K and V bytes read and written.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <string>
#include <vector>

#include "flashcache/cuda/compress.cuh"

namespace {

namespace fcc = flashcache::cuda;
using flashcache::bfloat16_t;

constexpr int kLayers = 28, kHeads = 4, kHeadDim = 128;
constexpr double kKeep = 0.2;

#define BENCH_CHECK(expr)                                                                  \
  do {                                                                                     \
    const cudaError_t e_ = (expr);                                                         \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s failed: %s\n", #expr, cudaGetErrorString(e_));              \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

// Smooth-plus-noise bf16 values from a hash, so that no host upload is needed.
__global__ void fill_kernel(std::uint16_t* out, std::int64_t n, std::uint32_t seed) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n; i += std::int64_t{gridDim.x} * blockDim.x) {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float noise = static_cast<float>(h & 0xffff) / 65536.0f - 0.5f;
    const float smooth = __sinf(0.001f * static_cast<float>(i / (kHeads * kHeadDim)) + static_cast<float>(i % kHeadDim));
    out[i] = static_cast<std::uint16_t>(__float_as_uint(smooth + noise) >> 16);
  }
}

struct Result {
  std::string name;
  std::int64_t tokens;
  double ms;
  double bytes;
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

  for (flashcache::Transform transform : {flashcache::Transform::blocked, flashcache::Transform::global}) {
    flashcache::Options opt;
    opt.transform = transform;
    opt.block_size = 64;
    opt.allocation = flashcache::Allocation::dynamic;
    fcc::GlobalPlan plan;
    const fcc::GlobalPlan* plan_ptr = nullptr;
    if (transform == flashcache::Transform::global) {
      const std::int64_t lengths[1] = {tokens};
      const flashcache::Status s = fcc::GlobalPlan::create(lengths, 1, kHeads, kHeadDim, &plan);
      if (!s.ok()) {
        std::fprintf(stderr, "GlobalPlan: %s\n", s.message().c_str());
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
    const flashcache::Status device = fcc::device_status(ws, [&] {
      fcc::WorkspaceLayout layout;
      (void)fcc::workspace_layout(cache, opt, plan_ptr, &layout);
      return layout;
    }(), nullptr);
    if (!device.ok()) std::fprintf(stderr, "device status: %s\n", device.message().c_str());
    if (ok && device.ok())
      results.push_back({std::string("compress_") + flashcache::to_string(transform), tokens, ms, compress_bytes});
    BENCH_CHECK(cudaFree(ws));
  }

  // The bandwidth reference: the same K and V bytes, device to device.
  const double copy_ms = time_ms([&] {
    BENCH_CHECK(cudaMemcpyAsync(copy, k, cache_bytes, cudaMemcpyDeviceToDevice));
    BENCH_CHECK(cudaMemcpyAsync(copy + cache_bytes / 2, v, cache_bytes, cudaMemcpyDeviceToDevice));
  }, 2, 20);
  results.push_back({"memcpy_d2d", tokens, copy_ms, static_cast<double>(4 * cache_bytes)});

  BENCH_CHECK(cudaFree(k));
  BENCH_CHECK(cudaFree(v));
  BENCH_CHECK(cudaFree(k_out));
  BENCH_CHECK(cudaFree(v_out));
  BENCH_CHECK(cudaFree(copy));
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
  std::string json = "{\n  \"context\": {\"device\": \"" + std::string(prop.name) +
                     "\", \"model\": \"Qwen2.5-VL-7B cache: 28 layers, 4 KV heads, head dim 128, bf16\", "
                     "\"keep_ratio\": 0.2},\n  \"benchmarks\": [\n";
  for (std::size_t i = 0; i < all.size(); ++i) {
    const Result& r = all[i];
    char line[512];
    std::snprintf(line, sizeof line,
                  "    {\"name\": \"%s/%lld\", \"run_type\": \"iteration\", \"real_time\": %.6f, \"time_unit\": \"ms\", "
                  "\"bytes\": %.0f, \"bytes_per_second\": %.6e}%s\n",
                  r.name.c_str(), static_cast<long long>(r.tokens), r.ms, r.bytes, r.bytes / (r.ms * 1e-3),
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
