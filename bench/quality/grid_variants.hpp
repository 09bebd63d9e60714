#pragma once
// grid_eval's rows and the variants it evaluates: a row label names a policy
// and, for FlashCache, 1D or 2D scores, global or blocked/tiled, with or
// without the base sample; --sweep adds every zone x base share of the
// FlashCache families. Each variant's flashcache::Options and its description
// in the results file.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "eval_util.hpp"
#include "flashcache/flashcache.hpp"
#include "flashcache/policies/baselines.hpp"
#include "grid_entries.hpp"

namespace flashcache::quality::grid {

namespace fc = flashcache;
namespace fp = flashcache::policies;
using json = nlohmann::ordered_json;

constexpr double kGamma = 0.2;
constexpr std::int64_t kBlock = 64;
constexpr std::int64_t kTile = 8;
inline const std::vector<double> kSweepShares = {0.0, 0.25, 0.5, 0.75};
inline const std::vector<fc::GridZone> kSweepZones = {fc::GridZone::rectangle, fc::GridZone::triangle};

inline std::string share_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

inline fc::GridZone parse_zone(const std::string& z) {
  if (z == "rectangle") return fc::GridZone::rectangle;
  if (z == "triangle") return fc::GridZone::triangle;
  fail("--zone must be rectangle or triangle, got '" + z + "'");
}

// One scored-and-selected configuration. Rows are variants; the dev sweep
// evaluates more of them.
struct Variant {
  std::string family;  // the row label without "+base"
  fp::Policy policy = fp::Policy::flashcache;
  bool grid2d = false;
  fc::Transform transform = fc::Transform::global;
  fc::GridZone zone = fc::GridZone::rectangle;  // 2D only
  double share = 0;                             // base share (2D: grid_base_share, 1D: base_share)
  bool base = false;                            // a "+base" row
  bool defaults = false;                        // Options{} as a user calls it (with or without the spans)

  std::string label() const { return family + (base ? "+base" : ""); }
  // Identity of the evaluation (what the scores and the selection depend on).
  std::string key() const {
    if (policy != fp::Policy::flashcache) return family;
    return family + (grid2d ? std::string("/") + fc::to_string(zone) : "") + "/share=" + share_text(share);
  }
  // Identity of the scores alone (the share only matters to selection).
  std::string score_key() const {
    return policy != fp::Policy::flashcache ? family : family + "/" + fc::to_string(zone);
  }
};

inline const std::vector<std::string>& row_labels() {
  static const std::vector<std::string> labels = {"flashcache-1d-global",
                                                  "flashcache-1d-blocked",
                                                  "flashcache-2d-global",
                                                  "flashcache-2d-tiles",
                                                  "flashcache-1d-global+base",
                                                  "flashcache-1d-blocked+base",
                                                  "flashcache-2d-global+base",
                                                  "flashcache-2d-tiles+base",
                                                  "defaults",
                                                  "defaults-grid",
                                                  "random",
                                                  "knorm",
                                                  "keydiff",
                                                  "snapkv",
                                                  "h2o"};
  return labels;
}

// The labels of --rows (all when empty), in row_labels() order.
inline std::vector<std::string> choose_labels(const std::string& rows_text) {
  std::vector<std::string> labels;
  for (const auto& l : row_labels())
    if (rows_text.empty() || ("," + rows_text + ",").find("," + l + ",") != std::string::npos) labels.push_back(l);
  for (const auto& r : split_list(rows_text))
    if (std::find(labels.begin(), labels.end(), r) == labels.end()) fail("--rows: unknown row '" + r + "'");
  if (labels.empty()) fail("--rows matches no row");
  return labels;
}

inline Variant make_variant(const std::string& label, fc::GridZone zone, double share) {
  Variant v;
  v.base = label.size() > 5 && label.compare(label.size() - 5, 5, "+base") == 0;
  v.family = v.base ? label.substr(0, label.size() - 5) : label;
  if (v.family == "defaults" || v.family == "defaults-grid") {
    if (v.base) fail("row " + label + ": the defaults rows take no +base");
    v.defaults = true;
    v.grid2d = v.family == "defaults-grid";
    v.transform = fc::Options{}.score.transform;
  } else if (v.family.rfind("flashcache-", 0) == 0) {
    v.grid2d = v.family.find("-2d-") != std::string::npos;
    v.transform = v.family.find("global") != std::string::npos ? fc::Transform::global : fc::Transform::blocked;
    v.zone = v.grid2d ? zone : fc::GridZone::rectangle;
    v.share = v.base ? share : 0.0;
  } else {
    if (v.base) fail("row " + label + ": only flashcache rows have +base");
    if (auto s = fp::parse_policy(v.family, &v.policy); !s.ok()) fail("row " + label + ": " + s.message());
  }
  return v;
}

// The variants to evaluate: the rows at the given zone and share, or with --sweep
// every zone x share of the FlashCache families (the other rows once).
inline std::vector<Variant> make_variants(const std::vector<std::string>& labels, bool sweep,
                                          const std::string& zone_text, double base_share) {
  std::vector<Variant> variants;
  std::set<std::string> have;
  const auto add = [&](const Variant& v) {
    if (have.insert(v.key()).second) variants.push_back(v);
  };
  if (sweep) {
    std::set<std::string> families;
    for (const auto& l : labels) families.insert(make_variant(l, fc::GridZone::rectangle, 0).family);
    if (!families.count("flashcache-2d-global") && !families.count("flashcache-2d-tiles"))
      fail("--sweep needs flashcache-2d-global or flashcache-2d-tiles among --rows");
    for (const auto& l : labels) {
      const Variant base = make_variant(l, fc::GridZone::rectangle, 0);
      if (base.policy != fp::Policy::flashcache || base.defaults) {
        add(base);
        continue;
      }
      for (fc::GridZone z : kSweepZones) {
        if (!base.grid2d && z != fc::GridZone::rectangle) continue;
        for (double s : kSweepShares) {
          Variant v = make_variant(base.family + "+base", z, s);
          v.base = false;  // sweep variants are named by family, zone and share
          add(v);
        }
      }
    }
  } else {
    for (const auto& l : labels) add(make_variant(l, parse_zone(zone_text), base_share));
  }
  return variants;
}

inline fc::Options variant_options(const Variant& v) {
  if (v.defaults) {  // what `flashcache compress --keep-ratio r [--grid ...]` selects, layer by layer
    return fc::Options{};
  }
  fc::Options o = fc::Options::paper();
  o.score.gamma = kGamma;
  o.select.sink = 0;
  o.select.window = 0;
  o.select.window_share = 0.0;
  o.allocate.mode = fc::Allocation::uniform;
  o.score.transform = v.transform;
  o.score.block_size = kBlock;
  o.score.grid_tile = kTile;
  if (v.grid2d) {
    o.score.grid_zone = v.zone;
    o.select.grid_base_share = v.share;
  } else if (v.policy == fp::Policy::flashcache) {
    o.select.base_share = v.share;
  }
  return o;
}

// The image spans a variant scores and selects with: the entry's for the 2D
// rows, none for the 1D ones.
inline fc::ImageSpans variant_spans(const Variant& v, const Entry& e) {
  return v.grid2d ? fc::ImageSpans(e.grids) : fc::ImageSpans();
}

inline json variant_json(const Variant& v, const fc::Options& o, const fp::PolicyOptions& po, int seeds) {
  json j;
  j["policy"] = fp::to_string(v.policy);
  if (v.defaults) {
    j["options"] = "flashcache::Options{} (the library's defaults)";
    j["grids"] = v.grid2d ? "the entry's spans" : "none";
    j["base"] = fc::to_string(o.score.base);
    j["transform"] = fc::to_string(o.score.transform);
    j["sink"] = o.select.sink;
    j["window_share"] = o.select.window_share;
    j["grid_base_share"] = o.select.grid_base_share;
  } else if (v.policy == fp::Policy::flashcache) {
    j["scores"] = v.grid2d ? "2d" : "1d";
    j["transform"] = fc::to_string(v.transform);
    if (!v.grid2d && v.transform == fc::Transform::blocked) j["block_size"] = o.score.block_size;
    j["gamma"] = o.score.gamma;
    if (v.grid2d) {
      j["grids"] = "the entry's spans";
      j["grid_zone"] = fc::to_string(o.score.grid_zone);
      if (v.transform == fc::Transform::blocked) j["grid_tile"] = o.score.grid_tile;
      j["grid_base_share"] = o.select.grid_base_share;
    } else {
      j["base_share"] = o.select.base_share;
    }
    j["normalize_terms"] = o.score.normalize_terms;
  }
  if (v.policy == fp::Policy::random) j["seeds"] = seeds;
  if (v.policy == fp::Policy::snapkv) {
    j["observation_window"] = po.observation_window;
    j["pool_kernel"] = po.pool_kernel;
  }
  if (fp::needs_queries(v.policy)) j["queries"] = "all N evaluated queries (in-sample), causal accumulation";
  j["sink"] = 0;
  j["window"] = 0;
  j["window_share"] = 0;
  j["allocation"] = "uniform";
  j["protect"] = "cls_tokens";
  return j;
}

}  // namespace flashcache::quality::grid
