// The GPU decode-attention baseline (bench/gpu/decode_attention.cuh) against
// the CPU step of the CPU benchmark (bench/decode_attention.hpp), on random
// float and bfloat16 caches of awkward sizes. bf16 caches are rounded once
// and both sides read the same rounded values. Tests that launch kernels
// GTEST_SKIP without a device; argument checks run anywhere.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "../decode_attention.hpp"
#include "decode_attention.cuh"

namespace {

namespace fg = flashcache::bench::gpu;
using flashcache::bfloat16_t;

// The skip pattern of gpu_testing.cuh.
bool device_available() {
  int count = 0;
  const bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  if (!ok) (void)cudaGetLastError();  // clear the sticky "no device" error
  return ok;
}

#define DECODE_REQUIRE_DEVICE() \
  if (!device_available()) GTEST_SKIP() << "no CUDA device"
// CUDA graphs: not simulated by GPGPU-Sim (the pattern of gpu_testing.cuh).
#ifdef FLASHCACHE_GPU_SIM
#define DECODE_REQUIRE_GRAPHS() GTEST_SKIP() << "CUDA graphs are not simulated (FLASHCACHE_GPU_SIM build)"
#else
#define DECODE_REQUIRE_GRAPHS() static_cast<void>(0)
#endif
#define DECODE_CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

// Owning device bytes, for this test only.
class DeviceBytes {
 public:
  explicit DeviceBytes(std::size_t n) : n_(n) {
    if (cudaMalloc(&ptr_, std::max<std::size_t>(n, 1)) != cudaSuccess) ptr_ = nullptr;
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  ~DeviceBytes() {
    if (ptr_) cudaFree(ptr_);
  }
  template <class U>
  U* as() const {
    return static_cast<U*>(ptr_);
  }
  void* get() const { return ptr_; }
  std::size_t size() const { return n_; }

 private:
  void* ptr_ = nullptr;
  std::size_t n_ = 0;
};

struct DecodeCase {
  int batch = 1;
  int kv_heads = 2;
  int group = 1;
  int head_dim = 128;
  std::int64_t tokens = 1;
  float q_scale = 1.0f;  // larger: a peakier softmax
  std::uint64_t seed = 1;
};

// A random problem: the cache is batch-strided with spare rows after each
// head and spare elements after each sequence, all NaN, so that a read
// outside the tokens shows up in the output.
template <class T>
struct Problem {
  DecodeCase c;
  std::int64_t head_stride = 0, seq_stride = 0;
  std::vector<float> q;
  std::vector<T> k, v;
  std::vector<float> ref;  // the CPU step

  explicit Problem(const DecodeCase& dc) : c(dc) {
    const std::int64_t d = c.head_dim, query_heads = static_cast<std::int64_t>(c.kv_heads) * c.group;
    head_stride = (c.tokens + 3) * d;
    seq_stride = c.kv_heads * head_stride + 32;
    std::mt19937_64 rng(c.seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    q.resize(static_cast<std::size_t>(c.batch * query_heads * d));
    for (float& x : q) x = c.q_scale * normal(rng);
    const T nan = flashcache::from_float<T>(std::numeric_limits<float>::quiet_NaN());
    k.assign(static_cast<std::size_t>(c.batch * seq_stride), nan);
    v.assign(k.size(), nan);
    for (int b = 0; b < c.batch; ++b)
      for (int h = 0; h < c.kv_heads; ++h)
        for (std::int64_t t = 0; t < c.tokens; ++t)
          for (std::int64_t i = 0; i < d; ++i) {
            const std::size_t at = static_cast<std::size_t>(b * seq_stride + h * head_stride + t * d + i);
            k[at] = flashcache::from_float<T>(normal(rng));
            v[at] = flashcache::from_float<T>(normal(rng));
          }
    std::vector<flashcache::KVView<const T>> ks, vs;
    for (int b = 0; b < c.batch; ++b) {
      ks.emplace_back(k.data() + b * seq_stride, c.kv_heads, c.tokens, d, head_stride, d);
      vs.emplace_back(v.data() + b * seq_stride, c.kv_heads, c.tokens, d, head_stride, d);
    }
    ref.assign(q.size(), 0.0f);
    flashcache::bench::decode_attention(q.data(), ks, vs, query_heads, ref.data());
  }

  fg::DecodeShape shape() const {
    fg::DecodeShape s;
    s.batch = c.batch;
    s.query_heads = c.kv_heads * c.group;
    s.kv_heads = c.kv_heads;
    s.head_dim = c.head_dim;
    s.tokens = c.tokens;
    return s;
  }
};

// Device copies of a problem's inputs.
template <class T>
struct DeviceProblem {
  DeviceBytes q, k, v, out;
  explicit DeviceProblem(const Problem<T>& p)
      : q(p.q.size() * sizeof(float)),
        k(p.k.size() * sizeof(T)),
        v(p.v.size() * sizeof(T)),
        out(p.q.size() * sizeof(float)) {
    cudaMemcpy(q.get(), p.q.data(), q.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(k.get(), p.k.data(), k.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(v.get(), p.v.data(), v.size(), cudaMemcpyHostToDevice);
  }
  fg::DecodeArgs<T> args(const Problem<T>& p, int splits) const {
    fg::DecodeArgs<T> a;
    a.shape = p.shape();
    a.q = q.as<const float>();
    a.k = k.as<const T>();
    a.v = v.as<const T>();
    a.seq_stride = p.seq_stride;
    a.head_stride = p.head_stride;
    a.out = out.as<float>();
    a.splits = splits;
    return a;
  }
};

// Every element written and finite; each (sequence, query head) row within
// 1e-3 of the CPU in relative L2 norm, and the whole output too.
void expect_matches(const std::vector<float>& got, const std::vector<float>& want, std::int64_t head_dim) {
  ASSERT_EQ(got.size(), want.size());
  const std::size_t d = static_cast<std::size_t>(head_dim);
  double err2 = 0, ref2 = 0;
  int bad_elements = 0, bad_rows = 0;
  for (std::size_t row = 0; row * d < got.size(); ++row) {
    double e2 = 0, r2 = 0;
    for (std::size_t i = 0; i < d; ++i) {
      const std::size_t at = row * d + i;
      if (!std::isfinite(got[at])) {
        if (bad_elements++ < 5)
          ADD_FAILURE() << "element " << at << " is " << got[at] << " (unwritten, or read outside the cache)";
        continue;
      }
      const double diff = static_cast<double>(got[at]) - want[at];
      e2 += diff * diff;
      r2 += static_cast<double>(want[at]) * want[at];
    }
    const double rel = std::sqrt(e2) / std::max(std::sqrt(r2), 1e-6);
    if (!(rel < 1e-3) && bad_rows++ < 5)
      ADD_FAILURE() << "row (sequence x query head) " << row << ": relative error " << rel;
    err2 += e2;
    ref2 += r2;
  }
  EXPECT_EQ(bad_elements, 0) << "non-finite elements";
  EXPECT_EQ(bad_rows, 0) << "rows over 1e-3";
  EXPECT_LT(std::sqrt(err2) / std::max(std::sqrt(ref2), 1e-6), 1e-3);
}

// Runs the GPU step with `splits` (0: decode_splits) over poisoned output and
// workspace, and returns the output.
template <class T>
std::vector<float> run_gpu(const Problem<T>& p, const DeviceProblem<T>& dp, int splits, cudaStream_t stream = nullptr) {
  fg::DecodeArgs<T> a = dp.args(p, splits);
  if (splits == 0) {
    int device = 0;
    EXPECT_EQ(cudaGetDevice(&device), cudaSuccess);
    EXPECT_EQ(fg::decode_splits<T>(a.shape, device, &a.splits), cudaSuccess);
    EXPECT_GE(a.splits, 1);
  }
  const std::size_t ws_bytes = fg::decode_workspace_bytes(a.shape, a.splits);
  EXPECT_GT(ws_bytes, 0u);
  DeviceBytes ws(ws_bytes);
  EXPECT_EQ(cudaMemset(ws.get(), 0xff, ws_bytes), cudaSuccess);  // NaN everywhere
  EXPECT_EQ(cudaMemset(dp.out.get(), 0xff, dp.out.size()), cudaSuccess);
  EXPECT_EQ(fg::decode_attention_async(a, ws.get(), ws_bytes, stream), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<float> out(p.q.size());
  EXPECT_EQ(cudaMemcpy(out.data(), dp.out.get(), dp.out.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  return out;
}

// ---- against the CPU step: dtype x head dim x group x batch x tokens ---------------------------------

using Param = std::tuple<bool, int, int, int, std::int64_t>;  // bf16, head_dim, group, batch, tokens

class GpuDecode : public ::testing::TestWithParam<Param> {};

template <class T>
void check_against_cpu(const DecodeCase& c) {
  const Problem<T> p(c);
  const DeviceProblem<T> dp(p);
  // The split count of the benchmark, one split, and an awkward count (more
  // splits than tokens for the short caches: empty splits).
  for (int splits : {0, 1, 37}) {
    SCOPED_TRACE("splits " + std::to_string(splits));
    expect_matches(run_gpu(p, dp, splits), p.ref, c.head_dim);
  }
}

TEST_P(GpuDecode, MatchesCpuStep) {
  DECODE_REQUIRE_DEVICE();
  const auto [bf16, head_dim, group, batch, tokens] = GetParam();
  DecodeCase c;
  c.batch = batch;
  c.kv_heads = 2;
  c.group = group;
  c.head_dim = head_dim;
  c.tokens = tokens;
  c.seed = static_cast<std::uint64_t>(tokens * 131 + batch * 17 + group * 5 + head_dim + (bf16 ? 1 : 0));
  for (float q_scale : {1.0f, 6.0f}) {
    SCOPED_TRACE("q scale " + std::to_string(q_scale));
    c.q_scale = q_scale;
    if (bf16)
      check_against_cpu<bfloat16_t>(c);
    else
      check_against_cpu<float>(c);
    c.seed += 1000;
  }
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const auto [bf16, head_dim, group, batch, tokens] = info.param;
  return std::string(bf16 ? "bf16" : "f32") + "_d" + std::to_string(head_dim) + "_g" + std::to_string(group) + "_b" +
         std::to_string(batch) + "_n" + std::to_string(tokens);
}

INSTANTIATE_TEST_SUITE_P(
    Awkward, GpuDecode,
    ::testing::Combine(::testing::Bool(), ::testing::Values(64, 128), ::testing::Values(1, 7), ::testing::Values(1, 3),
                       ::testing::Values(std::int64_t{1}, std::int64_t{7}, std::int64_t{257}, std::int64_t{4099})),
    param_name);

// Every supported group size, one shape each (the GQA dispatch).
TEST(GpuDecodeGroups, EveryGroupSize) {
  DECODE_REQUIRE_DEVICE();
  for (int group = 1; group <= fg::kDecodeMaxGroup; ++group) {
    SCOPED_TRACE("group " + std::to_string(group));
    DecodeCase c;
    c.batch = 2;
    c.kv_heads = 3;
    c.group = group;
    c.head_dim = group % 2 ? 128 : 64;
    c.tokens = 300 + group;
    c.seed = 77 + static_cast<std::uint64_t>(group);
    check_against_cpu<bfloat16_t>(c);
  }
}

// An empty cache gives zeros, as the CPU step does.
TEST(GpuDecodeEdges, NoTokensGivesZeros) {
  DECODE_REQUIRE_DEVICE();
  DecodeCase c;
  c.batch = 2;
  c.group = 4;
  c.tokens = 0;
  const Problem<float> p(c);
  const DeviceProblem<float> dp(p);
  for (int splits : {0, 1, 5}) {
    const std::vector<float> out = run_gpu(p, dp, splits);
    for (float x : out) ASSERT_EQ(x, 0.0f);
  }
}

// The shape of the graph test below: long enough for several splits.
DecodeCase graph_case() {
  DecodeCase c;
  c.batch = 3;
  c.group = 7;
  c.tokens = 5000;
  return c;
}

// Repeated runs agree bit for bit (no atomics: a fixed reduction order).
TEST(GpuDecodeEdges, RepeatedRunsAgreeBitForBit) {
  DECODE_REQUIRE_DEVICE();
  const DecodeCase c = graph_case();
  const Problem<bfloat16_t> p(c);
  const DeviceProblem<bfloat16_t> dp(p);
  const std::vector<float> first = run_gpu(p, dp, 0);
  expect_matches(first, p.ref, c.head_dim);
  const std::vector<float> second = run_gpu(p, dp, 0);
  ASSERT_EQ(first.size(), second.size());
  EXPECT_EQ(0, std::memcmp(first.data(), second.data(), first.size() * sizeof(float))) << "second run differs";
}

// The run path captures into a CUDA graph (no sync, no allocation), and its
// replays give the direct run's output bit for bit.
TEST(GpuDecodeEdges, GraphReplayMatchesTheDirectRun) {
  DECODE_REQUIRE_DEVICE();
  DECODE_REQUIRE_GRAPHS();
  const DecodeCase c = graph_case();
  const Problem<bfloat16_t> p(c);
  const DeviceProblem<bfloat16_t> dp(p);
  const std::vector<float> direct = run_gpu(p, dp, 0);

  fg::DecodeArgs<bfloat16_t> a = dp.args(p, 0);
  DECODE_CUDA_OK(fg::decode_splits<bfloat16_t>(a.shape, 0, &a.splits));
  const std::size_t ws_bytes = fg::decode_workspace_bytes(a.shape, a.splits);
  DeviceBytes ws(ws_bytes);
  cudaStream_t stream = nullptr;
  DECODE_CUDA_OK(cudaStreamCreate(&stream));
  DECODE_CUDA_OK(cudaMemset(dp.out.get(), 0xff, dp.out.size()));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  DECODE_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const cudaError_t launched = fg::decode_attention_async(a, ws.get(), ws_bytes, stream);
  DECODE_CUDA_OK(cudaStreamEndCapture(stream, &graph));
  DECODE_CUDA_OK(launched);
  DECODE_CUDA_OK(cudaGraphInstantiateWithFlags(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) DECODE_CUDA_OK(cudaGraphLaunch(exec, stream));
  DECODE_CUDA_OK(cudaStreamSynchronize(stream));
  std::vector<float> replayed(direct.size());
  DECODE_CUDA_OK(cudaMemcpy(replayed.data(), dp.out.get(), dp.out.size(), cudaMemcpyDeviceToHost));
  EXPECT_EQ(0, std::memcmp(replayed.data(), direct.data(), direct.size() * sizeof(float))) << "graph replay differs";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// ---- argument checks: host only, no device needed ------------------------------------------------------

TEST(GpuDecodeArgs, RejectsWhatItCannotRun) {
  // Aligned fake pointers: every check below returns before any launch.
  alignas(16) static float fake[64];
  auto args = [&] {
    fg::DecodeArgs<bfloat16_t> a;
    a.shape.batch = 2;
    a.shape.query_heads = 28;
    a.shape.kv_heads = 4;
    a.shape.head_dim = 128;
    a.shape.tokens = 100;
    a.q = fake;
    a.out = fake;
    a.k = reinterpret_cast<const bfloat16_t*>(fake);
    a.v = reinterpret_cast<const bfloat16_t*>(fake);
    a.head_stride = 100 * 128;
    a.seq_stride = 4 * a.head_stride;
    a.splits = 3;
    return a;
  };
  const std::size_t need = fg::decode_workspace_bytes(args().shape, 3);
  // (max, sum) pairs padded to 256 bytes, then 2 x 4 x 3 partials of 7 x 128 floats.
  EXPECT_EQ(need, 256u * ((2 * 4 * 3 * 7 * 2 * 4 + 255) / 256) + 2u * 4 * 3 * 7 * 128 * 4);
  EXPECT_EQ(fg::decode_attention_async(args(), fake, need - 1, nullptr), cudaErrorInvalidValue)
      << "workspace too small";

  auto rejected = [&](auto change, const char* what) {
    fg::DecodeArgs<bfloat16_t> a = args();
    change(a);
    EXPECT_EQ(fg::decode_attention_async(a, fake, need, nullptr), cudaErrorInvalidValue) << what;
  };
  rejected([](auto& a) { a.shape.head_dim = 96; }, "head dim 96");
  rejected([](auto& a) { a.shape.query_heads = 36; }, "group 9");
  rejected([](auto& a) { a.shape.query_heads = 30; }, "query heads not a multiple of KV heads");
  rejected([](auto& a) { a.splits = 0; }, "no split");
  rejected([](auto& a) { a.head_stride = 99 * 128; }, "head stride below tokens x head dim");
  rejected([](auto& a) { a.seq_stride = a.head_stride * 4 - 8; }, "sequences overlap");
  rejected([](auto& a) { a.seq_stride = a.head_stride * 4 + 4; }, "stride not a multiple of 16 bytes");
  rejected([&](auto& a) { a.k = reinterpret_cast<const bfloat16_t*>(fake) + 1; }, "misaligned K");
  rejected([](auto& a) { a.q = nullptr; }, "null q");
  EXPECT_EQ(fg::decode_workspace_bytes(fg::DecodeShape{1, 12, 4, 96, 10}, 1), 0u) << "unsupported head dim";
  EXPECT_EQ(fg::decode_workspace_bytes(args().shape, 0), 0u) << "no split";
}

}  // namespace
