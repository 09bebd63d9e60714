// The GGUF reader on small hand-built files: every metadata type, every tensor
// type against values computed here, and each kind of bad file refused by name.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "engine_runtime/gguf.hpp"

namespace {

using engine::GgufErrc;
using engine::GgufError;

// Writes GGUF bytes field by field.
struct Builder {
  std::vector<std::uint8_t> b;
  template <class T>
  Builder& put(T v) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
    return *this;
  }
  Builder& str(const std::string& s) {
    put<std::uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Builder& header(std::uint32_t version, std::uint64_t tensors, std::uint64_t kv) {
    b.insert(b.end(), {'G', 'G', 'U', 'F'});
    return put(version).put(tensors).put(kv);
  }
  Builder& key(const std::string& k, std::uint32_t type) { return str(k).put(type); }
  Builder& tensor(const std::string& name, std::vector<std::uint64_t> dims, std::uint32_t type, std::uint64_t off) {
    str(name).put<std::uint32_t>(static_cast<std::uint32_t>(dims.size()));
    for (auto d : dims) put(d);
    return put(type).put(off);
  }
  Builder& align(std::size_t a) {
    while (b.size() % a) b.push_back(0);
    return *this;
  }
};

GgufErrc error_of(const std::vector<std::uint8_t>& bytes) {
  try {
    auto f = engine::parse_gguf(bytes.data(), bytes.size());
    for (const auto& t : f.tensors) f.to_float(t);
  } catch (const GgufError& e) {
    EXPECT_NE(std::string(e.what()).find(engine::to_string(e.code())), std::string::npos) << e.what();
    return e.code();
  }
  ADD_FAILURE() << "accepted a bad file";
  return GgufErrc::io_error;
}

constexpr std::uint16_t kHalfHalf = 0x3800, kHalfMinusOne = 0xBC00, kHalfTwo = 0x4000;

// A version-3 file with one metadata key of every type and one tensor of every type.
std::vector<std::uint8_t> good_file(std::uint32_t version = 3) {
  Builder w;
  w.header(version, 6, 15);
  w.key("u8", 0).put<std::uint8_t>(200);
  w.key("i8", 1).put<std::int8_t>(-5);
  w.key("u16", 2).put<std::uint16_t>(60000);
  w.key("i16", 3).put<std::int16_t>(-300);
  w.key("u32", 4).put<std::uint32_t>(4000000000u);
  w.key("i32", 5).put<std::int32_t>(-70000);
  w.key("f32", 6).put<float>(1.5f);
  w.key("bool", 7).put<std::uint8_t>(1);
  w.key("str", 8).str("héllo");
  w.key("ints", 9).put<std::uint32_t>(5).put<std::uint64_t>(3).put<std::int32_t>(7).put<std::int32_t>(-8).put<std::int32_t>(9);
  w.key("strs", 9).put<std::uint32_t>(8).put<std::uint64_t>(2).str("a b").str("");
  w.key("nested", 9).put<std::uint32_t>(9).put<std::uint64_t>(1).put<std::uint32_t>(12).put<std::uint64_t>(1).put<double>(2.25);
  w.key("u64", 10).put<std::uint64_t>(1ull << 40);
  w.key("i64", 11).put<std::int64_t>(-(1ll << 40));
  w.key("f64", 12).put<double>(-0.125);
  // Tensors, 32-byte aligned offsets: f32 [3], f16 [2], bf16 [2], q8_0 [32], q4_0 [32], q4_1 [32 x 2 rows].
  w.tensor("t_f32", {3}, 0, 0).tensor("t_f16", {2}, 1, 32).tensor("t_bf16", {2}, 30, 64);
  w.tensor("t_q8", {32}, 8, 96).tensor("t_q40", {32}, 2, 160).tensor("t_q41", {32, 2}, 3, 192);
  w.align(32);
  const std::size_t data = w.b.size();
  w.put<float>(1.f).put<float>(-2.f).put<float>(0.5f).align(32);
  w.put<std::uint16_t>(kHalfTwo).put<std::uint16_t>(0x0001).align(32);  // 2, smallest subnormal
  w.put<std::uint16_t>(0x3FC0).put<std::uint16_t>(0xC000).align(32);    // bf16 1.5, -2
  w.put<std::uint16_t>(kHalfHalf);
  for (int j = 0; j < 32; ++j) w.put<std::int8_t>(static_cast<std::int8_t>(j - 16));
  w.align(32);
  w.put<std::uint16_t>(kHalfTwo);
  for (int j = 0; j < 16; ++j) w.put<std::uint8_t>(static_cast<std::uint8_t>(j | ((15 - j) << 4)));
  w.align(32);
  for (int row = 0; row < 2; ++row) {
    w.put<std::uint16_t>(kHalfHalf).put<std::uint16_t>(kHalfMinusOne);
    for (int j = 0; j < 16; ++j) w.put<std::uint8_t>(static_cast<std::uint8_t>(j | ((15 - j) << 4)));
  }
  EXPECT_EQ(w.b.size() - data, 192u + 40u);
  return w.b;
}

TEST(Gguf, ReadsEveryMetadataType) {
  const auto bytes = good_file();
  const auto f = engine::parse_gguf(bytes.data(), bytes.size());
  EXPECT_EQ(f.version, 3u);
  EXPECT_EQ(f.get_int("u8"), 200);
  EXPECT_EQ(f.get_int("i8"), -5);
  EXPECT_EQ(f.get_int("u16"), 60000);
  EXPECT_EQ(f.get_int("i16"), -300);
  EXPECT_EQ(f.get_int("u32"), 4000000000ll);
  EXPECT_EQ(f.get_int("i32"), -70000);
  EXPECT_EQ(f.get_float("f32"), 1.5);
  EXPECT_EQ(f.get_int("bool"), 1);
  EXPECT_EQ(f.get_string("str"), "héllo");
  EXPECT_EQ(f.get_ints("ints"), (std::vector<std::int64_t>{7, -8, 9}));
  EXPECT_EQ(f.get_strings("strs"), (std::vector<std::string>{"a b", ""}));
  ASSERT_EQ(f.get("nested").items.size(), 1u);
  EXPECT_EQ(f.get("nested").items[0].floats, std::vector<double>{2.25});
  EXPECT_EQ(f.get_int("u64"), 1ll << 40);
  EXPECT_EQ(f.get_int("i64"), -(1ll << 40));
  EXPECT_EQ(f.get_float("f64"), -0.125);
  EXPECT_EQ(f.metadata.size(), 15u);
  EXPECT_THROW(f.get_string("u8"), GgufError);
  EXPECT_THROW(f.get_int("absent"), GgufError);
}

TEST(Gguf, DequantisesEveryTensorType) {
  const auto bytes = good_file();
  const auto f = engine::parse_gguf(bytes.data(), bytes.size());
  EXPECT_EQ(f.to_float(f.tensor("t_f32")), (std::vector<float>{1.f, -2.f, 0.5f}));
  EXPECT_EQ(f.to_float(f.tensor("t_f16")), (std::vector<float>{2.f, 5.9604645e-08f}));
  EXPECT_EQ(f.to_float(f.tensor("t_bf16")), (std::vector<float>{1.5f, -2.f}));
  const auto q8 = f.to_float(f.tensor("t_q8"));
  for (int j = 0; j < 32; ++j) EXPECT_EQ(q8[j], 0.5f * static_cast<float>(j - 16));
  const auto q40 = f.to_float(f.tensor("t_q40"));
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(q40[j], 2.f * static_cast<float>(j - 8));
    EXPECT_EQ(q40[j + 16], 2.f * static_cast<float>(15 - j - 8));
  }
  const auto& t41 = f.tensor("t_q41");
  EXPECT_EQ(t41.rows(), 2u);
  const auto q41 = f.to_float(t41);
  ASSERT_EQ(q41.size(), 64u);
  for (int row = 0; row < 2; ++row)
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(q41[row * 32 + j], 0.5f * static_cast<float>(j) - 1.f);
      EXPECT_EQ(q41[row * 32 + j + 16], 0.5f * static_cast<float>(15 - j) - 1.f);
    }
}

TEST(Gguf, ReadsVersion2) {
  const auto bytes = good_file(2);
  EXPECT_EQ(engine::parse_gguf(bytes.data(), bytes.size()).version, 2u);
}

TEST(Gguf, EveryTruncationIsRefused) {
  const auto bytes = good_file();
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    std::vector<std::uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    const auto code = error_of(cut);
    EXPECT_TRUE(code == GgufErrc::truncated || code == GgufErrc::absurd_count ||
                code == GgufErrc::tensor_out_of_range) << "cut at " << n << ": " << engine::to_string(code);
  }
}

TEST(Gguf, BadMagicAndVersion) {
  auto bytes = good_file();
  bytes[0] = 'X';
  EXPECT_EQ(error_of(bytes), GgufErrc::bad_magic);
  for (std::uint32_t v : {1u, 4u, 0x03000000u}) {
    bytes = good_file();
    std::memcpy(bytes.data() + 4, &v, 4);
    EXPECT_EQ(error_of(bytes), GgufErrc::unknown_version) << v;
  }
}

TEST(Gguf, AbsurdCountsAndLengths) {
  Builder a;
  a.header(3, 0, 1ull << 60);
  EXPECT_EQ(error_of(a.b), GgufErrc::absurd_count);
  Builder t;
  t.header(3, 1ull << 40, 0);
  EXPECT_EQ(error_of(t.b), GgufErrc::absurd_count);
  Builder s;
  s.header(3, 0, 1).put<std::uint64_t>(~0ull).put<std::uint32_t>(8);
  EXPECT_EQ(error_of(s.b), GgufErrc::absurd_count);
  Builder arr;
  arr.header(3, 0, 1).key("big", 9).put<std::uint32_t>(0).put<std::uint64_t>(1ull << 62).put<std::uint8_t>(0);
  EXPECT_EQ(error_of(arr.b), GgufErrc::absurd_count);
  Builder deep;
  deep.header(3, 0, 1).key("deep", 9);
  for (int j = 0; j < 20; ++j) deep.put<std::uint32_t>(9).put<std::uint64_t>(1);
  deep.put<std::uint32_t>(0).put<std::uint64_t>(0);
  EXPECT_EQ(error_of(deep.b), GgufErrc::absurd_count);
}

TEST(Gguf, UnknownTypes) {
  Builder v;
  v.header(3, 0, 1).key("k", 13).put<std::uint64_t>(0);
  EXPECT_EQ(error_of(v.b), GgufErrc::unknown_value_type);
  Builder t;
  t.header(3, 1, 0).tensor("w", {32}, 12, 0).align(32);  // Q4_K: not read
  t.b.resize(t.b.size() + 256);
  EXPECT_EQ(error_of(t.b), GgufErrc::unknown_tensor_type);
  Builder b;
  b.header(3, 0, 1).key("flag", 7).put<std::uint8_t>(2);
  EXPECT_EQ(error_of(b.b), GgufErrc::unknown_value_type);
}

TEST(Gguf, TensorPastTheEndOrMisaligned) {
  Builder past;
  past.header(3, 1, 0).tensor("w", {4}, 0, 0).align(32).put<float>(1).put<float>(2).put<float>(3);
  EXPECT_EQ(error_of(past.b), GgufErrc::tensor_out_of_range);
  Builder far;
  far.header(3, 1, 0).tensor("w", {4}, 0, 1ull << 62).align(32);
  EXPECT_EQ(error_of(far.b), GgufErrc::tensor_out_of_range);
  Builder mis;
  mis.header(3, 1, 0).tensor("w", {4}, 0, 4).align(32);
  mis.b.resize(mis.b.size() + 64);
  EXPECT_EQ(error_of(mis.b), GgufErrc::bad_alignment);
  Builder al;
  al.header(3, 0, 1).key("general.alignment", 4).put<std::uint32_t>(24);
  EXPECT_EQ(error_of(al.b), GgufErrc::bad_alignment);
}

TEST(Gguf, BadShapesAndDuplicates) {
  Builder zero;
  zero.header(3, 1, 0).tensor("w", {4, 0}, 0, 0).align(32);
  EXPECT_EQ(error_of(zero.b), GgufErrc::bad_shape);
  Builder dims;
  dims.header(3, 1, 0).tensor("w", {1, 1, 1, 1, 1}, 0, 0).align(32);
  EXPECT_EQ(error_of(dims.b), GgufErrc::bad_shape);
  Builder huge;
  huge.header(3, 1, 0).tensor("w", {1ull << 40, 1ull << 40}, 0, 0).align(32);
  EXPECT_EQ(error_of(huge.b), GgufErrc::bad_shape);
  Builder block;
  block.header(3, 1, 0).tensor("w", {31}, 3, 0).align(32);
  block.b.resize(block.b.size() + 64);
  EXPECT_EQ(error_of(block.b), GgufErrc::bad_shape);
  Builder dup;
  dup.header(3, 0, 2).key("k", 0).put<std::uint8_t>(1).key("k", 0).put<std::uint8_t>(2);
  EXPECT_EQ(error_of(dup.b), GgufErrc::duplicate_name);
}

TEST(Gguf, MissingFileIsAnIoError) {
  try {
    engine::load_gguf("/nonexistent/model.gguf");
    FAIL() << "opened a missing file";
  } catch (const GgufError& e) {
    EXPECT_EQ(e.code(), GgufErrc::io_error);
  }
}

}  // namespace
