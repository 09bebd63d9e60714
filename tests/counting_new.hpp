#pragma once
// A global operator new that counts, for the tests that show a warm path
// allocates nothing. Include it first, in one file of an executable (it
// defines the replacement functions).
//
// Our operator delete frees what our operator new took with malloc; GCC
// cannot see that pairing through the replacement and would warn (at any
// later call site: hence first).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
#include <atomic>
#include <cstdlib>
#include <new>

namespace flashcache_test {
inline std::atomic<long> allocations{0};
}

void* operator new(std::size_t size) {
  flashcache_test::allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
