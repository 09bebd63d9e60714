// select_configs: which tokens every policy configuration keeps, for the
// long-context evaluation (bench/quality/long_eval.py).
//
// Reads one prompt cache (k.npy, v.npy [L, H, P, d] float32, and q.npy
// [L, Hq, P, d] when a policy needs queries; cache_io.hpp) and a JSON list of
// configurations, and writes for each configuration the kept token indices of
// every layer and head, through the library's own policies, select and
// allocation stages: the same code a user calls.
//
//   select_configs --cache DIR --configs FILE.json --out DIR
//
// FILE.json: {"configs": [{"id": "c0", "policy": "flashcache", "per_head": 205,
//              "options": {"gamma": 0.2, "base": "lowpass", "transform": "global", "block_size": 64,
//              "sink": 4, "window": 0, "window_share": 0.25, "base_share": 0,
//              "normalize_terms": false, "rope_theta": 0, "rope_layout": "half",
//              "allocation": "dynamic", "keep_set": "per_head", "combine": "mean_normalized",
//              "page": 1, "query": "none", "tail_weight": 0.5, "tail_mix": "max", "tail_stride": 1,
//              "tail_min_distance": 32, "tail_last": 256, "mean_weight": 0.75, "mean_mix": "sum",
//              "mean_distance": "kv_squared", "mean_full_keep": 0.5, "mean_zero_keep": 0.25},
//              "seed": 0}, ...]}
// query "tail" (ScoreOptions::query) scores with each key's tail from q.npy, fed by every
// tail_stride-th prompt query (only the last tail_last when above 0); the tail
// fields left out take Options::with_query_tail()'s and PolicyOptions{}'s values.
// mean_weight, mean_mix, mean_distance, mean_full_keep and mean_zero_keep (ScoreOptions) left out take
// Options{}'s:
// a row that fixes them names them. The weight is resolved at each configuration's keep ratio
// (per_head / P, mean_weight_at), as compress_model resolves it from its budget.
// Every configuration keeps per_head * L tokens in all: per_head in every
// layer, or that total re-split by the dynamic allocation.
// keep_set (shared_keep.hpp): per_head (the default) keeps a set per (layer,
// head); per_layer one set for a layer's heads, per_sequence one set for all
// layers (per_head tokens in each: the allocation does not apply), both
// through compress_scored_model with "combine" and "page"; the output layout
// is the same, every head repeating its layer's set.
// Output: DIR/kept_<id>.npy (int32, the layers' [H][B_l] blocks one after the
// other) and DIR/result.json ({"configs": [{"id", "budgets", "keep_set", "seconds"}]}).
// Scores are computed once per distinct (policy, scoring options) and reused
// across budgets and protected sets.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "cache_io.hpp"
#include "flashcache/flashcache.hpp"
#include "flashcache/policies/baselines.hpp"
#include "npy/npy.hpp"
#include "results_io.hpp"

namespace {

namespace fc = flashcache;
namespace fp = flashcache::policies;
using Json = nlohmann::json;

namespace fq = flashcache::quality;

// Every key a row's "options" may hold (options_from, tail_options_from, shared_from):
// any other is refused by name rather than ignored.
const std::set<std::string> kOptionKeys = {
    "gamma",       "base",         "transform",   "block_size",        "sink",
    "window",      "window_share", "base_share",  "normalize_terms",   "rope_theta",
    "rope_layout", "allocation",   "query",       "tail_weight",       "tail_mix",
    "mean_weight", "mean_mix",     "tail_stride", "tail_min_distance", "tail_last",
    "keep_set",    "combine",      "page",        "mean_full_keep",    "mean_zero_keep",
    "bridge",      "mean_distance"};

// The enum named at options[key] (the library's names), or `fallback` when absent.
template <class E>
E enum_option(const Json& j, const char* key, E fallback) {
  E out = fallback;
  if (j.contains(key))
    fc::throw_if_error(fc::parse_enum(j.at(key).get<std::string>(), &out, (std::string("options.") + key).c_str()));
  return out;
}

fc::Options options_from(const Json& j) {
  for (const auto& item : j.items())
    if (kOptionKeys.count(item.key()) == 0)
      throw std::runtime_error("options key '" + item.key() + "' is not one select_configs reads");
  fc::Options o;
  o.score.gamma = j.value("gamma", o.score.gamma);
  o.score.base = enum_option(j, "base", fc::Base::lowpass);
  o.score.transform = enum_option(j, "transform", fc::Transform::global);
  o.score.block_size = j.value("block_size", o.score.block_size);
  o.select.sink = j.value("sink", o.select.sink);
  o.select.window = j.value("window", o.select.window);
  o.select.window_share = j.value("window_share", o.select.window_share);
  o.select.base_share = j.value("base_share", o.select.base_share);
  o.score.normalize_terms = j.value("normalize_terms", o.score.normalize_terms);
  const double theta = j.value("rope_theta", 0.0);
  o.score.rope.derotate = theta > 0;
  if (theta > 0) o.score.rope.theta = theta;
  o.score.rope.layout = enum_option(j, "rope_layout", fc::RopeLayout::half);
  o.allocate.mode = enum_option(j, "allocation", fc::Allocation::dynamic);
  if (enum_option(j, "query", fc::QueryInput::none) == fc::QueryInput::tail)
    o = fc::Options::with_query_tail(o);  // the preset, but for what the row sets
  o.score.tail_weight = j.value("tail_weight", o.score.tail_weight);
  o.score.tail_mix = enum_option(j, "tail_mix", o.score.tail_mix);
  o.score.mean_weight = j.value("mean_weight", o.score.mean_weight);
  o.score.mean_mix = enum_option(j, "mean_mix", o.score.mean_mix);
  o.score.mean_distance = enum_option(j, "mean_distance", o.score.mean_distance);
  o.score.mean_full_keep = j.value("mean_full_keep", o.score.mean_full_keep);
  o.score.mean_zero_keep = j.value("mean_zero_keep", o.score.mean_zero_keep);
  o.score.bridge = j.value("bridge", o.score.bridge);
  return o;
}

// Which prompt queries feed the tails (ScoreOptions::query = tail).
void tail_options_from(const Json& j, fp::PolicyOptions* po) {
  po->tail.stride = j.value("tail_stride", po->tail.stride);
  po->tail.min_distance = j.value("tail_min_distance", po->tail.min_distance);
  po->tail_last = j.value("tail_last", po->tail_last);
}

fc::SharedKeepOptions shared_from(const Json& j) {
  fc::SharedKeepOptions s;
  fc::throw_if_error(fc::parse_keep_set(j.value("keep_set", std::string("per_head")), &s.keep_set));
  fc::throw_if_error(fc::parse_head_combine(j.value("combine", std::string("mean_normalized")), &s.combine));
  s.page = j.value("page", s.page);
  fc::throw_if_error(fc::check_shared_options(s));
  return s;
}

// What the scores depend on: the policy, its seed and, for FlashCache, the
// transform settings, the distance's weight at this keep ratio (and the tails'
// feed and weight, and the bridge: both applied after the residual is scored);
// sink, window and shares only change the selection.
std::string score_key(const std::string& policy, const Json& options, std::uint64_t seed, bool with_tail,
                      bool with_bridge, double mean_weight) {
  if (policy == "random") return policy + "/" + std::to_string(seed);
  if (policy != "flashcache") return policy;
  Json key;
  for (const char* field : {"gamma", "base", "transform", "block_size", "normalize_terms", "rope_theta", "rope_layout",
                            "mean_mix", "mean_distance"})
    if (options.contains(field)) key[field] = options[field];
  key["mean_weight"] = mean_weight;
  if (with_tail)
    for (const char* field : {"query", "tail_weight", "tail_mix", "tail_stride", "tail_min_distance", "tail_last"})
      if (options.contains(field)) key[field] = options[field];
  if (with_bridge) key["bridge"] = options.at("bridge");
  return policy + "/" + key.dump();
}

// What the tails depend on: which queries feed them.
std::string tail_key(const fp::PolicyOptions& po) {
  return std::to_string(po.tail.stride) + "/" + std::to_string(po.tail.min_distance) + "/" +
         std::to_string(po.tail_last);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Kept tokens of many policy configurations on one prompt cache (long-context evaluation)"};
  std::string cache_dir, configs_path, out_dir;
  app.add_option("--cache", cache_dir, "Folder with k.npy, v.npy (and q.npy): float32 [L, H, P, d]")->required();
  app.add_option("--configs", configs_path, "JSON file with the configurations")->required();
  app.add_option("--out", out_dir, "Output folder (must exist)")->required();
  CLI11_PARSE(app, argc, argv);

  try {
    std::ifstream in(configs_path);
    if (!in) throw std::runtime_error("cannot open " + configs_path);
    const Json doc = Json::parse(in);
    bool want_q = false;
    for (const Json& cfg : doc.at("configs")) {
      fp::Policy p = fp::Policy::flashcache;  // set by parse_policy (GCC 12 cannot see it)
      fc::throw_if_error(fp::parse_policy(cfg.at("policy").get<std::string>(), &p));
      want_q |= fp::needs_queries(p, options_from(cfg.value("options", Json::object())).score);
    }
    // float32, no meta.json; q.npy only when a policy needs queries.
    const fq::Cache c = fq::read_cache(cache_dir, {/*meta=*/false, /*queries=*/want_q, /*float32_only=*/true});
    const auto k = c.k_views(), v = c.v_views();
    const auto q = want_q ? c.q_views() : std::vector<fc::KVView<const float>>{};

    std::map<std::string, std::vector<fc::LayerScores>> scored;
    std::map<std::string, std::vector<std::vector<float>>> tails;  // per feed: [layer][head * P + token]
    Json results = Json::array();
    for (const Json& cfg : doc.at("configs")) {
      const auto t0 = std::chrono::steady_clock::now();
      const std::string id = cfg.at("id"), policy_name = cfg.at("policy");
      const Json options = cfg.value("options", Json::object());
      fp::Policy policy = fp::Policy::flashcache;
      fc::throw_if_error(fp::parse_policy(policy_name, &policy));
      fp::PolicyOptions po;
      po.seed = cfg.value("seed", std::uint64_t{0});
      tail_options_from(options, &po);
      const fc::Options opt = options_from(options);
      fc::throw_if_error(fc::check_options(opt));
      const fc::SharedKeepOptions shared = shared_from(options);
      const std::int64_t per_head = cfg.at("per_head");
      // ratio per_head / P: per layer round(ratio * P) = per_head, in all per_head * L.
      const auto budget = fc::Budget::ratio(static_cast<double>(per_head) / static_cast<double>(c.tokens));
      // The distance's weight at this keep ratio, fixed for the scorer (which sees no budget).
      const double mean_weight = fc::mean_weight_at(opt.score, budget.keep_ratio(c.tokens));

      // Query tails: the residual scores (without tails) and the tails of this feed, each
      // computed once, mixed as the Scorer mixes them (mix_term); then the bridge, last, as
      // the Scorer bridges (bridge_head).
      const bool with_tail = policy == fp::Policy::flashcache && opt.score.query == fc::QueryInput::tail;
      const bool with_bridge = policy == fp::Policy::flashcache && opt.score.bridge > 0;
      fc::Options residual_opt = opt;
      residual_opt.score.query = fc::QueryInput::none;
      residual_opt.score.mean_weight = mean_weight;
      residual_opt.score.mean_full_keep = residual_opt.score.mean_zero_keep = 0.0;
      residual_opt.score.bridge = 0;
      const std::string residual_key = score_key(policy_name, options, po.seed, false, false, mean_weight);
      auto base_it = scored.find(residual_key);
      if (base_it == scored.end()) {
        std::vector<fc::LayerScores> scores(static_cast<std::size_t>(c.layers));
        for (std::int64_t l = 0; l < c.layers; ++l) {
          const auto ql = fp::needs_queries(policy) ? q[static_cast<std::size_t>(l)] : fc::KVView<const float>{};
          fc::throw_if_error(fp::score_with_policy<float>(policy, ql, k[static_cast<std::size_t>(l)],
                                                          v[static_cast<std::size_t>(l)], residual_opt.score, po,
                                                          &scores[static_cast<std::size_t>(l)]));
        }
        base_it = scored.emplace(residual_key, std::move(scores)).first;
      }
      auto it = base_it;
      if (with_tail || with_bridge) {
        const std::string key = score_key(policy_name, options, po.seed, with_tail, with_bridge, mean_weight);
        it = scored.find(key);
        if (it == scored.end()) {
          std::vector<fc::LayerScores> scores = base_it->second;
          if (with_tail) {
            auto tail_it = tails.find(tail_key(po));
            if (tail_it == tails.end()) {
              std::vector<std::vector<float>> layers(static_cast<std::size_t>(c.layers));
              fc::TailAccumulator acc;
              for (std::int64_t l = 0; l < c.layers; ++l)
                fc::throw_if_error(fp::prompt_tails(q[static_cast<std::size_t>(l)], k[static_cast<std::size_t>(l)], po,
                                                    &acc, &layers[static_cast<std::size_t>(l)]));
              tail_it = tails.emplace(tail_key(po), std::move(layers)).first;
            }
            for (std::size_t l = 0; l < scores.size(); ++l)
              for (std::int64_t h = 0; h < scores[l].heads; ++h)
                fc::mix_term(opt.score.tail_weight, opt.score.tail_mix,
                             tail_it->second[l].data() + h * scores[l].tokens,
                             scores[l].score.data() + h * scores[l].tokens, scores[l].tokens);
          }
          if (with_bridge) {
            std::vector<float> scratch;
            for (fc::LayerScores& layer : scores)
              for (std::int64_t h = 0; h < layer.heads; ++h)
                fc::bridge_head(opt.score.bridge, layer.score.data() + h * layer.tokens, layer.tokens, &scratch);
          }
          it = scored.emplace(key, std::move(scores)).first;
        }
      }
      fc::CompressedModel<float> model;
      fc::throw_if_error(fc::compress_scored_model<float>(k, v, it->second, budget, opt, shared, {}, {}, &model));
      std::vector<std::int32_t> kept;
      std::int64_t total = 0;
      for (const auto& layer : model.layers) kept.insert(kept.end(), layer.kept.begin(), layer.kept.end());
      for (auto b : model.budgets) total += b;
      if (total != per_head * c.layers)
        throw std::runtime_error(id + ": kept " + std::to_string(total) + " tokens, expected " +
                                 std::to_string(per_head * c.layers));
      fc::npy::write(out_dir + "/kept_" + id + ".npy", {static_cast<std::int64_t>(kept.size())}, kept.data());
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      results.push_back(
          {{"id", id}, {"budgets", model.budgets}, {"keep_set", fc::to_string(shared.keep_set)}, {"seconds", seconds}});
    }
    fq::write_json(out_dir + "/result.json", Json{{"configs", results}});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "select_configs: %s\n", e.what());
    return 2;
  }
  return 0;
}
