// Views: layouts, and the stride/shape checks with their messages.
#include <gtest/gtest.h>
#include <flashcache/view.hpp>

#include <type_traits>
#include <utility>
#include <vector>

namespace fc = flashcache;

namespace {

TEST(View, HndAndNhdAddressTheSameElementDifferently) {
  std::vector<float> buf(2 * 3 * 4);
  const auto a = fc::hnd(buf.data(), fc::Heads(2), fc::Tokens(3), fc::HeadDim(4));
  const auto b = fc::nhd(buf.data(), fc::Tokens(3), fc::Heads(2), fc::HeadDim(4));
  EXPECT_EQ(&a(1, 2, 3), buf.data() + (1 * 3 + 2) * 4 + 3);
  EXPECT_EQ(&b(1, 2, 3), buf.data() + (2 * 2 + 1) * 4 + 3);
  EXPECT_TRUE(fc::check_view(a, "K").ok());
  EXPECT_TRUE(fc::check_view(b, "K").ok());
  fc::KVView<const float> c = a;  // const conversion
  EXPECT_EQ(c.row(1, 1), a.row(1, 1));
}

TEST(View, OverlappingStridesAreRefused) {
  std::vector<float> buf(100);
  fc::KVView<float> v(buf.data(), 2, 3, 4, 12, 3);  // token stride 3 < head_dim 4
  const auto s = fc::check_view(v, "K");
  EXPECT_EQ(s.code(), fc::Errc::invalid_stride);
  EXPECT_NE(s.message().find("stride 3 < head_dim 4"), std::string::npos) << s.message();
  fc::KVView<float> w(buf.data(), 2, 3, 4, 8, 4);  // heads 8 apart but each spans 3 x 4
  EXPECT_EQ(fc::check_view(w, "V").code(), fc::Errc::invalid_stride);
  fc::KVView<float> neg(buf.data(), 2, 3, 4, -12, 4);
  EXPECT_EQ(fc::check_view(neg, "V").code(), fc::Errc::invalid_stride);
}

// hnd and nhd take their extents as distinct named types: swapped or plain
// integer arguments do not compile.
template <class, class, class, class = void>
struct HndCompiles : std::false_type {};
template <class A, class B, class C>
struct HndCompiles<A, B, C, std::void_t<decltype(fc::hnd(std::declval<float*>(), A{1}, B{1}, C{1}))>> : std::true_type {
};
template <class, class, class, class = void>
struct NhdCompiles : std::false_type {};
template <class A, class B, class C>
struct NhdCompiles<A, B, C, std::void_t<decltype(fc::nhd(std::declval<float*>(), A{1}, B{1}, C{1}))>> : std::true_type {
};
static_assert(HndCompiles<fc::Heads, fc::Tokens, fc::HeadDim>::value);
static_assert(!HndCompiles<fc::Tokens, fc::Heads, fc::HeadDim>::value);
static_assert(!HndCompiles<std::int64_t, std::int64_t, std::int64_t>::value);
static_assert(NhdCompiles<fc::Tokens, fc::Heads, fc::HeadDim>::value);
static_assert(!NhdCompiles<fc::Heads, fc::Tokens, fc::HeadDim>::value);
static_assert(!NhdCompiles<int, int, int>::value);

TEST(View, ShapeProblemsAreNamed) {
  std::vector<float> buf(24);
  EXPECT_EQ(fc::check_view(fc::hnd<float>(nullptr, fc::Heads(2), fc::Tokens(3), fc::HeadDim(4)), "K").code(),
            fc::Errc::invalid_shape);
  EXPECT_TRUE(
      fc::check_view(fc::hnd<float>(nullptr, fc::Heads(2), fc::Tokens(0), fc::HeadDim(4)), "K").ok());  // empty is fine
  EXPECT_EQ(fc::check_view(fc::hnd(buf.data(), fc::Heads(-1), fc::Tokens(3), fc::HeadDim(4)), "K").code(),
            fc::Errc::invalid_shape);
  const auto s = fc::check_pair(fc::hnd(buf.data(), fc::Heads(2), fc::Tokens(3), fc::HeadDim(4)),
                                fc::hnd(buf.data(), fc::Heads(2), fc::Tokens(4), fc::HeadDim(3)));
  EXPECT_EQ(s.code(), fc::Errc::invalid_shape);
  EXPECT_NE(s.message().find("K is 2x3x4 but V is 2x4x3"), std::string::npos) << s.message();
}

TEST(View, UnusedStridesDoNotMatter) {
  std::vector<float> buf(8);
  // One head and one token: neither stride is ever used.
  EXPECT_TRUE(fc::check_view(fc::KVView<float>(buf.data(), 1, 1, 8, 0, 0), "K").ok());
}

}  // namespace
