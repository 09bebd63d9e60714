// fuzz_npy: the .npy reader on arbitrary bytes. It must either refuse the file
// with a flashcache::Error (io_error) naming the file, or return an array
// whose bytes match its shape and dtype and that survives a write/read round trip.
#include <cstdint>
#include <cstring>
#include <string>

#include "fuzz_util.hpp"
#include "npy/npy.hpp"

namespace fz = flashcache::fuzz;
namespace npy = flashcache::npy;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = (fz::ScratchDir::path() / "in.npy").string();
  fz::write_file(path, reinterpret_cast<const char*>(data), size);
  npy::Array a;
  try {
    a = npy::read(path);
  } catch (const flashcache::Error& e) {
    const std::string msg = e.what();
    FUZZ_CHECK(e.code() == flashcache::Errc::io_error, msg);
    FUZZ_CHECK(msg.find(path + ": ") != std::string::npos, msg);
    FUZZ_CHECK(msg.size() > path.size() + 2 + std::strlen("flashcache: "), msg);
    return 0;
  }
  // Accepted: the sizes must agree, within the reader's limit.
  const std::int64_t n = a.size();
  FUZZ_CHECK(n >= 0 && n <= npy::kMaxElements, npy::shape_string(a.shape));
  const std::size_t item = npy::itemsize(a.dtype);
  FUZZ_CHECK(item != 0, a.dtype);
  FUZZ_CHECK(a.bytes.size() == static_cast<std::size_t>(n) * item, npy::shape_string(a.shape));
  if (a.is<bool>())
    for (char b : a.bytes) FUZZ_CHECK(b == 0 || b == 1, "bool byte not normalised");
  // What we read we can write, and read back the same.
  const std::string copy = (fz::ScratchDir::path() / "copy.npy").string();
  npy::write(copy, a);
  const npy::Array b = npy::read(copy);
  FUZZ_CHECK(b.dtype == a.dtype && b.shape == a.shape && b.bytes == a.bytes, "round trip changed the array");
  return 0;
}
