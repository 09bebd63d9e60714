// The score stage (flashcache/cuda/kernels/score_blocked.cuh, score_global.cuh)
// against the CPU scorer: awkward lengths, every compiled head dim, both
// layouts, non-finite rows wherever a block's stand-in row can come from,
// unaligned rows, reproducibility, the distance from the mean (mean_weight, both
// distances),
// and the global transform's plan (its lengths and its stream). Device tests skip without a GPU.
#include <gtest/gtest.h>

#include "element_types.cuh"
#include "gpu_testing.cuh"
#include "host_fixture.cuh"

namespace flashcache::gpu_testing {
namespace {

using host::expect_error;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Scores against the CPU, for each element type.
FLASHCACHE_ELEMENT_TYPED_SUITE(GpuScore);

TYPED_TEST(GpuScore, BlockedScoresAwkwardLengthsBothLayouts) {
  FLASHCACHE_REQUIRE_DEVICE();
  std::vector<Case> cases;
  for (std::int64_t n : {1, 7, 257, 4099})
    for (bool nhd : {true, false}) {
      Case c;
      c.name = "blocked N=" + std::to_string(n) + (nhd ? " NHD" : " HND");
      c.lengths = {n};
      c.heads = 3;
      c.head_dim = 128;
      c.nhd = nhd;
      c.opt = blocked(64);
      c.seed = static_cast<std::uint64_t>(n) * 2 + nhd;
      cases.push_back(c);
    }
  for (const Case& c : cases) run_and_check<TypeParam>(c);
}

TYPED_TEST(GpuScore, BlockedEveryCompiledHeadDimAndTheGenericOne) {
  FLASHCACHE_REQUIRE_DEVICE();
  for (std::int64_t d : {64, 96, 128, 256, 40, 8}) {
    for (std::int64_t block : {16, 64, 100}) {
      if (d == 256 && block > 64 && sizeof(TypeParam) == 4) continue;  // refused: shared memory
      Case c;
      c.name = "head_dim " + std::to_string(d) + " block " + std::to_string(block);
      c.lengths = {333};
      c.head_dim = d;
      c.opt = blocked(block);
      c.opt.score.gamma = block == 16 ? 0.3 : 0.2;
      c.seed = static_cast<std::uint64_t>(d * 1000 + block);
      run_and_check<TypeParam>(c);
    }
  }
}

TYPED_TEST(GpuScore, GlobalScoresAwkwardLengths) {
  FLASHCACHE_REQUIRE_DEVICE();
  for (std::int64_t n : {1, 7, 257, 4099}) {
    Case c;
    c.name = "global N=" + std::to_string(n);
    c.lengths = {n};
    c.heads = 2;
    c.head_dim = 64;
    c.nhd = n % 2 == 1;
    c.opt = global_transform();
    c.seed = static_cast<std::uint64_t>(n) + 77;
    run_and_check<TypeParam>(c);
  }
}

// ScoreOptions::mean_weight (kernels/mean_distance.cuh, then the mix): both
// transforms, both mixes, a ragged batch with a one-token sequence (its
// distance and that term's mean are 0), NaN and inf rows (left out of the
// mean), NHD and HND, paged, a generic head dim.
TYPED_TEST(GpuScore, MeanWeightMatchesTheCpu) {
  FLASHCACHE_REQUIRE_DEVICE();
  int i = 0;
  for (const bool global : {false, true})
    for (const TailMix mix : {TailMix::sum, TailMix::max}) {
      Case c;
      c.name = std::string("mean_weight ") + (global ? "global " : "blocked ") + to_string(mix);
      c.lengths = {333, 1, 100};
      c.heads = 3;
      c.head_dim = i == 3 ? 40 : 64;
      c.nhd = i % 2 == 0;
      c.page_size = i == 2 ? 16 : 0;
      c.bad_rows = {{0, 1, 40, 41, kNaN}, {2, 0, 99, 99, kInf}};  // not in the one-token sequence: its budget is 0
      c.opt = global ? global_transform() : blocked(64);
      c.opt.score.mean_weight = 0.5;
      c.opt.score.mean_mix = mix;
      c.seed = 900u + static_cast<std::uint64_t>(i++);
      run_and_check<TypeParam>(c);
    }
}

// MeanDistance::key_cosine (KeyDiff's 1 - cos from the mean unit key): both transforms,
// a ragged batch with a one-token sequence (its distance is 0), a zero key (cosine 0,
// distance 1), NaN and inf rows (left out of the anchor), NHD and HND, paged, a generic
// head dim.
TYPED_TEST(GpuScore, KeyCosineMatchesTheCpu) {
  FLASHCACHE_REQUIRE_DEVICE();
  for (int i = 0; i < 4; ++i) {
    Case c;
    c.name = "key_cosine " + std::to_string(i);
    c.lengths = {333, 1, 100};
    c.heads = 3;
    c.head_dim = i == 3 ? 40 : 64;
    c.nhd = i % 2 == 0;
    c.page_size = i == 2 ? 16 : 0;
    c.bad_rows = {{0, 1, 40, 41, kNaN}, {2, 0, 99, 99, kInf}, {0, 2, 7, 7, 0.0f, true}};
    c.opt = i % 2 == 0 ? global_transform() : blocked(64);
    c.opt.score.mean_weight = 0.75;
    c.opt.score.mean_distance = MeanDistance::key_cosine;
    c.opt.score.mean_mix = i == 1 ? TailMix::max : TailMix::sum;
    c.seed = 970u + static_cast<std::uint64_t>(i);
    run_and_check<TypeParam>(c);
  }
}

// mean_full_keep / mean_zero_keep: the weight at each sequence's keep ratio. A count of
// 30 tokens keeps 0.09 of 333 (weight 0: the residual alone), 0.75 of 40 (in full) and
// 0.3 of 100 (on the ramp); a ratio budget gives every sequence the same weight.
TYPED_TEST(GpuScore, MeanWeightFollowsEachSequencesKeepRatio) {
  FLASHCACHE_REQUIRE_DEVICE();
  int i = 0;
  // Ratio 0.2 is at or below mean_zero_keep: the weight fades to 0 everywhere and neither kernel runs.
  for (const Budget budget : {Budget::tokens(30), Budget::ratio(0.3), Budget::ratio(0.2)}) {
    Case c;
    c.name = std::string("mean_weight fading, ") + (budget.is_ratio() ? "ratio" : "count");
    c.lengths = {333, 40, 100};
    c.heads = 3;
    c.nhd = i == 0;
    c.bad_rows = {{0, 1, 40, 41, kNaN}};
    c.opt = blocked(64);
    c.opt.score.mean_weight = 0.75;
    c.opt.score.mean_full_keep = 0.5;
    c.opt.score.mean_zero_keep = 0.25;
    c.budget = budget;
    c.seed = 950u + static_cast<std::uint64_t>(i++);
    run_and_check<TypeParam>(c);
  }
}

TYPED_TEST(GpuScore, BlockedScoresAreReproducible) {
  FLASHCACHE_REQUIRE_DEVICE();
  Case c;
  c.layers = 2;
  c.lengths = {700, 300};
  c.opt = blocked(64);
  c.nan_tokens = 2;
  const std::vector<float> a = blocked_scores<TypeParam>(c), b = blocked_scores<TypeParam>(c);
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

// Found by a review of the kernels: a block whose first row is non-finite takes its stand-in
// row from outside itself. Every placement that exercises a different source
// (before the block, the block's own first finite row, after it, zeros), on
// both transforms, scores checked against the CPU.
TYPED_TEST(GpuScore, NonFiniteRowsAtBlockStartsMatchTheCpu) {
  FLASHCACHE_REQUIRE_DEVICE();
  struct Placement {
    const char* name;
    std::vector<Case::BadRow> rows;
    Budget budget;
  };
  const std::vector<Placement> placements = {
      {"NaN at token 0", {{0, 0, 0, 0, kNaN}}, Budget::ratio(0.5)},
      {"NaN at token 64 (a block start)", {{0, 1, 64, 64, kNaN}}, Budget::ratio(0.5)},
      {"NaN run 50..70 across a block start", {{0, 0, 50, 70, kNaN}}, Budget::ratio(0.5)},
      {"NaN run 0..70: no finite row before block 2", {{0, 0, 0, 70, kNaN}}, Budget::ratio(0.8)},
      {"a whole block 0..63 non-finite", {{0, 1, 0, 63, kInf}}, Budget::ratio(0.8)},
      {"a whole sequence of one head", {{0, 0, 0, 99, kNaN}}, Budget::ratio(1.0)},
      {"a head of inf (fp16 overflow)", {{0, 1, 0, 99, kInf}}, Budget::ratio(1.0)},
  };
  for (const Placement& pl : placements)
    for (Transform transform : {Transform::blocked, Transform::global}) {
      Case c =
          one_sequence(100, transform == Transform::blocked ? blocked(64) : global_transform(), pl.rows, pl.budget);
      c.name = std::string(pl.name) + " / " + to_string(transform);
      run_and_check<TypeParam>(c);
    }
}

// The finite check (independent and 16-byte loads) rides on the
// placements above for aligned rows; these take the scalar paths: head dim
// 100, and a token stride padded by one element.
TYPED_TEST(GpuScore, NonFiniteRowsOnUnalignedRows) {
  FLASHCACHE_REQUIRE_DEVICE();
  for (Transform transform : {Transform::blocked, Transform::global})
    for (int variant = 0; variant < 2; ++variant) {
      Case c = one_sequence(150, transform == Transform::blocked ? blocked(64) : global_transform(),
                            {{0, 0, 64, 66, kNaN}, {0, 1, 0, 0, kInf}}, Budget::ratio(0.5));
      c.head_dim = variant == 0 ? 100 : 64;
      c.token_pad = variant == 0 ? 0 : 1;
      c.name = std::string(to_string(transform)) + (variant == 0 ? " head_dim 100" : " token stride + 1");
      run_and_check<TypeParam>(c);
    }
}

// Found by a review of the kernels: a long non-finite run used to cost a walk per block back to token
// 0 (quadratic); now it is a scan. 64K tokens, one head all inf, must agree
// with the CPU (a hang or timeout fails the test).
TEST(GpuScoreF16, LongNonFiniteRunIsLinear) {
  FLASHCACHE_REQUIRE_DEVICE();
  Case c = one_sequence(65536, blocked(64), {{0, 0, 0, 65535, kInf}}, Budget::ratio(1.0));
  c.name = "64K tokens, head 0 all inf";
  c.gather = false;
  run_and_check<half_t>(c);
}

// Found by a review of the kernels: plan lengths {0, 100} against device lengths {30, 100} must be
// reported (the zero-length entry used to skip the comparison and let the
// packed offsets drift).
TEST(GpuGlobalTransform, ZeroLengthPlanEntryMismatchIsReported) {
  FLASHCACHE_REQUIRE_DEVICE();
  Case c;
  c.lengths = {30, 100};
  c.opt = global_transform();
  c.gather = false;
  const HostCache<float> hc = make_cache<float>(c);
  DeviceCache<float> dc(hc);
  const std::vector<std::int64_t> plan_lengths = {0, 100};
  gpu::GlobalTransform plan;
  FLASHCACHE_OK(gpu::GlobalTransform::create(plan_lengths.data(), 2, c.heads, c.head_dim, &plan));
  std::size_t bytes = 0;
  FLASHCACHE_OK(gpu::workspace_size(dc.cache, dc.opt, &bytes, &plan));
  DeviceArray<unsigned char> ws(bytes);
  FLASHCACHE_OK(compress_on(dc, c.budget, ws.get(), bytes, nullptr, &plan));
  expect_error(gpu::device_status(dc.cache, dc.opt, ws.get(), nullptr, &plan), Errc::invalid_shape,
               "sequence 0 has 30 tokens on the device but 0 in the GlobalTransform");
}

// Found by a review of the kernels: one GlobalTransform serves one stream and workspace; another stream is
// refused by name, and release_binding() lets it move.
TEST(GpuGlobalTransform, GlobalTransformRefusesASecondStream) {
  FLASHCACHE_REQUIRE_DEVICE();
  Case c;
  c.lengths = {64};
  c.opt = global_transform();
  c.gather = false;
  const HostCache<float> hc = make_cache<float>(c);
  DeviceCache<float> dc(hc);
  gpu::GlobalTransform plan;
  FLASHCACHE_OK(gpu::GlobalTransform::create(c.lengths.data(), 1, c.heads, c.head_dim, &plan));
  std::size_t bytes = 0;
  FLASHCACHE_OK(gpu::workspace_size(dc.cache, dc.opt, &bytes, &plan));
  DeviceArray<unsigned char> ws(bytes);
  cudaStream_t a = nullptr, b = nullptr;
  FLASHCACHE_CUDA_OK(cudaStreamCreate(&a));
  FLASHCACHE_CUDA_OK(cudaStreamCreate(&b));
  FLASHCACHE_OK(compress_on(dc, c.budget, ws.get(), bytes, a, &plan));
  FLASHCACHE_OK(compress_on(dc, c.budget, ws.get(), bytes, a, &plan));
  expect_error(compress_on(dc, c.budget, ws.get(), bytes, b, &plan), Errc::invalid_option, "bound to another stream");
  FLASHCACHE_CUDA_OK(cudaStreamSynchronize(a));
  plan.release_binding();
  FLASHCACHE_OK(compress_on(dc, c.budget, ws.get(), bytes, b, &plan));
  FLASHCACHE_OK(gpu::device_status(dc.cache, dc.opt, ws.get(), b, &plan));
  FLASHCACHE_CUDA_OK(cudaStreamDestroy(a));
  FLASHCACHE_CUDA_OK(cudaStreamDestroy(b));
}

}  // namespace
}  // namespace flashcache::gpu_testing

namespace flashcache::gpu_testing::host {
namespace {

TEST(GpuGlobalTransform, RefusesBadArgumentsBeforeTouchingCufft) {
  fcc::GlobalTransform plan;
  std::int64_t lengths[2] = {10, -1};
  expect_error(fcc::GlobalTransform::create(lengths, 0, 4, 128, &plan), Errc::invalid_shape, "sequences");
  expect_error(fcc::GlobalTransform::create(nullptr, 2, 4, 128, &plan), Errc::invalid_shape, "lengths");
  std::int64_t bad[1] = {-1};
  expect_error(fcc::GlobalTransform::create(bad, 1, 4, 128, &plan), Errc::unsupported, "length");
}

}  // namespace
}  // namespace flashcache::gpu_testing::host
