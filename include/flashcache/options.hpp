#pragma once
// What a caller can choose, with the documented defaults, and the checks that
// refuse anything out of range before any work starts.
#include <cmath>
#include <cstdint>

#include "config.hpp"
#include "enum_names.hpp"
#include "error.hpp"
#include "grid.hpp"
#include "rules.hpp"

namespace flashcache {

// Scope of the DCT along the token axis.
enum class Transform {
  global,   // one transform over the whole sequence (the paper's form), O(N log N)
  blocked,  // independent transforms over blocks of `block_size` tokens
};

template <>
struct EnumNames<Transform> {
  static constexpr EnumName<Transform> table[] = {{Transform::global, "global"}, {Transform::blocked, "blocked"}};
};
inline const char* to_string(Transform e) { return enum_name(e); }

// Which DCT frequencies of a head form its Base KV (the smooth part that the
// outlier score measures deviation from). Frequencies are chosen per head and
// per transform (each block of Transform::blocked), separately for K and V;
// the count is m = lowpass_cutoff(length, gamma) for every kind.
enum class Base {
  lowpass,  // the m lowest frequencies (the paper's filter)
  peak,     // the m frequencies with the most energy (summed over the head dim): a
            // repeated pattern, with all its harmonics, becomes part of the base and
            // what breaks the pattern is the outlier
  mixed,    // the ceil(m / 2) lowest, then the strongest of the others up to m
};

template <>
struct EnumNames<Base> {
  static constexpr EnumName<Base> table[] = {{Base::lowpass, "lowpass"}, {Base::peak, "peak"}, {Base::mixed, "mixed"}};
};
inline const char* to_string(Base e) { return enum_name(e); }

// How a model-wide budget is split over layers (compress_model only).
enum class Allocation {
  dynamic,  // in proportion to each layer's high-frequency energy ratio R_l
  uniform,  // every layer keeps the same ratio / count
};

template <>
struct EnumNames<Allocation> {
  static constexpr EnumName<Allocation> table[] = {{Allocation::dynamic, "dynamic"}, {Allocation::uniform, "uniform"}};
};
inline const char* to_string(Allocation e) { return enum_name(e); }

// What the score reads of the prompt's queries (query_tail.hpp).
enum class QueryInput {
  none,  // nothing: the score is the residual alone (works without queries)
  tail,  // each key's tail, the largest attention probability a prompt query gave it,
         // mixed with the residual by ScoreOptions::tail_weight
};

template <>
struct EnumNames<QueryInput> {
  static constexpr EnumName<QueryInput> table[] = {{QueryInput::none, "none"}, {QueryInput::tail, "tail"}};
};
inline const char* to_string(QueryInput e) { return enum_name(e); }

// How QueryInput::tail puts the two terms together, each over its head mean:
// r = (1 - tail_weight) residual / mean, t = tail_weight tail / mean.
enum class TailMix {
  sum,  // r + t: a token needs both to rank high
  max,  // max(r, t): either flags it (an outlier, or a key one query needs)
};

template <>
struct EnumNames<TailMix> {
  static constexpr EnumName<TailMix> table[] = {{TailMix::sum, "sum"}, {TailMix::max, "max"}};
};
inline const char* to_string(TailMix e) { return enum_name(e); }

// What ScoreOptions::mean_weight measures of a token against its head's whole
// context.
enum class MeanDistance {
  kv_squared,  // its squared distance from the head's mean K and V rows (the DC base's residual)
  key_cosine,  // 1 - cos(key, mean of the head's unit keys): KeyDiff's, the key's direction only
};

template <>
struct EnumNames<MeanDistance> {
  static constexpr EnumName<MeanDistance> table[] = {{MeanDistance::kv_squared, "kv_squared"},
                                                     {MeanDistance::key_cosine, "key_cosine"}};
};
inline const char* to_string(MeanDistance e) { return enum_name(e); }

// Which dimensions a rotary position embedding pairs up.
enum class RopeLayout {
  half,        // dimension i with i + d/2 (Hugging Face "rotate_half"; vLLM, transformers)
  interleaved  // dimension 2i with 2i + 1 (GPT-J style; llama.cpp's permuted GGUF weights)
};

template <>
struct EnumNames<RopeLayout> {
  static constexpr EnumName<RopeLayout> table[] = {{RopeLayout::half, "half"},
                                                   {RopeLayout::interleaved, "interleaved"}};
};
inline const char* to_string(RopeLayout e) { return enum_name(e); }

// Engines cache keys after RoPE, whose fast-rotating dimensions oscillate along
// the token axis. With `derotate`, the scorer undoes the rotation (token t at
// position `first_position + t`, angle pos * theta^(-2i/d)) before the DCT.
struct RopeOptions {
  bool derotate = false;
  double theta = 10000.0;
  RopeLayout layout = RopeLayout::half;
  std::int64_t first_position = 0;
};

// ScoreOptions::bridge's bound: a bridge is for short runs (a number, a name),
// and costs O(bridge) per token.
constexpr std::int64_t kMaxBridge = 64;

// How a layer's tokens are scored (score.hpp, the GPU's stage 1). Where each
// default comes from: docs/DEFAULTS.md.
struct ScoreOptions {
  // Base ratio: m = max(1, ceil(gamma * N)) frequencies form the Base KV
  // (0.05 since 0.1.0's RULER round eighteen; 0.1 before).
  double gamma = 0.05;
  Base base = Base::peak;                   // which m frequencies (see Base)
  Transform transform = Transform::global;  // the paper's; blocked is one fused pass on the GPU
  // Tokens per block for Transform::blocked; the last block may be shorter and
  // is transformed at its own length.
  std::int64_t block_size = 64;
  // Divide the K and V terms each by its head's mean over the tokens, so that
  // neither dominates by scale (the paper sums them unweighted). CPU only.
  bool normalize_terms = false;
  RopeOptions rope;  // score keys in their pre-RoPE form (CPU only)
  // What the score reads of the prompt's queries. With QueryInput::tail the
  // caller passes each key's tail (query_tail.hpp) and a token scores
  //   (1 - tail_weight) * residual / mean residual + tail_weight * tail / mean tail
  // (or the larger of the two terms: tail_mix), means over the head's finite
  // tokens; none scores the residual alone, as the paper does.
  QueryInput query = QueryInput::none;
  double tail_weight = 0.5;
  TailMix tail_mix = TailMix::sum;
  // A second, coarser base: each token's distance from its head's mean K and V
  // (the DC base alone: how far it stands from the whole context, where the
  // residual tells how far from its neighbourhood), mixed in as the tails are,
  // (1 - mean_weight) * residual / mean + mean_weight * distance / mean (or the
  // larger term: mean_mix). 0: the residual alone, as the paper scores. The
  // residual ranks a short run of tokens unlike the text around it (a number
  // in prose) low, since the base draws that run's bump; the distance keeps it
  // (a gain on RULER-style tasks at light compression, a loss of passkeys at
  // heavy compression: docs/DEFAULTS.md). The GPU takes head dims up to 6,144
  // with it (cuda/can_implement.cuh).
  double mean_weight = 0.75;
  TailMix mean_mix = TailMix::sum;
  // Which distance (MeanDistance): a key's cosine distance from the mean
  // direction (KeyDiff's, the default since RULER's round eighteen), or K and V
  // from their means (kv_squared, the default before).
  MeanDistance mean_distance = MeanDistance::key_cosine;
  // The weight follows the budget (mean_weight_at): in full where the caller
  // keeps at least mean_full_keep of the tokens, none at or below
  // mean_zero_keep, linearly between. Both 0: mean_weight at every budget.
  // The keep ratio reaches the score through ScoreInputs::keep, which every
  // compressing entry point sets (the GPU: each sequence's, from the budget).
  // By default the distance helps where half or more is kept and is off at a
  // quarter or less, where it lost passkeys.
  double mean_full_keep = 0.5;
  double mean_zero_keep = 0.25;
  // Keep runs whole (score/bridge.hpp): after the terms are mixed, a token
  // with a higher-scoring token within `bridge` tokens on each side is raised
  // to the lower of the two, so that a number spelled digit by digit is not
  // kept with a digit missing; an isolated high token is left as it is. 0:
  // none (the paper's). At most kMaxBridge. CPU only.
  std::int64_t bridge = 0;
  // Image spans (given per request, grid.hpp's ImageSpans) are scored by a 2D
  // DCT over their patch grid with a low-pass zone of about gamma of the 2D
  // coefficients; with Transform::blocked a span is cut into grid_tile x
  // grid_tile tiles (the edge tiles at their own size), as JPEG does.
  GridZone grid_zone = GridZone::rectangle;
  std::int64_t grid_tile = 8;
};

// Which tokens every head keeps before the scores rank the rest (select.hpp,
// the GPU's stage 3). The protected tokens count toward the budget.
struct SelectOptions {
  std::int64_t sink = 4;    // the first `sink` tokens (the attention sink)
  std::int64_t window = 0;  // the last `window` tokens
  // A recent window that scales with the budget: after the always-kept tokens,
  // the last round(window_share * B) tokens are kept (B = the layer's budget
  // per head), newest first while the budget lasts.
  double window_share = 0.5;
  // Base + outliers: after the always-kept tokens and the window, up to
  // round(base_share * B) evenly spaced tokens, a regular sample of the smooth
  // base the outlier score discards; the rest to the highest scores.
  double base_share = 0.0;
  // The same inside image spans: a span's share of the budget (by its free
  // tokens) times grid_base_share goes to a regular sub-grid.
  double grid_base_share = 0.75;
};

// How a model-wide budget is split over layers (compress_model, the GPU's stage 2).
struct AllocateOptions {
  Allocation mode = Allocation::dynamic;
  double min_layer_ratio = 0.0;  // a floor on every layer's share, as a fraction of its tokens
};

// Everything a caller can set, in the stages' order. An entry point reads and
// checks only its stages' parts: Scorer::score the score, select_tokens the
// selection, compress() both, compress_model all three. What a request holds
// (the protect mask, image spans, the keys' tails) is given beside the data, not here.
// The defaults were chosen on dev data (docs/DEFAULTS.md); paper() is the paper's algorithm.
struct Options {
  ScoreOptions score;
  SelectOptions select;
  AllocateOptions allocate;

  // The query-informed preset: `base` with each key's tail in the score
  // (QueryInput::tail), for callers that have the prompt's queries. Its feed:
  // QueryTailOptions{} and last_queries() (query_tail.hpp).
  static Options with_query_tail(Options base = {}) {
    base.score.query = QueryInput::tail;
    base.score.tail_weight = 0.5;
    base.score.tail_mix = TailMix::max;
    return base;
  }

  // The paper's algorithm exactly: no sink, no window, no base sample, K and V
  // terms unweighted, keys as cached, global low-pass DCT, gamma 0.2, the residual
  // alone (no distance from the mean, no bridge), dynamic allocation.
  static Options paper() {
    Options o;
    o.score = ScoreOptions{};
    o.score.gamma = 0.2;
    o.score.base = Base::lowpass;
    o.score.transform = Transform::global;
    o.score.mean_weight = 0.0;  // the residual alone
    o.score.mean_full_keep = 0.0;
    o.score.mean_zero_keep = 0.0;
    o.score.bridge = 0;  // each token's own score
    o.score.mean_distance = MeanDistance::kv_squared;  // unread at weight 0; named as before the choice
    o.select.sink = 0;
    o.select.window = 0;
    o.select.window_share = 0.0;
    o.select.base_share = 0.0;
    o.select.grid_base_share = 0.0;
    o.allocate = AllocateOptions{};
    return o;
  }
};

// Number of low frequencies kept: m = max(1, ceil(gamma * n)), at most n.
// The 1e-9 slack keeps products such as 0.1 * 30 = 3.0000000000000004 at 3.
// Host and device code share this one definition.
FLASHCACHE_INLINE std::int64_t lowpass_cutoff(std::int64_t n, double gamma) {
  if (n <= 0) return 0;
  const auto m = static_cast<std::int64_t>(ceil(gamma * static_cast<double>(n) - 1e-9));
  return m < 1 ? 1 : (m > n ? n : m);
}

// The distance from the mean's weight when the caller keeps `keep` of the
// tokens (a ratio in [0, 1]): mean_weight at keep >= mean_full_keep, 0 at keep
// <= mean_zero_keep, linear between (ScoreOptions::mean_full_keep).
inline double mean_weight_at(const ScoreOptions& o, double keep) {
  return rules::faded_weight(o.mean_weight, o.mean_full_keep, o.mean_zero_keep, keep);
}

// The tiles of span g's 2D pass under opt: grid_tile x grid_tile patches with
// Transform::blocked, the whole span with Transform::global.
inline SpanTiling span_tiling(const GridSpan& g, const ScoreOptions& opt) {
  return span_tiling(g.rows, g.cols, opt.transform == Transform::global ? 0 : opt.grid_tile);
}

inline Status check_options(const ScoreOptions& o) {
  // A value cast from an integer outside the enum is refused by name, never read as another.
  if (!is_known(o.transform)) return make_error(Errc::invalid_option, "unknown transform");
  if (!is_known(o.base)) return make_error(Errc::invalid_option, "unknown base");
  if (!is_known(o.query)) return make_error(Errc::invalid_option, "unknown query input");
  if (!is_known(o.tail_mix)) return make_error(Errc::invalid_option, "unknown tail_mix");
  if (!is_known(o.grid_zone)) return make_error(Errc::invalid_option, "unknown grid_zone");
  if (!is_known(o.rope.layout)) return make_error(Errc::invalid_option, "unknown rope layout");
  if (!(o.gamma > 0.0 && o.gamma <= 1.0))
    return make_error(Errc::invalid_option, "gamma ", o.gamma, " is outside (0, 1]");
  if (o.transform == Transform::blocked && !rules::block_size_ok(o.block_size, false))
    return make_error(Errc::invalid_option, "block_size ", o.block_size, " must be at least 1");
  if (!(o.tail_weight >= 0.0 && o.tail_weight <= 1.0))
    return make_error(Errc::invalid_option, "tail_weight ", o.tail_weight, " is outside [0, 1]");
  if (!is_known(o.mean_mix)) return make_error(Errc::invalid_option, "unknown mean_mix");
  if (!is_known(o.mean_distance)) return make_error(Errc::invalid_option, "unknown mean_distance");
  if (!(o.mean_weight >= 0.0 && o.mean_weight <= 1.0))
    return make_error(Errc::invalid_option, "mean_weight ", o.mean_weight, " is outside [0, 1]");
  if (!(o.mean_zero_keep >= 0.0 && o.mean_zero_keep <= 1.0))
    return make_error(Errc::invalid_option, "mean_zero_keep ", o.mean_zero_keep, " is outside [0, 1]");
  if (!(o.mean_full_keep >= o.mean_zero_keep && o.mean_full_keep <= 1.0))
    return make_error(Errc::invalid_option, "mean_full_keep ", o.mean_full_keep, " is outside [mean_zero_keep ",
                      o.mean_zero_keep, ", 1]");
  if (!(o.bridge >= 0 && o.bridge <= kMaxBridge))
    return make_error(Errc::invalid_option, "bridge ", o.bridge, " is outside [0, ", kMaxBridge, "]");
  if (o.grid_tile < 1) return make_error(Errc::invalid_option, "grid_tile ", o.grid_tile, " must be at least 1");
  if (o.rope.derotate && !(o.rope.theta > 1.0 && std::isfinite(o.rope.theta)))
    return make_error(Errc::invalid_option, "rope theta ", o.rope.theta, " must be finite and > 1");
  if (o.rope.derotate && o.rope.first_position < 0)
    return make_error(Errc::invalid_option, "rope first_position ", o.rope.first_position, " is negative");
  return Status::success();
}

inline Status check_options(const SelectOptions& o) {
  if (o.sink < 0) return make_error(Errc::invalid_option, "sink ", o.sink, " is negative");
  if (o.window < 0) return make_error(Errc::invalid_option, "window ", o.window, " is negative");
  if (!(o.window_share >= 0.0 && o.window_share <= 1.0))
    return make_error(Errc::invalid_option, "window_share ", o.window_share, " is outside [0, 1]");
  if (!(o.base_share >= 0.0 && o.base_share <= 1.0))
    return make_error(Errc::invalid_option, "base_share ", o.base_share, " is outside [0, 1]");
  if (!(o.grid_base_share >= 0.0 && o.grid_base_share <= 1.0))
    return make_error(Errc::invalid_option, "grid_base_share ", o.grid_base_share, " is outside [0, 1]");
  return Status::success();
}

inline Status check_options(const AllocateOptions& o) {
  if (!is_known(o.mode)) return make_error(Errc::invalid_option, "unknown allocation mode");
  if (!(o.min_layer_ratio >= 0.0 && o.min_layer_ratio <= 1.0))
    return make_error(Errc::invalid_option, "min_layer_ratio ", o.min_layer_ratio, " is outside [0, 1]");
  return Status::success();
}

inline Status check_options(const Options& o) {
  FLASHCACHE_RETURN_IF_ERROR(check_options(o.score));
  FLASHCACHE_RETURN_IF_ERROR(check_options(o.select));
  return check_options(o.allocate);
}

// How many tokens to keep: an absolute count or a ratio of what is there.
// For one layer it is the count per head. For compress_model it is per layer
// (a ratio of each layer's tokens); Allocation::dynamic then moves budget
// between layers while keeping the model-wide total.
class Budget {
 public:
  static Budget tokens(std::int64_t n) { return Budget(false, static_cast<double>(n), n); }
  static Budget ratio(double r) { return Budget(true, r, 0); }

  bool is_ratio() const { return is_ratio_; }
  double ratio_value() const { return ratio_; }
  std::int64_t token_count() const { return count_; }

  // The share of `available` tokens it keeps, for the score's mean_weight_at:
  // the ratio itself, or the count over what is there (1 when nothing is),
  // clamped to [0, 1] (resolve() refuses a budget outside, by name).
  double keep_ratio(std::int64_t available) const { return rules::keep_share(is_ratio_, ratio_, count_, available); }

  // Tokens to keep out of `available`: round(ratio * available) (halves away
  // from zero) or the count, which must not exceed what is there.
  Status resolve(std::int64_t available, std::int64_t* out) const {
    if (is_ratio_) {
      if (!(ratio_ >= 0.0 && ratio_ <= 1.0))
        return make_error(Errc::invalid_budget, "keep ratio ", ratio_, " is outside [0, 1]");
      *out = rules::layer_budget(true, ratio_, 0, available);
      return Status::success();
    }
    if (count_ < 0) return make_error(Errc::invalid_budget, "keep budget ", count_, " is negative");
    if (count_ > available)
      return make_error(Errc::invalid_budget, "keep budget ", count_, " > ", available, " tokens");
    *out = count_;
    return Status::success();
  }

 private:
  Budget(bool is_ratio, double r, std::int64_t n) : is_ratio_(is_ratio), ratio_(r), count_(n) {}
  bool is_ratio_;
  double ratio_;
  std::int64_t count_;
};

}  // namespace flashcache
