#pragma once
// A small .npy reader and writer (NumPy's array file format, versions 1.0,
// 2.0 and 3.0), for the CLI, the benchmarks and the quality evaluation.
//
//   flashcache::npy::Array a = flashcache::npy::read("k.npy");   // throws flashcache::Error
//   const float* k = a.data<float>();                             // checks the dtype
//   flashcache::npy::write("out.npy", {2, 3}, values);            // values: const float*
//
// Only what a KV cache needs: C-order, little-endian, the dtypes float32 '<f4',
// float16 '<f2', float64 '<f8', int32 '<i4', int64 '<i8', uint8 '|u1' and bool
// '|b1'. Everything else is refused with an Errc::io_error naming the file and
// the problem, never read wrongly. The host must be little-endian.
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "flashcache/error.hpp"
#include "flashcache/types.hpp"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "flashcache/npy reads and writes little-endian data in place; this host is big-endian"
#endif

namespace flashcache::npy {

// NumPy's dtype string ("descr") of an element type.
template <class T>
constexpr const char* descr() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>)
    return "<f4";
  else if constexpr (std::is_same_v<U, double>)
    return "<f8";
  else if constexpr (std::is_same_v<U, half_t>)
    return "<f2";
  else if constexpr (std::is_same_v<U, std::int32_t>)
    return "<i4";
  else if constexpr (std::is_same_v<U, std::int64_t>)
    return "<i8";
  else if constexpr (std::is_same_v<U, std::uint8_t>)
    return "|u1";
  else if constexpr (std::is_same_v<U, bool>)
    return "|b1";
  else
    static_assert(sizeof(U) == 0, "npy: no .npy dtype for this element type");
}

static_assert(sizeof(bool) == 1 && sizeof(half_t) == 2, "npy: element sizes must match the file format");

// Bytes per element of a supported descr, 0 for anything else.
inline std::size_t itemsize(const std::string& descr) {
  if (descr == "<f8" || descr == "<i8") return 8;
  if (descr == "<f4" || descr == "<i4") return 4;
  if (descr == "<f2") return 2;
  if (descr == "|u1" || descr == "|b1") return 1;
  return 0;
}

// Readable name of a supported descr ("float32"), or the descr itself.
inline std::string dtype_name(const std::string& descr) {
  static const char* const names[][2] = {{"<f4", "float32"}, {"<f2", "float16"}, {"<f8", "float64"}, {"<i4", "int32"},
                                         {"<i8", "int64"},   {"|u1", "uint8"},   {"|b1", "bool"}};
  for (const auto& n : names)
    if (descr == n[0]) return n[1];
  return descr;
}

// "[2, 3]" for error messages and summaries.
inline std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// The most elements one array read from a file may hold (2^31 - 1): larger
// counts are refused from the header, so a hostile header cannot make the
// reader allocate gigabytes, and int32 element indices stay exact.
constexpr std::int64_t kMaxElements = std::numeric_limits<std::int32_t>::max();

// Number of elements of a shape (1 for a 0-d array); -1 if a dimension is
// negative or the count overflows int64.
inline std::int64_t element_count(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (std::int64_t dim : shape) {
    if (dim < 0) return -1;
    if (dim != 0 && n > std::numeric_limits<std::int64_t>::max() / dim) return -1;
    n *= dim;
  }
  return n;
}

// An array as stored in the file: C-order, little-endian bytes.
struct Array {
  std::string dtype;                // descr: "<f4", "<f2", "<f8", "<i4", "<i8", "|u1", "|b1"
  std::vector<std::int64_t> shape;  // empty for a 0-d array
  std::vector<char> bytes;          // size() * itemsize(dtype) bytes

  std::int64_t size() const { return element_count(shape); }
  template <class T>
  bool is() const {
    return dtype == descr<T>();
  }
  // Typed access; refuses a dtype other than T's, since a mismatch would be
  // read as garbage. (vector<char> storage is aligned for any scalar.)
  template <class T>
  const T* data() const {
    check_type(descr<T>());
    return reinterpret_cast<const T*>(bytes.data());
  }
  template <class T>
  T* data() {
    check_type(descr<T>());
    return reinterpret_cast<T*>(bytes.data());
  }

  // A copy of `values` (size = product of shape) as an Array.
  template <class T>
  static Array from(std::vector<std::int64_t> shape, const T* values) {
    Array a;
    a.dtype = descr<T>();
    a.shape = std::move(shape);
    const std::int64_t n = element_count(a.shape);
    if (n < 0) throw Error(make_error(Errc::invalid_shape, "npy: bad shape ", shape_string(a.shape)));
    a.bytes.resize(static_cast<std::size_t>(n) * sizeof(T));
    if (n > 0) std::memcpy(a.bytes.data(), values, a.bytes.size());
    return a;
  }

 private:
  void check_type(const char* want) const {
    if (dtype != want)
      throw Error(make_error(Errc::io_error, "npy: array holds ", dtype_name(dtype), " ('", dtype, "'), not ",
                             dtype_name(want), " ('", want, "')"));
  }
};

namespace detail {

constexpr char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMagicSize = 6;

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

[[noreturn]] inline void fail(const std::string& path, const std::string& what) {
  throw Error(Errc::io_error, path + ": " + what);
}

inline std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

// The header dict, e.g. {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// (a Python literal). A strict little recursive-descent parser: anything that
// is not exactly this form is an error with the reason.
class HeaderParser {
 public:
  HeaderParser(const std::string& text, const std::string& path) : s_(text), path_(path) {}

  void parse(std::string* descr, bool* fortran, std::vector<std::int64_t>* shape) {
    bool have_descr = false, have_fortran = false, have_shape = false;
    skip_space();
    expect('{');
    for (;;) {
      skip_space();
      if (peek() == '}') break;
      const std::string key = parse_string("a key");
      skip_space();
      expect(':');
      skip_space();
      if (key == "descr") {
        check_once(&have_descr, key);
        if (peek() == '[') bad("unsupported dtype: structured arrays are not supported");
        *descr = parse_string("the dtype");
      } else if (key == "fortran_order") {
        check_once(&have_fortran, key);
        *fortran = parse_bool();
      } else if (key == "shape") {
        check_once(&have_shape, key);
        *shape = parse_shape();
      } else {
        malformed("unexpected key '" + key + "'");
      }
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      skip_space();
      if (peek() != '}') malformed("expected ',' or '}' after the value of '" + key + "'");
    }
    ++pos_;  // '}'
    skip_space();
    if (pos_ != s_.size()) malformed("unexpected text after the closing '}'");
    if (!have_descr) malformed("no 'descr' key");
    if (!have_fortran) malformed("no 'fortran_order' key");
    if (!have_shape) malformed("no 'shape' key");
  }

 private:
  [[noreturn]] void bad(const std::string& what) const { fail(path_, what); }
  [[noreturn]] void malformed(const std::string& what) const { fail(path_, "malformed .npy header: " + what); }

  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void skip_space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  void expect(char c) {
    if (peek() != c) malformed(std::string("expected '") + c + "'");
    ++pos_;
  }
  void check_once(bool* seen, const std::string& key) {
    if (*seen) malformed("key '" + key + "' appears twice");
    *seen = true;
  }

  std::string parse_string(const char* what) {
    const char quote = peek();
    if (quote != '\'' && quote != '"') malformed(std::string("expected a quoted string for ") + what);
    const std::size_t end = s_.find(quote, pos_ + 1);
    if (end == std::string::npos) malformed("unterminated string");
    std::string out = s_.substr(pos_ + 1, end - pos_ - 1);
    pos_ = end + 1;
    return out;
  }

  bool parse_bool() {
    if (s_.compare(pos_, 4, "True") == 0) {
      pos_ += 4;
      return true;
    }
    if (s_.compare(pos_, 5, "False") == 0) {
      pos_ += 5;
      return false;
    }
    malformed("'fortran_order' must be True or False");
  }

  // A tuple of non-negative integers: (), (5,), (2, 3). Python 2 files may
  // carry a long suffix (2L).
  std::vector<std::int64_t> parse_shape() {
    std::vector<std::int64_t> shape;
    expect('(');
    skip_space();
    while (peek() != ')') {
      shape.push_back(parse_dim());
      skip_space();
      if (peek() == ',') {
        ++pos_;
        skip_space();
      } else if (peek() != ')') {
        malformed("expected ',' or ')' in the shape");
      }
    }
    ++pos_;
    return shape;
  }

  std::int64_t parse_dim() {
    if (peek() == '-') bad("bad shape: negative dimension");
    if (peek() < '0' || peek() > '9') malformed("the shape must be a tuple of integers");
    std::int64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      const int digit = peek() - '0';
      if (v > (std::numeric_limits<std::int64_t>::max() - digit) / 10) bad("bad shape: dimension too large");
      v = v * 10 + digit;
      ++pos_;
    }
    if (peek() == 'L') ++pos_;
    return v;
  }

  const std::string& s_;
  const std::string& path_;
  std::size_t pos_ = 0;
};

// Normalises and checks a descr; returns the canonical form ('|' for 1-byte types).
inline std::string check_descr(std::string d, const std::string& path) {
  // Byte order is meaningless for one-byte types; '=' (native) is '<' on this host.
  const bool one_byte = d.size() == 3 && (d[1] == 'u' || d[1] == 'b') && d[2] == '1';
  if (one_byte && (d[0] == '<' || d[0] == '>' || d[0] == '=')) d[0] = '|';
  if (!d.empty() && d[0] == '=') d[0] = '<';
  if (itemsize(d) != 0) return d;
  if (!d.empty() && d[0] == '>' && itemsize("<" + d.substr(1)) != 0)
    fail(path, "big-endian dtype '" + d + "' is not supported (save it little-endian, e.g. with astype('<" +
                   d.substr(1) + "'))");
  fail(path, "unsupported dtype '" + d +
                 "' (supported: float32 '<f4', float16 '<f2', float64 '<f8', int32 '<i4', int64 '<i8', uint8 '|u1', "
                 "bool '|b1')");
}

inline std::string header_text(const std::string& dtype, const std::vector<std::int64_t>& shape) {
  std::string dict = "{'descr': '" + dtype + "', 'fortran_order': False, 'shape': (";
  for (std::size_t i = 0; i < shape.size(); ++i) dict += (i ? ", " : "") + std::to_string(shape[i]);
  dict += shape.size() == 1 ? ",), }" : "), }";
  return dict;
}

inline void write_all(std::FILE* f, const void* data, std::size_t n, const std::string& path) {
  if (n > 0 && std::fwrite(data, 1, n, f) != n) fail(path, "cannot write: " + errno_text(errno));
}

// Writes one file: magic, version, header padded to a multiple of 64 bytes, data.
inline void write_raw(const std::string& path, const std::string& dtype, const std::vector<std::int64_t>& shape,
                      const void* data, std::size_t nbytes) {
  const std::size_t size = itemsize(dtype);
  if (size == 0) fail(path, "cannot write unsupported dtype '" + dtype + "'");
  const std::int64_t n = element_count(shape);
  if (n < 0) fail(path, "cannot write bad shape " + shape_string(shape));
  if (static_cast<std::uint64_t>(n) * size != nbytes)
    fail(path, "cannot write: shape " + shape_string(shape) + " of " + dtype_name(dtype) + " needs " +
                   std::to_string(static_cast<std::uint64_t>(n) * size) + " bytes, got " + std::to_string(nbytes));

  std::string dict = header_text(dtype, shape);
  // Version 1.0 holds headers up to 65535 bytes; 2.0 has a 4-byte length.
  auto padded_end = [&](std::size_t prefix) { return (prefix + dict.size() + 1 + 63) / 64 * 64; };
  const bool v1 = padded_end(kMagicSize + 4) - (kMagicSize + 4) <= 65535;
  const std::size_t prefix = kMagicSize + 2 + (v1 ? 2 : 4);
  const std::size_t total = padded_end(prefix);
  dict.append(total - prefix - dict.size() - 1, ' ');
  dict += '\n';

  std::string head(kMagic, kMagicSize);
  head += static_cast<char>(v1 ? 1 : 2);
  head += '\0';
  const std::uint32_t len = static_cast<std::uint32_t>(dict.size());
  for (std::size_t i = 0; i < (v1 ? 2u : 4u); ++i) head += static_cast<char>((len >> (8 * i)) & 0xffu);
  head += dict;

  File f(std::fopen(path.c_str(), "wb"));
  if (!f) fail(path, "cannot create: " + errno_text(errno));
  write_all(f.get(), head.data(), head.size(), path);
  write_all(f.get(), data, nbytes, path);
  // A full disk often shows only when the buffer is flushed.
  if (std::fflush(f.get()) != 0) fail(path, "cannot write: " + errno_text(errno));
  if (std::fclose(f.release()) != 0) fail(path, "cannot close: " + errno_text(errno));
}

}  // namespace detail

// Reads a whole .npy file. Throws flashcache::Error (Errc::io_error) with a
// message "<path>: <problem>" for anything it cannot read exactly.
inline Array read(const std::string& path) {
  using detail::fail;
  detail::File f(std::fopen(path.c_str(), "rb"));
  if (!f) fail(path, "cannot open: " + detail::errno_text(errno));
  // fopen() succeeds on a directory too; the first fread() then fails with EISDIR.
  if (std::fseek(f.get(), 0, SEEK_END) != 0) fail(path, "cannot read: " + detail::errno_text(errno));
  const long end = std::ftell(f.get());
  if (end < 0) fail(path, "cannot read: " + detail::errno_text(errno));
  std::rewind(f.get());
  const auto file_size = static_cast<std::uint64_t>(end);

  auto read_exact = [&](void* dst, std::size_t n) {
    if (n > 0 && std::fread(dst, 1, n, f.get()) != n)
      fail(path, std::ferror(f.get()) ? "cannot read: " + detail::errno_text(errno) : "unexpected end of file");
  };

  // Magic and version: 8 bytes.
  char start[8] = {};
  const std::size_t got = std::fread(start, 1, sizeof start, f.get());
  if (std::ferror(f.get())) fail(path, "cannot read: " + detail::errno_text(errno));
  if (got == 0) fail(path, "not a .npy file (empty)");
  if (std::memcmp(start, detail::kMagic, std::min(got, detail::kMagicSize)) != 0)
    fail(path, "not a .npy file (wrong magic)");
  if (got < sizeof start) fail(path, "truncated header (" + std::to_string(file_size) + " bytes)");
  const int major = static_cast<unsigned char>(start[6]), minor = static_cast<unsigned char>(start[7]);
  if (major < 1 || major > 3 || minor != 0)
    fail(path, "unsupported .npy format version " + std::to_string(major) + "." + std::to_string(minor));

  // Header length: 2 bytes in 1.0, 4 bytes in 2.0 and 3.0, little-endian.
  const std::size_t len_size = major == 1 ? 2 : 4;
  unsigned char len_bytes[4] = {};
  if (file_size < 8 + len_size) fail(path, "truncated header (" + std::to_string(file_size) + " bytes)");
  read_exact(len_bytes, len_size);
  std::uint64_t header_len = 0;
  for (std::size_t i = 0; i < len_size; ++i) header_len |= static_cast<std::uint64_t>(len_bytes[i]) << (8 * i);
  const std::uint64_t data_offset = 8 + len_size + header_len;
  if (data_offset > file_size)
    fail(path, "truncated header (needs " + std::to_string(data_offset) + " bytes, file has " +
                   std::to_string(file_size) + ")");
  std::string header(static_cast<std::size_t>(header_len), '\0');
  read_exact(header.data(), header.size());
  if (header.find('\0') != std::string::npos) fail(path, "malformed .npy header: contains a NUL byte");

  Array a;
  bool fortran = false;
  detail::HeaderParser(header, path).parse(&a.dtype, &fortran, &a.shape);
  a.dtype = detail::check_descr(a.dtype, path);
  if (fortran) fail(path, "Fortran-order arrays are not supported (save a C-order copy, e.g. np.ascontiguousarray)");
  // Sizes are checked on the header alone, before anything is allocated.
  const std::int64_t count = a.size();
  const std::uint64_t size = itemsize(a.dtype);
  if (count < 0)
    fail(path, "bad shape " + shape_string(a.shape) + ": too many elements (the element count overflows 64 bits)");
  if (count > kMaxElements)
    fail(path, "bad shape " + shape_string(a.shape) + ": too many elements (" + std::to_string(count) +
                   ", more than the limit of 2^31 - 1 per array)");
  const std::uint64_t nbytes = static_cast<std::uint64_t>(count) * size;
  const std::uint64_t available = file_size - data_offset;
  if (available < nbytes)
    fail(path, "truncated data: shape " + shape_string(a.shape) + " of " + dtype_name(a.dtype) + " needs " +
                   std::to_string(nbytes) + " bytes of data, the file has " + std::to_string(available));
  if (available > nbytes)
    fail(path, std::to_string(available - nbytes) + " unexpected bytes after the data (shape " + shape_string(a.shape) +
                   " of " + dtype_name(a.dtype) + ")");
  if (nbytes > std::numeric_limits<std::size_t>::max()) fail(path, "too large for this platform");
  a.bytes.resize(static_cast<std::size_t>(nbytes));
  read_exact(a.bytes.data(), a.bytes.size());
  // NumPy reads any nonzero byte as True; a C++ bool must hold exactly 0 or 1.
  if (a.dtype == "|b1")
    for (char& b : a.bytes) b = b != 0;
  return a;
}

// Writes `a` as a version 1.0 file (2.0 if the header needs it).
inline void write(const std::string& path, const Array& a) {
  detail::write_raw(path, a.dtype, a.shape, a.bytes.data(), a.bytes.size());
}

// Writes product(shape) elements of `values` without copying them first.
template <class T>
void write(const std::string& path, const std::vector<std::int64_t>& shape, const T* values) {
  const std::int64_t n = element_count(shape);
  if (n < 0) detail::fail(path, "cannot write bad shape " + shape_string(shape));
  detail::write_raw(path, descr<T>(), shape, values, static_cast<std::size_t>(n) * sizeof(T));
}

}  // namespace flashcache::npy
