// fuzz_compress: the CPU API -- flashcache::compress, flashcache::compress_model
// and policies::compress_model -- on shapes, strides, dtypes (float, half_t,
// bfloat16_t), budgets and options decoded from the bytes. Every call must
// either throw flashcache::Error with a message, or return a valid result:
// per head `budget` kept indices, ascending and in range, protected and
// non-finite tokens among them, K'/V' rows equal to the kept input rows, and
// layer budgets that add up to the model total. Anything else aborts.
//
// Buffers are sized exactly for the views the input describes, so a view the
// API wrongly accepts (bad strides, a short mask) shows up as an ASan report.
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "flashcache/flashcache.hpp"
#include "flashcache/policies/baselines.hpp"
#include "fuzz_util.hpp"

namespace fc = flashcache;
namespace fz = flashcache::fuzz;
using fc::KVView;

namespace {

// Caps that keep one input well under a millisecond.
constexpr int kMaxLayers = 3, kMaxHeads = 3, kMaxTokens = 40, kMaxDim = 8, kMaxGroup = 2;
constexpr std::size_t kMaxElements = 1 << 14;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr std::int64_t kHuge = std::numeric_limits<std::int64_t>::max();

double pick_real(FuzzedDataProvider& in, std::initializer_list<double> specials) {
  const auto i = in.ConsumeIntegralInRange<std::size_t>(0, specials.size());
  return i < specials.size() ? specials.begin()[i] : in.ConsumeProbability<double>();
}

std::int64_t pick_count(FuzzedDataProvider& in, std::int64_t lo, std::int64_t hi) {
  switch (in.ConsumeIntegralInRange(0, 15)) {
    case 0:
      return kHuge;
    case 1:
      return -kHuge - 1;
    default:
      return in.ConsumeIntegralInRange<std::int64_t>(lo, hi);
  }
}

// One view and the buffer it points into (exactly as large as the view reaches).
template <class T>
struct Tensor {
  std::vector<T> buf;
  KVView<const T> view;
};

template <class T>
T from_float(float f) {
  if constexpr (std::is_same_v<T, float>)
    return f;
  else
    return T(f);
}

template <class T>
Tensor<T> make_tensor(FuzzedDataProvider& in, std::int64_t heads, std::int64_t tokens, std::int64_t dim) {
  Tensor<T> t;
  std::int64_t hs = tokens * dim, ts = dim;  // hnd
  switch (in.ConsumeIntegralInRange(0, 4)) {
    case 1:  // nhd
      hs = dim;
      ts = heads * dim;
      break;
    case 2: {  // padded rows and heads
      ts = dim + in.ConsumeIntegralInRange(0, 3);
      hs = tokens * ts + in.ConsumeIntegralInRange(0, 5);
      break;
    }
    case 3:  // anything: the API must refuse what overlaps
      hs = in.ConsumeIntegralInRange<std::int64_t>(-3, 200);
      ts = in.ConsumeIntegralInRange<std::int64_t>(-3, 60);
      break;
    default:
      break;
  }
  // The furthest element a (non-negative) view reaches, plus one.
  std::int64_t reach = 0;
  if (heads > 0 && tokens > 0 && dim > 0)
    reach = (heads - 1) * std::max<std::int64_t>(hs, 0) + (tokens - 1) * std::max<std::int64_t>(ts, 0) + dim;
  if (reach > static_cast<std::int64_t>(kMaxElements)) {
    hs = tokens * dim;
    ts = dim;
    reach = heads * tokens * dim;
  }
  t.buf.resize(static_cast<std::size_t>(reach));
  // Values: a cheap pseudo-random fill, plus a few special values where the input says.
  std::uint32_t state = in.ConsumeIntegral<std::uint32_t>() | 1u;
  const float scale = std::ldexp(1.0f, in.ConsumeIntegralInRange(-20, 20));
  for (auto& x : t.buf) {
    state = state * 1664525u + 1013904223u;
    x = from_float<T>(scale * (static_cast<float>(state >> 8) / 8388608.0f - 1.0f));
  }
  static const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                                   std::numeric_limits<float>::infinity(),
                                   -std::numeric_limits<float>::infinity(),
                                   0.0f,
                                   -0.0f,
                                   1e-40f,
                                   65504.0f,
                                   3e38f,
                                   -3e38f};
  for (int s = in.ConsumeIntegralInRange(0, 3); s > 0 && !t.buf.empty(); --s) {
    const auto at = in.ConsumeIntegralInRange<std::size_t>(0, t.buf.size() - 1);
    t.buf[at] = from_float<T>(specials[in.ConsumeIntegralInRange<std::size_t>(0, std::size(specials) - 1)]);
  }
  const T* data = t.buf.empty() ? nullptr : t.buf.data();
  if (in.ConsumeIntegralInRange(0, 31) == 0) data = nullptr;  // must be refused unless the view is empty
  t.view = KVView<const T>(data, heads, tokens, dim, hs, ts);
  return t;
}

// Options, and the image spans the request gives with them.
fc::Options make_options(FuzzedDataProvider& in, std::vector<fc::GridSpan>* grids) {
  fc::Options o;
  if (in.ConsumeBool()) o.score.gamma = pick_real(in, {0.2, 1.0, 0.0, -0.5, 1e-12, 1.0000001, kNaN, kInf});
  o.score.transform = in.ConsumeBool() ? fc::Transform::blocked : fc::Transform::global;
  if (in.ConsumeBool()) o.score.block_size = pick_count(in, -2, 70);
  if (in.ConsumeBool()) o.select.sink = pick_count(in, -2, 50);
  if (in.ConsumeBool()) o.select.window = pick_count(in, -2, 50);
  o.allocate.mode = in.ConsumeBool() ? fc::Allocation::uniform : fc::Allocation::dynamic;
  if (in.ConsumeBool()) o.allocate.min_layer_ratio = pick_real(in, {0.0, 0.5, 1.0, -0.1, 1.5, kNaN});
  if (in.ConsumeBool()) o.select.window_share = pick_real(in, {0.0, 0.1, 1.0, -0.1, 1.5, kNaN});
  if (in.ConsumeBool()) o.select.base_share = pick_real(in, {0.0, 0.25, 1.0, -0.1, 1.5, kNaN});
  if (in.ConsumeIntegralInRange(0, 3) == 0) {  // image spans, possibly overlapping or outside the layer
    const int spans = in.ConsumeIntegralInRange(1, 2);
    for (int i = 0; i < spans; ++i)
      grids->push_back({pick_count(in, -1, 40), pick_count(in, -1, 8), pick_count(in, -1, 8)});
    if (in.ConsumeBool()) o.score.grid_zone = fc::GridZone::triangle;
    if (in.ConsumeBool()) o.score.grid_tile = pick_count(in, -1, 9);
    if (in.ConsumeBool()) o.select.grid_base_share = pick_real(in, {0.0, 0.5, 1.0, -0.1, kNaN});
  }
  return o;
}

fc::Budget make_budget(FuzzedDataProvider& in) {
  if (in.ConsumeBool()) return fc::Budget::tokens(pick_count(in, -2, 60));
  return fc::Budget::ratio(pick_real(in, {0.2, 0.0, 1.0, -0.1, 1.1, kNaN, kInf, 0.5}));
}

// What the API should resolve a budget to for `tokens` tokens (only called after success).
std::int64_t resolved(const fc::Budget& b, std::int64_t tokens) {
  return b.is_ratio() ? std::llround(b.ratio_value() * static_cast<double>(tokens)) : b.token_count();
}

std::string shape(std::int64_t h, std::int64_t n, std::int64_t d) {
  return std::to_string(h) + "x" + std::to_string(n) + "x" + std::to_string(d);
}

// One compressed layer against its inputs.
template <class T>
void check_layer(const fc::CompressedLayer<T>& out, KVView<const T> k, KVView<const T> v, std::int64_t budget,
                 const fc::Options& o, const std::vector<std::uint8_t>& mask) {
  const std::string where = shape(k.heads, k.tokens, k.head_dim) + " budget " + std::to_string(budget);
  FUZZ_CHECK(out.heads == k.heads && out.tokens == k.tokens && out.head_dim == k.head_dim, where);
  FUZZ_CHECK(out.budget == budget && budget >= 0 && budget <= k.tokens, where);
  const auto rows = static_cast<std::size_t>(k.heads * budget);
  FUZZ_CHECK(out.kept.size() == rows, where);
  FUZZ_CHECK(out.k.size() == rows * static_cast<std::size_t>(k.head_dim) && out.v.size() == out.k.size(), where);
  const std::int64_t n = k.tokens;
  std::vector<std::uint8_t> kept(static_cast<std::size_t>(n));
  for (std::int64_t h = 0; h < k.heads; ++h) {
    std::fill(kept.begin(), kept.end(), 0);
    const std::int32_t* idx = out.kept_head(h);
    for (std::int64_t j = 0; j < budget; ++j) {
      FUZZ_CHECK(idx[j] >= 0 && idx[j] < n, where + ": kept index " + std::to_string(idx[j]) + " out of range");
      FUZZ_CHECK(j == 0 || idx[j] > idx[j - 1], where + ": kept indices not ascending in head " + std::to_string(h));
      kept[static_cast<std::size_t>(idx[j])] = 1;
      // K', V' rows are the kept input rows, bit for bit.
      const std::size_t row = static_cast<std::size_t>((h * budget + j) * k.head_dim);
      const std::size_t bytes = static_cast<std::size_t>(k.head_dim) * sizeof(T);
      FUZZ_CHECK(std::memcmp(&out.k[row], k.row(h, idx[j]), bytes) == 0, where + ": K' row differs");
      FUZZ_CHECK(std::memcmp(&out.v[row], v.row(h, idx[j]), bytes) == 0, where + ": V' row differs");
    }
    for (std::int64_t t = 0; t < n; ++t) {
      const bool forced = t < o.select.sink || t >= n - o.select.window || (!mask.empty() && mask[static_cast<std::size_t>(t)]) ||
                          fc::is_forced_score(out.scores(h, t));
      FUZZ_CHECK(!forced || kept[static_cast<std::size_t>(t)],
                 where + ": protected or non-finite token " + std::to_string(t) + " dropped");
    }
  }
}

template <class T>
void check_model(const fc::CompressedModel<T>& m, const std::vector<KVView<const T>>& k,
                 const std::vector<KVView<const T>>& v, const fc::Budget& b, const fc::Options& o,
                 const std::vector<std::uint8_t>& mask) {
  const std::size_t L = k.size();
  FUZZ_CHECK(m.layers.size() == L && m.budgets.size() == L && m.energy_ratio.size() == L, "layer count");
  std::int64_t sum = 0, all_tokens = 0;
  for (std::size_t l = 0; l < L; ++l) {
    check_layer(m.layers[l], k[l], v[l], m.budgets[l], o, mask);
    sum += m.budgets[l];
    all_tokens += k[l].tokens;
    if (o.allocate.mode == fc::Allocation::uniform) {
      FUZZ_CHECK(m.budgets[l] == resolved(b, k[l].tokens), "uniform budget of layer " + std::to_string(l));
    } else {
      const double floor = std::ceil(o.allocate.min_layer_ratio * static_cast<double>(k[l].tokens) - 1e-9);
      FUZZ_CHECK(static_cast<double>(m.budgets[l]) >= floor, "layer " + std::to_string(l) + " below min_layer_ratio");
    }
  }
  if (o.allocate.mode == fc::Allocation::dynamic) {
    const std::int64_t total = b.is_ratio() ? resolved(b, all_tokens) : b.token_count() * static_cast<std::int64_t>(L);
    FUZZ_CHECK(sum == total, "budgets sum to " + std::to_string(sum) + ", not " + std::to_string(total));
  }
}

void check_error(const fc::Error& e) {
  const std::string msg = e.what(), prefix = "flashcache: ";
  FUZZ_CHECK(msg.size() > prefix.size() && msg.compare(0, prefix.size(), prefix) == 0, msg);
  FUZZ_CHECK(e.code() != fc::Errc::ok, msg);
}

template <class T>
void run(FuzzedDataProvider& in) {
  const int entry = in.ConsumeIntegralInRange(0, 2);        // compress, compress_model, policies::compress_model
  const bool exact = in.ConsumeIntegralInRange(0, 7) == 0;  // Real = double
  const int layers = entry == 0 ? 1 : in.ConsumeIntegralInRange(0, kMaxLayers);
  const bool same_shape = in.ConsumeBool();
  std::int64_t H = in.ConsumeIntegralInRange(0, kMaxHeads), N = in.ConsumeIntegralInRange(0, kMaxTokens),
               D = in.ConsumeIntegralInRange(0, kMaxDim);
  std::vector<Tensor<T>> ks, vs, qs;
  for (int l = 0; l < layers; ++l) {
    if (!same_shape && l > 0) {
      H = in.ConsumeIntegralInRange(0, kMaxHeads);
      N = in.ConsumeIntegralInRange(0, kMaxTokens);
      D = in.ConsumeIntegralInRange(0, kMaxDim);
    }
    ks.push_back(make_tensor<T>(in, H, N, D));
    // Now and then V disagrees with K.
    const int odd = in.ConsumeIntegralInRange(0, 15);
    vs.push_back(make_tensor<T>(in, H + (odd == 1), N + (odd == 2), D + (odd == 3)));
  }
  const fc::policies::Policy policy = static_cast<fc::policies::Policy>(in.ConsumeIntegralInRange(0, 5));
  if (entry == 2 && fc::policies::needs_queries(policy)) {
    const int q_layers = layers + (in.ConsumeIntegralInRange(0, 15) == 0 ? 1 : 0);
    for (int l = 0; l < q_layers && layers > 0; ++l) {
      const auto& k = ks[static_cast<std::size_t>(std::min(l, layers - 1))].view;
      const std::int64_t qh = in.ConsumeIntegralInRange(0, 7) == 0 ? in.ConsumeIntegralInRange(0, 7)
                                                                   : k.heads * in.ConsumeIntegralInRange(1, kMaxGroup);
      const int odd = in.ConsumeIntegralInRange(0, 15);
      qs.push_back(make_tensor<T>(in, qh, k.tokens + (odd == 1), k.head_dim + (odd == 2)));
    }
  }
  // The mask is exactly as long as layer 0's tokens: a longer read is an ASan report.
  std::vector<std::uint8_t> mask;
  const bool use_mask = layers > 0 && in.ConsumeIntegralInRange(0, 3) == 0;
  if (use_mask) {
    mask.resize(static_cast<std::size_t>(ks[0].view.tokens));
    for (auto& m : mask) m = in.ConsumeIntegralInRange(0, 5) == 0 ? in.ConsumeIntegral<std::uint8_t>() : 0;
  }
  std::vector<fc::GridSpan> spans;
  const fc::Options opt = make_options(in, &spans);
  // One mask for every layer: a layer of another length is a named error.
  const fc::ProtectMask layer_mask = mask.empty() ? fc::ProtectMask{} : fc::ProtectMask(mask);
  const std::vector<fc::ProtectMask> masks(mask.empty() ? 0 : ks.size(), layer_mask);
  const fc::Budget budget = make_budget(in);
  fc::policies::PolicyOptions po;
  po.seed = in.ConsumeIntegral<std::uint64_t>();
  if (in.ConsumeBool()) po.observation_window = pick_count(in, -1, 60);
  if (in.ConsumeBool()) po.pool_kernel = in.ConsumeIntegralInRange<std::int64_t>(-1, 9);

  std::vector<KVView<const T>> k, v, q;
  for (const auto& t : ks) k.push_back(t.view);
  for (const auto& t : vs) v.push_back(t.view);
  for (const auto& t : qs) q.push_back(t.view);
  if (layers > 0 && in.ConsumeIntegralInRange(0, 15) == 0) v.pop_back();  // K and V layer counts differ

  try {
    if (entry == 0) {
      const auto out = exact ? fc::compress<double, const T>(k[0], v[0], budget, opt, layer_mask, spans)
                             : fc::compress<float, const T>(k[0], v[0], budget, opt, layer_mask, spans);
      check_layer(out, k[0], v[0], resolved(budget, k[0].tokens), opt, mask);
    } else if (entry == 1) {
      const auto m = exact ? fc::compress_model<double, const T>(k, v, budget, opt, masks, spans)
                           : fc::compress_model<float, const T>(k, v, budget, opt, masks, spans);
      check_model(m, k, v, budget, opt, mask);
    } else {
      const auto m = exact ? fc::policies::compress_model<double, const T>(policy, q, k, v, budget, opt, po, masks, spans)
                           : fc::policies::compress_model<float, const T>(policy, q, k, v, budget, opt, po, masks, spans);
      check_model(m, k, v, budget, opt, mask);
    }
  } catch (const fc::Error& e) {
    check_error(e);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  switch (in.ConsumeIntegralInRange(0, 2)) {
    case 0:
      run<float>(in);
      break;
    case 1:
      run<fc::half_t>(in);
      break;
    default:
      run<fc::bfloat16_t>(in);
      break;
  }
  return 0;
}
