// The archive of evicted tokens and the recall that brings blocks of it back
// (archive.hpp, recall.hpp): rows kept bit for bit, the byte cap's drops
// counted, and block scores against a naive double-precision attention over
// the whole context, shared and per head, on awkward sizes, f32 / f16 / bf16 /
// q8_0 rows (K and V of different types) and NaN rows.
#include <gtest/gtest.h>
#include <flashcache/archive.hpp>
#include <flashcache/recall.hpp>
#include <flashcache/recall_pool.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace fc = flashcache;

namespace {

// Layers of token rows: per layer, tokens x (heads x d) values, random.
struct Rows {
  int layers;
  std::int64_t tokens, heads, d;
  std::vector<std::vector<float>> k, v;
  Rows(int l, std::int64_t n, std::int64_t h, std::int64_t dim, std::uint64_t seed)
      : layers(l), tokens(n), heads(h), d(dim) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int i = 0; i < l; ++i) {
      k.emplace_back(static_cast<std::size_t>(n * h * dim));
      v.emplace_back(k.back().size());
      for (auto& x : k.back()) x = normal(rng);
      for (auto& x : v.back()) x = normal(rng);
    }
  }
};

// q8_0 as ggml quantizes it: per block of 32, the scale max|x| / 127 (stored
// as a half) and each value rounded to x / scale.
void quantize_q8_0(const float* x, unsigned char* block) {
  float top = 0;
  for (int i = 0; i < 32; ++i) top = std::max(top, std::fabs(x[i]));
  const float scale = top / 127.0f;
  const std::uint16_t bits = fc::half_t(scale).bits;
  std::memcpy(block, &bits, 2);
  for (int i = 0; i < 32; ++i)
    block[2 + i] = static_cast<unsigned char>(static_cast<std::int8_t>(scale == 0 ? 0 : std::lround(x[i] / scale)));
}

// Rows of `type` from floats (the bytes an engine would hand over); q8_0 rows
// hold whole blocks, so x's rows are multiples of 32.
std::vector<unsigned char> as_bytes(const std::vector<float>& x, fc::RowType type) {
  std::vector<unsigned char> out(static_cast<std::size_t>(fc::row_bytes(type, static_cast<std::int64_t>(x.size()))));
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (type == fc::RowType::q8_0) {
      if (i % 32 == 0) quantize_q8_0(x.data() + i, out.data() + i / 32 * 34);
    } else if (type == fc::RowType::f32) {
      std::memcpy(out.data() + 4 * i, &x[i], 4);
    } else {
      const std::uint16_t bits = type == fc::RowType::f16 ? fc::half_t(x[i]).bits : fc::bfloat16_t(x[i]).bits;
      std::memcpy(out.data() + 2 * i, &bits, 2);
    }
  }
  return out;
}

// The values archived elements hold after their round trip through `type`,
// decoded here on their own (not by the library's decoder).
std::vector<float> rounded(const std::vector<float>& x, fc::RowType type) {
  std::vector<float> out(x.size());
  const std::vector<unsigned char> bytes = as_bytes(x, type);
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (type == fc::RowType::q8_0) {
      const unsigned char* block = bytes.data() + i / 32 * 34;
      std::uint16_t bits;
      std::memcpy(&bits, block, 2);
      out[i] = static_cast<float>(static_cast<double>(fc::half_t::to_float(bits)) *
                                  static_cast<std::int8_t>(block[2 + i % 32]));
    } else if (type == fc::RowType::f16) {
      out[i] = static_cast<float>(fc::half_t(x[i]));
    } else if (type == fc::RowType::bf16) {
      out[i] = static_cast<float>(fc::bfloat16_t(x[i]));
    } else {
      out[i] = x[i];
    }
  }
  return out;
}

struct Archived {
  fc::Archive archive;
  std::vector<std::vector<unsigned char>> k, v;
  std::vector<std::int32_t> positions;
};

// Archives every token of `rows` (positions 1000 + i) in two appends, K rows
// of k_type and V rows of v_type (the same unless given).
void fill(const Rows& rows, fc::RowType k_type, fc::ArchiveOptions opt, Archived* a,
          std::optional<fc::RowType> v_type = std::nullopt) {
  const fc::ArchiveShape shape{rows.layers, rows.heads, rows.d, k_type, v_type.value_or(k_type)};
  ASSERT_TRUE(a->archive.reset(shape, opt).ok());
  for (int l = 0; l < rows.layers; ++l) {
    a->k.push_back(as_bytes(rows.k[static_cast<std::size_t>(l)], shape.k_type));
    a->v.push_back(as_bytes(rows.v[static_cast<std::size_t>(l)], shape.v_type));
  }
  for (std::int64_t i = 0; i < rows.tokens; ++i) a->positions.push_back(static_cast<std::int32_t>(1000 + i));
  const std::int64_t split = rows.tokens / 3, k_row = shape.k_row_bytes(), v_row = shape.v_row_bytes();
  for (const auto& [first, n] : {std::pair<std::int64_t, std::int64_t>{0, split}, {split, rows.tokens - split}}) {
    std::vector<const void*> k, v;
    for (int l = 0; l < rows.layers; ++l) {
      k.push_back(a->k[static_cast<std::size_t>(l)].data() + first * k_row);
      v.push_back(a->v[static_cast<std::size_t>(l)].data() + first * v_row);
    }
    ASSERT_TRUE(a->archive.append(a->positions.data() + first, n, k.data(), k_row, v.data(), v_row).ok());
  }
}

TEST(Archive, KeepsRowsAndPositionsInBlocks) {
  const Rows rows(3, 53, 2, 7, 1);
  Archived a;
  fill(rows, fc::RowType::bf16, {16, 0}, &a);
  EXPECT_EQ(a.archive.tokens(), 53);
  EXPECT_EQ(a.archive.blocks(), 4);
  EXPECT_EQ(a.archive.block_tokens(3), 5);
  EXPECT_EQ(a.archive.bytes(), 53 * (4 + 2 * 3 * 2 * 7 * 2));
  const std::int64_t row = a.archive.shape().k_row_bytes();
  for (int l = 0; l < 3; ++l)
    for (std::int64_t t = 0; t < 53; ++t) {
      ASSERT_EQ(std::memcmp(a.archive.k_row(l, t), a.k[static_cast<std::size_t>(l)].data() + t * row, row), 0);
      ASSERT_EQ(std::memcmp(a.archive.v_row(l, t), a.v[static_cast<std::size_t>(l)].data() + t * row, row), 0);
    }
  EXPECT_EQ(a.archive.positions()[52], 1052);
}

TEST(Archive, TakeMovesBlocksOutAndClosesUp) {
  const Rows rows(2, 45, 3, 5, 2);
  Archived a;
  fill(rows, fc::RowType::f32, {8, 0}, &a);  // blocks of 8: 0..4 whole, 5 holds 5 tokens
  const std::int64_t row = a.archive.shape().k_row_bytes();
  const std::int64_t blocks[] = {1, 5};
  std::vector<std::int32_t> pos(13);
  std::vector<std::vector<unsigned char>> k(2, std::vector<unsigned char>(13 * row)), v = k;
  void* kp[] = {k[0].data(), k[1].data()};
  void* vp[] = {v[0].data(), v[1].data()};
  std::int64_t taken = 0;
  ASSERT_TRUE(a.archive.take(blocks, 2, pos.data(), kp, vp, &taken).ok());
  EXPECT_EQ(taken, 13);
  EXPECT_EQ(pos[0], 1008);
  EXPECT_EQ(pos[8], 1040);
  EXPECT_EQ(std::memcmp(k[1].data() + 8 * row, a.k[1].data() + 40 * row, 5 * row), 0);
  EXPECT_EQ(std::memcmp(v[0].data(), a.v[0].data() + 8 * row, 8 * row), 0);
  // What stays: tokens 0-7 and 16-39, in order.
  ASSERT_EQ(a.archive.tokens(), 32);
  EXPECT_EQ(a.archive.positions()[7], 1007);
  EXPECT_EQ(a.archive.positions()[8], 1016);
  EXPECT_EQ(std::memcmp(a.archive.k_row(1, 8), a.k[1].data() + 16 * row, 24 * row), 0);
  const std::int64_t bad[] = {2, 2};
  const fc::Status s = a.archive.take(bad, 2, pos.data(), kp, vp, &taken);
  EXPECT_NE(s.message().find("ascending and distinct"), std::string::npos) << s.message();
}

TEST(Archive, TheCapDropsTheOldestWholeBlocksAndCountsThem) {
  const Rows rows(2, 50, 1, 4, 3);
  const fc::ArchiveShape shape{2, 1, 4, fc::RowType::f16, fc::RowType::f16};
  const std::int64_t per_token = shape.token_bytes();  // 4 + 2 x 2 x 8 = 36
  Archived a;
  fill(rows, fc::RowType::f16, {8, 30 * per_token}, &a);
  // 50 tokens, room for 30: the oldest 24 (three blocks) go, 26 stay.
  EXPECT_EQ(a.archive.dropped_tokens(), 24);
  ASSERT_EQ(a.archive.tokens(), 26);
  EXPECT_LE(a.archive.bytes(), 30 * per_token);
  EXPECT_EQ(a.archive.positions()[0], 1024);
  EXPECT_EQ(std::memcmp(a.archive.k_row(1, 0), a.k[1].data() + 24 * shape.k_row_bytes(), 26 * shape.k_row_bytes()), 0);
  fc::Archive small;
  const fc::Status s = small.reset(shape, {8, 7 * per_token});
  EXPECT_NE(s.message().find("holds less than one block"), std::string::npos) << s.message();
}

// copy_blocks leaves the archive as it was; erase then closes up; drop_all empties
// it and counts every token it held.
TEST(Archive, CopyEraseAndDropAllKeepTheCount) {
  const Rows rows(2, 40, 1, 4, 5);
  Archived a;
  fill(rows, fc::RowType::f16, {8, 0}, &a);
  const std::int64_t blocks[] = {1, 4};
  std::vector<std::int32_t> pos(16);
  std::vector<std::vector<unsigned char>> k(2, std::vector<unsigned char>(16 * 8)), v = k;
  void* kp[] = {k[0].data(), k[1].data()};
  void* vp[] = {v[0].data(), v[1].data()};
  std::int64_t copied = 0;
  ASSERT_TRUE(a.archive.copy_blocks(blocks, 2, pos.data(), kp, vp, &copied).ok());
  EXPECT_EQ(copied, 16);
  EXPECT_EQ(a.archive.tokens(), 40);
  EXPECT_EQ(pos[0], 1008);
  EXPECT_EQ(pos[8], 1032);
  EXPECT_EQ(std::memcmp(k[1].data() + 8 * 8, a.archive.k_row(1, 32), 8 * 8), 0);
  ASSERT_TRUE(a.archive.erase(blocks, 2).ok());
  ASSERT_EQ(a.archive.tokens(), 24);
  EXPECT_EQ(a.archive.positions()[8], 1016);
  EXPECT_EQ(a.archive.positions()[23], 1031);
  EXPECT_EQ(std::memcmp(a.archive.v_row(0, 8), a.v[0].data() + 16 * 8, 16 * 8), 0);
  a.archive.drop_all();
  EXPECT_EQ(a.archive.tokens(), 0);
  EXPECT_EQ(a.archive.dropped_tokens(), 24);
}

// ArchiveOrder::position: appends land among the tokens already there by position,
// each with its own rows, and the cap then drops the lowest positions.
TEST(Archive, PositionOrderKeepsTokensSortedWithTheirRows) {
  const fc::ArchiveShape shape{2, 1, 4, fc::RowType::f32, fc::RowType::f32};
  fc::ArchiveOptions opt;
  opt.block_size = 2;
  opt.order = fc::ArchiveOrder::position;
  fc::Archive a;
  ASSERT_TRUE(a.reset(shape, opt).ok());
  // Each token's rows hold its position (K) and minus it (V), layer l adding 1000 l.
  const auto put = [&](std::vector<std::int32_t> pos) {
    std::vector<std::vector<float>> k(2), v(2);
    for (int l = 0; l < 2; ++l)
      for (const std::int32_t p : pos)
        for (int c = 0; c < 4; ++c) {
          k[static_cast<std::size_t>(l)].push_back(static_cast<float>(p + 1000 * l));
          v[static_cast<std::size_t>(l)].push_back(-static_cast<float>(p + 1000 * l));
        }
    const void* kp[] = {k[0].data(), k[1].data()};
    const void* vp[] = {v[0].data(), v[1].data()};
    ASSERT_TRUE(a.append(pos.data(), static_cast<std::int64_t>(pos.size()), kp, 16, vp, 16).ok());
  };
  put({10, 20, 30});
  put({5, 25});
  put({40, 15});  // not sorted within the append either
  const std::vector<std::int32_t> want = {5, 10, 15, 20, 25, 30, 40};
  ASSERT_EQ(a.tokens(), 7);
  for (std::int64_t t = 0; t < 7; ++t) {
    EXPECT_EQ(a.positions()[t], want[static_cast<std::size_t>(t)]) << t;
    for (int l = 0; l < 2; ++l) {
      float k = 0, v = 0;
      std::memcpy(&k, a.k_row(l, t) + 12, 4);
      std::memcpy(&v, a.v_row(l, t), 4);
      EXPECT_EQ(k, static_cast<float>(want[static_cast<std::size_t>(t)] + 1000 * l)) << t;
      EXPECT_EQ(v, -static_cast<float>(want[static_cast<std::size_t>(t)] + 1000 * l)) << t;
    }
  }
  // A cap of three blocks (6 tokens): the lowest positions' block goes.
  fc::Archive capped;
  opt.byte_cap = 6 * shape.token_bytes();
  ASSERT_TRUE(capped.reset(shape, opt).ok());
  std::swap(a, capped);
  put({10, 20, 30});
  put({5, 25});
  put({40, 15});
  EXPECT_EQ(a.dropped_tokens(), 2);
  ASSERT_EQ(a.tokens(), 5);
  EXPECT_EQ(a.positions()[0], 15);
}

TEST(Archive, RefusesBadInputByName) {
  fc::Archive a;
  constexpr fc::RowType f32 = fc::RowType::f32;
  EXPECT_NE(a.reset({0, 2, 4, f32, f32}).message().find("0 layers"), std::string::npos);
  EXPECT_NE(a.reset({1, 2, 4, f32, f32}, {0, 0}).message().find("block_size 0"), std::string::npos);
  EXPECT_NE(a.reset({1, 2, 7, f32, fc::RowType::q8_0}).message().find("q8_0 rows of 14 elements (whole blocks of 32)"),
            std::string::npos);
  ASSERT_TRUE(a.reset({1, 2, 4, f32, f32}).ok());
  std::int32_t pos = 0;
  float row[8] = {};
  const void* k[] = {row};
  const void* none[] = {nullptr};
  EXPECT_NE(a.append(&pos, 1, k, 32, k, 16).message().find("row strides 32 (K) and 16 (V) bytes; a row is 32 and 32"),
            std::string::npos);
  EXPECT_NE(a.append(&pos, 1, k, 32, none, 32).message().find("layer 0: null K or V rows"), std::string::npos);
  EXPECT_EQ(a.tokens(), 0);  // nothing half-added
}

// Naive reference: layer by layer, each query's softmax over the whole context
// (resident, archived, question keys, causally) in double; each archived
// token's largest probability over its KV head's query groups and queries, and
// over layers and KV heads too (shared) or per (layer, KV head): [rankings][a].
std::vector<double> naive_scores(const std::vector<std::vector<float>>& q, const std::vector<std::vector<float>>& res,
                                 const std::vector<std::vector<float>>& arch, const std::vector<std::vector<float>>& qk,
                                 std::int64_t hq, std::int64_t hkv, std::int64_t r, std::int64_t a, std::int64_t m,
                                 std::int64_t d, bool per_head) {
  const std::int64_t rankings = per_head ? static_cast<std::int64_t>(q.size()) * hkv : 1;
  std::vector<double> best(static_cast<std::size_t>(rankings * a), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (std::size_t l = 0; l < q.size(); ++l)
    for (std::int64_t g = 0; g < hq; ++g) {
      const std::int64_t h = g / (hq / hkv);
      for (std::int64_t i = 0; i < m; ++i) {
        const float* qi = q[l].data() + (g * m + i) * d;  // [Hq][m][d]
        bool finite = true;
        for (std::int64_t c = 0; c < d; ++c) finite = finite && std::isfinite(qi[c]);
        if (!finite) continue;
        std::vector<double> logit;
        const auto key = [&](std::int64_t j) -> const float* {  // nhd rows [t][Hkv][d]
          if (j < r) return res[l].data() + (j * hkv + h) * d;
          if (j < r + a) return arch[l].data() + ((j - r) * hkv + h) * d;
          return qk[l].data() + ((j - r - a) * hkv + h) * d;
        };
        for (std::int64_t j = 0; j <= r + a + i; ++j) {
          double s = 0;
          for (std::int64_t c = 0; c < d; ++c) s += static_cast<double>(qi[c]) * key(j)[c];
          logit.push_back(std::isfinite(s) ? s * scale : -INFINITY);
        }
        const double top = *std::max_element(logit.begin(), logit.end());
        double sum = 0;
        for (double x : logit) sum += std::exp(x - top);
        double* out = best.data() + (per_head ? static_cast<std::int64_t>(l) * hkv + h : 0) * a;
        for (std::int64_t t = 0; t < a; ++t)
          out[t] = std::max(out[t], std::exp(logit[static_cast<std::size_t>(r + t)] - top) / sum);
      }
    }
  return best;
}

void check_scores_against_naive(fc::RowType type, bool nan_rows, std::int64_t d = 24,
                                fc::RecallScope scope = fc::RecallScope::shared) {
  SCOPED_TRACE(std::string(fc::to_string(type)) + " " + fc::to_string(scope));
  const bool per_head = scope == fc::RecallScope::per_head;
  const int layers = 3;
  const std::int64_t hq = 6, hkv = 2, r = 37, a = 53, m = 5;
  const Rows archived(layers, a, hkv, d, 7);
  Rows resident(layers, r, hkv, d, 8), question_k(layers, m, hkv, d, 9);
  Rows queries(layers, m, hq, d, 10);  // read as [Hq][m][d]
  Rows plain = archived;
  if (nan_rows) {
    plain.k[1][static_cast<std::size_t>((20 * hkv + 1) * d + 3)] = std::numeric_limits<float>::quiet_NaN();
    queries.k[2][static_cast<std::size_t>((4 * m + 2) * d)] = std::numeric_limits<float>::infinity();
  }
  Archived arc;
  fill(plain, type, {16, 0}, &arc);
  // The reference sees the archived values as stored.
  std::vector<std::vector<float>> arch_values;
  for (const auto& layer : plain.k) arch_values.push_back(rounded(layer, type));
  const auto want = naive_scores(queries.k, resident.k, arch_values, question_k.k, hq, hkv, r, a, m, d, per_head);

  fc::RecallScorer scorer;
  ASSERT_TRUE(scorer.reset(arc.archive, scope).ok());
  const std::int64_t rankings = per_head ? layers * hkv : 1;
  ASSERT_EQ(scorer.rankings(), rankings);
  for (int l = 0; l < layers; ++l) {
    const auto q = fc::hnd<const float>(queries.k[static_cast<std::size_t>(l)].data(), fc::Heads(hq), fc::Tokens(m),
                                        fc::HeadDim(d));
    const auto res = fc::nhd<const float>(resident.k[static_cast<std::size_t>(l)].data(), fc::Tokens(r), fc::Heads(hkv),
                                          fc::HeadDim(d));
    const auto qk = fc::nhd<const float>(question_k.k[static_cast<std::size_t>(l)].data(), fc::Tokens(m),
                                         fc::Heads(hkv), fc::HeadDim(d));
    ASSERT_TRUE(scorer.add_layer(l, q, res, qk).ok());
  }
  for (std::int64_t u = 0; u < rankings; ++u) {
    const double* w = want.data() + u * a;
    for (std::int64_t t = 0; t < a; ++t) {
      EXPECT_NEAR(scorer.token_score(t, u), w[t], 2e-5 + 1e-4 * w[t]) << "ranking " << u << ", archived token " << t;
      EXPECT_TRUE(std::isfinite(scorer.token_score(t, u))) << t;
    }
    std::vector<float> blocks(static_cast<std::size_t>(arc.archive.blocks()));
    ASSERT_TRUE(scorer.block_scores(blocks.data(), arc.archive.blocks(), u).ok());
    for (std::int64_t b = 0; b < arc.archive.blocks(); ++b) {
      double top = 0;
      for (std::int64_t t = b * 16; t < std::min<std::int64_t>(a, b * 16 + 16); ++t) top = std::max(top, w[t]);
      EXPECT_NEAR(blocks[static_cast<std::size_t>(b)], top, 2e-5 + 1e-4 * top) << "ranking " << u << ", block " << b;
    }
  }
  const fc::Status s = scorer.block_scores(nullptr, arc.archive.blocks(), rankings);
  EXPECT_NE(s.message().find("ranking " + std::to_string(rankings) + " of " + std::to_string(rankings)),
            std::string::npos)
      << s.message();
}

TEST(Recall, BlockScoresMatchANaiveAttentionOverTheWholeContext) {
  for (fc::RowType type : {fc::RowType::f32, fc::RowType::f16, fc::RowType::bf16})
    check_scores_against_naive(type, false);
  // q8_0: rows of 2 x 48 elements, so KV head 1 starts inside a block.
  check_scores_against_naive(fc::RowType::q8_0, false, 48);
}

TEST(Recall, NonFiniteRowsScoreNothingAndChangeNoOtherToken) { check_scores_against_naive(fc::RowType::f32, true); }

// Per head: one ranking per (layer, KV head), each its own maximum.
TEST(Recall, PerHeadScoresMatchTheNaiveAttentionOfEachHead) {
  check_scores_against_naive(fc::RowType::bf16, false, 24, fc::RecallScope::per_head);
  check_scores_against_naive(fc::RowType::f32, true, 24, fc::RecallScope::per_head);
}

// K and V of different types (llama.cpp's -ctk q8_0 -ctv f16): each kept as it came.
// RecallScore::digest against a naive double reference (each block's per-channel
// range of its keys as stored, each query's lse over the resident and question keys,
// causally), and as a bound: a block's digest is at least its exact score.
TEST(Recall, DigestScoresMatchANaiveBoundAndBoundTheExactScore) {
  for (fc::RowType type : {fc::RowType::f32, fc::RowType::f16, fc::RowType::q8_0}) {
    SCOPED_TRACE(fc::to_string(type));
    const int layers = 2;
    const std::int64_t hq = 6, hkv = 2, r = 29, a = 45, m = 4, d = 48, block = 16;
    const Rows archived(layers, a, hkv, d, 17), resident(layers, r, hkv, d, 18), question_k(layers, m, hkv, d, 19);
    const Rows queries(layers, m, hq, d, 20);
    Archived arc;
    fill(archived, type, {block, 0}, &arc);
    fc::RecallScorer digest, exact;
    ASSERT_TRUE(digest.reset(arc.archive, fc::RecallScope::shared, fc::RecallScore::digest).ok());
    ASSERT_TRUE(exact.reset(arc.archive).ok());
    const std::int64_t blocks = arc.archive.blocks();
    std::vector<double> want(static_cast<std::size_t>(blocks), 0.0), want_resident(static_cast<std::size_t>(r), 0.0);
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    for (int l = 0; l < layers; ++l) {
      const auto& Q = queries.k[static_cast<std::size_t>(l)];
      const auto& R = resident.k[static_cast<std::size_t>(l)];
      const auto& M = question_k.k[static_cast<std::size_t>(l)];
      const std::vector<float> A = rounded(archived.k[static_cast<std::size_t>(l)], type);
      for (std::int64_t g = 0; g < hq; ++g) {
        const std::int64_t h = g / (hq / hkv);
        for (std::int64_t i = 0; i < m; ++i) {
          const float* qi = Q.data() + (g * m + i) * d;
          auto dot = [&](const float* k) {
            double x = 0;
            for (std::int64_t c = 0; c < d; ++c) x += static_cast<double>(qi[c]) * k[c];
            return x * scale;
          };
          std::vector<double> logit;
          for (std::int64_t j = 0; j < r; ++j) logit.push_back(dot(R.data() + (j * hkv + h) * d));
          for (std::int64_t j = 0; j <= i; ++j) logit.push_back(dot(M.data() + (j * hkv + h) * d));
          double sum = 0;
          for (double x : logit) sum += std::exp(x);
          const double lse = std::log(sum);
          for (std::int64_t t = 0; t < r; ++t)
            want_resident[static_cast<std::size_t>(t)] = std::max(want_resident[static_cast<std::size_t>(t)],
                                                                  std::exp(logit[static_cast<std::size_t>(t)] - lse));
          for (std::int64_t b = 0; b < blocks; ++b) {
            double most = 0;
            for (std::int64_t c = 0; c < d; ++c) {
              double lo = INFINITY, hi = -INFINITY;
              for (std::int64_t t = b * block; t < std::min(a, (b + 1) * block); ++t) {
                lo = std::min<double>(lo, A[static_cast<std::size_t>((t * hkv + h) * d + c)]);
                hi = std::max<double>(hi, A[static_cast<std::size_t>((t * hkv + h) * d + c)]);
              }
              most += std::max(qi[c] * lo, qi[c] * hi);
            }
            want[static_cast<std::size_t>(b)] =
                std::max(want[static_cast<std::size_t>(b)], std::exp(most * scale - lse));
          }
        }
      }
      const auto q = fc::hnd<const float>(Q.data(), fc::Heads(hq), fc::Tokens(m), fc::HeadDim(d));
      const auto res = fc::nhd<const float>(R.data(), fc::Tokens(r), fc::Heads(hkv), fc::HeadDim(d));
      const auto qk = fc::nhd<const float>(M.data(), fc::Tokens(m), fc::Heads(hkv), fc::HeadDim(d));
      ASSERT_TRUE(digest.add_layer(l, q, res, qk).ok());
      ASSERT_TRUE(exact.add_layer(l, q, res, qk).ok());
    }
    std::vector<float> got(static_cast<std::size_t>(blocks)), exact_blocks(static_cast<std::size_t>(blocks));
    ASSERT_TRUE(digest.block_scores(got.data(), blocks).ok());
    ASSERT_TRUE(exact.block_scores(exact_blocks.data(), blocks).ok());
    for (std::int64_t b = 0; b < blocks; ++b) {
      const double w = want[static_cast<std::size_t>(b)];
      EXPECT_NEAR(got[static_cast<std::size_t>(b)], w, 1e-5 + 1e-4 * w) << "block " << b;
      EXPECT_GE(got[static_cast<std::size_t>(b)], exact_blocks[static_cast<std::size_t>(b)] * (1 - 1e-4f))
          << "block " << b;
    }
    for (std::int64_t t = 0; t < r; ++t)
      EXPECT_NEAR(digest.resident_score(t), want_resident[static_cast<std::size_t>(t)],
                  1e-5 + 1e-4 * want_resident[static_cast<std::size_t>(t)])
          << "resident " << t;
  }
}

TEST(Archive, KeepsKAndVOfDifferentTypesBitForBit) {
  const Rows rows(2, 41, 2, 32, 5);
  Archived a;
  fill(rows, fc::RowType::q8_0, {8, 0}, &a, fc::RowType::f16);
  const fc::ArchiveShape& shape = a.archive.shape();
  EXPECT_EQ(shape.k_row_bytes(), 2 * 34);  // 64 elements: two q8_0 blocks
  EXPECT_EQ(shape.v_row_bytes(), 64 * 2);
  EXPECT_EQ(a.archive.bytes(), 41 * (4 + 2 * (68 + 128)));
  const std::int64_t blocks[] = {0, 5};  // tokens 0-7 and 40
  std::vector<std::int32_t> pos(9);
  std::vector<unsigned char> k0(9 * 68), k1 = k0, v0(9 * 128), v1 = v0;
  void* kp[] = {k0.data(), k1.data()};
  void* vp[] = {v0.data(), v1.data()};
  std::int64_t taken = 0;
  ASSERT_TRUE(a.archive.take(blocks, 2, pos.data(), kp, vp, &taken).ok());
  ASSERT_EQ(taken, 9);
  EXPECT_EQ(pos[8], 1040);
  EXPECT_EQ(std::memcmp(k1.data(), a.k[1].data(), 8 * 68), 0);
  EXPECT_EQ(std::memcmp(k1.data() + 8 * 68, a.k[1].data() + 40 * 68, 68), 0);
  EXPECT_EQ(std::memcmp(v0.data() + 8 * 128, a.v[0].data() + 40 * 128, 128), 0);
  ASSERT_EQ(a.archive.tokens(), 32);  // tokens 8-39 stay, closed up
  EXPECT_EQ(std::memcmp(a.archive.k_row(0, 0), a.k[0].data() + 8 * 68, 32 * 68), 0);
  EXPECT_EQ(std::memcmp(a.archive.v_row(1, 31), a.v[1].data() + 39 * 128, 128), 0);
}

TEST(Recall, SelectTakesTheBestWholeBlocksWithinTheBudget) {
  const Rows rows(1, 45, 1, 4, 4);
  Archived a;
  fill(rows, fc::RowType::f32, {8, 0}, &a);  // blocks 0-4 of 8, block 5 of 5
  const float scores[] = {0.1f, 0.5f, 0.0f, 0.5f, std::numeric_limits<float>::quiet_NaN(), 0.3f};
  std::vector<std::int64_t> chosen, order;
  ASSERT_TRUE(fc::select_recall(a.archive, scores, 21, &chosen, &order).ok());
  // 0.5 (block 1), 0.5 (block 3, the tie goes to the lower first), then 0.3 (block 5, 5 tokens): 21.
  EXPECT_EQ(chosen, (std::vector<std::int64_t>{1, 3, 5}));
  // A budget larger than the archive: every block with a score above 0, never the 0 or NaN ones.
  ASSERT_TRUE(fc::select_recall(a.archive, scores, 1000, &chosen, &order).ok());
  EXPECT_EQ(chosen, (std::vector<std::int64_t>{0, 1, 3, 5}));
  EXPECT_EQ(fc::select_recall(a.archive, scores, -1, &chosen, &order).code(), fc::Errc::invalid_budget);
}

// choose_recall, the recall that displaces residents, against a plain reading of its rule:
// blocks best first; each comes back if it fits the budget and the residents it needs out
// (beyond the room) are all below its score, the lowest remaining first.
TEST(Recall, ChooseDisplacesOnlyResidentsEveryBlockBeats) {
  const Rows rows(1, 45, 1, 4, 4);
  Archived a;
  fill(rows, fc::RowType::f32, {8, 0}, &a);  // blocks 0-4 of 8 tokens, block 5 of 5
  const float blocks[] = {0.1f, 0.5f, 0.0f, 0.45f, std::numeric_limits<float>::quiet_NaN(), 0.3f};
  // 20 residents; 0-1 and 18-19 are protected (first 2, end 18).
  std::vector<float> residents(20, 0.9f);
  for (int i : {3, 5, 7, 9, 11, 13, 15, 17}) residents[static_cast<std::size_t>(i)] = 0.2f;  // 8 below 0.3
  residents[0] = residents[1] = residents[18] = residents[19] = 0.0f;  // protected: never displaced
  fc::RecallRoom room;
  // Room for 4: block 1 (8 tokens, 0.5) displaces 4 residents at 0.2; block 3 (0.45) would need
  // 8 more, 4 of them at 0.9, and stays; so do block 5 (0.3) and block 0 (0.1).
  ASSERT_TRUE(fc::choose_recall(a.archive, blocks, residents.data(), 2, 18, 4, 100, &room).ok());
  EXPECT_EQ(room.blocks, (std::vector<std::int64_t>{1}));
  EXPECT_EQ(room.displaced, (std::vector<std::int64_t>{3, 5, 7, 9}));
  // Room for 8: block 1 fits the room, block 3 displaces the eight at 0.2, block 5 would need 0.9s.
  ASSERT_TRUE(fc::choose_recall(a.archive, blocks, residents.data(), 2, 18, 8, 100, &room).ok());
  EXPECT_EQ(room.blocks, (std::vector<std::int64_t>{1, 3}));
  EXPECT_EQ(room.displaced, (std::vector<std::int64_t>{3, 5, 7, 9, 11, 13, 15, 17}));
  // With room for everything, no resident leaves and the budget alone decides (as select_recall).
  ASSERT_TRUE(fc::choose_recall(a.archive, blocks, residents.data(), 2, 18, 1000, 21, &room).ok());
  EXPECT_EQ(room.blocks, (std::vector<std::int64_t>{1, 3, 5}));
  EXPECT_TRUE(room.displaced.empty());
  // No room and no residents that may leave: nothing comes back.
  ASSERT_TRUE(fc::choose_recall(a.archive, blocks, residents.data(), 5, 5, 0, 100, &room).ok());
  EXPECT_TRUE(room.blocks.empty());
  EXPECT_EQ(fc::choose_recall(a.archive, blocks, residents.data(), 2, 18, 4, -1, &room).code(),
            fc::Errc::invalid_budget);
  EXPECT_EQ(fc::choose_recall(a.archive, blocks, residents.data(), 9, 3, 4, 10, &room).code(), fc::Errc::invalid_shape);
  EXPECT_EQ(fc::choose_recall(a.archive, nullptr, residents.data(), 2, 18, 4, 10, &room).code(),
            fc::Errc::invalid_shape);
}

TEST(Recall, ChooseMatchesItsRuleOnRandomScores) {
  const Rows rows(1, 61, 1, 4, 5);
  Archived a;
  fill(rows, fc::RowType::f32, {7, 0}, &a);  // 8 blocks of 7, one of 5
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  fc::RecallRoom room;
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> bs(static_cast<std::size_t>(a.archive.blocks())), rs(37);
    for (float& x : bs) x = trial % 5 == 0 ? std::round(u(rng) * 4) / 4 : u(rng);  // ties too
    for (float& x : rs) x = trial % 7 == 0 ? std::round(u(rng) * 4) / 4 : u(rng);
    const std::int64_t first = trial % 4, end = 37 - trial % 3, space = trial % 11, budget = trial % 40;
    ASSERT_TRUE(fc::choose_recall(a.archive, bs.data(), rs.data(), first, end, space, budget, &room).ok());
    // The rule, read plainly: a list of the residents that may still leave, lowest first.
    std::vector<std::int64_t> left;
    for (std::int64_t i = first; i < end; ++i) left.push_back(i);
    std::sort(left.begin(), left.end(), [&](auto x, auto y) { return rs[x] < rs[y] || (rs[x] == rs[y] && x < y); });
    std::vector<std::int64_t> by_score;
    for (std::int64_t b = 0; b < a.archive.blocks(); ++b)
      if (bs[static_cast<std::size_t>(b)] > 0) by_score.push_back(b);
    std::sort(by_score.begin(), by_score.end(),
              [&](auto x, auto y) { return bs[x] > bs[y] || (bs[x] == bs[y] && x < y); });
    std::vector<std::int64_t> chosen, gone;
    std::int64_t used = 0, free_cells = space;
    for (const std::int64_t b : by_score) {
      const std::int64_t size = a.archive.block_tokens(b);
      if (used + size > budget) continue;
      const std::int64_t out = std::max<std::int64_t>(0, size - free_cells);
      if (out > static_cast<std::int64_t>(left.size())) continue;
      if (!std::all_of(left.begin(), left.begin() + out, [&](auto i) { return bs[b] > rs[i]; })) continue;
      chosen.push_back(b);
      used += size;
      free_cells = std::max<std::int64_t>(0, free_cells - size);
      gone.insert(gone.end(), left.begin(), left.begin() + out);
      left.erase(left.begin(), left.begin() + out);
    }
    std::sort(chosen.begin(), chosen.end());
    std::sort(gone.begin(), gone.end());
    ASSERT_EQ(room.blocks, chosen) << "trial " << trial;
    ASSERT_EQ(room.displaced, gone) << "trial " << trial;
  }
}

TEST(Recall, AnEmptyArchiveRecallsNothing) {
  fc::Archive a;
  ASSERT_TRUE(a.reset({2, 1, 4, fc::RowType::f32, fc::RowType::f32}).ok());
  fc::RecallScorer scorer;
  ASSERT_TRUE(scorer.reset(a).ok());
  std::vector<float> q(4), k(4);
  const auto view = fc::hnd<const float>(q.data(), fc::Heads(1), fc::Tokens(1), fc::HeadDim(4));
  const auto none = fc::hnd<const float>(k.data(), fc::Heads(1), fc::Tokens(0), fc::HeadDim(4));
  EXPECT_TRUE(scorer.add_layer(0, view, none, view).ok());
  EXPECT_TRUE(scorer.block_scores(nullptr, 0).ok());
  std::vector<std::int64_t> chosen{7}, order;
  EXPECT_TRUE(fc::select_recall(a, nullptr, 32, &chosen, &order).ok());
  EXPECT_TRUE(chosen.empty());
  const fc::Status s = scorer.add_layer(2, view, none, view);
  EXPECT_NE(s.message().find("layer 2 of 2"), std::string::npos) << s.message();
}

// The pool spreads layers over workers and merges by maximum: every score is, bit
// for bit, one scorer's over the same layers, at any thread count, in both scopes
// and with both scores (5 layers: uneven over 2 and 3 workers).
TEST(RecallPool, MergedScoresEqualOneScorerOverEveryLayer) {
  const int layers = 5;
  const std::int64_t hq = 4, hkv = 2, r = 23, a = 41, m = 3, d = 32;
  const Rows archived(layers, a, hkv, d, 31), resident(layers, r, hkv, d, 32), question_k(layers, m, hkv, d, 33);
  const Rows queries(layers, m, hq, d, 34);  // read as [Hq][m][d]
  Archived arc;
  fill(archived, fc::RowType::f16, {8, 0}, &arc);
  auto views = [&](std::int64_t l) {
    const auto i = static_cast<std::size_t>(l);
    return std::make_tuple(fc::hnd<const float>(queries.k[i].data(), fc::Heads(hq), fc::Tokens(m), fc::HeadDim(d)),
                           fc::nhd<const float>(resident.k[i].data(), fc::Tokens(r), fc::Heads(hkv), fc::HeadDim(d)),
                           fc::nhd<const float>(question_k.k[i].data(), fc::Tokens(m), fc::Heads(hkv), fc::HeadDim(d)));
  };
  for (const fc::RecallScope scope : {fc::RecallScope::shared, fc::RecallScope::per_head})
    for (const fc::RecallScore how : {fc::RecallScore::exact, fc::RecallScore::digest}) {
      fc::RecallScorer one;
      ASSERT_TRUE(one.reset(arc.archive, scope, how).ok());
      for (int l = 0; l < layers; ++l) {
        const auto [q, res, qk] = views(l);
        ASSERT_TRUE(one.add_layer(l, q, res, qk).ok());
      }
      const std::int64_t blocks = arc.archive.blocks();
      fc::RecallScorerPool pool;
      for (const int threads : {1, 2, 3}) {
        SCOPED_TRACE(std::string(fc::to_string(scope)) + " " + fc::to_string(how) + " threads " +
                     std::to_string(threads));
        ASSERT_TRUE(pool.reset(arc.archive, scope, how, threads).ok());
        auto add = [&](std::int64_t l, fc::RecallScorer& s, int) {
          const auto [q, res, qk] = views(l);
          return s.add_layer(static_cast<int>(l), q, res, qk);
        };
        ASSERT_TRUE(pool.run(layers, add).ok());
        ASSERT_EQ(pool.rankings(), one.rankings());
        EXPECT_EQ(pool.resident_tokens(), r);
        for (std::int64_t u = 0; u < one.rankings(); ++u) {
          std::vector<float> want(static_cast<std::size_t>(blocks)), got(want.size());
          ASSERT_TRUE(one.block_scores(want.data(), blocks, u).ok());
          ASSERT_TRUE(pool.block_scores(got.data(), blocks, u).ok());
          EXPECT_EQ(got, want) << "ranking " << u;
          for (std::int64_t t = 0; t < a; ++t) EXPECT_EQ(pool.token_score(t, u), one.token_score(t, u)) << t;
          for (std::int64_t t = 0; t < r; ++t) EXPECT_EQ(pool.resident_score(t, u), one.resident_score(t, u)) << t;
        }
        float most = 0;
        for (std::int64_t t = 0; t < a; ++t) most = std::max(most, pool.token_score(t));
        if (how == fc::RecallScore::exact) {
          EXPECT_GT(most, 0.0f);  // the test compares something
        }
      }
    }
}

// Layers with different resident counts are refused whichever workers ran them;
// a worker's error is returned, and a pool that was never reset refuses to run.
TEST(RecallPool, RefusesLayersThatDisagreeAndPassesErrorsOn) {
  const std::int64_t hkv = 1, d = 8;
  const Rows archived(2, 9, hkv, d, 41);
  Archived arc;
  fill(archived, fc::RowType::f32, {4, 0}, &arc);
  std::vector<float> q(static_cast<std::size_t>(2 * d), 0.5f), keys(static_cast<std::size_t>(12 * d), 0.25f);
  fc::RecallScorerPool pool;
  auto never = [](std::int64_t, fc::RecallScorer&, int) { return fc::Status::success(); };
  EXPECT_NE(pool.run(1, never).message().find("reset()"), std::string::npos);
  EXPECT_FALSE(pool.reset(arc.archive, fc::RecallScope::shared, fc::RecallScore::exact, 0).ok());
  ASSERT_TRUE(pool.reset(arc.archive, fc::RecallScope::shared, fc::RecallScore::exact, 2).ok());
  auto uneven = [&](std::int64_t l, fc::RecallScorer& s, int) {
    const std::int64_t r = l == 0 ? 10 : 9;  // layer 0 on worker 0, layer 1 on worker 1
    return s.add_layer(static_cast<int>(l), fc::hnd<const float>(q.data(), fc::Heads(1), fc::Tokens(2), fc::HeadDim(d)),
                       fc::hnd<const float>(keys.data(), fc::Heads(1), fc::Tokens(r), fc::HeadDim(d)),
                       fc::hnd<const float>(keys.data(), fc::Heads(1), fc::Tokens(2), fc::HeadDim(d)));
  };
  const fc::Status s = pool.run(2, uneven);
  EXPECT_NE(s.message().find("resident keys in some layers"), std::string::npos) << s.message();
  ASSERT_TRUE(pool.reset(arc.archive, fc::RecallScope::shared, fc::RecallScore::exact, 2).ok());
  auto bad_layer = [&](std::int64_t l, fc::RecallScorer& s, int) {
    return s.add_layer(static_cast<int>(l) + 5,
                       fc::hnd<const float>(q.data(), fc::Heads(1), fc::Tokens(2), fc::HeadDim(d)),
                       fc::hnd<const float>(keys.data(), fc::Heads(1), fc::Tokens(9), fc::HeadDim(d)),
                       fc::hnd<const float>(keys.data(), fc::Heads(1), fc::Tokens(2), fc::HeadDim(d)));
  };
  const fc::Status e = pool.run(2, bad_layer);
  EXPECT_NE(e.message().find("layer 5 of 2"), std::string::npos) << e.message();
}

}  // namespace
