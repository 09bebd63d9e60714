// DCT-II/III and the low-pass filter against the naive O(N^2) double DCT.
#include <gtest/gtest.h>
#include <flashcache/score/dct.hpp>
#include <flashcache/options.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "reference.hpp"

namespace fc = flashcache;
using fc::testing::naive_dct2;
using fc::testing::naive_lowpass;
using fc::testing::random_normal;

namespace {

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

// Odd, prime, power-of-two and smooth-composite lengths; 4099 is prime and
// goes through Bluestein, 1000 = 2^3 5^3 through kissfft directly.
class DctSizes : public ::testing::TestWithParam<std::int64_t> {};

TEST_P(DctSizes, ForwardMatchesNaiveDouble) {
  const std::int64_t n = GetParam();
  std::mt19937_64 rng(1234 + n);
  const auto x1 = random_normal(n, rng), x2 = random_normal(n, rng);
  std::vector<double> c1(n), c2(n);
  fc::Dct<double> dct(n);
  dct.forward(x1.data(), x2.data(), c1.data(), c2.data());
  const double tol = 1e-12 * std::sqrt(static_cast<double>(n)) * std::log2(2.0 * n);
  EXPECT_LE(max_abs_diff(c1, naive_dct2(x1)), tol);
  EXPECT_LE(max_abs_diff(c2, naive_dct2(x2)), tol);
  // A single column gives the same as a paired one.
  std::vector<double> single(n);
  dct.forward(x1.data(), nullptr, single.data(), nullptr);
  EXPECT_LE(max_abs_diff(single, c1), tol);
}

TEST_P(DctSizes, InverseUndoesForward) {
  const std::int64_t n = GetParam();
  std::mt19937_64 rng(99 + n);
  const auto x1 = random_normal(n, rng), x2 = random_normal(n, rng);
  std::vector<double> c1(n), c2(n), y1(n), y2(n);
  fc::Dct<double> dct(n);
  dct.forward(x1.data(), x2.data(), c1.data(), c2.data());
  dct.inverse(c1.data(), c2.data(), y1.data(), y2.data());
  EXPECT_LE(max_abs_diff(y1, x1), 1e-12 * std::log2(2.0 * n));
  EXPECT_LE(max_abs_diff(y2, x2), 1e-12 * std::log2(2.0 * n));
}

TEST_P(DctSizes, ParsevalHolds) {
  const std::int64_t n = GetParam();
  std::mt19937_64 rng(7 + n);
  const auto x = random_normal(n, rng, 3.0);
  std::vector<double> c(n);
  fc::Dct<double>(n).forward(x.data(), nullptr, c.data(), nullptr);
  const double ex = std::inner_product(x.begin(), x.end(), x.begin(), 0.0);
  const double ec = std::inner_product(c.begin(), c.end(), c.begin(), 0.0);
  EXPECT_NEAR(ec, ex, 1e-11 * ex);
}

TEST_P(DctSizes, LowpassMatchesNaive) {
  const std::int64_t n = GetParam();
  std::mt19937_64 rng(31 + n);
  const auto x = random_normal(n, rng);
  for (double gamma : {0.1, 0.2, 0.5, 1.0}) {
    const std::int64_t m = fc::lowpass_cutoff(n, gamma);
    std::vector<double> base(n);
    fc::Dct<double>(n).lowpass(x.data(), nullptr, m, base.data(), nullptr);
    EXPECT_LE(max_abs_diff(base, naive_lowpass(x, m)), 1e-11) << "gamma " << gamma;
  }
}

TEST_P(DctSizes, FloatAgreesWithDoubleToFloatPrecision) {
  const std::int64_t n = GetParam();
  std::mt19937_64 rng(5 + n);
  const auto x = random_normal(n, rng);
  std::vector<float> xf(x.begin(), x.end()), cf(n);
  fc::Dct<float>(n).forward(xf.data(), nullptr, cf.data(), nullptr);
  const auto ref = naive_dct2(std::vector<double>(xf.begin(), xf.end()));
  for (std::int64_t k = 0; k < n; ++k) EXPECT_NEAR(cf[k], ref[k], 2e-5 * std::sqrt(static_cast<double>(n))) << k;
}

INSTANTIATE_TEST_SUITE_P(OddAndAwkward, DctSizes, ::testing::Values(1, 2, 3, 7, 16, 100, 127, 257, 1000, 4099));

TEST(Lowpass, LowFrequencySignalIsUnchanged) {
  // A signal built from the first m basis vectors passes the filter untouched.
  const std::int64_t n = 300;
  const std::int64_t m = fc::lowpass_cutoff(n, 0.2);
  std::mt19937_64 rng(3);
  std::vector<double> coeff = random_normal(n, rng);
  for (std::int64_t k = m; k < n; ++k) coeff[k] = 0;
  const auto x = fc::testing::naive_dct3(coeff);
  std::vector<double> base(n);
  fc::Dct<double>(n).lowpass(x.data(), nullptr, m, base.data(), nullptr);
  EXPECT_LE(max_abs_diff(base, x), 1e-11);
}

TEST(Lowpass, CutoffFollowsTheDefinition) {
  EXPECT_EQ(fc::lowpass_cutoff(0, 0.2), 0);
  EXPECT_EQ(fc::lowpass_cutoff(1, 0.2), 1);
  EXPECT_EQ(fc::lowpass_cutoff(4, 0.2), 1);    // ceil(0.8)
  EXPECT_EQ(fc::lowpass_cutoff(6, 0.2), 2);    // ceil(1.2)
  EXPECT_EQ(fc::lowpass_cutoff(30, 0.1), 3);   // 0.1 * 30 is 3.0000000000000004 in double
  EXPECT_EQ(fc::lowpass_cutoff(64, 0.2), 13);  // ceil(12.8)
  EXPECT_EQ(fc::lowpass_cutoff(10, 1.0), 10);
}

TEST(DctBasis, RowsAreOrthonormalAndMatchNaive) {
  for (std::int64_t n : {1, 5, 64, 67}) {
    const auto c = fc::dct_basis<double>(n, n);
    const Eigen::MatrixXd gram = c * c.transpose();
    EXPECT_LE((gram - Eigen::MatrixXd::Identity(n, n)).cwiseAbs().maxCoeff(), 1e-12) << n;
    std::vector<double> e(n, 0.0);
    e[n / 2] = 1.0;  // column n/2 of C is the DCT of a unit impulse
    const auto col = naive_dct2(e);
    for (std::int64_t k = 0; k < n; ++k) EXPECT_NEAR(c(k, n / 2), col[k], 1e-12);
  }
}

TEST(Fft, BluesteinIsChosenForLargePrimeFactors) {
  EXPECT_FALSE((fc::PanelFft<float, 1>(1024).uses_bluestein()));
  EXPECT_FALSE((fc::PanelFft<float, 1>(1000).uses_bluestein()));
  EXPECT_FALSE((fc::PanelFft<float, 1>(3 * 29 * 31).uses_bluestein()));
  EXPECT_TRUE((fc::PanelFft<float, 1>(4099).uses_bluestein()));
  EXPECT_TRUE((fc::PanelFft<float, 1>(2 * 1009).uses_bluestein()));
}

// The convolution covers 2n - 1 points, is 5-smooth, and is no power of two where a
// smooth length is cheaper: 4099 would need 16384 points as a power of two.
TEST(Fft, BluesteinConvolvesOverACheapSmoothLength) {
  for (std::int64_t n : {37, 613, 1031, 4099, 8191}) {
    const std::int64_t m = fc::PanelFft<float, 1>(n).convolution_length();
    EXPECT_GE(m, 2 * n - 1) << n;
    std::int64_t rest = m;
    for (std::int64_t p : {2, 3, 5})
      while (rest % p == 0) rest /= p;
    EXPECT_EQ(rest, 1) << n << " convolves over " << m;
  }
  EXPECT_LT((fc::PanelFft<float, 1>(4099).convolution_length()), 16384);
  EXPECT_EQ((fc::PanelFft<float, 1>(1024).convolution_length()), 0);
}

// 3678 = 6 x 613, 1025 = 25 x 41 and 164 = 4 x 41: only the large factor goes through Bluestein.
TEST(Fft, OnlyTheLargeFactorGoesThroughBluestein) {
  const fc::PanelFft<float, 1> a(3678), b(1025), prime(4099);
  EXPECT_EQ(a.bluestein_factor(), 613);
  EXPECT_EQ(a.convolution_length(), 0);
  EXPECT_TRUE(a.uses_bluestein());
  EXPECT_EQ(b.bluestein_factor(), 41);
  EXPECT_EQ((fc::PanelFft<float, 1>(4 * 41).bluestein_factor()), 41);
  EXPECT_EQ(prime.bluestein_factor(), 0);
  EXPECT_GT(prime.convolution_length(), 0);
}

// Every lane of a panel FFT against the naive DFT, mixed radices and Bluestein.
class FftSizes : public ::testing::TestWithParam<std::int64_t> {};

TEST_P(FftSizes, PanelMatchesNaiveDftInEveryLane) {
  constexpr int W = 3;
  const std::int64_t n = GetParam();
  std::mt19937_64 rng(n);
  const auto re = random_normal(static_cast<std::size_t>(n * W), rng), im = random_normal(re.size(), rng);
  std::vector<double> fr = re, fi = im;
  fc::PanelFft<double, W> fft(n);
  fft.forward(fr.data(), fi.data());
  double err = 0;
  for (std::int64_t k = 0; k < n; ++k)
    for (int w = 0; w < W; ++w) {
      long double sr = 0, si = 0;
      for (std::int64_t j = 0; j < n; ++j) {
        const double a = -2.0 * M_PI * static_cast<double>((j * k) % n) / static_cast<double>(n);
        sr += re[j * W + w] * std::cos(a) - im[j * W + w] * std::sin(a);
        si += re[j * W + w] * std::sin(a) + im[j * W + w] * std::cos(a);
      }
      err = std::max(
          {err, std::abs(static_cast<double>(sr) - fr[k * W + w]), std::abs(static_cast<double>(si) - fi[k * W + w])});
    }
  EXPECT_LE(err, 1e-12 * static_cast<double>(n));
  // inverse(forward(x)) = n x
  fft.inverse(fr.data(), fi.data());
  for (std::size_t i = 0; i < re.size(); ++i) {
    EXPECT_NEAR(fr[i] / static_cast<double>(n), re[i], 1e-12);
    EXPECT_NEAR(fi[i] / static_cast<double>(n), im[i], 1e-12);
  }
}

INSTANTIATE_TEST_SUITE_P(Radices, FftSizes,
                         ::testing::Values(1, 2, 3, 4, 5, 8, 12, 15, 30, 49, 64, 75, 210, 243, 375, 31 * 2, 37,
                                           101, 613, 1024 + 1, 2 * 3 * 5 * 7 * 11, 2 * 1009, 6 * 613,
                                           4 * 41));

TEST(Dct, PanelLanesAreIndependentColumns) {
  constexpr int W = 5;
  const std::int64_t n = 77;
  std::mt19937_64 rng(77);
  const auto x1 = random_normal(static_cast<std::size_t>(n * W), rng), x2 = random_normal(x1.size(), rng);
  std::vector<double> b1(x1.size()), b2(x1.size());
  fc::Dct<double, W>(n).lowpass(x1.data(), x2.data(), 9, b1.data(), b2.data());
  for (int w = 0; w < W; ++w) {
    std::vector<double> col1(n), col2(n);
    for (std::int64_t t = 0; t < n; ++t) col1[t] = x1[t * W + w], col2[t] = x2[t * W + w];
    const auto ref1 = naive_lowpass(col1, 9), ref2 = naive_lowpass(col2, 9);
    for (std::int64_t t = 0; t < n; ++t) {
      EXPECT_NEAR(b1[t * W + w], ref1[t], 1e-12);
      EXPECT_NEAR(b2[t * W + w], ref2[t], 1e-12);
    }
  }
}

}  // namespace
