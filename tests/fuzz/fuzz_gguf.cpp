// fuzz_gguf: the engine's GGUF reader (tools/engine_runtime/gguf.hpp) and its
// byte-level BPE tokenizer (tokenizer.hpp) on arbitrary bytes. parse_gguf()
// must refuse a bad file with a GgufError, or return tensors that lie inside
// the bytes (every one is dequantised here, so ASan sees any read past them);
// a tokenizer built from the metadata must encode and decode without crashing
// or hanging, or refuse with std::invalid_argument / GgufError.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "fuzz_util.hpp"
#include "engine_runtime/gguf.hpp"
#include "engine_runtime/tokenizer.hpp"

namespace {

constexpr std::uint64_t kMaxDequantised = 1 << 16;  // elements per input, to stay fast

void check_message(const std::exception& e) { FUZZ_CHECK(std::string(e.what()).size() > 0, "empty error message"); }

void tokenize(const engine::GgufFile& f) {
  if (f.find("tokenizer.ggml.model") == nullptr) return;
  try {
    const engine::Tokenizer tok(f);
    static const char kBadUtf8[] = "\x00\xff\xfe bad utf8 \xc0\x80";
    const std::string texts[] = {"Hello, world! 123 don't", tok.chat("What is 2+2?\n\xc3\xa9\xe2\x82\xac"),
                                 std::string(kBadUtf8, sizeof kBadUtf8 - 1)};
    for (const std::string& text : texts) {
      const std::vector<int> ids = tok.encode(text);
      for (int id : ids) FUZZ_CHECK(id >= 0 && id < tok.vocab_size(), "token id " + std::to_string(id));
      (void)tok.decode(ids);
    }
  } catch (const engine::GgufError& e) {
    check_message(e);
  } catch (const std::invalid_argument& e) {
    check_message(e);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // A copy of exactly `size` bytes, so that ASan catches a read one past the end.
  const std::vector<std::uint8_t> bytes(data, data + size);
  try {
    const engine::GgufFile f = engine::parse_gguf(bytes.data(), bytes.size());
    std::uint64_t budget = kMaxDequantised;
    for (const auto& t : f.tensors) {
      if (t.elements > budget) continue;
      budget -= t.elements;
      (void)f.to_float(t);
    }
    tokenize(f);
  } catch (const engine::GgufError& e) {
    check_message(e);
  }
  return 0;
}
