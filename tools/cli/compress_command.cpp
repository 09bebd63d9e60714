// `flashcache compress`: run compress_model() over a cache stored as .npy
// files and write the scores, budgets, kept indices and compact K', V'.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "cli_error.hpp"
#include "commands.hpp"
#include "flashcache/flashcache.hpp"
#include "flashcache/policies/baselines.hpp"
#include "input.hpp"
#include "npy/npy.hpp"
#include "output_dir.hpp"

namespace flashcache::cli {

namespace fs = std::filesystem;

namespace {

struct Plan {
  policies::Policy policy = policies::Policy::flashcache;
  policies::PolicyOptions policy_options;
  Options options;
  Budget budget = Budget::ratio(0.2);
  std::vector<std::uint8_t> mask;  // empty for none
  std::vector<GridSpan> spans;     // --grid: the image spans

  // The mask for each of `layers` layers (all share the token count), or none.
  std::vector<ProtectMask> masks(std::int64_t layers) const {
    return mask.empty() ? std::vector<ProtectMask>{} : std::vector<ProtectMask>(static_cast<std::size_t>(layers), mask);
  }
};

// --grid FIRST:ROWS:COLS as a span, checked against the sequence and the
// spans before it, with the command-line text in the messages.
GridSpan parse_grid(const std::string& text, std::int64_t tokens, const std::vector<GridSpan>& before) {
  std::int64_t v[3] = {0, 0, 0};
  std::size_t pos = 0;
  for (int i = 0; i < 3; ++i) {
    const std::size_t end = i < 2 ? text.find(':', pos) : text.size();
    const std::string part = end == std::string::npos ? "" : text.substr(pos, end - pos);
    const bool digits = !part.empty() && part.size() <= 12 && part.find_first_not_of("0123456789") == std::string::npos;
    if (!digits || (i == 2 && text.find(':', pos) != std::string::npos))
      usage_error("--grid " + text + " is not FIRST:ROWS:COLS (three non-negative integers)");
    v[i] = std::stoll(part);
    pos = end + 1;
  }
  const GridSpan g{v[0], v[1], v[2]};
  if (g.rows < 1 || g.cols < 1) usage_error("--grid " + text + ": ROWS and COLS must be at least 1");
  if (g.rows * g.cols > tokens || g.first > tokens - g.rows * g.cols)
    usage_error("--grid " + text + ": tokens [" + std::to_string(g.first) + ", " + std::to_string(g.end()) +
                ") reach past the " + std::to_string(tokens) + " tokens of the cache");
  for (const GridSpan& o : before)
    if (g.first < o.end() && o.first < g.end())
      usage_error("--grid " + text + " overlaps --grid " + std::to_string(o.first) + ":" + std::to_string(o.rows) +
                  ":" + std::to_string(o.cols));
  return g;
}

// The library's options as the flags set them (--paper: its preset).
Options flag_options(const CompressArgs& a, policies::Policy policy) {
  Options o;
  if (a.paper) {
    o = Options::paper();
  } else {
    o = to_options(a.transform);
    o.select.sink = a.sink;
    o.select.window = a.window;
    o.select.window_share = a.window_share;
    o.select.base_share = a.base_share;
    o.score.normalize_terms = a.normalize_terms;
    o.score.mean_weight = a.mean_weight;
    o.score.mean_mix = enum_flag<TailMix>("--mean-mix", a.mean_mix);
    o.score.mean_distance = enum_flag<MeanDistance>("--mean-distance", a.mean_distance);
    o.score.mean_full_keep = a.mean_full_keep;
    o.score.mean_zero_keep = a.mean_zero_keep;
    o.score.bridge = a.bridge;
    o.score.rope.derotate = a.rope_theta > 0;
    o.score.rope.theta = a.rope_theta > 0 ? a.rope_theta : o.score.rope.theta;
    o.score.rope.layout = enum_flag<RopeLayout>("--rope-layout", a.rope_layout);
    o.score.rope.first_position = a.rope_first_position;
  }
  if (policy == policies::Policy::flashcache && !a.q.empty()) {
    // --q: the query-informed score, the preset's query fields over the options set above
    o = Options::with_query_tail(o);
    o.score.tail_weight = a.tail_weight;
    o.score.tail_mix = enum_flag<TailMix>("--tail-mix", a.tail_mix);
  }
  o.score.grid_zone = enum_flag<GridZone>("--grid-zone", a.grid_zone);
  o.score.grid_tile = a.grid_tile;
  o.select.grid_base_share = a.grid_base_share;
  return o;
}

// The flags' own rules; the values they give the library, by its checks:
// the options they set, checked.
Options check_args(const CompressArgs& a) {
  if (a.has_keep_ratio && !(a.keep_ratio >= 0.0 && a.keep_ratio <= 1.0))
    usage_error("--keep-ratio " + num(a.keep_ratio) + " is outside [0, 1]");
  if (a.has_keep && a.keep < 0) usage_error("--keep " + std::to_string(a.keep) + " is negative");
  policies::Policy p = policies::Policy::flashcache;
  if (!policies::parse_policy(a.policy, &p).ok()) usage_error("--policy " + a.policy + " is not a policy");
  if (policies::needs_queries(p) && a.q.empty())
    usage_error("--policy " + a.policy + " needs --q (the queries, [L, Hq, N, d])");
  if (!policies::needs_queries(p) && p != policies::Policy::flashcache && !a.q.empty())
    usage_error("--q is used only by --policy flashcache (query tails), snapkv and h2o, not " + a.policy);
  if (a.paper && !a.q.empty())
    usage_error("--paper is the paper's algorithm, which reads no queries: drop --q, or drop --paper for query tails");
  if (a.has_tail_option && (p != policies::Policy::flashcache || a.q.empty()))
    usage_error(
        "--tail-weight, --tail-mix, --tail-stride, --tail-min-distance and --tail-last are used only by "
        "--policy flashcache with --q");
  if (a.tail_min_distance < 0)
    usage_error("--tail-min-distance " + std::to_string(a.tail_min_distance) + " is negative");
  if (a.tail_last < 0) usage_error("--tail-last " + std::to_string(a.tail_last) + " is negative");
  if (a.tail_stride < 1) usage_error("--tail-stride " + std::to_string(a.tail_stride) + " must be at least 1");
  if (a.has_seed && p != policies::Policy::random) usage_error("--seed is used only by --policy random");
  if (a.has_observation_window && p != policies::Policy::snapkv)
    usage_error("--observation-window is used only by --policy snapkv");
  if (a.observation_window < 1)
    usage_error("--observation-window " + std::to_string(a.observation_window) + " must be at least 1");
  if ((a.has_transform_option || a.has_rope_option || a.paper) && p != policies::Policy::flashcache)
    usage_error(
        "--gamma, --transform, --block, --normalize-terms, --mean-*, --bridge, --rope-* and --paper are used only by "
        "--policy flashcache, not " +
        a.policy + " (so is --base)");
  if (a.has_rope_option && !(a.rope_theta > 1.0 && std::isfinite(a.rope_theta)))
    usage_error("--rope-theta is required with --rope-layout / --rope-first-position and must be > 1, got " +
                num(a.rope_theta));
  if (a.rope_first_position < 0)
    usage_error("--rope-first-position " + std::to_string(a.rope_first_position) + " is negative");
  if (a.paper && a.has_transform_option)
    usage_error("--paper fixes --gamma, --transform and --block (and --base); give none of them");
  if (a.has_grid_option && a.grids.empty()) usage_error("--grid-zone and --grid-tile need --grid");
  if (a.has_grid_option && p != policies::Policy::flashcache)
    usage_error("--grid-zone and --grid-tile are used only by --policy flashcache, not " + a.policy);
  Options options = flag_options(a, p);
  check_options_as_flags(options);
  return options;
}

// The plan from the flags, `options` those check_args returned.
Plan make_plan(const CompressArgs& a, const KVCache& cache, Options options) {
  Plan p;
  throw_if_error(policies::parse_policy(a.policy, &p.policy));
  p.options = std::move(options);
  p.policy_options.seed = a.seed;
  p.policy_options.observation_window = a.observation_window;
  if (p.policy == policies::Policy::flashcache && !a.q.empty()) {
    p.policy_options.tail.stride = a.tail_stride;
    p.policy_options.tail.min_distance = a.tail_min_distance;
    p.policy_options.tail_last = a.tail_last;
  }
  for (const std::string& g : a.grids) p.spans.push_back(parse_grid(g, cache.tokens, p.spans));
  if (!a.protect.empty()) p.mask = load_mask(a.protect, cache.tokens);
  if (a.has_keep) {
    if (a.keep > cache.tokens)
      usage_error("--keep " + std::to_string(a.keep) + " is more than the " + std::to_string(cache.tokens) +
                  " tokens per layer");
    p.budget = Budget::tokens(a.keep);
    p.options.allocate.mode = Allocation::uniform;  // a count per layer: nothing to reallocate
  } else {
    p.budget = Budget::ratio(a.keep_ratio);
    p.options.allocate.mode = a.no_allocate ? Allocation::uniform : Allocation::dynamic;
  }
  return p;
}

nlohmann::ordered_json summary(const CompressArgs& a, const KVCache& cache, const Queries* q, const Plan& plan,
                               const std::vector<double>& energy_ratio, const std::vector<std::int64_t>& budgets,
                               std::int64_t nonfinite) {
  const Options& o = plan.options;
  std::int64_t kept = 0, masked = 0;
  for (auto b : budgets) kept += b;
  for (auto m : plan.mask) masked += m != 0;
  const std::int64_t row_bytes = 2 * cache.head_dim * size_of(cache.dtype);  // one token of K and V
  nlohmann::ordered_json grids = nlohmann::ordered_json::array();
  for (const GridSpan& g : plan.spans) grids.push_back({g.first, g.rows, g.cols});
  nlohmann::ordered_json j;
  j["version"] = FLASHCACHE_VERSION_STRING;
  const auto null = nlohmann::ordered_json(nullptr);
  j["input"] = {{"k", a.k},
                {"v", a.v},
                {"q", q ? nlohmann::ordered_json(a.q) : null},
                {"q_shape", q ? nlohmann::ordered_json(q->file_shape) : null},
                {"protect", a.protect.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(a.protect)},
                {"dtype", to_string(cache.dtype)},
                {"shape", cache.file_shape}};
  j["shape"] = {
      {"layers", cache.layers}, {"heads", cache.heads}, {"tokens", cache.tokens}, {"head_dim", cache.head_dim}};
  const bool fc = plan.policy == policies::Policy::flashcache;  // gamma, transform, block: FlashCache's only
  const bool random = plan.policy == policies::Policy::random, snapkv = plan.policy == policies::Policy::snapkv;
  j["options"] = {
      {"policy", policies::to_string(plan.policy)},
      {"seed", random ? nlohmann::ordered_json(a.seed) : null},
      {"observation_window", snapkv ? nlohmann::ordered_json(a.observation_window) : null},
      {"keep_ratio", a.has_keep ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(a.keep_ratio)},
      {"keep", a.has_keep ? nlohmann::ordered_json(a.keep) : nlohmann::ordered_json(nullptr)},
      {"allocation", to_string(o.allocate.mode)},
      {"gamma", fc ? nlohmann::ordered_json(o.score.gamma) : null},
      {"base", fc ? nlohmann::ordered_json(to_string(o.score.base)) : null},
      {"sink", o.select.sink},
      {"window", o.select.window},
      {"window_share", o.select.window_share},
      {"base_share", o.select.base_share},
      {"normalize_terms", fc ? nlohmann::ordered_json(o.score.normalize_terms) : null},
      {"mean_weight", fc ? nlohmann::ordered_json(o.score.mean_weight) : null},
      {"mean_mix", fc ? nlohmann::ordered_json(to_string(o.score.mean_mix)) : null},
      {"mean_distance", fc ? nlohmann::ordered_json(to_string(o.score.mean_distance)) : null},
      {"mean_full_keep", fc ? nlohmann::ordered_json(o.score.mean_full_keep) : null},
      {"mean_zero_keep", fc ? nlohmann::ordered_json(o.score.mean_zero_keep) : null},
      {"bridge", fc ? nlohmann::ordered_json(o.score.bridge) : null},
      {"query", fc ? nlohmann::ordered_json(to_string(o.score.query)) : null},
      {"tail_weight", fc && o.score.query == QueryInput::tail ? nlohmann::ordered_json(o.score.tail_weight) : null},
      {"tail_mix",
       fc && o.score.query == QueryInput::tail ? nlohmann::ordered_json(to_string(o.score.tail_mix)) : null},
      {"tail_stride",
       fc && o.score.query == QueryInput::tail ? nlohmann::ordered_json(plan.policy_options.tail.stride) : null},
      {"tail_min_distance",
       fc && o.score.query == QueryInput::tail ? nlohmann::ordered_json(plan.policy_options.tail.min_distance) : null},
      {"tail_last",
       fc && o.score.query == QueryInput::tail ? nlohmann::ordered_json(plan.policy_options.tail_last) : null},
      {"rope_theta", fc && o.score.rope.derotate ? nlohmann::ordered_json(o.score.rope.theta) : null},
      {"rope_layout", fc && o.score.rope.derotate ? nlohmann::ordered_json(to_string(o.score.rope.layout)) : null},
      {"rope_first_position", fc && o.score.rope.derotate ? nlohmann::ordered_json(o.score.rope.first_position) : null},
      {"paper", a.paper},
      {"transform", fc ? nlohmann::ordered_json(to_string(o.score.transform)) : null},
      {"block", fc ? nlohmann::ordered_json(o.score.block_size) : null},
      {"grids", grids},
      {"grid_zone", fc && !plan.spans.empty() ? nlohmann::ordered_json(to_string(o.score.grid_zone)) : null},
      {"grid_tile", fc && !plan.spans.empty() ? nlohmann::ordered_json(o.score.grid_tile) : null},
      {"grid_base_share", o.select.grid_base_share},
      {"protected_by_mask", masked}};
  j["budgets"] = budgets;
  j["energy_ratio"] = energy_ratio;
  j["tokens_before"] = cache.layers * cache.tokens;
  j["tokens_after"] = kept;
  j["kept_fraction"] = static_cast<double>(kept) / static_cast<double>(cache.layers * cache.tokens);
  j["bytes_before"] = cache.bytes();                  // K and V
  j["bytes_after"] = kept * cache.heads * row_bytes;  // K' and V'
  j["nonfinite"] = nonfinite;
  return j;
}

template <class T>
void write_outputs(const CompressArgs& a, const KVCache& cache, const Queries* q, const Plan& plan,
                   const CompressedModel<T>& model) {
  StagedDir dir(a.out, a.force);
  auto file = [&](const std::string& name) { return (dir.path() / name).string(); };
  const std::int64_t L = cache.layers, H = cache.heads, N = cache.tokens, d = cache.head_dim;
  try {
    std::vector<float> scores;
    scores.reserve(static_cast<std::size_t>(L * H * N));
    for (const auto& layer : model.layers)
      scores.insert(scores.end(), layer.scores.score.begin(), layer.scores.score.end());
    npy::write(file("scores.npy"), {L, H, N}, scores.data());
    npy::write(file("energy_ratio.npy"), {L}, model.energy_ratio.data());
    npy::write(file("budgets.npy"), {L}, model.budgets.data());
    for (std::int64_t l = 0; l < L; ++l) {
      const auto& layer = model.layers[static_cast<std::size_t>(l)];
      const std::string n = std::to_string(l);
      npy::write(file("kept_" + n + ".npy"), {H, layer.budget}, layer.kept.data());
      npy::write(file("k_" + n + ".npy"), {H, layer.budget, d}, layer.k.data());
      npy::write(file("v_" + n + ".npy"), {H, layer.budget, d}, layer.v.data());
    }
    const auto j = summary(a, cache, q, plan, model.energy_ratio, model.budgets, model.nonfinite);
    write_text_file(dir.path() / "summary.json", j.dump(2) + "\n");
  } catch (const Error& e) {  // npy::write: the inputs were fine, the disk was not
    throw CliError(kExitFailure, std::string(e.what()).substr(std::string("flashcache: ").size()));
  }
  dir.commit();

  const auto kept = model.tokens_after(), before = model.tokens_before();
  std::printf("wrote %s: %lld layers, kept %lld of %lld tokens per head (%.1f%%), %lld -> %lld bytes\n", a.out.c_str(),
              static_cast<long long>(L), static_cast<long long>(kept), static_cast<long long>(before),
              100.0 * static_cast<double>(kept) / static_cast<double>(before), static_cast<long long>(cache.bytes()),
              static_cast<long long>(2 * kept * H * d * size_of(cache.dtype)));
}

template <class T>
void compress_as(const CompressArgs& a, const KVCache& cache, const Queries* q, const Plan& plan) {
  const std::vector<KVView<const T>> qv = q ? q->views<T>(cache) : std::vector<KVView<const T>>{};
  const CompressedModel<T> model = policies::compress_model<float, const T>(
      plan.policy, qv, cache.views<T>(cache.k), cache.views<T>(cache.v), plan.budget, plan.options, plan.policy_options,
      plan.masks(cache.layers), plan.spans);
  write_outputs(a, cache, q, plan, model);
}

}  // namespace

int run_compress(const CompressArgs& a) {
  Options options = check_args(a);
  StagedDir::check_target(a.out, a.force);  // before any work
  const KVCache cache = load_cache(a.k, a.v);
  Queries queries;
  if (!a.q.empty()) queries = load_queries(a.q, a.k, cache);
  const Queries* q = a.q.empty() ? nullptr : &queries;
  const Plan plan = make_plan(a, cache, std::move(options));
  if (cache.dtype == DType::f16)
    compress_as<half_t>(a, cache, q, plan);
  else
    compress_as<float>(a, cache, q, plan);
  return kExitOk;
}

}  // namespace flashcache::cli
