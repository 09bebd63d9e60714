#include <cmath>
#include <cstdio>
#include <vector>

#include <flashcache/flashcache.hpp>
int main() {
  std::vector<float> k(2 * 50 * 8), v(k.size());
  for (std::size_t i = 0; i < k.size(); ++i) {
    k[i] = std::sin(0.1f * static_cast<float>(i));
    v[i] = std::cos(0.07f * static_cast<float>(i));
  }
  auto out = flashcache::compress(
      flashcache::hnd(k.data(), flashcache::Heads(2), flashcache::Tokens(50), flashcache::HeadDim(8)),
      flashcache::hnd(v.data(), flashcache::Heads(2), flashcache::Tokens(50), flashcache::HeadDim(8)),
      flashcache::Budget::ratio(0.2));
  std::printf("parent kept %lld of 50\n", static_cast<long long>(out.budget));
}
