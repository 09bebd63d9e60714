#pragma once
// A strict reader for GGUF files (versions 2 and 3): metadata of every type,
// tensor infos, and tensors F32, F16, BF16, Q8_0, Q4_0, Q4_1 dequantised to float.
//
//   engine::GgufFile f = engine::load_gguf("model.gguf");
//   std::vector<float> w = f.to_float(f.tensor("blk.0.attn_q.weight"));
//
// Every count and length is checked against the bytes that are left before
// anything is allocated, so a hostile file gets a GgufError naming the problem,
// never a crash or a huge allocation. parse_gguf() works on a byte span (the
// fuzzer's entry point); the span must outlive the returned file.
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace engine {

enum class GgufErrc {
  truncated,          // the file ends inside a field
  bad_magic,          // not "GGUF"
  unknown_version,    // only 2 and 3 are read
  unknown_value_type, // a metadata type id outside 0..12
  unknown_tensor_type,
  absurd_count,       // a count or length that cannot fit in the bytes left
  bad_alignment,      // general.alignment not a power of two, or a misaligned offset
  bad_shape,          // dims count, zero dims, overflow, rows not whole blocks
  tensor_out_of_range,// data past the end of the file
  duplicate_name,     // a key or tensor name seen twice
  missing,            // a key or tensor the caller asked for is absent or of another type
  io_error,
};

inline const char* to_string(GgufErrc e) {
  switch (e) {
    case GgufErrc::truncated: return "truncated";
    case GgufErrc::bad_magic: return "bad_magic";
    case GgufErrc::unknown_version: return "unknown_version";
    case GgufErrc::unknown_value_type: return "unknown_value_type";
    case GgufErrc::unknown_tensor_type: return "unknown_tensor_type";
    case GgufErrc::absurd_count: return "absurd_count";
    case GgufErrc::bad_alignment: return "bad_alignment";
    case GgufErrc::bad_shape: return "bad_shape";
    case GgufErrc::tensor_out_of_range: return "tensor_out_of_range";
    case GgufErrc::duplicate_name: return "duplicate_name";
    case GgufErrc::missing: return "missing";
    case GgufErrc::io_error: return "io_error";
  }
  return "unknown";
}

class GgufError : public std::runtime_error {
 public:
  GgufError(GgufErrc code, const std::string& message)
      : std::runtime_error(std::string("gguf ") + to_string(code) + ": " + message), code_(code) {}
  GgufErrc code() const { return code_; }

 private:
  GgufErrc code_;
};

// Metadata value types, as numbered in the GGUF specification.
enum class GgufType : std::uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7,
  string = 8, array = 9, u64 = 10, i64 = 11, f64 = 12,
};

// Tensor element types we read (ggml numbering).
enum class TensorType : std::uint32_t { f32 = 0, f16 = 1, q4_0 = 2, q4_1 = 3, q8_0 = 8, bf16 = 30 };

struct MetaValue {
  GgufType type = GgufType::u8;
  GgufType elem = GgufType::u8;  // arrays: the element type
  std::int64_t i = 0;            // signed and unsigned integers, bool
  std::uint64_t u = 0;
  double f = 0;
  std::string s;
  // Arrays, one vector by element kind (compact, so a hostile count costs at most 12x its bytes):
  std::vector<std::int64_t> ints;      // integer and bool elements (u64 above 2^63 wrap)
  std::vector<double> floats;          // f32, f64 elements
  std::vector<std::string> strings;    // string elements
  std::vector<MetaValue> items;        // nested arrays
  std::size_t size() const { return ints.size() + floats.size() + strings.size() + items.size(); }

  bool is_integer() const {
    return type != GgufType::f32 && type != GgufType::f64 && type != GgufType::string && type != GgufType::array;
  }
};

struct TensorInfo {
  std::string name;
  std::vector<std::uint64_t> dims;  // dims[0] varies fastest (a row)
  TensorType type = TensorType::f32;
  std::uint64_t offset = 0;         // from the start of the data section
  std::uint64_t elements = 0;
  std::uint64_t bytes = 0;
  std::uint64_t rows() const { return dims.empty() ? 0 : elements / dims[0]; }
};

namespace gguf_detail {

constexpr std::uint64_t kMaxDims = 4;
constexpr int kMaxArrayDepth = 8;

struct TypeLayout {
  std::uint64_t block;  // elements per block
  std::uint64_t bytes;  // bytes per block
};

inline bool tensor_layout(std::uint32_t type, TypeLayout* out) {
  switch (static_cast<TensorType>(type)) {
    case TensorType::f32: *out = {1, 4}; return true;
    case TensorType::f16: *out = {1, 2}; return true;
    case TensorType::bf16: *out = {1, 2}; return true;
    case TensorType::q8_0: *out = {32, 34}; return true;
    case TensorType::q4_0: *out = {32, 18}; return true;
    case TensorType::q4_1: *out = {32, 20}; return true;
  }
  return false;
}

inline float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    exp = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float bf16_to_float(std::uint16_t b) {
  const std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// Bounds-checked little-endian cursor.
class Cursor {
 public:
  Cursor(const std::uint8_t* p, std::size_t n) : p_(p), n_(n) {}
  std::size_t pos() const { return pos_; }
  std::size_t left() const { return n_ - pos_; }

  void need(std::uint64_t bytes, const char* what) const {
    if (bytes > left())
      throw GgufError(GgufErrc::truncated, cat(what, " needs ", bytes, " bytes at offset ", pos_, ", ", left(),
                                               " left"));
  }
  template <class T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));  // the host is little-endian, as GGUF is
    pos_ += sizeof(T);
    return v;
  }
  std::string string(const char* what) {
    const auto len = read<std::uint64_t>(what);
    if (len > left())
      throw GgufError(GgufErrc::absurd_count,
                      cat(what, ": string length ", len, " at offset ", pos_ - 8, " exceeds the ", left(),
                          " bytes left"));
    std::string s(reinterpret_cast<const char*>(p_ + pos_), static_cast<std::size_t>(len));
    pos_ += static_cast<std::size_t>(len);
    return s;
  }

 private:
  const std::uint8_t* p_;
  std::size_t n_;
  std::size_t pos_ = 0;
};

// Smallest encoding of one value of `type`, so counts can be checked before allocating.
inline std::uint64_t min_value_bytes(GgufType type) {
  switch (type) {
    case GgufType::u8: case GgufType::i8: case GgufType::boolean: return 1;
    case GgufType::u16: case GgufType::i16: return 2;
    case GgufType::u32: case GgufType::i32: case GgufType::f32: return 4;
    case GgufType::u64: case GgufType::i64: case GgufType::f64: case GgufType::string: return 8;
    case GgufType::array: return 12;
  }
  return 1;
}

inline GgufType value_type(std::uint32_t raw, const std::string& key) {
  if (raw > 12)
    throw GgufError(GgufErrc::unknown_value_type, cat("key '", key, "' has value type ", raw, " (known: 0..12)"));
  return static_cast<GgufType>(raw);
}

inline MetaValue read_value(Cursor& c, GgufType type, const std::string& key, int depth) {
  MetaValue v;
  v.type = type;
  switch (type) {
    case GgufType::u8: v.u = c.read<std::uint8_t>("u8"); v.i = static_cast<std::int64_t>(v.u); break;
    case GgufType::i8: v.i = c.read<std::int8_t>("i8"); break;
    case GgufType::u16: v.u = c.read<std::uint16_t>("u16"); v.i = static_cast<std::int64_t>(v.u); break;
    case GgufType::i16: v.i = c.read<std::int16_t>("i16"); break;
    case GgufType::u32: v.u = c.read<std::uint32_t>("u32"); v.i = static_cast<std::int64_t>(v.u); break;
    case GgufType::i32: v.i = c.read<std::int32_t>("i32"); break;
    case GgufType::u64: v.u = c.read<std::uint64_t>("u64"); v.i = static_cast<std::int64_t>(v.u); break;
    case GgufType::i64: v.i = c.read<std::int64_t>("i64"); break;
    case GgufType::f32: v.f = c.read<float>("f32"); break;
    case GgufType::f64: v.f = c.read<double>("f64"); break;
    case GgufType::boolean: {
      const auto b = c.read<std::uint8_t>("bool");
      if (b > 1) throw GgufError(GgufErrc::unknown_value_type, cat("key '", key, "': bool byte ", int(b)));
      v.i = b;
      break;
    }
    case GgufType::string: v.s = c.string("string value"); break;
    case GgufType::array: {
      if (depth >= kMaxArrayDepth)
        throw GgufError(GgufErrc::absurd_count, cat("key '", key, "': arrays nested deeper than ", kMaxArrayDepth));
      v.elem = value_type(c.read<std::uint32_t>("array type"), key);
      const auto count = c.read<std::uint64_t>("array count");
      if (count > c.left() / min_value_bytes(v.elem))
        throw GgufError(GgufErrc::absurd_count, cat("key '", key, "': array of ", count, " elements cannot fit in the ",
                                                    c.left(), " bytes left"));
      const auto n = static_cast<std::size_t>(count);
      if (v.elem == GgufType::array) {
        v.items.reserve(n);
        for (std::size_t j = 0; j < n; ++j) v.items.push_back(read_value(c, v.elem, key, depth + 1));
      } else if (v.elem == GgufType::string) {
        v.strings.reserve(n);
        for (std::size_t j = 0; j < n; ++j) v.strings.push_back(c.string("string element"));
      } else if (v.elem == GgufType::f32 || v.elem == GgufType::f64) {
        v.floats.reserve(n);
        for (std::size_t j = 0; j < n; ++j) v.floats.push_back(read_value(c, v.elem, key, depth + 1).f);
      } else {
        v.ints.reserve(n);
        for (std::size_t j = 0; j < n; ++j) v.ints.push_back(read_value(c, v.elem, key, depth + 1).i);
      }
      break;
    }
  }
  return v;
}

}  // namespace gguf_detail

class GgufFile {
 public:
  std::uint32_t version = 0;
  std::uint64_t alignment = 32;
  std::uint64_t data_offset = 0;  // start of the tensor data section in the file
  std::vector<std::pair<std::string, MetaValue>> metadata;  // file order
  std::vector<TensorInfo> tensors;                          // file order

  const MetaValue* find(const std::string& key) const {
    auto it = meta_index_.find(key);
    return it == meta_index_.end() ? nullptr : &metadata[it->second].second;
  }
  const MetaValue& get(const std::string& key) const {
    const MetaValue* v = find(key);
    if (v == nullptr) throw GgufError(GgufErrc::missing, "no metadata key '" + key + "'");
    return *v;
  }
  std::int64_t get_int(const std::string& key) const {
    const MetaValue& v = get(key);
    if (!v.is_integer()) throw GgufError(GgufErrc::missing, "metadata key '" + key + "' is not an integer");
    return v.i;
  }
  double get_float(const std::string& key) const {
    const MetaValue& v = get(key);
    if (v.type == GgufType::f32 || v.type == GgufType::f64) return v.f;
    if (v.is_integer()) return static_cast<double>(v.i);
    throw GgufError(GgufErrc::missing, "metadata key '" + key + "' is not a number");
  }
  const std::string& get_string(const std::string& key) const {
    const MetaValue& v = get(key);
    if (v.type != GgufType::string) throw GgufError(GgufErrc::missing, "metadata key '" + key + "' is not a string");
    return v.s;
  }
  const std::vector<std::string>& get_strings(const std::string& key) const {
    const MetaValue& v = get(key);
    if (v.type != GgufType::array || v.elem != GgufType::string)
      throw GgufError(GgufErrc::missing, "metadata key '" + key + "' is not an array of strings");
    return v.strings;
  }
  const std::vector<std::int64_t>& get_ints(const std::string& key) const {
    const MetaValue& v = get(key);
    if (v.type != GgufType::array || v.elem == GgufType::string || v.elem == GgufType::array ||
        v.elem == GgufType::f32 || v.elem == GgufType::f64)
      throw GgufError(GgufErrc::missing, "metadata key '" + key + "' is not an array of integers");
    return v.ints;
  }

  const TensorInfo* find_tensor(const std::string& name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors[it->second];
  }
  const TensorInfo& tensor(const std::string& name) const {
    const TensorInfo* t = find_tensor(name);
    if (t == nullptr) throw GgufError(GgufErrc::missing, "no tensor '" + name + "'");
    return *t;
  }

  // Dequantises one tensor into out[0 .. t.elements).
  void to_float(const TensorInfo& t, float* out) const;
  std::vector<float> to_float(const TensorInfo& t) const {
    std::vector<float> out(static_cast<std::size_t>(t.elements));
    to_float(t, out.data());
    return out;
  }

 private:
  friend GgufFile parse_gguf(const std::uint8_t* bytes, std::size_t size);
  friend GgufFile load_gguf(const std::string& path);
  const std::uint8_t* bytes_ = nullptr;
  std::size_t size_ = 0;
  std::shared_ptr<std::vector<std::uint8_t>> storage_;  // set by load_gguf
  std::map<std::string, std::size_t> meta_index_, tensor_index_;
};

// Parses and validates a whole GGUF image. Throws GgufError.
inline GgufFile parse_gguf(const std::uint8_t* bytes, std::size_t size) {
  using namespace gguf_detail;
  if (bytes == nullptr && size != 0) throw GgufError(GgufErrc::io_error, "null buffer");
  Cursor c(bytes, size);
  GgufFile f;
  f.bytes_ = bytes;
  f.size_ = size;
  c.need(4, "magic");
  if (std::memcmp(bytes, "GGUF", 4) != 0) throw GgufError(GgufErrc::bad_magic, "the file does not start with 'GGUF'");
  c.read<std::uint32_t>("magic");
  f.version = c.read<std::uint32_t>("version");
  if (f.version != 2 && f.version != 3)
    throw GgufError(GgufErrc::unknown_version, cat("version ", f.version, " (this reader knows 2 and 3)"));
  const auto n_tensors = c.read<std::uint64_t>("tensor count");
  const auto n_kv = c.read<std::uint64_t>("metadata count");
  // Each metadata entry takes at least 8 (key length) + 4 (type) + 1 bytes; each tensor info 8 + 4 + 8 + 4 + 8.
  if (n_kv > c.left() / 13)
    throw GgufError(GgufErrc::absurd_count, cat(n_kv, " metadata entries cannot fit in ", c.left(), " bytes"));
  if (n_tensors > c.left() / 32)
    throw GgufError(GgufErrc::absurd_count, cat(n_tensors, " tensor infos cannot fit in ", c.left(), " bytes"));

  f.metadata.reserve(static_cast<std::size_t>(n_kv));
  for (std::uint64_t j = 0; j < n_kv; ++j) {
    std::string key = c.string("metadata key");
    const GgufType type = value_type(c.read<std::uint32_t>("value type"), key);
    MetaValue v = read_value(c, type, key, 0);
    if (!f.meta_index_.emplace(key, f.metadata.size()).second)
      throw GgufError(GgufErrc::duplicate_name, "metadata key '" + key + "' appears twice");
    f.metadata.emplace_back(std::move(key), std::move(v));
  }
  if (const MetaValue* a = f.find("general.alignment")) {
    if (!a->is_integer() || a->i <= 0 || (a->i & (a->i - 1)) != 0)
      throw GgufError(GgufErrc::bad_alignment, cat("general.alignment ", a->i, " is not a positive power of two"));
    f.alignment = static_cast<std::uint64_t>(a->i);
  }

  f.tensors.reserve(static_cast<std::size_t>(n_tensors));
  for (std::uint64_t j = 0; j < n_tensors; ++j) {
    TensorInfo t;
    t.name = c.string("tensor name");
    const auto n_dims = c.read<std::uint32_t>("tensor dims");
    if (n_dims == 0 || n_dims > kMaxDims)
      throw GgufError(GgufErrc::bad_shape, cat("tensor '", t.name, "' has ", n_dims, " dims (1..4)"));
    t.elements = 1;
    for (std::uint32_t d = 0; d < n_dims; ++d) {
      const auto n = c.read<std::uint64_t>("tensor dim");
      if (n == 0 || n > (std::uint64_t{1} << 62) / t.elements)
        throw GgufError(GgufErrc::bad_shape, cat("tensor '", t.name, "' dim ", d, " = ", n, " is zero or overflows"));
      t.elements *= n;
      t.dims.push_back(n);
    }
    const auto raw_type = c.read<std::uint32_t>("tensor type");
    TypeLayout layout{};
    if (!tensor_layout(raw_type, &layout))
      throw GgufError(GgufErrc::unknown_tensor_type,
                      cat("tensor '", t.name, "' has type ", raw_type, " (read: F32, F16, BF16, Q8_0, Q4_0, Q4_1)"));
    t.type = static_cast<TensorType>(raw_type);
    if (t.dims[0] % layout.block != 0)
      throw GgufError(GgufErrc::bad_shape, cat("tensor '", t.name, "': row of ", t.dims[0],
                                               " elements is not a whole number of ", layout.block, "-blocks"));
    t.bytes = t.elements / layout.block * layout.bytes;
    t.offset = c.read<std::uint64_t>("tensor offset");
    if (t.offset % f.alignment != 0)
      throw GgufError(GgufErrc::bad_alignment,
                      cat("tensor '", t.name, "' offset ", t.offset, " is not a multiple of ", f.alignment));
    if (!f.tensor_index_.emplace(t.name, f.tensors.size()).second)
      throw GgufError(GgufErrc::duplicate_name, "tensor '" + t.name + "' appears twice");
    f.tensors.push_back(std::move(t));
  }

  const std::uint64_t header_end = c.pos();
  f.data_offset = (header_end + f.alignment - 1) / f.alignment * f.alignment;
  const std::uint64_t data_bytes = f.data_offset <= size ? size - f.data_offset : 0;
  for (const TensorInfo& t : f.tensors)
    if (f.data_offset > size || t.offset > data_bytes || t.bytes > data_bytes - t.offset)
      throw GgufError(GgufErrc::tensor_out_of_range,
                      cat("tensor '", t.name, "' spans data bytes [", t.offset, ", ", t.offset + t.bytes,
                          ") but the data section holds ", data_bytes));
  return f;
}

inline void GgufFile::to_float(const TensorInfo& t, float* out) const {
  using gguf_detail::bf16_to_float;
  using gguf_detail::half_to_float;
  const std::uint8_t* p = bytes_ + data_offset + t.offset;
  auto u16 = [](const std::uint8_t* q) { return static_cast<std::uint16_t>(q[0] | (q[1] << 8)); };
  const std::uint64_t n = t.elements;
  switch (t.type) {
    case TensorType::f32:
      std::memcpy(out, p, static_cast<std::size_t>(n * 4));
      return;
    case TensorType::f16:
      for (std::uint64_t j = 0; j < n; ++j) out[j] = half_to_float(u16(p + 2 * j));
      return;
    case TensorType::bf16:
      for (std::uint64_t j = 0; j < n; ++j) out[j] = bf16_to_float(u16(p + 2 * j));
      return;
    case TensorType::q8_0:  // per block: f16 scale, 32 x int8
      for (std::uint64_t b = 0; b < n / 32; ++b, p += 34) {
        const float d = half_to_float(u16(p));
        for (int j = 0; j < 32; ++j) out[b * 32 + j] = d * static_cast<float>(static_cast<std::int8_t>(p[2 + j]));
      }
      return;
    case TensorType::q4_0:  // f16 scale, 16 bytes: element j low nibble, j + 16 high nibble, value (q - 8) * d
      for (std::uint64_t b = 0; b < n / 32; ++b, p += 18) {
        const float d = half_to_float(u16(p));
        for (int j = 0; j < 16; ++j) {
          out[b * 32 + j] = static_cast<float>((p[2 + j] & 0x0f) - 8) * d;
          out[b * 32 + j + 16] = static_cast<float>((p[2 + j] >> 4) - 8) * d;
        }
      }
      return;
    case TensorType::q4_1:  // f16 scale, f16 min, 16 bytes: value q * d + m
      for (std::uint64_t b = 0; b < n / 32; ++b, p += 20) {
        const float d = half_to_float(u16(p)), m = half_to_float(u16(p + 2));
        for (int j = 0; j < 16; ++j) {
          out[b * 32 + j] = static_cast<float>(p[4 + j] & 0x0f) * d + m;
          out[b * 32 + j + 16] = static_cast<float>(p[4 + j] >> 4) * d + m;
        }
      }
      return;
  }
}

// Reads a file into memory and parses it; the returned file owns the bytes.
inline GgufFile load_gguf(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw GgufError(GgufErrc::io_error, "cannot open '" + path + "'");
  const std::streamoff size = in.tellg();
  if (size < 0) throw GgufError(GgufErrc::io_error, "cannot size '" + path + "'");
  auto storage = std::make_shared<std::vector<std::uint8_t>>(static_cast<std::size_t>(size));
  in.seekg(0);
  if (size > 0 && !in.read(reinterpret_cast<char*>(storage->data()), size))
    throw GgufError(GgufErrc::io_error, "cannot read '" + path + "'");
  GgufFile f = parse_gguf(storage->data(), storage->size());
  f.storage_ = std::move(storage);
  return f;
}

}  // namespace engine
