// One layer's GPU work, once each, for GPGPU-Sim's performance (cycle) model:
// bench/gpu_sim_perf.sh runs it and bench/gpu_sim_perf.py splits the
// simulator's per-kernel statistics by the stage markers printed here. Nothing
// it prints is a GPU time; the simulator's cycle counts are a model's.
//
//   sim_perf N [scrub_bytes [stages]]     stages: a comma list, default global,blocked,copy,decode
//
// One layer of 8 KV heads, head dim 128, f16, N tokens (HND), keep ratio 0.2:
//   compress_global   the default options (Transform::global, peak base);
//                     in a FLASHCACHE_GPU_SIM build its two FFTs run on the
//                     host (flashcache/cuda/sim_fft.cuh), so their cost is in
//                     no simulated cycle
//   compress_blocked  Transform::blocked (lowpass base, blocks of 64)
//   copy              the same K and V bytes device to device: a 16-byte copy
//                     kernel, because GPGPU-Sim performs cudaMemcpy
//                     device-to-device functionally, outside its timing model
//   decode            one decode-attention step (bench/gpu/decode_attention.cuh)
//                     over the full cache: batch 1, 32 query heads. That header
//                     takes float or bf16, so it reads the same 2-byte rows as
//                     bf16 (the bytes read, and so the cost, are the same).
// Before every stage a scrub kernel reads `scrub_bytes` of another buffer
// (default 12 MB, twice SM7_QV100's L2; bench/gpu_sim_perf.sh passes twice the
// configured L2), so each stage starts with none of its data in L2, and the
// lines the previous stage left dirty are written back there (the parser
// charges those writes to that stage). After each stage a "sim_perf: check"
// line fingerprints what the device computed, to compare simulator modes.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_check.cuh"
#include "decode_attention.cuh"
#include "flashcache/cuda/compress.cuh"

namespace {

namespace fcg = flashcache::gpu;
using flashcache::half_t;

constexpr int kHeads = 8, kHeadDim = 128, kQueryHeads = 32;
constexpr double kKeep = 0.2;
constexpr std::size_t kDefaultScrubBytes = std::size_t{12} << 20;  // twice SM7_QV100's 6 MB L2
constexpr const char* kAllStages = "global,blocked,copy,decode";

void check(const flashcache::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.message().c_str());
    std::exit(1);
  }
}

// The log's stage boundary: bench/gpu_sim_perf.py assigns every kernel whose
// statistics follow this line to `stage`. Flushed so that it lands before them.
void marker(const char* stage, std::int64_t tokens) {
  std::printf("@@sim_perf stage=%s tokens=%lld\n", stage, static_cast<long long>(tokens));
  std::fflush(stdout);
}

// A plain device-to-device copy of K and V in 16-byte pieces, one per thread,
// in one launch (as the compression is one call): what cudaMemcpy's copy does,
// inside the timing model.
__global__ void copy_kernel(const uint4* __restrict__ k, const uint4* __restrict__ v, uint4* __restrict__ to,
                            std::int64_t pieces) {
  const std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < pieces)
    to[i] = k[i];
  else if (i < 2 * pieces)
    to[i] = v[i - pieces];
}

// Reads every piece so that the L2 holds none of the next stage's data; the
// store never happens (the sum is never that value) but keeps the loads alive.
__global__ void scrub_kernel(const uint4* __restrict__ buffer, std::int64_t pieces, unsigned* __restrict__ sink) {
  unsigned acc = 0;
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < pieces;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const uint4 x = buffer[i];
    acc ^= x.x ^ x.y ^ x.z ^ x.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

unsigned blocks_for(std::int64_t threads, int per_block) {
  return static_cast<unsigned>((threads + per_block - 1) / per_block);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s TOKENS [SCRUB_BYTES [STAGES]]   (STAGES: a comma list of %s)\n", argv[0],
                 kAllStages);
    return 2;
  }
  const std::int64_t tokens = std::atoll(argv[1]);
  const std::size_t scrub_bytes =
      argc > 2 && std::atoll(argv[2]) > 0 ? static_cast<std::size_t>(std::atoll(argv[2])) : kDefaultScrubBytes;
  const std::string stages = argc > 3 ? argv[3] : kAllStages;
  if (tokens < 64 || tokens % 8 != 0 || scrub_bytes < 16) {
    std::fprintf(stderr, "sim_perf: TOKENS must be a multiple of 8, at least 64; SCRUB_BYTES at least 16\n");
    return 2;
  }
  for (std::size_t at = 0; at <= stages.size();) {  // every name in STAGES must be known
    const std::size_t end = std::min(stages.find(',', at), stages.size());
    if (("," + std::string(kAllStages) + ",").find("," + stages.substr(at, end - at) + ",") == std::string::npos) {
      std::fprintf(stderr, "sim_perf: unknown stage '%s' (known: %s)\n", stages.substr(at, end - at).c_str(),
                   kAllStages);
      return 2;
    }
    at = end + 1;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("sim_perf: no CUDA device (or simulator), nothing run\n");
    return 0;
  }
  int sms = 0;
  BENCH_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));

  const std::int64_t elements = std::int64_t{kHeads} * tokens * kHeadDim;  // of K (or V)
  const std::size_t bytes = static_cast<std::size_t>(elements) * sizeof(half_t);
#ifdef FLASHCACHE_GPU_SIM
  const char* fft_note = "host (FLASHCACHE_GPU_SIM: sim_fft.cuh stands in for cuFFT; no simulated cycles)";
#else
  const char* fft_note = "cuFFT (on the device)";
#endif
  std::printf(
      "sim_perf: one layer, %d KV heads, head dim %d, f16, %lld tokens, HND, keep %g; K+V %zu bytes; "
      "global transform FFTs: %s; scrub %zu bytes before each stage; stages %s\n",
      kHeads, kHeadDim, static_cast<long long>(tokens), kKeep, 2 * bytes, fft_note, scrub_bytes, stages.c_str());

  // ---- setup: everything allocated and filled before the first stage ----
  half_t *k = nullptr, *v = nullptr, *k_out = nullptr, *v_out = nullptr, *copy = nullptr;
  BENCH_CHECK(cudaMalloc(&k, bytes));
  BENCH_CHECK(cudaMalloc(&v, bytes));
  BENCH_CHECK(cudaMalloc(&k_out, bytes));  // room for every row: only the kept ones are written
  BENCH_CHECK(cudaMalloc(&v_out, bytes));
  BENCH_CHECK(cudaMalloc(&copy, 2 * bytes));
  {
    // Smooth-plus-noise rows, uploaded (a host copy costs no simulated cycles).
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> noise(-0.5f, 0.5f);
    std::vector<half_t> host(static_cast<std::size_t>(elements));
    for (half_t* dst : {k, v}) {
      for (std::int64_t i = 0; i < elements; ++i) {
        const std::int64_t t = (i / kHeadDim) % tokens, c = i % kHeadDim;
        host[static_cast<std::size_t>(i)] =
            half_t(std::sin(0.01f * static_cast<float>(t) + static_cast<float>(c)) + noise(rng));
      }
      BENCH_CHECK(cudaMemcpy(dst, host.data(), bytes, cudaMemcpyHostToDevice));
    }
  }
  uint4* scrub = nullptr;
  unsigned* sink = nullptr;
  const std::int64_t scrub_pieces = static_cast<std::int64_t>(scrub_bytes / 16);
  BENCH_CHECK(cudaMalloc(&scrub, scrub_pieces * 16));
  BENCH_CHECK(cudaMalloc(&sink, sizeof(unsigned)));
  BENCH_CHECK(cudaMemset(scrub, 0, scrub_pieces * 16));

  half_t* const kp[1] = {k};
  half_t* const vp[1] = {v};
  half_t* const kop[1] = {k_out};
  half_t* const vop[1] = {v_out};
  const auto cache = fcg::Cache<half_t>::dense_hnd(1, kp, vp, kHeads, kHeadDim, tokens);
  fcg::Outputs<half_t> out;  // a dense HND compact cache
  out.k_out = kop;
  out.v_out = vop;
  out.out_head_stride = tokens * kHeadDim;
  out.out_token_stride = kHeadDim;
  out.out_capacity = tokens;
  const flashcache::Budget budget = flashcache::Budget::ratio(kKeep);

  flashcache::Options global_opt;  // the defaults: global transform, peak base
  flashcache::Options blocked_opt;
  blocked_opt.score.transform = flashcache::Transform::blocked;
  blocked_opt.score.base = flashcache::Base::lowpass;  // the blocked kernel's only base
  fcg::GlobalTransform plan;
  const std::int64_t lengths[1] = {tokens};
  check(fcg::GlobalTransform::create(lengths, 1, kHeads, kHeadDim, &plan), "GlobalTransform::create");
  std::size_t ws_global = 0, ws_blocked = 0;
  check(fcg::workspace_size(cache, global_opt, &ws_global, &plan), "workspace_size (global)");
  check(fcg::workspace_size(cache, blocked_opt, &ws_blocked, nullptr), "workspace_size (blocked)");
  const std::size_t ws_bytes = ws_global > ws_blocked ? ws_global : ws_blocked;
  void* ws = nullptr;
  BENCH_CHECK(cudaMalloc(&ws, ws_bytes));

  namespace fg = flashcache::bench::gpu;
  using flashcache::bfloat16_t;
  fg::DecodeArgs<bfloat16_t> dec;
  dec.shape.batch = 1;
  dec.shape.query_heads = kQueryHeads;
  dec.shape.kv_heads = kHeads;
  dec.shape.head_dim = kHeadDim;
  dec.shape.tokens = tokens;
  BENCH_CHECK(fg::decode_splits<bfloat16_t>(dec.shape, 0, &dec.splits));
  const std::size_t dec_ws_bytes = fg::decode_workspace_bytes(dec.shape, dec.splits);
  void* dec_ws = nullptr;
  float *q = nullptr, *attn = nullptr;
  const std::size_t q_elems = std::size_t{kQueryHeads} * kHeadDim;
  BENCH_CHECK(cudaMalloc(&dec_ws, dec_ws_bytes));
  BENCH_CHECK(cudaMalloc(&q, q_elems * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&attn, q_elems * sizeof(float)));
  {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> host(q_elems);
    for (float& x : host) x = normal(rng);
    BENCH_CHECK(cudaMemcpy(q, host.data(), q_elems * sizeof(float), cudaMemcpyHostToDevice));
  }
  dec.q = q;
  dec.out = attn;
  dec.k = reinterpret_cast<const bfloat16_t*>(k);
  dec.v = reinterpret_cast<const bfloat16_t*>(v);
  dec.head_stride = tokens * kHeadDim;
  dec.seq_stride = kHeads * dec.head_stride;
  std::printf("sim_perf: workspace %zu bytes (global %zu, blocked %zu); decode splits %d\n", ws_bytes, ws_global,
              ws_blocked, dec.splits);
  BENCH_CHECK(cudaDeviceSynchronize());

  auto scrub_l2 = [&] {
    marker("scrub", tokens);
    scrub_kernel<<<static_cast<unsigned>(4 * sms), 256>>>(scrub, scrub_pieces, sink);  // 4 CTAs per SM, grid-stride
    BENCH_CHECK(cudaGetLastError());
    BENCH_CHECK(cudaDeviceSynchronize());
  };
  // What a run left on the device, as one line to compare across simulator modes
  // (bench/gpu_sim_perf.sh checks it against a functional-mode run): the
  // sequence table, the kept rows per head, and hashes of the scores and kept indices.
  auto fingerprint = [&](const char* name, const flashcache::Options& opt, const fcg::GlobalTransform* global) {
    check(fcg::device_status(cache, opt, ws, nullptr, global), "device status");
    fcg::WorkspaceLayout layout;
    check(fcg::workspace_layout(cache, opt, global, &layout), "workspace_layout");
    auto read = [&](std::size_t offset, std::size_t count) {
      std::vector<std::uint32_t> host(count);
      BENCH_CHECK(cudaMemcpy(host.data(), static_cast<unsigned char*>(ws) + offset, count * 4, cudaMemcpyDeviceToHost));
      return host;
    };
    auto fnv = [](const std::vector<std::uint32_t>& words, std::size_t stride, std::size_t take) {
      std::uint64_t h = 1469598103934665603ull;
      for (std::size_t row = 0; row * stride < words.size(); ++row)
        for (std::size_t i = 0; i < take; ++i) h = (h ^ words[row * stride + i]) * 1099511628211ull;
      return static_cast<unsigned long long>(h);
    };
    const auto len = read(layout.seq_len, 1), offset = read(layout.seq_offset, 2), slots = read(layout.seq_slots, 2);
    const auto indptr = read(layout.kept_indptr, 2);  // kept_indptr stays in the workspace (no Outputs::kept_indptr)
    const auto cap = static_cast<std::size_t>(tokens);
    const auto scores = read(layout.scores, kHeads * cap), kept = read(layout.kept, kHeads * cap);
    // Global only: rows that are their own substitute (all of them for finite data).
    std::size_t own_rows = 0;
    if (global != nullptr) {
      const auto sub = read(layout.substitutes, kHeads * cap);
      for (std::size_t i = 0; i < sub.size(); ++i) own_rows += sub[i] == i % cap ? 1 : 0;
    }
    std::printf(
        "sim_perf: check %s: len %u offsets %u..%u slots %u..%u own-substitute rows %zu kept/head %u scores %016llx "
        "kept %016llx\n",
        name, len[0], offset[0], offset[1], slots[0], slots[1], own_rows, indptr[1], fnv(scores, cap, cap),
        fnv(kept, cap, indptr[1] <= cap ? indptr[1] : 0));
    return static_cast<int>(indptr[1]);
  };

  // ---- the stages asked for, each once, each after a scrub ----
  auto wanted = [&](const char* stage) {
    return ("," + stages + ",").find("," + std::string(stage) + ",") != std::string::npos;
  };
  bool ok = true;
  if (wanted("global")) {
    scrub_l2();
    marker("compress_global", tokens);
    check(fcg::compress_async(cache, budget, global_opt, out, ws, ws_bytes, nullptr, &plan), "compress_async (global)");
    BENCH_CHECK(cudaDeviceSynchronize());
    ok = fingerprint("compress_global", global_opt, &plan) > 0 && ok;
  }
  if (wanted("blocked")) {
    scrub_l2();
    marker("compress_blocked", tokens);
    check(fcg::compress_async(cache, budget, blocked_opt, out, ws, ws_bytes, nullptr), "compress_async (blocked)");
    BENCH_CHECK(cudaDeviceSynchronize());
    ok = fingerprint("compress_blocked", blocked_opt, nullptr) > 0 && ok;
  }
  if (wanted("copy")) {
    scrub_l2();
    marker("copy", tokens);
    const std::int64_t pieces = static_cast<std::int64_t>(bytes / 16);
    copy_kernel<<<blocks_for(2 * pieces, 256), 256>>>(
        reinterpret_cast<const uint4*>(k), reinterpret_cast<const uint4*>(v), reinterpret_cast<uint4*>(copy), pieces);
    BENCH_CHECK(cudaGetLastError());
    BENCH_CHECK(cudaDeviceSynchronize());
  }
  if (wanted("decode")) {
    scrub_l2();
    marker("decode", tokens);
    BENCH_CHECK(fg::decode_attention_async(dec, dec_ws, dec_ws_bytes, nullptr));
    BENCH_CHECK(cudaDeviceSynchronize());
    std::vector<float> host(q_elems);
    BENCH_CHECK(cudaMemcpy(host.data(), attn, q_elems * sizeof(float), cudaMemcpyDeviceToHost));
    bool finite = true;
    std::uint64_t h = 1469598103934665603ull;
    for (float x : host) {
      finite = finite && std::isfinite(x);
      std::uint32_t bits = 0;
      std::memcpy(&bits, &x, sizeof bits);
      h = (h ^ bits) * 1099511628211ull;
    }
    std::printf("sim_perf: check decode: output %s %016llx\n", finite ? "finite" : "NOT FINITE",
                static_cast<unsigned long long>(h));
    ok = finite && ok;
  }
  scrub_l2();  // writes back what the last stage left dirty
  marker("end", tokens);

  for (void* p : {static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(k_out), static_cast<void*>(v_out),
                  static_cast<void*>(copy), static_cast<void*>(scrub), static_cast<void*>(sink), ws, dec_ws,
                  static_cast<void*>(q), static_cast<void*>(attn)})
    BENCH_CHECK(cudaFree(p));
  return ok ? 0 : 1;
}
