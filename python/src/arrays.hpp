#pragma once
// Arrays across the door: numpy arrays and torch tensors (DLPack) in, library
// views over their memory out, and owning results back as arrays of the
// caller's framework. Nothing is copied on the way in: a view takes the
// array's pointer and strides, and what the library cannot read that way is
// refused by name.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <flashcache/error.hpp>
#include <flashcache/types.hpp>
#include <flashcache/view.hpp>

namespace flashcache::python {

namespace nb = nanobind;

// Any array or tensor, on any device, of any dtype: checked here, never converted by nanobind.
using AnyArray = nb::ndarray<nb::ro>;

// The two cache layouts the library knows (view.hpp).
enum class Layout { hnd, nhd };

// Which framework a result is handed back in: the caller's.
enum class Framework { numpy, torch };

// The failures a binding raises itself; the library's own Status becomes flashcache.Error
// through flashcache::throw_if_error.
[[noreturn]] inline void type_error(const std::string& what) { throw nb::type_error(what.c_str()); }
[[noreturn]] inline void value_error(const std::string& what) { throw nb::value_error(what.c_str()); }

inline std::string dtype_name(nb::dlpack::dtype t) {
  using code = nb::dlpack::dtype_code;
  const char* kind = t.code == static_cast<std::uint8_t>(code::Float)    ? "float"
                     : t.code == static_cast<std::uint8_t>(code::Bfloat) ? "bfloat"
                     : t.code == static_cast<std::uint8_t>(code::Int)    ? "int"
                     : t.code == static_cast<std::uint8_t>(code::UInt)   ? "uint"
                     : t.code == static_cast<std::uint8_t>(code::Bool)   ? "bool"
                                                                         : "other";
  return std::string(kind) + std::to_string(t.bits) + (t.lanes != 1 ? "x" + std::to_string(t.lanes) : "");
}

// The element type of a K or V array, or a TypeError naming the one given.
inline DType kv_dtype(const AnyArray& a, const char* name) {
  const nb::dlpack::dtype t = a.dtype();
  if (t == nb::dtype<float>()) return DType::f32;
  if (t.lanes == 1 && t.bits == 16 && t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float))
    return DType::f16;
  if (t.lanes == 1 && t.bits == 16 && t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat))
    return DType::bf16;
  type_error(std::string(name) + ": dtype " + dtype_name(t) + " is not float32, float16 or bfloat16");
}

inline bool on_cpu(const AnyArray& a) { return a.device_type() == nb::device::cpu::value; }

inline void require_cpu(const AnyArray& a, const char* name) {
  if (!on_cpu(a))
    value_error(std::string(name) +
                ": the array is on a device; this call reads host memory (CUDA tensors: flashcache.compress_model "
                "and flashcache.cuda, in a build with the CUDA door; otherwise pass .cpu())");
}

template <class Array>
std::string shape_string(const Array& a) {
  std::string s = "(";
  for (std::size_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

// One layer's K or V as a view: 3-D in either layout, the head dim contiguous,
// any positive head and token strides (a slice of a bigger cache is fine).
template <class T>
KVView<const T> kv_view(const AnyArray& a, Layout layout, const char* name) {
  require_cpu(a, name);
  if (a.ndim() != 3)
    value_error(std::string(name) + ": expected 3 dimensions " +
                (layout == Layout::hnd ? "[heads, tokens, head_dim]" : "[tokens, heads, head_dim]") + ", got shape " +
                shape_string(a));
  const auto h = layout == Layout::hnd ? 0 : 1, n = layout == Layout::hnd ? 1 : 0;
  const std::int64_t dim = static_cast<std::int64_t>(a.shape(2));
  if (dim > 1 && a.stride(2) != 1)
    value_error(std::string(name) + ": the head dim must be contiguous (stride 1), its stride is " +
                std::to_string(a.stride(2)) + " elements; pass a contiguous copy (.copy() / .contiguous())");
  return KVView<const T>(static_cast<const T*>(a.data()), static_cast<std::int64_t>(a.shape(h)),
                         static_cast<std::int64_t>(a.shape(n)), dim, a.stride(h), a.stride(n));
}

// A 1-D or 2-D array of a fixed element type, contiguous; its element count is checked by the caller.
template <class T>
const T* dense_input(const AnyArray& a, std::size_t ndim, const char* name, const char* want) {
  require_cpu(a, name);
  if (a.dtype() != nb::dtype<T>()) type_error(std::string(name) + ": dtype " + dtype_name(a.dtype()) + ", expected " + want);
  if (a.ndim() != ndim)
    value_error(std::string(name) + ": expected " + std::to_string(ndim) + " dimension(s), got shape " + shape_string(a));
  std::int64_t expect = 1;
  for (std::size_t i = ndim; i-- > 0;) {
    if (a.shape(i) > 1 && a.stride(i) != expect)
      value_error(std::string(name) + ": must be C-contiguous (pass np.ascontiguousarray / .contiguous())");
    expect *= static_cast<std::int64_t>(a.shape(i));
  }
  return static_cast<const T*>(a.data());
}

template <class T>
nb::dlpack::dtype dlpack_dtype() {
  if constexpr (std::is_same_v<T, half_t>)
    return {static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float), 16, 1};
  else if constexpr (std::is_same_v<T, bfloat16_t>)
    return {static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1};
  else
    return nb::dtype<T>();
}

// Hands an owning vector to Python as an array of `shape` in the caller's
// framework, without a copy: the vector moves to the heap and a capsule frees it
// when the last array over it goes. bfloat16 has no numpy dtype: it comes back
// as a torch tensor, and a numpy caller with bfloat16 data had no numpy array to begin with.
template <class T>
nb::object to_array(std::vector<T>&& data, std::initializer_list<std::size_t> shape, Framework fw) {
  auto* owned = new std::vector<T>(std::move(data));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  const std::vector<std::size_t> dims(shape);
  if (fw == Framework::torch)
    return nb::cast(nb::ndarray<nb::pytorch>(owned->data(), dims.size(), dims.data(), owner, nullptr,
                                             dlpack_dtype<T>()));
  return nb::cast(nb::ndarray<nb::numpy>(owned->data(), dims.size(), dims.data(), owner, nullptr, dlpack_dtype<T>()));
}

// Calls f with a null pointer of the element type of `t`, for dispatch over the three KV dtypes.
template <class F>
decltype(auto) with_dtype(DType t, F&& f) {
  switch (t) {
    case DType::f16:
      return f(static_cast<half_t*>(nullptr));
    case DType::bf16:
      return f(static_cast<bfloat16_t*>(nullptr));
    case DType::f32:
      break;
  }
  return f(static_cast<float*>(nullptr));
}

}  // namespace flashcache::python
