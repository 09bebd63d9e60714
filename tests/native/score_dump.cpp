// The build for this machine's instructions (FLASHCACHE_NATIVE, -march=native)
// against the generic x86-64 one: the same program, built twice, scores fixed
// pseudo-random layers (odd lengths, the global and blocked transforms, the
// paper's options, query tails) and selects at keep 0.2. The generic build
// writes what it got; the native build compares its own results with that file:
// scores within 1e-4 of each head's largest, tails within 1e-5, and kept sets
// that differ only at near ties of the cut.
//
//   flashcache_score_dump_generic OUT.bin
//   flashcache_score_dump_native --compare OUT.bin
#include <flashcache/flashcache.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace fc = flashcache;

namespace {

struct Result {
  std::vector<float> scores, tails;
  std::vector<std::int32_t> kept;
};

// Smooth rows plus noise and a few outliers, [heads][n][d]; queries [2 * heads][n][d].
std::vector<float> rows(std::int64_t heads, std::int64_t n, std::int64_t d, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.0f, 0.3f);
  std::vector<float> x(static_cast<std::size_t>(heads * n * d));
  for (std::int64_t h = 0; h < heads; ++h)
    for (std::int64_t t = 0; t < n; ++t)
      for (std::int64_t c = 0; c < d; ++c)
        x[static_cast<std::size_t>((h * n + t) * d + c)] =
            std::sin(0.01f * static_cast<float>(t) * static_cast<float>(c % 7 + 1)) + noise(rng) +
            (t % 97 == 13 ? 3.0f : 0.0f);
  return x;
}

bool run_case(std::int64_t n, int variant, Result* out) {
  const std::int64_t heads = 3, d = 64;
  const std::vector<float> k = rows(heads, n, d, 7u + static_cast<std::uint32_t>(n)),
                           v = rows(heads, n, d, 11u + static_cast<std::uint32_t>(n)),
                           q = rows(2 * heads, n, d, 13u + static_cast<std::uint32_t>(n));
  const auto kv = fc::hnd(k.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(d));
  const auto vv = fc::hnd(v.data(), fc::Heads(heads), fc::Tokens(n), fc::HeadDim(d));
  fc::Options opt;
  if (variant == 1) opt.score.transform = fc::Transform::blocked;
  if (variant == 2) opt = fc::Options::paper();
  if (variant == 3) opt = fc::Options::with_query_tail();
  out->tails.assign(static_cast<std::size_t>(heads * n), 0.0f);
  fc::TailView<const float> tails;
  if (opt.score.query == fc::QueryInput::tail) {
    fc::TailAccumulator acc;
    const auto qv = fc::hnd(q.data(), fc::Heads(2 * heads), fc::Tokens(n), fc::HeadDim(d));
    const fc::Status s = acc.add(qv, 0, kv, nullptr, {out->tails.data(), heads, n}, fc::last_queries(n));
    if (!s.ok()) return std::fprintf(stderr, "tails: %s\n", s.message().c_str()), false;
    tails = {out->tails.data(), heads, n};
  }
  fc::Scorer<float> scorer;
  fc::LayerScores scores;
  fc::Status s = scorer.score(kv, vv, opt.score, &scores, fc::ScoreInputs{{}, tails});
  if (!s.ok()) return std::fprintf(stderr, "score: %s\n", s.message().c_str()), false;
  std::int64_t keep = 0;
  s = fc::Budget::ratio(0.2).resolve(n, &keep);
  out->kept.resize(static_cast<std::size_t>(heads * keep));
  fc::SelectWorkspace ws;
  if (s.ok()) s = fc::select_tokens(scores.view(), keep, opt.select, fc::ProtectMask{}, {}, &ws, fc::KeptView{out->kept.data(), keep});
  if (!s.ok()) return std::fprintf(stderr, "select: %s\n", s.message().c_str()), false;
  out->scores = scores.score;
  return true;
}

constexpr std::int64_t kLengths[] = {157, 613, 1000};
constexpr int kVariants = 4;

template <class V>
void write_vec(std::FILE* f, const std::vector<V>& x) {
  const std::uint64_t n = x.size();
  std::fwrite(&n, sizeof n, 1, f);
  std::fwrite(x.data(), sizeof(V), x.size(), f);
}
template <class V>
bool read_vec(std::FILE* f, std::vector<V>* x) {
  std::uint64_t n = 0;
  if (std::fread(&n, sizeof n, 1, f) != 1 || n > (1u << 24)) return false;
  x->resize(n);
  return std::fread(x->data(), sizeof(V), n, f) == n;
}

// Differences of `got` from `want`: scores past 1e-4 of the head's largest, tails past 1e-5,
// kept tokens outside the other set whose score is not within 1e-4 of the cut's.
int compare(const Result& want, const Result& got, std::int64_t n, const char* name) {
  const std::int64_t heads = 3, keep = static_cast<std::int64_t>(want.kept.size()) / heads;
  int bad = 0;
  if (got.scores.size() != want.scores.size() || got.kept.size() != want.kept.size()) {
    std::fprintf(stderr, "%s: sizes differ\n", name);
    return 1;
  }
  for (std::int64_t h = 0; h < heads; ++h) {
    double largest = 0;
    for (std::int64_t t = 0; t < n; ++t) {
      const float s = want.scores[static_cast<std::size_t>(h * n + t)];
      if (std::isfinite(s)) largest = std::max(largest, static_cast<double>(s));
    }
    for (std::int64_t t = 0; t < n; ++t) {
      const float a = want.scores[static_cast<std::size_t>(h * n + t)], b = got.scores[static_cast<std::size_t>(h * n + t)];
      if (std::isfinite(a) != std::isfinite(b) || (std::isfinite(a) && std::fabs(a - b) > 1e-4 * largest)) {
        if (bad++ < 5) std::fprintf(stderr, "%s: head %lld token %lld: score %g against %g\n", name,
                                    static_cast<long long>(h), static_cast<long long>(t), b, a);
      }
      const float ta = want.tails[static_cast<std::size_t>(h * n + t)], tb = got.tails[static_cast<std::size_t>(h * n + t)];
      if (std::fabs(ta - tb) > 1e-5f && bad++ < 5)
        std::fprintf(stderr, "%s: head %lld token %lld: tail %g against %g\n", name, static_cast<long long>(h),
                     static_cast<long long>(t), tb, ta);
    }
    const auto* wk = want.kept.data() + h * keep;
    const auto* gk = got.kept.data() + h * keep;
    float cut = INFINITY;  // the lowest score the generic build kept
    for (std::int64_t j = 0; j < keep; ++j) cut = std::min(cut, want.scores[static_cast<std::size_t>(h * n + wk[j])]);
    for (std::int64_t i = 0; i < keep; ++i) {
      if (std::binary_search(wk, wk + keep, gk[i])) continue;
      const float s = want.scores[static_cast<std::size_t>(h * n + gk[i])];
      if (std::fabs(s - cut) > 1e-4 * largest && bad++ < 5)
        std::fprintf(stderr, "%s: head %lld keeps token %d (score %g, cut %g) that the generic build does not\n", name,
                     static_cast<long long>(h), gk[i], s, cut);
    }
  }
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  const bool comparing = argc == 3 && std::strcmp(argv[1], "--compare") == 0;
  if (!(argc == 2 || comparing)) {
    std::fprintf(stderr, "usage: %s OUT.bin | %s --compare GENERIC.bin\n", argv[0], argv[0]);
    return 2;
  }
  std::FILE* f = std::fopen(argv[comparing ? 2 : 1], comparing ? "rb" : "wb");
  if (f == nullptr) {
    std::fprintf(stderr, "cannot open %s\n", argv[comparing ? 2 : 1]);
    return 2;
  }
  int bad = 0, cases = 0;
  for (std::int64_t n : kLengths)
    for (int variant = 0; variant < kVariants; ++variant) {
      Result r;
      if (!run_case(n, variant, &r)) return 1;
      const std::string name = "length " + std::to_string(n) + " variant " + std::to_string(variant);
      if (!comparing) {
        write_vec(f, r.scores);
        write_vec(f, r.tails);
        write_vec(f, r.kept);
      } else {
        Result want;
        if (!read_vec(f, &want.scores) || !read_vec(f, &want.tails) || !read_vec(f, &want.kept)) {
          std::fprintf(stderr, "%s: %s ends early\n", name.c_str(), argv[2]);
          return 1;
        }
        bad += compare(want, r, n, name.c_str());
      }
      ++cases;
    }
  std::fclose(f);
  if (comparing) std::printf("%d cases, %d differences: %s\n", cases, bad, bad == 0 ? "the same" : "DIFFERENT");
  return bad == 0 ? 0 : 1;
}
