// Gather: rows land where the kept indices say, across layouts and types.
#include <gtest/gtest.h>
#include <flashcache/gather.hpp>
#include <flashcache/types.hpp>

#include <vector>

namespace fc = flashcache;

namespace {

TEST(Gather, CopiesKeptRowsFromNhdIntoHnd) {
  const std::int64_t heads = 2, n = 5, d = 3;
  std::vector<fc::bfloat16_t> src(heads * n * d);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = fc::bfloat16_t(static_cast<float>(i));
  const auto view = fc::nhd(src.data(), fc::Tokens(n), fc::Heads(heads), fc::HeadDim(d));
  const std::vector<std::int32_t> kept = {0, 3, 1, 4};  // head 0 keeps 0, 3; head 1 keeps 1, 4
  std::vector<fc::bfloat16_t> dst(heads * 2 * d);
  ASSERT_TRUE(fc::gather(fc::KVView<const fc::bfloat16_t>(view), kept.data(),
                         fc::hnd(dst.data(), fc::Heads(heads), fc::Tokens(2), fc::HeadDim(d)))
                  .ok());
  for (std::int64_t h = 0; h < heads; ++h)
    for (std::int64_t i = 0; i < 2; ++i)
      for (std::int64_t c = 0; c < d; ++c) EXPECT_EQ(dst[(h * 2 + i) * d + c].bits, view(h, kept[h * 2 + i], c).bits);
}

TEST(Gather, RefusesBadIndicesAndShapes) {
  std::vector<float> src(2 * 4 * 2), dst(2 * 2 * 2);
  const std::vector<std::int32_t> bad = {0, 4, 1, 2};
  auto s = fc::gather(fc::hnd(src.data(), fc::Heads(2), fc::Tokens(4), fc::HeadDim(2)), bad.data(),
                      fc::hnd(dst.data(), fc::Heads(2), fc::Tokens(2), fc::HeadDim(2)));
  EXPECT_EQ(s.code(), fc::Errc::invalid_shape);
  EXPECT_NE(s.message().find("kept index 4 outside [0, 4)"), std::string::npos) << s.message();
  const std::vector<std::int32_t> good = {0, 1, 1, 2};
  EXPECT_FALSE(fc::gather(fc::hnd(src.data(), fc::Heads(2), fc::Tokens(4), fc::HeadDim(2)), good.data(),
                          fc::hnd(dst.data(), fc::Heads(1), fc::Tokens(2), fc::HeadDim(4)))
                   .ok());
}

}  // namespace
