// Query tails on the GPU: the tail kernel (query_tails.cuh) and the mix of tails
// into the scores (mix_tails.cuh). Host runs of each kernel's arithmetic, in the
// kernel's order, against independent references (naive double tails, the CPU's
// mix_term) run anywhere; the device tests compare the kernels with the
// CPU accumulator and scorer, and skip without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "flashcache/cuda/compress.cuh"
#include "flashcache/flashcache.hpp"
#include "gpu_testing.cuh"

namespace {

namespace fc = flashcache;
namespace fcc = flashcache::gpu;
namespace kn = flashcache::gpu::kernels;

// A prompt's queries [hq][n][d] and keys [hk][n][d], uniform in [-1.5, 1.5].
struct Prompt {
  std::int64_t hq, hk, n, d;
  std::vector<float> q, k;
  Prompt(std::int64_t hq_, std::int64_t hk_, std::int64_t n_, std::int64_t d_, std::uint32_t seed)
      : hq(hq_), hk(hk_), n(n_), d(d_) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.5f, 1.5f);
    q.resize(static_cast<std::size_t>(hq * n * d));
    k.resize(static_cast<std::size_t>(hk * n * d));
    for (float& x : q) x = u(rng);
    for (float& x : k) x = u(rng);
  }
  float qv(std::int64_t g, std::int64_t i, std::int64_t c) const {
    return q[static_cast<std::size_t>((g * n + i) * d + c)];
  }
  float kv(std::int64_t h, std::int64_t j, std::int64_t c) const {
    return k[static_cast<std::size_t>((h * n + j) * d + c)];
  }
  fc::KVView<const float> q_view() const { return fc::hnd(q.data(), fc::Heads(hq), fc::Tokens(n), fc::HeadDim(d)); }
  fc::KVView<const float> k_view() const { return fc::hnd(k.data(), fc::Heads(hk), fc::Tokens(n), fc::HeadDim(d)); }
};

// Each query's log-sum-exp over the keys it sees, in double (what FlashAttention returns);
// a non-finite logit counts for nothing.
std::vector<float> naive_lse(const Prompt& p) {
  std::vector<float> lse(static_cast<std::size_t>(p.hq * p.n));
  const double scale = 1.0 / std::sqrt(static_cast<double>(p.d));
  for (std::int64_t g = 0; g < p.hq; ++g)
    for (std::int64_t i = 0; i < p.n; ++i) {
      double sum = 0;
      for (std::int64_t j = 0; j <= i; ++j) {
        double dot = 0;
        for (std::int64_t c = 0; c < p.d; ++c)
          dot += static_cast<double>(p.qv(g, i, c)) * p.kv(g / (p.hq / p.hk), j, c);
        if (std::isfinite(dot)) sum += std::exp(dot * scale);
      }
      lse[static_cast<std::size_t>(g * p.n + i)] = static_cast<float>(std::log(sum));
    }
  return lse;
}

// The definition in double: max over fed queries i >= j + min_distance of exp(q.k s - lse).
std::vector<double> naive_tails(const Prompt& p, const std::vector<float>& lse, const fc::QueryTailOptions& o) {
  std::vector<double> tail(static_cast<std::size_t>(p.hk * p.n), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(p.d));
  for (std::int64_t g = 0; g < p.hq; ++g) {
    const std::int64_t h = g / (p.hq / p.hk);
    for (std::int64_t i = 0; i < p.n; ++i) {
      if (i < o.from_position || i % o.stride != 0) continue;
      for (std::int64_t j = 0; j + o.min_distance <= i; ++j) {
        double dot = 0;
        for (std::int64_t c = 0; c < p.d; ++c) dot += static_cast<double>(p.qv(g, i, c)) * p.kv(h, j, c);
        const double e = std::isfinite(dot)
                             ? std::min(1.0, std::exp(dot * scale - lse[static_cast<std::size_t>(g * p.n + i)]))
                             : 0.0;
        double& t = tail[static_cast<std::size_t>(h * p.n + j)];
        if (std::isfinite(e)) t = std::max(t, e);
      }
    }
  }
  return tail;
}

// The tail kernel's loops on the host, for the chunk [first, first + chunk): CTAs of
// kTailKeys keys per query head, each lane one key, the dot products as the kernel
// forms them (fmaf over the head dim in order), its term and its maximum.
void host_run_query_tails(const Prompt& p, std::int64_t first, std::int64_t chunk, const std::vector<float>& lse,
                          const fc::QueryTailOptions& o, std::vector<float>* tails) {
  const std::int64_t end = first + chunk, reach = end - o.min_distance;
  if (reach <= 0) return;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.d)));
  const std::int64_t group = p.hq / p.hk;
  for (std::int64_t tile = 0; tile < kn::ceil_div(reach, kn::kTailKeys); ++tile)
    for (std::int64_t g = 0; g < p.hq; ++g)
      for (int lane = 0; lane < kn::kTailKeys; ++lane) {
        const std::int64_t j = tile * kn::kTailKeys + lane, h = g / group;
        float best = 0.0f;
        for (std::int64_t row = 0; row < chunk; ++row) {
          const std::int64_t i = first + row;
          if (!kn::tail_fed(i, o.stride, o.from_position) || j >= end || i - j < o.min_distance) continue;
          float dot = 0.0f;
          for (std::int64_t c = 0; c < p.d; ++c) dot = std::fmaf(p.qv(g, i, c), p.kv(h, j, c), dot);
          const float term = kn::tail_term(dot, scale, lse[static_cast<std::size_t>(g * p.n + i)]);
          best = term > best ? term : best;
        }
        float& t = (*tails)[static_cast<std::size_t>(h * p.n + j)];
        if (j < end && best > t) t = best;
      }
}

void expect_near_tails(const std::vector<float>& got, const std::vector<double>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 2e-6 + 2e-5 * want[i]) << what << ", tail " << i;
}

// Odd sizes, GQA 6 over 2, two uneven chunks, a stride, a minimum distance and the
// chosen feed; a NaN key gives nothing, and a NaN lse row (the device cannot refuse
// it) adds nothing.
TEST(GpuQueryTailsHost, HostRunOfTheKernelArithmeticMatchesTheNaiveTails) {
  Prompt p(6, 2, 157, 40, 3u);
  p.k[static_cast<std::size_t>((1 * p.n + 20) * p.d + 5)] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> lse = naive_lse(p);
  fc::QueryTailOptions chosen = fc::last_queries(p.n, 100);
  fc::QueryTailOptions strided;
  strided.stride = 3;
  strided.min_distance = 9;
  fc::QueryTailOptions exact;
  exact.min_distance = 0;
  int runs = 0;
  for (const fc::QueryTailOptions& o : {exact, strided, chosen}) {
    SCOPED_TRACE("stride " + std::to_string(o.stride) + ", min distance " + std::to_string(o.min_distance));
    std::vector<float> tails(static_cast<std::size_t>(p.hk * p.n), 0.0f);
    host_run_query_tails(p, 0, 70, lse, o, &tails);
    host_run_query_tails(p, 70, p.n - 70, lse, o, &tails);
    expect_near_tails(tails, naive_tails(p, lse, o), "host run");
    EXPECT_EQ(tails[static_cast<std::size_t>(1 * p.n + 20)], 0.0f);  // the NaN key
    ++runs;
  }
  EXPECT_EQ(runs, 3);
  // A NaN lse for one query row: that row adds nothing (its tails are those without it).
  std::vector<float> with_nan = lse;
  with_nan[static_cast<std::size_t>(0 * p.n + 150)] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> a(static_cast<std::size_t>(p.hk * p.n), 0.0f);
  host_run_query_tails(p, 0, p.n, with_nan, exact, &a);
  for (float t : a) EXPECT_TRUE(t >= 0.0f && t <= 1.0f);
}

TEST(GpuQueryTailsHost, CanImplementRefusesByName) {
  const Prompt p(6, 2, 64, 40, 5u);
  std::vector<float> tails(static_cast<std::size_t>(p.hk * p.n)), lse(static_cast<std::size_t>(p.hq * p.n));
  const fc::TailView<float> t{tails.data(), p.hk, p.n};
  const fc::QueryTailOptions o{};
  auto expect_refused = [](const fc::Status& s, const char* what) {
    EXPECT_FALSE(s.ok()) << what;
    EXPECT_NE(s.message().find(what), std::string::npos) << s.message();
  };
  EXPECT_TRUE(fcc::can_implement_query_tails(p.q_view(), 0, p.k_view(), lse.data(), t, o).ok());
  expect_refused(fcc::can_implement_query_tails(p.q_view(), 0, p.k_view(), nullptr, t, o), "softmax_lse");
  expect_refused(fcc::can_implement_query_tails(p.q_view(), 1, p.k_view(), lse.data(), t, o), "reach position 64");
  const Prompt odd(5, 2, 64, 40, 6u);
  expect_refused(fcc::can_implement_query_tails(odd.q_view(), 0, odd.k_view(), lse.data(), t, o), "multiple");
  const Prompt wide(2, 2, 8, 300, 7u);
  std::vector<float> wide_tails(16);
  expect_refused(fcc::can_implement_query_tails(wide.q_view(), 0, wide.k_view(), lse.data(),
                                                fc::TailView<float>{wide_tails.data(), 2, 8}, o),
                 "head_dim 300");
  expect_refused(fcc::can_implement_query_tails(p.q_view(), 0, p.k_view(), lse.data(),
                                                fc::TailView<float>{tails.data(), p.hk, p.n - 1}, o),
                 "tails are");
  fc::QueryTailOptions bad;
  bad.stride = 0;
  expect_refused(fcc::can_implement_query_tails(p.q_view(), 0, p.k_view(), lse.data(), t, bad), "stride");
}

// The mix kernel's arithmetic on the host: per (sequence, head) the strided
// per-thread sums of the rankable tokens, combined, the scales and the rewrite.
void host_run_mix(const std::vector<std::int64_t>& lengths, std::int64_t heads, std::int64_t capacity, double weight,
                  bool by_max, const std::vector<float>& tails, std::vector<float>* scores) {
  std::int64_t offset = 0;
  for (std::int64_t n : lengths) {
    for (std::int64_t h = 0; h < heads; ++h) {
      float* score = scores->data() + h * capacity + offset;
      const float* tail = tails.data() + h * capacity + offset;
      std::vector<kn::TailSums> per_thread(kn::kMixTailsThreads);
      for (int tid = 0; tid < kn::kMixTailsThreads; ++tid)
        for (std::int64_t t = tid; t < n; t += kn::kMixTailsThreads)
          kn::add_tail_term(score[t], tail[t], &per_thread[tid]);
      kn::TailSums sum;
      for (const kn::TailSums& s : per_thread) {
        sum.score += s.score;
        sum.tail += s.tail;
        sum.rankable += s.rankable;
      }
      const fc::rules::TailMixScales s = fc::rules::tail_mix_scales(weight, sum.score, sum.tail, sum.rankable);
      for (std::int64_t t = 0; t < n; ++t)
        if (!fc::rules::always_kept_score(score[t]))
          score[t] = fc::rules::mixed_tail_score(s, by_max, score[t], tail[t]);
    }
    offset += n;
  }
}

// Three packed sequences (one of more tokens than the CTA has threads, one empty),
// +inf and NaN scores that must stay, a head whose tails are all 0 (its tail term
// counts 0), both mixes: the CPU's mix_term per sequence and head.
TEST(GpuMixTailsHost, HostRunOfTheKernelArithmeticMatchesTheCpuMix) {
  const std::vector<std::int64_t> lengths{301, 0, 57};
  const std::int64_t heads = 3, capacity = 400;
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> u(0.0f, 2.0f);
  std::vector<float> scores(static_cast<std::size_t>(heads * capacity)), tails(scores.size());
  for (float& x : scores) x = u(rng);
  for (float& x : tails) x = 0.1f * u(rng);
  for (std::int64_t t = 0; t < capacity; ++t) tails[static_cast<std::size_t>(2 * capacity + t)] = 0.0f;
  scores[7] = std::numeric_limits<float>::infinity();
  scores[static_cast<std::size_t>(capacity + 310)] = std::numeric_limits<float>::quiet_NaN();
  for (const bool by_max : {false, true})
    for (const double weight : {0.5, 0.2}) {
      std::vector<float> host = scores, cpu = scores;
      host_run_mix(lengths, heads, capacity, weight, by_max, tails, &host);
      std::int64_t offset = 0;
      for (std::int64_t n : lengths) {
        for (std::int64_t h = 0; h < heads; ++h)
          fc::mix_term(weight, by_max ? fc::TailMix::max : fc::TailMix::sum, tails.data() + h * capacity + offset,
                       cpu.data() + h * capacity + offset, n);
        offset += n;
      }
      for (std::size_t i = 0; i < host.size(); ++i) {
        if (!std::isfinite(cpu[i])) {
          EXPECT_EQ(std::isnan(host[i]), std::isnan(cpu[i])) << i;
          EXPECT_EQ(std::isinf(host[i]), std::isinf(cpu[i])) << i;
        } else {
          EXPECT_NEAR(host[i], cpu[i], 1e-6f * std::max(1.0f, std::fabs(cpu[i]))) << i;
        }
      }
      EXPECT_TRUE(std::isinf(host[7]));
    }
}

using flashcache::gpu_testing::DeviceArray;

// The kernel against the CPU accumulator given the same lse: half and float keys,
// two chunks whose order is reversed (atomic maxima do not care), GQA 6 over 2.
TEST(GpuQueryTails, KernelMatchesTheCpuAccumulator) {
  FLASHCACHE_REQUIRE_DEVICE();
  const Prompt p(6, 2, 211, 64, 9u);
  const std::vector<float> lse = naive_lse(p);
  const fc::QueryTailOptions o = fc::last_queries(p.n, 150);
  std::vector<float> want(static_cast<std::size_t>(p.hk * p.n), 0.0f);
  fc::TailAccumulator acc;
  FLASHCACHE_OK(acc.add(p.q_view(), 0, p.k_view(), lse.data(), {want.data(), p.hk, p.n}, o));
  DeviceArray<float> q, k, l, t;
  q.upload(p.q);
  k.upload(p.k);
  t.upload(std::vector<float>(want.size(), 0.0f));
  const auto qd = fc::hnd<const float>(q.get(), fc::Heads(p.hq), fc::Tokens(p.n), fc::HeadDim(p.d));
  const auto kd = fc::hnd<const float>(k.get(), fc::Heads(p.hk), fc::Tokens(p.n), fc::HeadDim(p.d));
  using Chunk = std::pair<std::int64_t, std::int64_t>;  // first query, count
  for (const auto& [first, count] : std::initializer_list<Chunk>{{120, p.n - 120}, {0, 120}}) {
    std::vector<float> chunk_lse;
    for (std::int64_t g = 0; g < p.hq; ++g)
      for (std::int64_t r = 0; r < count; ++r) chunk_lse.push_back(lse[static_cast<std::size_t>(g * p.n + first + r)]);
    l.upload(chunk_lse);
    FLASHCACHE_OK(fcc::query_tails_async(fc::token_range(qd, first, count), first,
                                         fc::token_range(kd, 0, first + count), l.get(),
                                         fc::TailView<float>{t.get(), p.hk, p.n}, o, nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  const std::vector<float> got = t.download();
  for (std::size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 2e-6 + 2e-5 * want[i]) << "tail " << i;
}

// compress_async with the tails mixed in: its scores are the CPU scorer's with the
// same tails, and it keeps what the CPU keeps (one layer, one sequence, f32), on the
// default (global) transform and on the blocked one with its low-pass base.
TEST(GpuQueryTails, CompressWithTailsMatchesTheCpu) {
  FLASHCACHE_REQUIRE_DEVICE();
  const std::int64_t heads = 2, n = 333, d = 64;
  const Prompt kv(heads, heads, n, d, 21u);  // its q as V, its k as K: [heads][n][d]
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(0.0f, 0.2f);
  std::vector<float> tails(static_cast<std::size_t>(heads * n));
  for (float& x : tails) x = u(rng);
  tails[17] = 0.9f;  // one key a query needs
  for (const fc::Transform transform : {fc::Transform::global, fc::Transform::blocked}) {
    SCOPED_TRACE(fc::to_string(transform));
    fc::Options opt = fc::Options::with_query_tail(fc::Options{});
    opt.score.transform = transform;
    if (transform == fc::Transform::blocked)
      opt.score.base = fc::Base::lowpass;  // the GPU's blocked kernel: low-pass only
    const auto kh = fc::hnd<const float>(kv.k.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(d));
    const auto vh = fc::hnd<const float>(kv.q.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(d));
    const fc::Budget budget = fc::Budget::ratio(0.2);
    fc::Scorer<double> scorer;
    fc::LayerScores cpu;
    // At the budget's keep ratio, as compress_async scores (the default distance from the mean fades out at 0.2).
    FLASHCACHE_OK(
        scorer.score(kh, vh, opt.score, &cpu,
                     fc::ScoreInputs{{}, fc::TailView<const float>{tails.data(), heads, n}, budget.keep_ratio(n)}));

    DeviceArray<float> k, v, t;
    k.upload(kv.k);
    v.upload(kv.q);
    t.upload(tails);
    float* kp = k.get();
    float* vp = v.get();
    fcc::Cache<float> cache = fcc::Cache<float>::dense_nhd(1, &kp, &vp, heads, d, n);
    cache.head_stride = n * d;  // HND storage
    cache.token_stride = d;
    cache.tails = t.get();
    fcc::GlobalTransform global;
    const fcc::GlobalTransform* global_ptr = nullptr;
    if (transform == fc::Transform::global) {
      const std::int64_t lengths[1] = {n};
      FLASHCACHE_OK(fcc::GlobalTransform::create(lengths, 1, heads, d, &global));
      global_ptr = &global;
    }
    DeviceArray<std::int32_t> kept(static_cast<std::size_t>(heads * n)), kept_indptr(2);
    fcc::Outputs<float> out;
    out.kept = kept.get();
    out.kept_indptr = kept_indptr.get();
    std::size_t bytes = 0;
    FLASHCACHE_OK(fcc::workspace_size(cache, opt, &bytes, global_ptr));
    DeviceArray<unsigned char> ws(bytes);
    FLASHCACHE_OK(fcc::compress_async(cache, budget, opt, out, ws.get(), bytes, nullptr, global_ptr));
    FLASHCACHE_OK(fcc::device_status(cache, opt, ws.get(), nullptr, global_ptr));
    fcc::WorkspaceLayout layout;
    FLASHCACHE_OK(fcc::workspace_layout(cache, opt, global_ptr, &layout));
    std::vector<float> scores(static_cast<std::size_t>(heads * n));
    ASSERT_EQ(
        cudaMemcpy(scores.data(), ws.get() + layout.scores, scores.size() * sizeof(float), cudaMemcpyDeviceToHost),
        cudaSuccess);
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t j = 0; j < n; ++j) {
        const float want = cpu(h, j), got = scores[static_cast<std::size_t>(h * n + j)];
        if (std::isinf(want))
          EXPECT_TRUE(std::isinf(got)) << h << " " << j;
        else
          EXPECT_NEAR(got, want, 1e-4 * std::max(1.0f, std::fabs(want))) << h << " " << j;
      }
    const std::vector<std::int32_t> k_got = kept.download();
    const std::vector<std::int32_t> ip = kept_indptr.download();
    std::int64_t keep = 0;
    FLASHCACHE_OK(budget.resolve(n, &keep));
    ASSERT_EQ(ip[1] - ip[0], keep);
    EXPECT_NE(std::find(k_got.begin(), k_got.begin() + keep, 17), k_got.begin() + keep);  // head 0 keeps the needed key
  }
}

}  // namespace
