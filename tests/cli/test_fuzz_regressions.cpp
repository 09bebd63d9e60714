// Inputs found while fuzzing (tests/fuzz/README.md), kept as ordinary tests.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "flashcache/flashcache.hpp"
#include "engine_runtime/gguf.hpp"
#include "engine_runtime/tokenizer.hpp"

namespace {

// GGUF bytes field by field.
struct Gguf {
  std::vector<std::uint8_t> b;
  template <class T>
  Gguf& put(T v) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof v);
    return *this;
  }
  Gguf& str(const std::string& s) {
    put<std::uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
};

// A vocabulary {"", "a", "b"} whose empty token is a control token (type 3).
std::vector<std::uint8_t> empty_control_token_file() {
  Gguf g;
  g.b = {'G', 'G', 'U', 'F'};
  g.put<std::uint32_t>(3).put<std::uint64_t>(0).put<std::uint64_t>(5);
  g.str("tokenizer.ggml.model").put<std::uint32_t>(8).str("gpt2");
  g.str("tokenizer.ggml.tokens").put<std::uint32_t>(9).put<std::uint32_t>(8).put<std::uint64_t>(3);
  g.str("").str("a").str("b");
  g.str("tokenizer.ggml.token_type").put<std::uint32_t>(9).put<std::uint32_t>(5).put<std::uint64_t>(3);
  g.put<std::int32_t>(3).put<std::int32_t>(1).put<std::int32_t>(1);
  g.str("tokenizer.ggml.merges").put<std::uint32_t>(9).put<std::uint32_t>(8).put<std::uint64_t>(0);
  g.str("tokenizer.ggml.eos_token_id").put<std::uint32_t>(4).put<std::uint32_t>(0);
  return g.b;
}

// ASan, as gcc (__SANITIZE_ADDRESS__) and clang (__has_feature) say it.
#if defined(__SANITIZE_ADDRESS__)
#define FLASHCACHE_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FLASHCACHE_TEST_ASAN 1
#endif
#endif
#ifndef FLASHCACHE_TEST_ASAN
#define FLASHCACHE_TEST_ASAN 0
#endif

// Runs `work` in a child process; true if it ended by itself within `seconds`.
template <class Work>
bool finishes_within(unsigned seconds, Work work) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(seconds);  // SIGALRM ends a hung child
#if !FLASHCACHE_TEST_ASAN  // ASan reserves terabytes of address space up front
    const rlimit memory{1u << 30, 1u << 30};
    ::setrlimit(RLIMIT_AS, &memory);  // and a runaway allocation ends it early
#endif
    work();
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// Found while writing fuzz_gguf: an empty control token matched at every
// position, so Tokenizer::encode() appended its id forever without advancing
// (a hang that grew memory). The tokenizer now refuses such a vocabulary.
TEST(FuzzRegression, TokenizerWithEmptyControlTokenDoesNotHang) {
  const std::vector<std::uint8_t> bytes = empty_control_token_file();
  EXPECT_TRUE(finishes_within(5, [&] {
    try {
      const engine::GgufFile f = engine::parse_gguf(bytes.data(), bytes.size());
      const engine::Tokenizer tok(f);
      (void)tok.encode("ab");
    } catch (const std::invalid_argument&) {  // the fix: the vocabulary is refused
    }
  }));
  const engine::GgufFile f = engine::parse_gguf(bytes.data(), bytes.size());
  EXPECT_THROW(engine::Tokenizer{f}, std::invalid_argument);
}

// The file itself is well-formed GGUF: only the tokenizer is at fault.
TEST(FuzzRegression, EmptyControlTokenFileParses) {
  const std::vector<std::uint8_t> bytes = empty_control_token_file();
  const engine::GgufFile f = engine::parse_gguf(bytes.data(), bytes.size());
  EXPECT_EQ(f.get_strings("tokenizer.ggml.tokens").size(), 3u);
}

// Found probing the API's size checks with the fuzzers: check_view() multiplied
// extents by strides in int64 unchecked (undefined behaviour, and wrapped it
// accepted this view whose rows span 2^70 elements). It now refuses any view
// whose span does not fit in int64, by name, before forming a product.
TEST(FuzzRegression, ViewWhoseSpanOverflowsInt64IsRefused) {
  static const float dummy[4] = {};
  const flashcache::KVView<const float> k(dummy, 2, std::int64_t{1} << 40, 1, std::int64_t{1} << 62,
                                          std::int64_t{1} << 30);
  const flashcache::Status s = flashcache::check_view(k, "K");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("span more than 2^63 elements"), std::string::npos) << s.message();
}

}  // namespace
