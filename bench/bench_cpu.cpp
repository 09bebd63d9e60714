// CPU benchmarks: what compression costs, how each stage scales, and what a
// compressed cache buys at decode time. Every table row has its baseline in
// the same run (a copy of the same bytes; the full cache for decode).
//
//   build/bench/bench_cpu --benchmark_out=bench/results/cpu.json --benchmark_out_format=json
#include <benchmark/benchmark.h>

#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>

#include "decode_attention.hpp"
#include "flashcache/flashcache.hpp"
#include "flashcache/policies/baselines.hpp"

namespace fc = flashcache;
namespace fp = flashcache::policies;

namespace {

struct ModelShape {
  const char* name;
  std::int64_t layers, kv_heads, query_heads, head_dim;
};
constexpr ModelShape kQwen{"qwen2.5-vl-7b", 28, 4, 28, 128};
constexpr ModelShape kSmol{"smollm2-135m", 30, 3, 9, 64};
const ModelShape& shape_of(std::int64_t i) { return i == 0 ? kQwen : kSmol; }

// One layer of random bf16 K, V (and Q for the attention-based baselines), HND,
// shared between benchmarks of the same shape so set-up stays out of the time.
struct LayerData {
  std::int64_t heads, tokens, dim;
  std::vector<fc::bfloat16_t> q, k, v;
  fc::KVView<const fc::bfloat16_t> kv() const {
    return fc::hnd(k.data(), fc::Heads(heads), fc::Tokens(tokens), fc::HeadDim(dim));
  }
  fc::KVView<const fc::bfloat16_t> vv() const {
    return fc::hnd(v.data(), fc::Heads(heads), fc::Tokens(tokens), fc::HeadDim(dim));
  }
  std::int64_t bytes() const { return 2 * heads * tokens * dim * static_cast<std::int64_t>(sizeof(fc::bfloat16_t)); }
};

const LayerData& layer(std::int64_t heads, std::int64_t tokens, std::int64_t dim, std::int64_t query_heads = 0) {
  static std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t>, std::unique_ptr<LayerData>> cache;
  auto& slot = cache[{heads, tokens, dim, query_heads}];
  if (!slot) {
    slot = std::make_unique<LayerData>(LayerData{heads, tokens, dim, {}, {}, {}});
    std::mt19937_64 rng(static_cast<std::uint64_t>(heads * 131 + tokens * 7 + dim));
    std::normal_distribution<float> nd;
    // Smooth along tokens plus noise, like neighbouring visual tokens; never zeros.
    auto fill = [&](std::vector<fc::bfloat16_t>& x, std::int64_t h) {
      x.resize(static_cast<std::size_t>(h * tokens * dim));
      for (std::size_t i = 0; i < x.size(); ++i) {
        const auto t = static_cast<float>((static_cast<std::int64_t>(i) / dim) % tokens);
        x[i] = fc::bfloat16_t(std::sin(0.01f * t + static_cast<float>(i % dim)) + 0.3f * nd(rng));
      }
    };
    fill(slot->k, heads);
    fill(slot->v, heads);
    if (query_heads) fill(slot->q, query_heads);
  }
  return *slot;
}

// ---- compression cost: one layer, keep ratio 0.2 --------------------------------------------------------------

void set_bytes(benchmark::State& state, std::int64_t read, std::int64_t written) {
  state.SetBytesProcessed(state.iterations() * (read + written));
  state.counters["bytes_moved"] = static_cast<double>(read + written);
}

// Copies the layer's K and V bytes each iteration: the bandwidth reference.
void copy_layer(benchmark::State& state, const LayerData& l) {
  std::vector<fc::bfloat16_t> dk(l.k.size()), dv(l.v.size());
  for (auto _ : state) {
    std::memcpy(dk.data(), l.k.data(), l.k.size() * sizeof(fc::bfloat16_t));
    std::memcpy(dv.data(), l.v.data(), l.v.size() * sizeof(fc::bfloat16_t));
    benchmark::DoNotOptimize(dk.data());
    benchmark::DoNotOptimize(dv.data());
    benchmark::ClobberMemory();
  }
  set_bytes(state, l.bytes(), l.bytes());
}

void BM_Copy(benchmark::State& state) {
  const ModelShape& m = shape_of(state.range(0));
  copy_layer(state, layer(m.kv_heads, state.range(1), m.head_dim));
  state.SetLabel(m.name);
}

// FlashCache on one layer: score, select and gather (allocation is per model).
template <fc::Transform kTransform, fc::Base kBase>
void BM_FlashCache(benchmark::State& state) {
  const ModelShape& m = shape_of(state.range(0));
  const LayerData& l = layer(m.kv_heads, state.range(1), m.head_dim);
  fc::Options opt;
  opt.score.transform = kTransform;
  opt.score.base = kBase;
  fc::Scorer<float> scorer;  // reused across layers in a real pipeline
  fc::LayerScores scores;
  std::int64_t budget = 0;
  (void)fc::Budget::ratio(0.2).resolve(l.tokens, &budget);
  std::vector<std::int32_t> kept;
  std::vector<fc::bfloat16_t> ck(static_cast<std::size_t>(l.heads * budget * l.dim)), cv(ck.size());
  for (auto _ : state) {
    (void)scorer.score(l.kv(), l.vv(), opt.score, &scores);
    (void)fc::select_tokens(scores, budget, opt.select, &kept);
    (void)fc::gather(l.kv(), kept.data(),
                     fc::hnd(ck.data(), fc::Heads(l.heads), fc::Tokens(budget), fc::HeadDim(l.dim)));
    (void)fc::gather(l.vv(), kept.data(),
                     fc::hnd(cv.data(), fc::Heads(l.heads), fc::Tokens(budget), fc::HeadDim(l.dim)));
    benchmark::DoNotOptimize(cv.data());
  }
  set_bytes(state, l.bytes(), l.bytes() * budget / l.tokens);
  state.SetLabel(m.name);
}

// A baseline policy on the same layer, same select and gather.
template <fp::Policy kPolicy>
void BM_Baseline(benchmark::State& state) {
  const ModelShape& m = shape_of(state.range(0));
  const LayerData& l = layer(m.kv_heads, state.range(1), m.head_dim, m.query_heads);
  const fc::KVView<const fc::bfloat16_t> q =
      fc::hnd(l.q.data(), fc::Heads(m.query_heads), fc::Tokens(l.tokens), fc::HeadDim(l.dim));
  fc::Options opt;
  fp::PolicyOptions po;
  po.observation_window = 32;
  if (kPolicy == fp::Policy::snapkv) opt.select.window = 32;
  fc::LayerScores scores;
  std::int64_t budget = 0;
  (void)fc::Budget::ratio(0.2).resolve(l.tokens, &budget);
  if (kPolicy == fp::Policy::h2o) opt.select.window = budget / 2;  // H2O: half heavy hitters, half recent
  std::vector<std::int32_t> kept;
  std::vector<fc::bfloat16_t> ck(static_cast<std::size_t>(l.heads * budget * l.dim)), cv(ck.size());
  for (auto _ : state) {
    (void)fp::score_with_policy(kPolicy, q, l.kv(), l.vv(), opt.score, po, &scores);
    (void)fc::select_tokens(scores, budget, opt.select, &kept);
    (void)fc::gather(l.kv(), kept.data(),
                     fc::hnd(ck.data(), fc::Heads(l.heads), fc::Tokens(budget), fc::HeadDim(l.dim)));
    (void)fc::gather(l.vv(), kept.data(),
                     fc::hnd(cv.data(), fc::Heads(l.heads), fc::Tokens(budget), fc::HeadDim(l.dim)));
    benchmark::DoNotOptimize(cv.data());
  }
  set_bytes(state, l.bytes() + (fp::needs_queries(kPolicy) ? l.bytes() / 2 * m.query_heads / m.kv_heads : 0),
            l.bytes() * budget / l.tokens);
  state.SetLabel(m.name);
}

void CompressArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"model", "tokens"})->Unit(benchmark::kMillisecond);
  for (std::int64_t model : {0, 1})
    for (std::int64_t tokens : {2048, 4096, 8192, 32768}) b->Args({model, tokens});
}
// H2O needs every query's attention, O(N^2 d) per head: on a CPU only 2K tokens fit in seconds.
void QuadraticArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"model", "tokens"})->Unit(benchmark::kMillisecond)->Iterations(1);
  for (std::int64_t model : {0, 1}) b->Args({model, 2048});
}

BENCHMARK(BM_Copy)->Apply(CompressArgs);
// The defaults (Options{}: global, peak base), the paper's base on the same transform, and the blocked low-pass path.
BENCHMARK(BM_FlashCache<fc::Transform::global, fc::Base::peak>)->Name("BM_FlashCacheGlobal")->Apply(CompressArgs);
BENCHMARK(BM_FlashCache<fc::Transform::global, fc::Base::lowpass>)
    ->Name("BM_FlashCacheGlobalLowpass")
    ->Apply(CompressArgs);
BENCHMARK(BM_FlashCache<fc::Transform::blocked, fc::Base::lowpass>)->Name("BM_FlashCacheBlocked")->Apply(CompressArgs);
BENCHMARK(BM_Baseline<fp::Policy::streaming>)->Name("BM_StreamingLLM")->Apply(CompressArgs);
BENCHMARK(BM_Baseline<fp::Policy::knorm>)->Name("BM_KNorm")->Apply(CompressArgs);
BENCHMARK(BM_Baseline<fp::Policy::snapkv>)->Name("BM_SnapKV")->Apply(CompressArgs);
BENCHMARK(BM_Baseline<fp::Policy::h2o>)->Name("BM_H2O")->Apply(QuadraticArgs);

// ---- stage scaling --------------------------------------------------------------------------------------------

// Scoring one head as tokens grow: global should follow N log N, blocked N.
template <fc::Transform kTransform, fc::Base kBase>
void BM_ScoreScaling(benchmark::State& state) {
  const LayerData& l = layer(state.range(2), state.range(0), state.range(1));
  fc::Options opt;
  opt.score.transform = kTransform;
  opt.score.base = kBase;
  fc::Scorer<float> scorer;
  fc::LayerScores scores;
  for (auto _ : state) {
    (void)scorer.score(l.kv(), l.vv(), opt.score, &scores);
    benchmark::DoNotOptimize(scores.score.data());
  }
  state.SetComplexityN(state.range(0) * state.range(1) * state.range(2));
  set_bytes(state, l.bytes(), 0);
}
void ScalingArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"tokens", "head_dim", "heads"})->Unit(benchmark::kMillisecond);
  for (std::int64_t n : {1024, 4096, 16384, 65536}) b->Args({n, 128, 1});
  for (std::int64_t d : {64, 256}) b->Args({8192, d, 1});
  for (std::int64_t h : {2, 8}) b->Args({8192, 128, h});
}
BENCHMARK(BM_ScoreScaling<fc::Transform::global, fc::Base::peak>)->Name("BM_ScoreGlobal")->Apply(ScalingArgs);
BENCHMARK(BM_ScoreScaling<fc::Transform::global, fc::Base::lowpass>)->Name("BM_ScoreGlobalLowpass")->Apply(ScalingArgs);
BENCHMARK(BM_ScoreScaling<fc::Transform::blocked, fc::Base::lowpass>)->Name("BM_ScoreBlocked")->Apply(ScalingArgs);

// ---- query tails: one SmolLM2 layer (9 query heads over 3 KV heads, head dim 64), the chosen feed ---------------
// (the prompt's last 256 queries), beside the same layer's query-free score in the same run.

void BM_QueryTail(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  const LayerData& l = layer(kSmol.kv_heads, n, kSmol.head_dim, kSmol.query_heads);
  const auto q = fc::hnd(l.q.data(), fc::Heads(kSmol.query_heads), fc::Tokens(n), fc::HeadDim(kSmol.head_dim));
  fc::TailAccumulator acc;
  std::vector<float> tails(static_cast<std::size_t>(kSmol.kv_heads * n));
  for (auto _ : state) {
    std::fill(tails.begin(), tails.end(), 0.0f);
    (void)acc.add(q, 0, l.kv(), nullptr, fc::TailView<float>{tails.data(), kSmol.kv_heads, n}, fc::last_queries(n));
    benchmark::DoNotOptimize(tails.data());
  }
}
void BM_ScoreSmolLayer(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  const LayerData& l = layer(kSmol.kv_heads, n, kSmol.head_dim, kSmol.query_heads);
  fc::Scorer<float> scorer;
  fc::LayerScores scores;
  for (auto _ : state) {
    (void)scorer.score(l.kv(), l.vv(), fc::Options{}.score, &scores);
    benchmark::DoNotOptimize(scores.score.data());
  }
}
// A copy of the same layer's K and V bytes: the floor any pass over the layer pays.
void BM_CopySmolLayer(benchmark::State& state) {
  copy_layer(state, layer(kSmol.kv_heads, state.range(0), kSmol.head_dim, kSmol.query_heads));
}
// Smooth and awkward prompt lengths (prime and large-factor lengths go through Bluestein): 3,678 = 2 x 3 x 613 and the primes 4,099 and
// 8,191 send the global transform through Bluestein's algorithm.
void TailArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"tokens"})->Unit(benchmark::kMillisecond);
  for (std::int64_t n : {2048, 3678, 4096, 4099, 8191, 8192, 16384}) b->Args({n});
}
BENCHMARK(BM_QueryTail)->Apply(TailArgs);
BENCHMARK(BM_ScoreSmolLayer)->Apply(TailArgs);
BENCHMARK(BM_CopySmolLayer)->Apply(TailArgs);

void BM_Select(benchmark::State& state) {
  const std::int64_t n = state.range(0), heads = 4;
  fc::LayerScores scores;
  fp::random_scores(heads, n, 1, &scores);
  std::vector<std::int32_t> kept;
  for (auto _ : state) {
    (void)fc::select_tokens(scores, n / 5, {}, &kept);
    benchmark::DoNotOptimize(kept.data());
  }
  state.SetItemsProcessed(state.iterations() * heads * n);
}
BENCHMARK(BM_Select)->ArgName("tokens")->Arg(4096)->Arg(65536)->Unit(benchmark::kMicrosecond);

void BM_Gather(benchmark::State& state) {
  const LayerData& l = layer(4, state.range(0), 128);
  const std::int64_t budget = l.tokens / 5;
  std::vector<std::int32_t> kept(static_cast<std::size_t>(4 * budget));
  for (std::size_t i = 0; i < kept.size(); ++i) kept[i] = static_cast<std::int32_t>((i % budget) * 5);
  std::vector<fc::bfloat16_t> out(static_cast<std::size_t>(4 * budget * 128));
  for (auto _ : state) {
    (void)fc::gather(l.kv(), kept.data(), fc::hnd(out.data(), fc::Heads(4), fc::Tokens(budget), fc::HeadDim(128)));
    benchmark::DoNotOptimize(out.data());
  }
  set_bytes(state, l.bytes() / 2 / 5, l.bytes() / 2 / 5);
}
BENCHMARK(BM_Gather)->ArgName("tokens")->Arg(4096)->Arg(65536)->Unit(benchmark::kMicrosecond);

void BM_Allocate(benchmark::State& state) {
  const auto layers = static_cast<std::size_t>(state.range(0));
  std::mt19937_64 rng(3);
  std::vector<double> ratio(layers);
  for (auto& r : ratio) r = std::uniform_real_distribution<double>(0.1, 1.0)(rng);
  const std::vector<std::int64_t> tokens(layers, 8192), floor(layers, 64);
  std::vector<std::int64_t> out;
  for (auto _ : state) {
    (void)fc::allocate_budgets(ratio, tokens, floor, static_cast<std::int64_t>(layers) * 8192 / 5, &out);
    benchmark::DoNotOptimize(out.data());
  }
}
BENCHMARK(BM_Allocate)->ArgName("layers")->Arg(28)->Arg(80)->Unit(benchmark::kMicrosecond);

// ---- decode attention: full cache vs compressed -----------------------------------------------------------------

// One layer of Qwen2.5-VL-7B (28 query heads over 4 KV heads, d 128), bf16
// cache, one query token per sequence. keep_permille 1000 is the full cache.
void BM_DecodeAttention(benchmark::State& state) {
  const std::int64_t batch = state.range(0), tokens = state.range(1), keep = state.range(2);
  const std::int64_t kept = tokens * keep / 1000;
  const LayerData& l = layer(kQwen.kv_heads, kept, kQwen.head_dim);  // a dense cache of the kept length
  std::vector<fc::KVView<const fc::bfloat16_t>> ks(static_cast<std::size_t>(batch), l.kv()),
      vs(static_cast<std::size_t>(batch), l.vv());
  std::vector<float> q(static_cast<std::size_t>(batch * kQwen.query_heads * kQwen.head_dim), 0.01f);
  std::vector<float> out(q.size());
  for (auto _ : state) {
    fc::bench::decode_attention(q.data(), ks, vs, kQwen.query_heads, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  set_bytes(state, batch * l.bytes(), 0);
  state.counters["cache_MiB"] = static_cast<double>(batch * l.bytes()) / 1048576.0;
}
void DecodeArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"batch", "tokens", "keep_permille"})->Unit(benchmark::kMillisecond);
  for (std::int64_t batch : {1, 16})
    for (std::int64_t n : {8192, 32768})
      for (std::int64_t keep : {1000, 200, 100}) b->Args({batch, n, keep});
}
BENCHMARK(BM_DecodeAttention)->Apply(DecodeArgs);

}  // namespace

BENCHMARK_MAIN();
