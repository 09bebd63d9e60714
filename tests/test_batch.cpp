// The ragged batch entry (batch.hpp): each sequence of a packed batch against
// the front door on that sequence alone, and bad input named.
#include <gtest/gtest.h>
#include <flashcache/flashcache.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "model_data.hpp"

namespace fc = flashcache;
using flashcache::testing::every;
using flashcache::testing::layer_data;
using flashcache::testing::Model;

namespace {

// The paper's settings: no sink or window unless a test asks for one.
const fc::Options kPaper = fc::Options::paper();

// Packs the sequences of a batch in NHD order: [tokens][heads][d].
std::vector<float> pack_nhd(const std::vector<std::vector<float>>& seqs, const std::vector<std::int64_t>& len,
                            std::int64_t heads, std::int64_t d) {
  std::vector<float> out;
  for (std::size_t b = 0; b < seqs.size(); ++b)
    for (std::int64_t t = 0; t < len[b]; ++t)
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t c = 0; c < d; ++c) out.push_back(seqs[b][static_cast<std::size_t>((h * len[b] + t) * d + c)]);
  return out;
}

TEST(Batch, RaggedBatchMatchesEachSequenceAlone) {
  const std::int64_t heads = 2, d = 5, layers = 3;
  const std::vector<std::int64_t> len{41, 0, 67, 23};
  const std::vector<std::int32_t> indptr{0, 41, 41, 108, 131};
  const std::int64_t capacity = 140;  // more rows than the batch uses
  fc::Options opt = fc::Options::paper();
  opt.select.window = 2;
  // Per sequence and layer: the data, and the reference from the front door.
  std::vector<std::vector<float>> k_packed(layers), v_packed(layers);
  std::vector<std::vector<std::uint8_t>> mask_bytes(layers);
  for (std::int64_t l = 0; l < layers; ++l) {
    std::vector<std::vector<float>> ks, vs;
    for (std::size_t b = 0; b < len.size(); ++b) {
      ks.push_back(layer_data(heads, len[b], d, 100 * l + 2 * b + 1));
      vs.push_back(layer_data(heads, len[b], d, 100 * l + 2 * b + 2));
    }
    k_packed[l] = pack_nhd(ks, len, heads, d);
    v_packed[l] = pack_nhd(vs, len, heads, d);
    k_packed[l].resize(static_cast<std::size_t>(capacity * heads * d), 9.0f);
    v_packed[l].resize(k_packed[l].size(), 9.0f);
    mask_bytes[l] = every(capacity, 11, l);
  }
  std::vector<fc::KVView<const float>> kv, vv;
  std::vector<fc::ProtectMask> masks;
  for (std::int64_t l = 0; l < layers; ++l) {
    kv.push_back(fc::nhd<const float>(k_packed[l].data(), fc::Tokens(capacity), fc::Heads(heads), fc::HeadDim(d)));
    vv.push_back(fc::nhd<const float>(v_packed[l].data(), fc::Tokens(capacity), fc::Heads(heads), fc::HeadDim(d)));
    masks.emplace_back(mask_bytes[l]);
  }
  std::vector<std::vector<std::int32_t>> kept(layers, std::vector<std::int32_t>(heads * capacity, -1));
  std::vector<std::int32_t*> kept_ptr;
  std::vector<std::vector<float>> k_out(layers, std::vector<float>(heads * capacity * d)), v_out = k_out;
  std::vector<fc::KVView<float>> k_out_view, v_out_view;
  for (std::int64_t l = 0; l < layers; ++l) {
    kept_ptr.push_back(kept[l].data());
    k_out_view.push_back(fc::hnd(k_out[l].data(), fc::Heads(heads), fc::Tokens(capacity), fc::HeadDim(d)));
    v_out_view.push_back(fc::hnd(v_out[l].data(), fc::Heads(heads), fc::Tokens(capacity), fc::HeadDim(d)));
  }
  const int sequences = static_cast<int>(len.size());
  std::vector<std::int32_t> kept_indptr(layers * (sequences + 1));
  std::vector<std::int64_t> budgets(layers * sequences);
  std::vector<double> ratio(layers * sequences);
  fc::BatchOutputs<float> out;
  out.kept = kept_ptr.data();
  out.kept_indptr = kept_indptr.data();
  out.budgets = budgets.data();
  out.energy_ratio = ratio.data();
  out.k_out = k_out_view.data();
  out.v_out = v_out_view.data();
  fc::BatchWorkspace<> ws;
  for (int call = 0; call < 2; ++call) {  // the second call reuses the warm workspace
    const fc::Status s =
        fc::compress_batch(kv.data(), vv.data(), static_cast<int>(layers), fc::Batch{sequences, indptr.data()},
                           fc::Budget::ratio(0.25), opt, masks.data(), {}, &ws, out);
    ASSERT_TRUE(s.ok()) << s.message();
  }

  for (int b = 0; b < sequences; ++b) {
    std::vector<fc::KVView<const float>> ks, vs;
    std::vector<fc::ProtectMask> ms;
    for (std::int64_t l = 0; l < layers; ++l) {
      ks.push_back(fc::token_range(kv[l], indptr[b], len[b]));
      vs.push_back(fc::token_range(vv[l], indptr[b], len[b]));
      ms.push_back(masks[l].slice(indptr[b], len[b]));
    }
    const auto ref = fc::compress_model(ks, vs, fc::Budget::ratio(0.25), opt, ms);
    for (std::int64_t l = 0; l < layers; ++l) {
      const std::int64_t bud = budgets[l * sequences + b];
      const std::int32_t row = kept_indptr[l * (sequences + 1) + b];
      ASSERT_EQ(bud, ref.budgets[l]) << "sequence " << b << " layer " << l;
      EXPECT_EQ(kept_indptr[l * (sequences + 1) + b + 1], row + bud);
      EXPECT_DOUBLE_EQ(ratio[l * sequences + b], ref.energy_ratio[l]);
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t i = 0; i < bud; ++i) {
          const std::int32_t t = kept[l][h * capacity + row + i];
          ASSERT_EQ(t, ref.layers[l].kept_head(h)[i]) << "sequence " << b << " layer " << l << " head " << h;
          for (std::int64_t c = 0; c < d; ++c) {
            EXPECT_EQ(k_out_view[l](h, row + i, c), kv[l](h, indptr[b] + t, c));
            EXPECT_EQ(v_out_view[l](h, row + i, c), vv[l](h, indptr[b] + t, c));
          }
        }
    }
  }
  EXPECT_EQ(kept_indptr[1], kept_indptr[2]);  // the empty sequence keeps nothing
}

TEST(Batch, RefusesBadInput) {
  const Model m(2, 4, {30});
  std::vector<std::int32_t> kept(60), kept_indptr(3);
  std::int32_t* kp = kept.data();
  fc::BatchOutputs<float> out;
  out.kept = &kp;
  out.kept_indptr = kept_indptr.data();
  fc::BatchWorkspace<> ws;
  const std::vector<std::int32_t> decreasing{0, 20, 10};
  fc::Status s = fc::compress_batch(m.kv.data(), m.vv.data(), 1, fc::Batch{2, decreasing.data()},
                                    fc::Budget::ratio(0.5), kPaper, nullptr, {}, &ws, out);
  EXPECT_EQ(s.code(), fc::Errc::invalid_shape);
  EXPECT_NE(s.message().find("indptr decreases at sequence 1"), std::string::npos) << s.message();
  const std::vector<std::int32_t> too_long{0, 20, 31};
  s = fc::compress_batch(m.kv.data(), m.vv.data(), 1, fc::Batch{2, too_long.data()}, fc::Budget::ratio(0.5), kPaper,
                         nullptr, {}, &ws, out);
  EXPECT_NE(s.message().find("indptr ends at 31 but the view holds 30 tokens"), std::string::npos) << s.message();
  s = fc::compress_batch(m.kv.data(), m.vv.data(), 1, fc::Batch{2, nullptr}, fc::Budget::ratio(0.5), kPaper, nullptr, {},
                         &ws, out);
  EXPECT_NE(s.message().find("needs an indptr"), std::string::npos) << s.message();
  out.kept = nullptr;
  s = fc::compress_batch(m.kv.data(), m.vv.data(), 1, fc::Batch{}, fc::Budget::ratio(0.5), kPaper, nullptr, {}, &ws, out);
  EXPECT_NE(s.message().find("kept and kept_indptr are required"), std::string::npos) << s.message();
  out.kept = &kp;
  const std::vector<std::int32_t> ok{0, 10, 30};
  s = fc::compress_batch(m.kv.data(), m.vv.data(), 1, fc::Batch{2, ok.data()}, fc::Budget::tokens(11), kPaper, nullptr, {},
                         &ws, out);
  EXPECT_NE(s.message().find("sequence 0: layer 0: keep budget 11 > 10 tokens"), std::string::npos) << s.message();
}

}  // namespace
