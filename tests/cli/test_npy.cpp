// tools/npy/npy.hpp: round trips for every dtype and shape, NumPy's own bytes,
// and every kind of bad file refused with an io_error that names the file.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "npy/npy.hpp"
#include "test_util.hpp"

namespace flashcache {
namespace {

using test::npy_file;
using test::read_bytes;
using test::TempDir;
using test::write_bytes;
namespace fs = std::filesystem;

// ---------------------------------------------------------------- round trips

template <class T>
T value_at(std::size_t i) {
  if constexpr (std::is_same_v<T, bool>)
    return i % 3 == 0;
  else if constexpr (std::is_same_v<T, half_t>)
    return half_t(static_cast<float>(i) * 0.5f - 3.0f);
  else if constexpr (std::is_signed_v<T>)
    return static_cast<T>(static_cast<double>(i) * 1.25 - 7.0);
  else
    return static_cast<T>(i * 37 % 251);
}

template <class T>
class NpyRoundTrip : public ::testing::Test {};
using ElementTypes = ::testing::Types<float, double, half_t, std::int32_t, std::int64_t, std::uint8_t, bool>;
// Names as gtest's default gives them (the type's index); passed explicitly so that the
// macro's variadic part is never empty (clang's -Wgnu-zero-variadic-macro-arguments).
struct TypeIndexName {
  template <class T>
  static std::string GetName(int i) {
    return std::to_string(i);
  }
};
TYPED_TEST_SUITE(NpyRoundTrip, ElementTypes, TypeIndexName);

TYPED_TEST(NpyRoundTrip, EveryShapeComesBackExactly) {
  using T = TypeParam;
  TempDir dir;
  const std::vector<std::vector<std::int64_t>> shapes = {{},     {0},       {1},          {5},
                                                         {2, 3}, {3, 0, 2}, {2, 1, 3, 4}, {1, 1, 1, 1, 7}};
  for (const auto& shape : shapes) {
    SCOPED_TRACE(npy::shape_string(shape));
    const auto n = static_cast<std::size_t>(npy::element_count(shape));
    std::unique_ptr<T[]> values(new T[n]);  // not a vector: vector<bool> has no data()
    for (std::size_t i = 0; i < n; ++i) values[i] = value_at<T>(i);
    const std::string path = dir / "a.npy";
    npy::write(path, shape, values.get());

    const npy::Array a = npy::read(path);
    EXPECT_EQ(a.dtype, npy::descr<T>());
    EXPECT_EQ(a.shape, shape);
    EXPECT_EQ(a.size(), static_cast<std::int64_t>(n));
    ASSERT_EQ(a.bytes.size(), n * sizeof(T));
    EXPECT_TRUE(a.template is<T>());
    if (n > 0) {
      EXPECT_EQ(std::memcmp(a.template data<T>(), values.get(), a.bytes.size()), 0);
    }

    // The Array overload writes the same bytes.
    npy::write(dir / "b.npy", a);
    EXPECT_EQ(read_bytes(dir / "b.npy"), read_bytes(path));
    // Headers are padded to 64 bytes and end in a newline, as NumPy writes them.
    const std::string raw = read_bytes(path);
    const std::size_t data_offset = raw.size() - a.bytes.size();
    EXPECT_EQ(data_offset % 64, 0u);
    EXPECT_EQ(raw[data_offset - 1], '\n');
  }
}

TEST(Npy, FromCopiesValues) {
  const std::int32_t v[] = {4, -5, 6};
  const npy::Array a = npy::Array::from<std::int32_t>({3}, v);
  EXPECT_EQ(a.dtype, "<i4");
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{3}));
  EXPECT_EQ(a.data<std::int32_t>()[1], -5);
}

TEST(Npy, WrongTypedAccessThrows) {
  const float v[] = {1.0f};
  const npy::Array a = npy::Array::from<float>({1}, v);
  EXPECT_THROW(a.data<half_t>(), Error);
  EXPECT_THROW(a.data<double>(), Error);
  EXPECT_NO_THROW(a.data<float>());
}

TEST(Npy, LongHeaderUsesVersion2) {
  TempDir dir;
  const std::vector<std::int64_t> shape(23000, 1);  // "1, " x 23000 > 65535 header bytes
  const float v = 2.5f;
  npy::write(dir / "a.npy", shape, &v);
  const std::string raw = read_bytes(dir / "a.npy");
  EXPECT_EQ(raw[6], 2);
  const npy::Array a = npy::read(dir / "a.npy");
  EXPECT_EQ(a.shape, shape);
  EXPECT_EQ(a.data<float>()[0], 2.5f);
}

// ------------------------------------------------------- NumPy compatibility

// np.save of np.arange(6, dtype='<f4').reshape(2, 3), byte for byte.
const std::string kNumpyF4 = std::string("\x93NUMPY\x01\x00v\x00", 10) +
                             "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }" + std::string(58, ' ') +
                             "\n" + std::string("\x00\x00\x00\x00\x00\x00\x80\x3f\x00\x00\x00\x40", 12) +
                             std::string("\x00\x00\x40\x40\x00\x00\x80\x40\x00\x00\xa0\x40", 12);

TEST(Npy, ReadsWhatNumpyWrites) {
  TempDir dir;
  write_bytes(dir / "a.npy", kNumpyF4);
  const npy::Array a = npy::read(dir / "a.npy");
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{2, 3}));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(a.data<float>()[i], static_cast<float>(i));
}

TEST(Npy, WritesWhatNumpyWrites) {
  TempDir dir;
  const float v[] = {0, 1, 2, 3, 4, 5};
  npy::write(dir / "a.npy", {2, 3}, v);
  EXPECT_EQ(read_bytes(dir / "a.npy"), kNumpyF4);
}

TEST(Npy, ReadsVersions2And3) {
  TempDir dir;
  // np.lib.format.write_array(f, np.array([1.5, -2, 65504], '<f2'), version=(2, 0))
  write_bytes(dir / "v2.npy", npy_file("{'descr': '<f2', 'fortran_order': False, 'shape': (3,), }",
                                       std::string("\x00\x3e\x00\xc0\xff\x7b", 6), 2));
  const npy::Array h = npy::read(dir / "v2.npy");
  ASSERT_EQ(h.shape, (std::vector<std::int64_t>{3}));
  EXPECT_EQ(static_cast<float>(h.data<half_t>()[0]), 1.5f);
  EXPECT_EQ(static_cast<float>(h.data<half_t>()[1]), -2.0f);
  EXPECT_EQ(static_cast<float>(h.data<half_t>()[2]), 65504.0f);
  // ... version=(3, 0) of [[True, False], [False, True]]
  write_bytes(dir / "v3.npy", npy_file("{'descr': '|b1', 'fortran_order': False, 'shape': (2, 2), }",
                                       std::string("\x01\x00\x00\x01", 4), 3));
  const npy::Array b = npy::read(dir / "v3.npy");
  EXPECT_EQ(b.dtype, "|b1");
  EXPECT_TRUE(b.data<bool>()[0]);
  EXPECT_FALSE(b.data<bool>()[1]);
  EXPECT_TRUE(b.data<bool>()[3]);
}

TEST(Npy, AcceptsHeaderVariants) {
  TempDir dir;
  const std::string one_f4("\x00\x00\x80\x3f", 4);
  const std::string dicts[] = {
      "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (1,)}",      // double quotes, no trailing comma
      "{'shape': (1,), 'fortran_order': False, 'descr': '<f4'}",              // any key order
      "{ 'descr' : '<f4' , 'fortran_order' : False , 'shape' : ( 1 , ) , }",  // spaces everywhere
      "{'descr': '=f4', 'fortran_order': False, 'shape': (1L,), }",           // native order, Python 2 long
  };
  for (const auto& dict : dicts) {
    SCOPED_TRACE(dict);
    write_bytes(dir / "a.npy", npy_file(dict, one_f4));
    const npy::Array a = npy::read(dir / "a.npy");
    EXPECT_EQ(a.dtype, "<f4");
    EXPECT_EQ(a.shape, (std::vector<std::int64_t>{1}));
    EXPECT_EQ(a.data<float>()[0], 1.0f);
  }
  // One-byte types have no byte order; '<u1' is read as '|u1'.
  write_bytes(dir / "u.npy", npy_file("{'descr': '<u1', 'fortran_order': False, 'shape': (2,), }", "\x07\x09"));
  EXPECT_EQ(npy::read(dir / "u.npy").dtype, "|u1");
}

TEST(Npy, BoolBytesAreNormalised) {
  TempDir dir;
  write_bytes(dir / "b.npy",
              npy_file("{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }", std::string("\x00\x02\xff", 3)));
  const npy::Array b = npy::read(dir / "b.npy");
  EXPECT_EQ(b.bytes, (std::vector<char>{0, 1, 1}));
}

// ----------------------------------------------------------------- bad files

// Reads `bytes` as a file and expects an io_error naming it and saying `what`.
void expect_refused(const std::string& bytes, const std::string& what) {
  TempDir dir;
  const std::string path = dir / "bad.npy";
  write_bytes(path, bytes);
  try {
    npy::read(path);
    ADD_FAILURE() << "read accepted a bad file; expected: " << what;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::io_error);
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path + ": "), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

std::string header(const std::string& descr, const std::string& fortran, const std::string& shape) {
  return "{'descr': " + descr + ", 'fortran_order': " + fortran + ", 'shape': " + shape + ", }";
}

const std::string kSixFloats(24, '\0');

TEST(NpyBadFile, MissingFile) {
  TempDir dir;
  EXPECT_THROW(npy::read(dir / "missing.npy"), Error);
  try {
    npy::read(dir / "missing.npy");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open"), std::string::npos);
  }
}

TEST(NpyBadFile, Directory) {
  TempDir dir;
  EXPECT_THROW(npy::read(dir.path().string()), Error);
}

TEST(NpyBadFile, WrongMagic) {
  expect_refused("", "not a .npy file");
  expect_refused("hello", "not a .npy file");
  expect_refused("PK\x03\x04 a zip file, e.g. an .npz", "wrong magic");
  std::string f = kNumpyF4;
  f[1] = 'n';
  expect_refused(f, "wrong magic");
  f = kNumpyF4;
  f[0] = '\x92';
  expect_refused(f, "wrong magic");
}

TEST(NpyBadFile, UnsupportedVersion) {
  std::string f = kNumpyF4;
  f[6] = 4;
  expect_refused(f, "unsupported .npy format version 4.0");
  f[6] = 1;
  f[7] = 1;
  expect_refused(f, "unsupported .npy format version 1.1");
}

TEST(NpyBadFile, EveryTruncationIsRefused) {
  // Cut a valid file at every length: all but the full file must be refused.
  const std::size_t data_offset = kNumpyF4.size() - 24;
  for (std::size_t n = 1; n < kNumpyF4.size(); ++n) {
    SCOPED_TRACE(n);
    expect_refused(kNumpyF4.substr(0, n), n < data_offset ? "truncated header" : "truncated data");
  }
}

TEST(NpyBadFile, HeaderLengthPastTheEnd) {
  std::string f = kNumpyF4;
  f[8] = '\xff';
  f[9] = '\x7f';
  expect_refused(f, "truncated header");
}

TEST(NpyBadFile, TrailingBytes) { expect_refused(kNumpyF4 + "x", "1 unexpected bytes after the data"); }

TEST(NpyBadFile, FortranOrder) {
  expect_refused(npy_file(header("'<f4'", "True", "(2, 3)"), kSixFloats), "Fortran-order arrays are not supported");
}

TEST(NpyBadFile, UnsupportedDtype) {
  for (const char* d : {"'<c8'", "'<u2'", "'|S4'", "'<f16'", "'<U3'", "'|O'", "'<M8[ns]'", "'f4'", "''"}) {
    SCOPED_TRACE(d);
    expect_refused(npy_file(header(d, "False", "(2, 3)"), kSixFloats), "unsupported dtype");
  }
  expect_refused(npy_file(header("[('a', '<f4')]", "False", "(6,)"), kSixFloats), "structured arrays");
}

TEST(NpyBadFile, BigEndian) {
  expect_refused(npy_file(header("'>f4'", "False", "(2, 3)"), kSixFloats), "big-endian dtype '>f4'");
  expect_refused(npy_file(header("'>i8'", "False", "(3,)"), kSixFloats), "big-endian");
}

TEST(NpyBadFile, BadShape) {
  expect_refused(npy_file(header("'<f4'", "False", "(-1, 6)"), kSixFloats), "negative dimension");
  expect_refused(npy_file(header("'<f4'", "False", "(2.5,)"), kSixFloats), "malformed .npy header");
  expect_refused(npy_file(header("'<f4'", "False", "[2, 3]"), kSixFloats), "malformed .npy header");
  expect_refused(npy_file(header("'<f4'", "False", "(2, 3"), kSixFloats), "malformed .npy header");
  expect_refused(npy_file(header("'<f4'", "False", "(a,)"), kSixFloats), "malformed .npy header");
  expect_refused(npy_file(header("'<f4'", "False", "(4611686018427387904, 4611686018427387904)"), kSixFloats),
                 "too many elements");
  expect_refused(npy_file(header("'<f4'", "False", "(99999999999999999999,)"), kSixFloats), "dimension too large");
  // Right shape, wrong size: the data does not match.
  expect_refused(npy_file(header("'<f4'", "False", "(7,)"), kSixFloats), "truncated data");
  expect_refused(npy_file(header("'<f4'", "False", "(5,)"), kSixFloats), "unexpected bytes after the data");
}

// Sizes come from the header alone and are refused before any allocation:
// these files are a few hundred bytes but claim gigabytes or more.
TEST(NpyBadFile, ElementCountPast2To31IsRefusedFromTheHeader) {
  expect_refused(npy_file(header("'|u1'", "False", "(2147483648,)"), ""), "more than the limit of 2^31 - 1 per array");
  expect_refused(npy_file(header("'<f4'", "False", "(65536, 32768)"), kSixFloats), "too many elements (2147483648,");
  expect_refused(npy_file(header("'<f2'", "False", "(28, 8, 131072, 128)"), kSixFloats), "too many elements (3758096384,");
  // At the limit the header passes and the missing data is what is refused.
  expect_refused(npy_file(header("'|u1'", "False", "(2147483647,)"), ""), "truncated data");
  // An empty dimension makes the array empty, whatever the others say.
  TempDir dir;
  write_bytes(dir / "empty.npy", npy_file(header("'<f4'", "False", "(0, 4611686018427387904)"), ""));
  EXPECT_EQ(npy::read(dir / "empty.npy").size(), 0);
}

TEST(NpyBadFile, ShapeProductOverflowing64BitsIsRefused) {
  const char* shapes[] = {"(4294967296, 4294967296)", "(9223372036854775807, 2)",
                          "(3037000500, 3037000500)", "(65536, 65536, 65536, 65536, 2)"};
  for (const char* shape : shapes) {
    SCOPED_TRACE(shape);
    expect_refused(npy_file(header("'<f4'", "False", shape), kSixFloats), "the element count overflows 64 bits");
  }
}

TEST(NpyBadFile, MalformedHeader) {
  const std::string bad[] = {
      "",                                                                         // nothing
      "'descr': '<f4', 'fortran_order': False, 'shape': (6,)",                    // no braces
      "{'descr': '<f4', 'fortran_order': False}",                                 // no shape
      "{'fortran_order': False, 'shape': (6,)}",                                  // no descr
      "{'descr': '<f4', 'shape': (6,)}",                                          // no fortran_order
      "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), 'extra': 1}",      // unknown key
      "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (6,)}",  // duplicate key
      "{'descr': '<f4, 'fortran_order': False, 'shape': (6,)}",                   // unterminated string
      "{'descr': '<f4' 'fortran_order': False, 'shape': (6,)}",                   // missing comma
      "{'descr': '<f4', 'fortran_order': false, 'shape': (6,)}",                  // not a Python bool
      "{'descr': '<f4', 'fortran_order': False, 'shape': (6,)} trailing",         // text after the dict
      "{descr: '<f4', 'fortran_order': False, 'shape': (6,)}",                    // unquoted key
  };
  for (const auto& dict : bad) {
    SCOPED_TRACE(dict);
    expect_refused(npy_file(dict, kSixFloats), "malformed .npy header");
  }
  std::string nul = npy_file(header("'<f4'", "False", "(6,)"), kSixFloats);
  nul[70] = '\0';
  expect_refused(nul, "NUL");
}

TEST(NpyBadFile, AnySingleByteChangeIsReadOrRefusedCleanly) {
  // Every header byte set to a few telling values: the reader must either
  // accept the file or throw flashcache::Error, never crash or over-read.
  TempDir dir;
  const std::string path = dir / "fuzz.npy";
  const std::size_t data_offset = kNumpyF4.size() - 24;
  for (std::size_t i = 0; i < data_offset; ++i)
    for (char c : {'\0', '\xff', '(', ')', ',', '\'', '9', '-', '}', ' ', 'T', '<', '>'}) {
      std::string f = kNumpyF4;
      f[i] = c;
      fs::remove(path);  // a fresh file: truncating one in place can wait on the disk (ext4 auto_da_alloc)
      write_bytes(path, f);
      try {
        const npy::Array a = npy::read(path);
        EXPECT_EQ(a.bytes.size(), static_cast<std::size_t>(a.size()) * npy::itemsize(a.dtype));
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), Errc::io_error);
      }
    }
}

TEST(NpyWrite, RefusesWhatItCannotWrite) {
  TempDir dir;
  const float v[] = {1, 2};
  EXPECT_THROW(npy::write(dir / "no/such/folder/a.npy", {2}, v), Error);
  EXPECT_THROW(npy::write(dir / "a.npy", {-2}, v), Error);
  npy::Array a;
  a.dtype = "<c8";
  a.shape = {1};
  a.bytes.resize(8);
  EXPECT_THROW(npy::write(dir / "a.npy", a), Error);
  a.dtype = "<f4";
  EXPECT_THROW(npy::write(dir / "a.npy", a), Error);  // 8 bytes for one float
}

}  // namespace
}  // namespace flashcache
