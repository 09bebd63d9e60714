// A Base KV chosen by energy (ScoreOptions::base peak, mixed) on the global
// transform (flashcache/cuda/kernels/score_global_base.cuh): the checks and the
// workspace, host replays of the choice and of the kernels' arithmetic against
// the CPU, and the device's whole pipeline against the CPU.
#include <gtest/gtest.h>

#include "element_types.cuh"
#include "flashcache/score.hpp"
#include "flashcache/score/base.hpp"
#include "gpu_testing.cuh"
#include "host_fixture.cuh"

namespace flashcache::gpu_testing {
namespace {

using host::expect_error;

// Chosen bases against the CPU, for each element type.
FLASHCACHE_ELEMENT_TYPED_SUITE(GpuChosenBase);

// The Base KV chosen by energy (ScoreOptions::base peak, mixed) on the global
// transform, against the CPU (choose_base_frequencies, its scorer, the whole
// pipeline): one ragged batch of odd lengths (a single token, an empty
// sequence, 1000 tokens: more frequencies than the choose kernel's threads),
// two layers with dynamic allocation, the generic head dim 5 and 64, gamma 0.1
// to 0.3, a mask. Spectral data (Case::spectral): a clear choice.
TYPED_TEST(GpuChosenBase, GlobalPeakAndMixedBasesMatchTheCpu) {
  FLASHCACHE_REQUIRE_DEVICE();
  int variant = 0;
  for (Base kind : {Base::peak, Base::mixed})
    for (std::int64_t d : {5, 64})
      for (double gamma : {0.1, 0.2, 0.3}) {
        Case c;
        c.name = std::string("global ") + to_string(kind) + " head_dim " + std::to_string(d) + " gamma " +
                 std::to_string(gamma);
        c.layers = 2;
        c.heads = 2;
        c.head_dim = d;
        c.lengths = {37, 0, 101, 250, 1, 1000};
        c.nhd = variant % 2 == 0;
        c.opt = global_transform();
        c.opt.score.base = kind;
        c.opt.score.gamma = gamma;
        c.mask_every = 29;  // no sink: the one-token sequence's model budget, round(0.3 x 2), is one token
        c.spectral = true;
        c.budget = Budget::ratio(0.3);
        c.seed = 600 + static_cast<std::uint64_t>(variant++);
        run_and_check<TypeParam>(c);
      }
}

// Transform::blocked keeps the low-pass base only on the GPU: refused by name, before any launch.
TYPED_TEST(GpuChosenBase, BlockedRefusesAChosenBaseByName) {
  FLASHCACHE_REQUIRE_DEVICE();
  Case c;
  c.lengths = {100};
  c.opt = blocked(64);
  c.opt.score.base = Base::peak;
  c.gather = false;
  const Status s = run_expecting_device_failure<TypeParam>(c);
  EXPECT_EQ(s.code(), Errc::unsupported) << s.message();
  EXPECT_NE(s.message().find("with Transform::blocked"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace flashcache::gpu_testing

namespace flashcache::gpu_testing::host {
namespace {

// ---- a base chosen by energy (ScoreOptions::base peak, mixed), global transform -------

Options global_base(flashcache::Base kind, double gamma = 0.2) {
  Options o;
  o.score.mean_weight = 0.0;  // the residual alone: what the base's kernels compute
  o.score.transform = Transform::global;
  o.score.base = kind;
  o.score.gamma = gamma;
  return o;
}

TEST(GpuChosenBase, CanImplementTakesPeakAndMixedGlobalAndRefusesThemBlockedByName) {
  DenseFixture f(2, 2, 16, 64);
  for (flashcache::Base kind : {flashcache::Base::peak, flashcache::Base::mixed}) {
    SCOPED_TRACE(flashcache::to_string(kind));
    Options b = blocked();
    b.score.base = kind;
    const Status s = fcc::can_implement(f.cache, Budget::ratio(0.2), b);
    expect_error(s, Errc::unsupported, std::string("base ") + flashcache::to_string(kind) + " with Transform::blocked");
    expect_error(s, Errc::unsupported, "only the m low rows of the DCT basis");
    expect_error(s, Errc::unsupported, "use Transform::global");
    // Global: the base is no reason to refuse. Without a plan the plan is.
    expect_error(fcc::can_implement(f.cache, Budget::ratio(0.2), global_base(kind)), Errc::invalid_option,
                 "needs a GlobalTransform");
    // Lengths 0 and 1 make no cuFFT plan, so a plan exists without a device.
    const std::int64_t lengths[] = {1};
    fcc::GlobalTransform plan;
    ASSERT_TRUE(fcc::GlobalTransform::create(lengths, 1, 2, 64, &plan).ok());
    const Status ok = fcc::can_implement(f.cache, Budget::ratio(0.2), global_base(kind), {}, &plan);
    EXPECT_TRUE(ok.ok()) << ok.message();
  }
  EXPECT_TRUE(fcc::can_implement(f.cache, Budget::ratio(0.2), blocked()).ok());  // lowpass blocked: as before
}

TEST(GpuChosenBase, WorkspaceHoldsEnergiesAndChoicesForTheLongestSequence) {
  fcc::Shape s;
  s.layers = 3;
  s.heads = 4;
  s.head_dim = 64;
  s.sequences = 2;
  s.capacity = 1000;
  const std::int64_t longest = 701;
  fcc::WorkspaceLayout low, peak, mixed, blocked_peak;
  ASSERT_TRUE(fcc::make_layout(s, global_base(flashcache::Base::lowpass), longest, 4096, &low).ok());
  ASSERT_TRUE(fcc::make_layout(s, global_base(flashcache::Base::peak), longest, 4096, &peak).ok());
  ASSERT_TRUE(fcc::make_layout(s, global_base(flashcache::Base::mixed), longest, 4096, &mixed).ok());
  Options bp = blocked();
  bp.score.base = flashcache::Base::peak;
  ASSERT_TRUE(fcc::make_layout(s, bp, 0, 0, &blocked_peak).ok());
  EXPECT_EQ(low.base_energy, 0u);  // the low-pass path: no new region, the same carve-up as before
  EXPECT_EQ(low.base_chosen, 0u);
  EXPECT_EQ(blocked_peak.base_energy, 0u);
  const std::size_t frequencies = 2u * 4 * static_cast<std::size_t>(longest);
  for (const fcc::WorkspaceLayout* w : {&peak, &mixed}) {
    EXPECT_EQ(w->base_energy % 256, 0u);
    EXPECT_EQ(w->base_chosen % 256, 0u);
    EXPECT_GE(w->base_energy, w->fft_work + 4096);                // after the cuFFT work area
    EXPECT_GE(w->base_chosen, w->base_energy + frequencies * 4);  // float [2][H][longest]
    EXPECT_GE(w->total, w->base_chosen + frequencies);            // bytes [2][H][longest]
    EXPECT_GE(w->total - low.total, frequencies * 5);
    EXPECT_LT(w->total - low.total, frequencies * 5 + 2 * 256);
  }
}

// base_choose_kernel replayed on the host, one frequency at a time where the
// kernel scans a CTA's worth: the same keys, passes, bins and tie rule.
std::vector<std::uint8_t> choose_as_the_kernel_does(const float* energy, std::int64_t n, std::int64_t m,
                                                    flashcache::Base kind) {
  namespace kn = fcc::kernels;
  const kn::BaseCount count = kn::base_count(kind, n, m);
  const std::int64_t candidates = n - count.low;
  enum { kNone, kAll, kThreshold };
  const int mode = count.rest <= 0 ? kNone : (count.rest >= candidates ? kAll : kThreshold);
  std::uint32_t prefix = 0, prefix_mask = 0;
  long long need = count.rest;
  if (mode == kThreshold) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      long long hist[256] = {};
      for (std::int64_t k = count.low; k < n; ++k) {
        const std::uint32_t key = kn::energy_key(energy[k]);
        if ((key & prefix_mask) == prefix) ++hist[(key >> shift) & 255u];
      }
      long long above = 0, still = 0;
      int chosen_bin = -1;
      for (int bin = 255; bin >= 0; --bin) {
        if (above < need && above + hist[bin] >= need) {
          chosen_bin = bin;
          still = need - above;
        }
        above += hist[bin];
      }
      EXPECT_GE(chosen_bin, 0);
      prefix |= static_cast<std::uint32_t>(chosen_bin) << shift;
      prefix_mask |= 255u << shift;
      need = still;
    }
  }
  std::vector<std::uint8_t> chosen(static_cast<std::size_t>(n), 0);
  long long equal_seen = 0;
  for (std::int64_t k = 0; k < n; ++k) {
    const bool ranked = k >= count.low;
    const std::uint32_t key = ranked && mode == kThreshold ? kn::energy_key(energy[k]) : 0u;
    const bool equal = ranked && mode == kThreshold && key == prefix;
    chosen[static_cast<std::size_t>(k)] =
        !ranked || mode == kAll || (mode == kThreshold && (key > prefix || (equal && equal_seen < need)));
    equal_seen += equal;
  }
  return chosen;
}

TEST(GpuChosenBase, TheChoiceIsChooseBaseFrequenciesWithItsTies) {
  std::mt19937_64 rng(3);
  std::vector<std::int32_t> order;
  int runs = 0, differs_from_lowpass = 0;
  for (std::int64_t n : {1, 2, 3, 37, 101, 250, 256, 257, 1000, 4099})
    for (double gamma : {0.1, 0.2, 0.3, 0.5, 1.0})
      for (flashcache::Base kind : {flashcache::Base::lowpass, flashcache::Base::peak, flashcache::Base::mixed})
        for (int spread : {0, 1, 4, 1 << 20}) {  // 0: all tie; small: many ties; large: few
          std::vector<float> e(static_cast<std::size_t>(n));
          for (float& x : e) x = spread == 0 ? 0.0f : static_cast<float>(rng() % (spread + 1)) * 0.25f;
          if (spread == 4 && n > 3) e[1] = std::numeric_limits<float>::infinity();  // overflowed: the strongest
          const std::int64_t m = flashcache::lowpass_cutoff(n, gamma);
          SCOPED_TRACE("n " + std::to_string(n) + " gamma " + std::to_string(gamma) + " " +
                       flashcache::to_string(kind) + " spread " + std::to_string(spread));
          std::vector<std::uint8_t> want(static_cast<std::size_t>(n));
          flashcache::choose_base_frequencies(kind, e.data(), n, m, &order, want.data());
          const std::vector<std::uint8_t> got = choose_as_the_kernel_does(e.data(), n, m, kind);
          ASSERT_EQ(got, want);
          std::int64_t count = 0, low = 0;
          for (std::int64_t k = 0; k < n; ++k) {
            count += got[static_cast<std::size_t>(k)];
            if (k < m) low += got[static_cast<std::size_t>(k)];
          }
          EXPECT_EQ(count, m);
          differs_from_lowpass += low != m;
          ++runs;
        }
  EXPECT_EQ(runs, 10 * 5 * 3 * 4);
  EXPECT_GT(differs_from_lowpass, 100);
}

// The global path's arithmetic with a chosen base, on the host, for `heads`
// heads of dense [h][t][c] K and V: pack (Makhoul), the forward DFT (double,
// rounded to float: cuFFT's place), base_energy_pair per (head, pair),
// the choice, chosen_base_pair per (column, pair), the inverse DFT, then the
// residual pass's scores. Also returns the energies and the choices.
struct HostChosenRun {
  std::vector<float> energy;         // [2][heads][n]
  std::vector<std::uint8_t> chosen;  // [2][heads][n]
  std::vector<float> scores;         // [heads][n]
};

void dft(std::vector<float2>* z, std::int64_t n, std::int64_t columns, double sign) {
  std::vector<double> cs(static_cast<std::size_t>(n)), sn(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const double a = 2 * 3.14159265358979323846 * static_cast<double>(i) / static_cast<double>(n);
    cs[static_cast<std::size_t>(i)] = std::cos(a);
    sn[static_cast<std::size_t>(i)] = sign * std::sin(a);
  }
  std::vector<double> re(static_cast<std::size_t>(n)), im(static_cast<std::size_t>(n));
  for (std::int64_t col = 0; col < columns; ++col) {
    float2* x = z->data() + col * n;
    for (std::int64_t k = 0; k < n; ++k) {
      double sr = 0, si = 0;
      for (std::int64_t j = 0; j < n; ++j) {
        const std::size_t w = static_cast<std::size_t>((j * k) % n);
        sr += x[j].x * cs[w] - x[j].y * sn[w];
        si += x[j].x * sn[w] + x[j].y * cs[w];
      }
      re[static_cast<std::size_t>(k)] = sr;
      im[static_cast<std::size_t>(k)] = si;
    }
    for (std::int64_t k = 0; k < n; ++k)
      x[k] = make_float2(static_cast<float>(re[static_cast<std::size_t>(k)]),
                         static_cast<float>(im[static_cast<std::size_t>(k)]));
  }
}

HostChosenRun run_chosen_base_on_host(const std::vector<float>& k, const std::vector<float>& v, int heads,
                                      std::int64_t n, int d, double gamma, flashcache::Base kind) {
  namespace kn = fcc::kernels;
  const std::int64_t columns = std::int64_t{heads} * d;
  auto at = [&](int h, std::int64_t t, int c) { return static_cast<std::size_t>((h * n + t) * d + c); };
  std::vector<float2> z(static_cast<std::size_t>(columns * n));
  for (std::int64_t col = 0; col < columns; ++col)
    for (std::int64_t j = 0; j < n; ++j) {  // pack_kernel's permutation
      const std::int64_t t = 2 * j < n ? 2 * j : 2 * (n - 1 - j) + 1;
      const int h = static_cast<int>(col / d), c = static_cast<int>(col % d);
      z[static_cast<std::size_t>(col * n + j)] = make_float2(k[at(h, t, c)], v[at(h, t, c)]);
    }
  dft(&z, n, columns, -1.0);  // cuFFT forward
  HostChosenRun out;
  out.energy.assign(static_cast<std::size_t>(2 * heads * n), std::numeric_limits<float>::quiet_NaN());
  for (int h = 0; h < heads; ++h)
    for (std::int64_t f = 0; f <= n / 2; ++f) {  // base_energy_kernel's threads
      float e[4];
      kn::base_energy_pair(z.data() + std::int64_t{h} * d * n, n, d, f, e);
      const std::int64_t r = f == 0 ? 0 : n - f;
      float* ek = out.energy.data() + h * n;
      float* ev = out.energy.data() + (heads + h) * n;
      ek[f] = e[0];
      ev[f] = e[2];
      if (r != f) {
        ek[r] = e[1];
        ev[r] = e[3];
      }
    }
  const std::int64_t m = flashcache::lowpass_cutoff(n, gamma);
  out.chosen.resize(out.energy.size());
  for (int row = 0; row < 2 * heads; ++row) {  // base_choose_kernel's CTAs
    const std::vector<std::uint8_t> c = choose_as_the_kernel_does(out.energy.data() + row * n, n, m, kind);
    std::copy(c.begin(), c.end(), out.chosen.begin() + row * n);
  }
  for (std::int64_t col = 0; col < columns; ++col) {  // chosen_base_kernel's threads
    const std::int64_t h = col / d;
    const std::uint8_t* ck = out.chosen.data() + h * n;
    const std::uint8_t* cv = out.chosen.data() + (heads + h) * n;
    for (std::int64_t f = 0; f <= n / 2; ++f) {
      const std::int64_t r = f == 0 ? 0 : n - f;
      kn::chosen_base_pair(z.data() + col * n, n, f, ck[f] != 0, ck[r] != 0, cv[f] != 0, cv[r] != 0);
    }
  }
  dft(&z, n, columns, 1.0);  // cuFFT inverse (unnormalised)
  out.scores.assign(static_cast<std::size_t>(heads * n), 0.0f);
  const float inv_n = 1.0f / static_cast<float>(n), inv_d = 1.0f / static_cast<float>(d);
  for (int h = 0; h < heads; ++h)
    for (std::int64_t t = 0; t < n; ++t) {  // residual_kernel
      const std::int64_t j = t % 2 == 0 ? t / 2 : n - 1 - (t - 1) / 2;
      float rk = 0, rv = 0;
      for (int c = 0; c < d; ++c) {
        const float2 base = z[static_cast<std::size_t>((std::int64_t{h} * d + c) * n + j)];
        const float dk = k[at(h, t, c)] - base.x * inv_n, dv = v[at(h, t, c)] - base.y * inv_n;
        rk += dk * dk;
        rv += dv * dv;
      }
      out.scores[static_cast<std::size_t>(h * n + t)] = rk * inv_d + rv * inv_d;
    }
  return out;
}

// Orthonormal DCT-II energies of one head's K (or V), in double: sum over the head dim.
std::vector<double> dct_energies(const std::vector<float>& x, int h, std::int64_t n, int d) {
  std::vector<double> e(static_cast<std::size_t>(n), 0.0);
  const double pi = 3.14159265358979323846;
  for (std::int64_t f = 0; f < n; ++f) {
    const double a = std::sqrt((f == 0 ? 1.0 : 2.0) / static_cast<double>(n));
    for (int c = 0; c < d; ++c) {
      double s = 0;
      for (std::int64_t t = 0; t < n; ++t)
        s += x[static_cast<std::size_t>((h * n + t) * d + c)] *
             std::cos(pi * static_cast<double>(f) * static_cast<double>(2 * t + 1) / static_cast<double>(2 * n));
      e[static_cast<std::size_t>(f)] += a * a * s * s;
    }
  }
  return e;
}

TEST(GpuChosenBase, HostRunOfTheKernelArithmeticMatchesTheCpuScorer) {
  const int heads = 2;
  int runs = 0, not_lowpass = 0, near_ties = 0;
  for (std::int64_t n : {37, 101, 250})
    for (int d : {5, 64}) {
      std::mt19937_64 rng(static_cast<std::uint64_t>(n * 100 + d));
      std::normal_distribution<float> noise(0.0f, 0.3f);
      std::vector<float> k(static_cast<std::size_t>(heads * n * d)), v(k.size());
      for (int h = 0; h < heads; ++h)
        for (std::int64_t t = 0; t < n; ++t)
          for (int c = 0; c < d; ++c) {
            // Smooth, a pattern of period 4 (a high frequency the peak base takes), noise, outliers.
            const float smooth = std::sin(0.05f * static_cast<float>(t) + 0.7f * static_cast<float>(c + h));
            const float pattern = (t % 4 == 1 ? 1.5f : -0.5f) * std::cos(0.3f * static_cast<float>(c));
            const std::size_t i = static_cast<std::size_t>((h * n + t) * d + c);
            k[i] = smooth + pattern + noise(rng) + (t % 17 == 3 ? 3.0f : 0.0f);
            v[i] = 0.5f * smooth - (h == 1 ? pattern : 0.0f) + noise(rng);
          }
      const auto kv = flashcache::hnd<const float>(k.data(), flashcache::Heads(heads), flashcache::Tokens(n),
                                                   flashcache::HeadDim(d));
      const auto vv = flashcache::hnd<const float>(v.data(), flashcache::Heads(heads), flashcache::Tokens(n),
                                                   flashcache::HeadDim(d));
      std::vector<std::vector<double>> cpu_energy;  // [K|V][head]
      for (const std::vector<float>* x : {&k, &v})
        for (int h = 0; h < heads; ++h) cpu_energy.push_back(dct_energies(*x, h, n, d));
      for (double gamma : {0.1, 0.2, 0.3})
        for (flashcache::Base kind : {flashcache::Base::peak, flashcache::Base::mixed}) {
          SCOPED_TRACE("n " + std::to_string(n) + " d " + std::to_string(d) + " gamma " + std::to_string(gamma) + " " +
                       flashcache::to_string(kind));
          const Options o = global_base(kind, gamma);
          flashcache::Scorer<double> scorer;
          flashcache::LayerScores cpu;
          ASSERT_TRUE(scorer.score(kv, vv, o.score, &cpu).ok());
          const HostChosenRun host = run_chosen_base_on_host(k, v, heads, n, d, gamma, kind);
          const std::int64_t m = flashcache::lowpass_cutoff(n, gamma);
          bool same_choice = true;
          for (int row = 0; row < 2 * heads; ++row) {
            const std::vector<double>& e = cpu_energy[static_cast<std::size_t>(row)];
            // The kernel's energies are N/2 times the orthonormal ones.
            double largest = 0;
            for (double x : e) largest = std::max(largest, x);
            for (std::int64_t f = 0; f < n; ++f)
              ASSERT_NEAR(host.energy[static_cast<std::size_t>(row * n + f)] * 2.0 / static_cast<double>(n),
                          e[static_cast<std::size_t>(f)], 1e-5 * largest)
                  << "row " << row << " frequency " << f;
            std::vector<std::uint8_t> want(static_cast<std::size_t>(n));
            std::vector<std::int32_t> order;
            flashcache::choose_base_frequencies(kind, e.data(), n, m, &order, want.data());
            const std::uint8_t* got = host.chosen.data() + row * n;
            std::int64_t low = 0;
            for (std::int64_t f = 0; f < m; ++f) low += got[f];
            not_lowpass += low != m;
            if (std::equal(want.begin(), want.end(), got)) continue;
            // Float against double may only part at a near tie: every frequency the
            // kernel ranked in is as strong, within rounding, as every one it left out.
            same_choice = false;
            ++near_ties;
            const std::int64_t first_ranked = fcc::kernels::base_count(kind, n, m).low;
            double weakest_in = largest, strongest_out = 0;
            for (std::int64_t f = first_ranked; f < n; ++f) {
              const double x = e[static_cast<std::size_t>(f)];
              if (got[f])
                weakest_in = std::min(weakest_in, x);
              else
                strongest_out = std::max(strongest_out, x);
            }
            EXPECT_GE(weakest_in, strongest_out - 1e-5 * largest) << "row " << row;
          }
          if (same_choice) {
            double largest = 0;
            for (float s : cpu.score) largest = std::max(largest, static_cast<double>(s));
            for (int h = 0; h < heads; ++h)
              for (std::int64_t t = 0; t < n; ++t)
                ASSERT_NEAR(host.scores[static_cast<std::size_t>(h * n + t)], cpu(h, t), 1e-5 * largest)
                    << "head " << h << " token " << t;
          }
          ++runs;
        }
    }
  EXPECT_EQ(runs, 3 * 2 * 3 * 2);
  EXPECT_GT(not_lowpass, 24);  // the peak and mixed bases do take the pattern's frequencies
  EXPECT_LE(near_ties, 2);
  RecordProperty("rows_not_lowpass", not_lowpass);  // in --gtest_output=xml
  RecordProperty("near_ties", near_ties);
}

// Every energy 0 (an all-zero head): every frequency ties and the lowest win,
// so peak and mixed take the low-pass base and every score is 0.
TEST(GpuChosenBase, AllZeroHeadsTieToTheLowestFrequencies) {
  for (std::int64_t n : {37, 250})
    for (flashcache::Base kind : {flashcache::Base::peak, flashcache::Base::mixed}) {
      const int d = 5;
      const std::vector<float> k(static_cast<std::size_t>(n * d), 0.0f), v(k.size(), 0.0f);
      const HostChosenRun host = run_chosen_base_on_host(k, v, 1, n, d, 0.2, kind);
      const std::int64_t m = flashcache::lowpass_cutoff(n, 0.2);
      for (int row = 0; row < 2; ++row)
        for (std::int64_t f = 0; f < n; ++f)
          EXPECT_EQ(host.chosen[static_cast<std::size_t>(row * n + f)], f < m ? 1 : 0) << "frequency " << f;
      for (float s : host.scores) EXPECT_EQ(s, 0.0f);
    }
}

}  // namespace
}  // namespace flashcache::gpu_testing::host
