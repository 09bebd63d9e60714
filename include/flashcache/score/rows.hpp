#pragma once
// Score's parts (CPU; score.hpp's Scorer puts them together): the rows one
// head's transforms read, and the per-token sums the residual classes
// (global.hpp, blocked.hpp, grid.hpp) write.
//
// Non-finite values: a token whose K or V row holds a NaN or infinity reads,
// for the transform, the nearest finite token before it (after it, for leading
// ones), so that it cannot spread through the transform. With RoPE de-rotation
// the transform reads one head's keys rotated back, as float rows.
#include <cmath>
#include <cstdint>
#include <vector>

#include "flashcache/options.hpp"
#include "flashcache/rules.hpp"
#include "flashcache/types.hpp"
#include "flashcache/view.hpp"

namespace flashcache {
namespace detail {

// Per-token sums of one head over its head dim, written by the residual
// classes: the residual ||X[t] - Xb[t]||^2 and the total ||X[t]||^2, of K and V.
template <class Real>
struct TokenResiduals {
  std::vector<Real> residual_k, residual_v;
  std::vector<Real> total_k, total_v;
};

// (*source)[t]: the row the transform reads for token t of head h. A finite
// token reads itself; a non-finite one the nearest finite token before it
// (after it, when it leads), or -1 (zeros) when the head has none. Returns the
// count of non-finite tokens. Grows *source only past its largest length.
template <class T>
std::int64_t map_nonfinite_rows(KVView<const T> k, KVView<const T> v, std::int64_t h,
                                std::vector<std::int64_t>* source) {
  const std::int64_t n = k.tokens, d = k.head_dim;
  source->resize(static_cast<std::size_t>(n));
  std::vector<std::int64_t>& src = *source;
  std::int64_t bad = 0, last_good = -1;
  for (std::int64_t t = 0; t < n; ++t) {
    const T* kr = k.row(h, t);
    const T* vr = v.row(h, t);
    bool finite = true;
    for (std::int64_t c = 0; c < d; ++c) {
      const bool k_ok = std::isfinite(to_float(kr[c])), v_ok = std::isfinite(to_float(vr[c]));
      finite &= k_ok & v_ok;  // no branch per element
    }
    if (finite) {
      if (last_good < 0)  // leading non-finite tokens take the first finite one
        for (std::int64_t u = 0; u < t; ++u) src[static_cast<std::size_t>(u)] = t;
      last_good = t;
    } else {
      ++bad;
    }
    src[static_cast<std::size_t>(t)] = finite ? t : last_good;
  }
  return bad;
}

// Element c of row src (from map_nonfinite_rows) of head h, as Real; 0 for -1.
template <class Real, class T>
Real source_element(KVView<const T> x, std::int64_t h, std::int64_t src, std::int64_t c) {
  return src < 0 ? Real(0) : static_cast<Real>(to_float(x(h, src, c)));
}

// Each token's squared distance from head h's mean K and V row, over the rows
// the transform reads (map_nonfinite_rows' src; the mean over the finite
// tokens): the residual against the DC base alone, what ScoreOptions::mean_weight
// mixes in (summed in Real, kept as float, as scores are). *mean is scratch
// [2 d]; *out gets [tokens].
template <class Real, class T>
void distance_from_mean(KVView<const T> k, KVView<const T> v, std::int64_t h, const std::vector<std::int64_t>& src,
                        std::vector<Real>* mean, std::vector<float>* out) {
  const std::int64_t n = k.tokens, d = k.head_dim;
  mean->assign(static_cast<std::size_t>(2 * d), Real(0));
  out->resize(static_cast<std::size_t>(n));
  std::int64_t finite = 0;
  for (std::int64_t t = 0; t < n; ++t) {
    if (src[static_cast<std::size_t>(t)] != t) continue;
    ++finite;
    for (std::int64_t c = 0; c < d; ++c) {
      (*mean)[static_cast<std::size_t>(c)] += static_cast<Real>(to_float(k(h, t, c)));
      (*mean)[static_cast<std::size_t>(d + c)] += static_cast<Real>(to_float(v(h, t, c)));
    }
  }
  if (finite > 0)
    for (Real& x : *mean) x /= static_cast<Real>(finite);
  for (std::int64_t t = 0; t < n; ++t) {
    const std::int64_t s = src[static_cast<std::size_t>(t)];
    Real sum = 0;
    for (std::int64_t c = 0; c < d; ++c) {
      const Real dk = source_element<Real>(k, h, s, c) - (*mean)[static_cast<std::size_t>(c)];
      const Real dv = source_element<Real>(v, h, s, c) - (*mean)[static_cast<std::size_t>(d + c)];
      sum += dk * dk + dv * dv;
    }
    (*out)[static_cast<std::size_t>(t)] = static_cast<float>(sum / static_cast<Real>(d));
  }
}

// Each token's cosine distance from head h's mean key direction, 1 - cos(k_t,
// a) with a the mean of the finite tokens' unit keys (KeyDiff's anchor), over
// the rows the transform reads (src, as distance_from_mean). A zero key, or a
// zero anchor, has cosine 0 (rules::key_cosine_distance). *anchor is scratch
// [d], *norms scratch [tokens] (each finite row's key norm, computed once);
// *out gets [tokens].
template <class Real, class T>
void key_cosine_from_mean(KVView<const T> k, std::int64_t h, const std::vector<std::int64_t>& src,
                          std::vector<Real>* anchor, std::vector<Real>* norms, std::vector<float>* out) {
  const std::int64_t n = k.tokens, d = k.head_dim;
  anchor->assign(static_cast<std::size_t>(d), Real(0));
  norms->resize(static_cast<std::size_t>(n));
  out->resize(static_cast<std::size_t>(n));
  for (std::int64_t t = 0; t < n; ++t) {
    if (src[static_cast<std::size_t>(t)] != t) continue;  // a non-finite row reads a finite one's norm
    Real sq = 0;
    for (std::int64_t c = 0; c < d; ++c) sq += source_element<Real>(k, h, t, c) * source_element<Real>(k, h, t, c);
    const Real norm = std::sqrt(sq);
    (*norms)[static_cast<std::size_t>(t)] = norm;
    if (norm > 0)
      for (std::int64_t c = 0; c < d; ++c)
        (*anchor)[static_cast<std::size_t>(c)] += static_cast<Real>(to_float(k(h, t, c))) / norm;
  }
  Real anchor_sq = 0;  // the anchor's scale cancels in the cosine: the sum serves as the mean
  for (const Real x : *anchor) anchor_sq += x * x;
  const Real anchor_norm = std::sqrt(anchor_sq);
  for (std::int64_t t = 0; t < n; ++t) {
    const std::int64_t s = src[static_cast<std::size_t>(t)];
    const Real norm = s < 0 ? Real(0) : (*norms)[static_cast<std::size_t>(s)];  // -1: no finite row, zeros
    Real dot = 0;
    for (std::int64_t c = 0; c < d; ++c)
      dot += source_element<Real>(k, h, s, c) * (*anchor)[static_cast<std::size_t>(c)];
    const Real cosine = norm > 0 && anchor_norm > 0 ? dot / (norm * anchor_norm) : Real(0);
    (*out)[static_cast<std::size_t>(t)] = static_cast<float>(rules::key_cosine_distance(static_cast<double>(cosine)));
  }
}

// One head of K rotated back to its pre-RoPE form, and V, as float rows
// [tokens][head_dim]; inv_freq is scratch. Kept between heads and layers.
struct DerotatedHead {
  std::vector<float> k, v;
  std::vector<double> inv_freq;
};

// Head h of K de-rotated and V copied into *out. Token t sits at position
// first_position + t; pair (i, i + d/2) (half) or (2i, 2i + 1) (interleaved)
// turned by -pos * theta^(-2i/d). A non-finite row stays non-finite;
// map_nonfinite_rows() has already routed around it. head_dim must be even.
template <class T>
void derotate_head(KVView<const T> k, KVView<const T> v, std::int64_t h, const RopeOptions& rope, DerotatedHead* out) {
  const std::int64_t n = k.tokens, d = k.head_dim, half = d / 2;
  out->k.resize(static_cast<std::size_t>(n * d));
  out->v.resize(static_cast<std::size_t>(n * d));
  out->inv_freq.resize(static_cast<std::size_t>(half));
  for (std::int64_t i = 0; i < half; ++i)
    out->inv_freq[static_cast<std::size_t>(i)] =
        std::pow(rope.theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
  for (std::int64_t t = 0; t < n; ++t) {
    float* kr = out->k.data() + t * d;
    float* vr = out->v.data() + t * d;
    for (std::int64_t c = 0; c < d; ++c) {
      kr[c] = to_float(k(h, t, c));
      vr[c] = to_float(v(h, t, c));
    }
    const double pos = static_cast<double>(rope.first_position + t);
    for (std::int64_t i = 0; i < half; ++i) {
      const std::int64_t a = rope.layout == RopeLayout::half ? i : 2 * i;
      const std::int64_t b = rope.layout == RopeLayout::half ? i + half : 2 * i + 1;
      const double angle = pos * out->inv_freq[static_cast<std::size_t>(i)];
      const double c = std::cos(angle), s = std::sin(angle);
      const double x = kr[a], y = kr[b];
      kr[a] = static_cast<float>(x * c + y * s);
      kr[b] = static_cast<float>(y * c - x * s);
    }
  }
}

}  // namespace detail
}  // namespace flashcache
