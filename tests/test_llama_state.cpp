// The llama.cpp sequence-state parser and writer (flashcache/llama/state.hpp) on
// synthetic blobs: no llama.cpp needed, so these always run.
#include <flashcache/llama/state.hpp>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "llama_blob_builder.hpp"

namespace fl = flashcache::llama;
using blob_builder::Spec;

namespace {

fl::SeqState parse_ok(const std::vector<std::uint8_t>& b) {
  fl::SeqState s;
  const flashcache::Status st = fl::parse_seq_state(b.data(), b.size(), &s);
  EXPECT_TRUE(st.ok()) << st.message();
  return s;
}

std::string refusal(const std::vector<std::uint8_t>& b) {
  fl::SeqState s;
  const flashcache::Status st = fl::parse_seq_state(b.data(), b.size(), &s);
  return st.ok() ? std::string("(accepted)") : st.message();
}

}  // namespace

TEST(LlamaState, ParsesEveryLayout) {
  for (bool trans : {false, true})
    for (std::int32_t type : {0, 1, 30}) {
      Spec spec;
      spec.v_trans = trans;
      spec.k_type = spec.v_type = type;
      spec.n_stream = 3;
      spec.stream = 1;
      const auto b = blob_builder::build(spec);
      const fl::SeqState s = parse_ok(b);
      EXPECT_EQ(s.cell_count, 4u);
      EXPECT_EQ(s.stream, 1u);
      EXPECT_EQ(s.n_stream, 3u);
      EXPECT_EQ(s.v_trans, trans);
      ASSERT_EQ(s.layers.size(), 2u);
      EXPECT_EQ(s.layers[1].k_embd, 8u);
      EXPECT_EQ(s.layers[1].v_embd, 8u);
      EXPECT_EQ(s.layers[0].k_type, static_cast<fl::GgmlType>(type));
      EXPECT_EQ(s.size, b.size());
      EXPECT_EQ(s.kv_bytes(), 2u * 4u * 2u * 8u * blob_builder::elem_bytes(type));
      EXPECT_EQ(fl::seq_state_size(s, 4), b.size());
    }
}

TEST(LlamaState, WritingEveryCellGivesTheSameBytes) {
  for (bool trans : {false, true}) {
    Spec spec;
    spec.v_trans = trans;
    const auto b = blob_builder::build(spec);
    const fl::SeqState s = parse_ok(b);
    const std::vector<std::int32_t> all = {0, 1, 2, 3};
    std::vector<std::uint8_t> out;
    ASSERT_TRUE(fl::write_seq_state(b.data(), s, all.data(), 4, &out).ok());
    EXPECT_EQ(out, b);
  }
}

TEST(LlamaState, KeptCellsKeepTheirPositionsAndBytes) {
  for (bool trans : {false, true}) {
    Spec spec;
    spec.v_trans = trans;
    spec.k_type = spec.v_type = 0;  // f32: the values read back exactly
    spec.pos = {10, 11, 12, 13, 14};
    const auto b = blob_builder::build(spec);
    const fl::SeqState s = parse_ok(b);
    const std::vector<std::int32_t> kept = {0, 2, 4};
    std::vector<std::uint8_t> out;
    ASSERT_TRUE(fl::write_seq_state(b.data(), s, kept.data(), 3, &out).ok());
    Spec want = spec;
    want.pos = {10, 12, 14};
    const fl::SeqState t = parse_ok(out);
    EXPECT_EQ(t.pos, want.pos);
    EXPECT_EQ(out.size(), fl::seq_state_size(s, 3));
    std::vector<float> k(3 * 8), v(3 * 8);
    const std::vector<std::int32_t> order = {0, 1, 2};
    for (std::size_t l = 0; l < 2; ++l) {
      fl::layer_to_float(out.data(), t, l, fl::Part::k, order.data(), 3, k.data());
      fl::layer_to_float(out.data(), t, l, fl::Part::v, order.data(), 3, v.data());
      for (std::size_t i = 0; i < 3; ++i)
        for (std::uint32_t c = 0; c < 8; ++c) {
          EXPECT_EQ(k[i * 8 + c], blob_builder::value(static_cast<std::uint32_t>(l), 0, 2 * i, c));
          EXPECT_EQ(v[i * 8 + c], blob_builder::value(static_cast<std::uint32_t>(l), 1, 2 * i, c));
        }
    }
  }
}

// A sliding-window model's blob (global layers' cache, then the sliding layers'):
// parsed only when asked for, the first section as the state's cells, the second
// kept byte for byte by the writer.
TEST(LlamaState, ASlidingWindowBlobKeepsItsSecondSectionByteForByte) {
  Spec global, sliding;
  global.pos = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  global.layers = 1;
  sliding.pos = {6, 7, 8, 9};
  sliding.layers = 3;
  sliding.v_trans = true;
  const auto b = blob_builder::build_two(global, sliding);
  EXPECT_NE(refusal(b).find("global_then_sliding"), std::string::npos) << refusal(b);
  fl::SeqState s;
  ASSERT_TRUE(fl::parse_seq_state(b.data(), b.size(), &s, fl::StateSections::global_then_sliding).ok());
  EXPECT_EQ(s.cell_count, 10u);
  EXPECT_EQ(s.layers.size(), 1u);
  EXPECT_EQ(s.sliding.cell_count, 4u);
  EXPECT_EQ(s.sliding.layers, 3u);
  EXPECT_EQ(s.sliding.pos_min, 6);
  EXPECT_EQ(s.sliding.pos_max, 9);
  EXPECT_EQ(s.sliding.offset, blob_builder::build(global).size());
  EXPECT_EQ(s.sliding.offset + s.sliding.size, b.size());
  EXPECT_EQ(fl::seq_state_size(s, 10), b.size());

  std::vector<std::int32_t> all(10);
  for (std::int32_t i = 0; i < 10; ++i) all[static_cast<std::size_t>(i)] = i;
  std::vector<std::uint8_t> out;
  ASSERT_TRUE(fl::write_seq_state(b.data(), s, all.data(), 10, &out).ok());
  EXPECT_EQ(out, b);
  const std::vector<std::int32_t> kept = {0, 2, 4, 6, 7, 8, 9};
  ASSERT_TRUE(fl::write_seq_state(b.data(), s, kept.data(), 7, &out).ok());
  fl::SeqState t;
  ASSERT_TRUE(fl::parse_seq_state(out.data(), out.size(), &t, fl::StateSections::global_then_sliding).ok());
  EXPECT_EQ(t.pos, (std::vector<std::int32_t>{0, 2, 4, 6, 7, 8, 9}));
  ASSERT_EQ(t.sliding.size, s.sliding.size);
  EXPECT_TRUE(std::equal(b.begin() + static_cast<std::ptrdiff_t>(s.sliding.offset), b.end(),
                         out.begin() + static_cast<std::ptrdiff_t>(t.sliding.offset)));

  // A second section cut short, or of another stream count: refused by name.
  const std::vector<std::uint8_t> cut(b.begin(), b.end() - 3);
  const flashcache::Status st = fl::parse_seq_state(cut.data(), cut.size(), &t, fl::StateSections::global_then_sliding);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("the sliding-window section: llama state truncated"), std::string::npos) << st.message();
  Spec two_streams = sliding;
  two_streams.n_stream = 2;
  const auto other = blob_builder::build_two(global, two_streams);
  const flashcache::Status st2 =
      fl::parse_seq_state(other.data(), other.size(), &t, fl::StateSections::global_then_sliding);
  ASSERT_FALSE(st2.ok());
  EXPECT_NE(st2.message().find("the sliding-window section has 2 streams, the global one 1"), std::string::npos)
      << st2.message();
  // A one-cache blob asked for two sections: the second is missing.
  const auto one = blob_builder::build(global);
  EXPECT_FALSE(fl::parse_seq_state(one.data(), one.size(), &t, fl::StateSections::global_then_sliding).ok());
}

TEST(LlamaState, CellsInPositionOrder) {
  Spec spec;
  spec.pos = {7, 3, 9, 0};
  const fl::SeqState s = parse_ok(blob_builder::build(spec));
  EXPECT_EQ(fl::cells_by_position(s), (std::vector<std::int32_t>{3, 1, 0, 2}));
}

// Every 16-bit pattern, from an odd byte offset and in rows of awkward lengths,
// converts bit for bit as the scalar half_t / bfloat16_t::to_float does.
TEST(LlamaState, RowConversionMatchesTheScalarOneForEveryPattern) {
  std::vector<std::uint8_t> bytes(2 * 65536 + 1);
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const auto v = static_cast<std::uint16_t>(b);
    std::memcpy(bytes.data() + 1 + 2 * b, &v, 2);
  }
  for (const fl::GgmlType type : {fl::GgmlType::f16, fl::GgmlType::bf16}) {
    std::vector<float> out(65536 + 1, 7.0f);
    std::uint64_t done = 0;
    for (std::uint64_t len : {1u, 7u, 8u, 9u, 15u, 16u, 1000u}) {  // awkward rows first, then the rest in one
      fl::to_float_row(type, bytes.data() + 1 + 2 * done, len, out.data() + done);
      done += len;
    }
    fl::to_float_row(type, bytes.data() + 1 + 2 * done, 65536 - done, out.data() + done);
    EXPECT_EQ(out[65536], 7.0f) << "wrote past the row";
    int differ = 0;
    for (std::uint32_t b = 0; b < 65536; ++b) {
      const auto v = static_cast<std::uint16_t>(b);
      const float want = type == fl::GgmlType::f16 ? flashcache::half_t::to_float(v) : flashcache::bfloat16_t::to_float(v);
      differ += std::memcmp(&want, &out[b], 4) != 0;
    }
    EXPECT_EQ(differ, 0) << fl::type_name(type);
  }
}

TEST(LlamaState, ConvertsF16Bf16AndQ8) {
  const std::uint16_t h[2] = {0x3c00, 0xc000};  // 1, -2
  float out[32];
  fl::to_float_row(fl::GgmlType::f16, reinterpret_cast<const std::uint8_t*>(h), 2, out);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  const std::uint16_t bf[1] = {0x4040};  // 3
  fl::to_float_row(fl::GgmlType::bf16, reinterpret_cast<const std::uint8_t*>(bf), 1, out);
  EXPECT_EQ(out[0], 3.0f);
  std::uint8_t q[34];
  const std::uint16_t d = 0x3800;  // 0.5
  std::memcpy(q, &d, 2);
  for (int i = 0; i < 32; ++i) q[2 + i] = static_cast<std::uint8_t>(static_cast<std::int8_t>(i - 16));
  fl::to_float_row(fl::GgmlType::q8_0, q, 32, out);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(out[i], 0.5f * static_cast<float>(i - 16));
  EXPECT_EQ(fl::row_elements(fl::GgmlType::q8_0, 34 * 6), 192u);
  EXPECT_EQ(fl::row_elements(fl::GgmlType::q8_0, 35), 0u);
}

TEST(LlamaState, RefusesTruncatedBlobsByName) {
  for (bool trans : {false, true}) {
    Spec spec;
    spec.v_trans = trans;
    const auto b = blob_builder::build(spec);
    for (std::size_t n = 0; n < b.size(); ++n) {
      const std::vector<std::uint8_t> cut(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(n));
      const std::string why = refusal(cut);
      EXPECT_NE(why.find("truncated"), std::string::npos) << n << ": " << why;
    }
  }
}

TEST(LlamaState, RefusesForeignAndOtherVersionBlobs) {
  auto b = blob_builder::build(Spec{});
  // llama_state_seq_save_file's header (magic 'ggsq', version 3) is not a get_data blob.
  std::vector<std::uint8_t> file = b;
  const std::uint32_t ggsq = 0x67677371u;
  std::memcpy(file.data(), &ggsq, 4);
  EXPECT_NE(refusal(file).find("not a llama.cpp sequence state: magic 0x67677371"), std::string::npos);
  std::vector<std::uint8_t> text(b.size(), 'x');
  EXPECT_NE(refusal(text).find("not a llama.cpp sequence state"), std::string::npos);
  // A format with a cell ext (M-RoPE / per-layer embeddings: 12 more bytes per cell).
  Spec spec;
  std::vector<std::uint8_t> ext;
  blob_builder::put(ext, std::uint32_t{0xaf143cd8u});
  blob_builder::put(ext, std::int32_t{0});
  blob_builder::put(ext, std::uint32_t{1});
  blob_builder::put(ext, std::uint32_t{2});
  for (std::int32_t p : {0, 1}) {
    blob_builder::put(ext, p);
    blob_builder::put(ext, std::uint32_t{1});
    for (std::int32_t e : {5, 6, 42}) blob_builder::put(ext, e);  // x, y, token
    blob_builder::put(ext, std::int32_t{0});
  }
  EXPECT_NE(refusal(ext).find("belongs to sequence 5"), std::string::npos) << refusal(ext);
  // Trailing bytes: a longer format.
  b.push_back(0);
  EXPECT_NE(refusal(b).find("1 trailing bytes"), std::string::npos);
}

TEST(LlamaState, RefusesSwappedSections) {
  Spec spec;
  const auto b = blob_builder::build(spec);
  const fl::SeqState s = parse_ok(b);
  // The cells' metadata and the layer data swapped.
  std::vector<std::uint8_t> swapped(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(s.meta_offset));
  swapped.insert(swapped.end(), b.begin() + static_cast<std::ptrdiff_t>(s.data_offset), b.end());
  swapped.insert(swapped.end(), b.begin() + static_cast<std::ptrdiff_t>(s.meta_offset),
                 b.begin() + static_cast<std::ptrdiff_t>(s.data_offset));
  EXPECT_NE(refusal(swapped), "(accepted)");
  // The stream count and the cell count swapped (1 stream of 4 cells -> 4 streams).
  std::vector<std::uint8_t> counts = b;
  std::swap_ranges(counts.begin() + 8, counts.begin() + 12, counts.begin() + 12);
  EXPECT_NE(refusal(counts), "(accepted)");
  // Layer 1's K section swapped with layer 0's V section (K f32, V f16): layers of two K types.
  Spec mixed;
  mixed.k_type = 0;
  mixed.v_type = 1;
  const auto m = blob_builder::build(mixed);
  const fl::SeqState ms = parse_ok(m);
  const auto at = [&m](std::size_t i) { return m.begin() + static_cast<std::ptrdiff_t>(i); };
  const std::size_t k1 = ms.layers[1].k_offset - 12, v0 = ms.layers[0].v_offset - 12, v1 = ms.layers[1].v_offset - 12;
  std::vector<std::uint8_t> kv(m.begin(), at(k1));
  kv.insert(kv.end(), at(v0), at(v1));  // V0 where K1 was
  kv.insert(kv.end(), at(k1), at(v0));  // K1 where V0 was
  kv.insert(kv.end(), at(v1), m.end());
  ASSERT_EQ(kv.size(), m.size());
  EXPECT_NE(refusal(kv).find("K of layer 1 is f16, of layer 0 f32"), std::string::npos) << refusal(kv);
}

TEST(LlamaState, RefusesWhatItDoesNotHandle) {
  Spec two;
  two.n_stream = 2;
  auto b = blob_builder::build(two);  // cells in stream 0; give stream 1 a copy
  {
    Spec one;
    auto single = blob_builder::build(one);
    std::vector<std::uint8_t> both(single.begin(), single.begin() + 8);
    blob_builder::put(both, std::uint32_t{2});
    both.insert(both.end(), single.begin() + 12, single.end());
    both.insert(both.end(), single.begin() + 12, single.end());
    EXPECT_NE(refusal(both).find("cells in streams 0 and 1"), std::string::npos) << refusal(both);
  }
  Spec dup;
  dup.pos = {0, 1, 1, 2};
  EXPECT_NE(refusal(blob_builder::build(dup)).find("position 1 is held by two cells"), std::string::npos);
  Spec neg;
  neg.pos = {-1, 0};
  EXPECT_NE(refusal(blob_builder::build(neg)).find("position -1"), std::string::npos);
  Spec q4;
  q4.k_type = 2;
  EXPECT_NE(refusal(blob_builder::build(q4)).find("K of layer 0 is q4_0"), std::string::npos);  // named
  Spec other;
  other.k_type = 41;
  EXPECT_NE(refusal(blob_builder::build(other)).find("ggml type 41"), std::string::npos);
  Spec tq8;
  tq8.v_trans = true;
  tq8.v_type = 8;
  EXPECT_NE(refusal(blob_builder::build(tq8)).find("transposed V of layer 0 is q8_0"), std::string::npos);
  // A cell of two sequences.
  b = blob_builder::build(Spec{});
  const fl::SeqState s = parse_ok(b);
  std::vector<std::uint8_t> shared = b;
  const std::uint32_t n2 = 2;
  std::memcpy(shared.data() + s.meta_offset + 4, &n2, 4);
  EXPECT_NE(refusal(shared).find("lists 2 sequences"), std::string::npos);
  // v_trans outside {0, 1}; a K row that is not whole elements.
  std::vector<std::uint8_t> vt = b;
  vt[s.data_offset] = 7;
  EXPECT_NE(refusal(vt).find("v_trans is 7"), std::string::npos);
  std::vector<std::uint8_t> row = b;
  const std::uint64_t odd = 15;
  std::memcpy(row.data() + s.layers[0].k_offset - 8, &odd, 8);
  EXPECT_NE(refusal(row).find("not whole f16 elements"), std::string::npos);
}

TEST(LlamaState, WriterRefusesBadCellLists) {
  const auto b = blob_builder::build(Spec{});
  const fl::SeqState s = parse_ok(b);
  std::vector<std::uint8_t> out;
  const std::vector<std::int32_t> repeated = {1, 1}, outside = {4};
  EXPECT_FALSE(fl::write_seq_state(b.data(), s, repeated.data(), 2, &out).ok());
  EXPECT_FALSE(fl::write_seq_state(b.data(), s, outside.data(), 1, &out).ok());
}
