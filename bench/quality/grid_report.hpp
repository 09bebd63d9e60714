#pragma once
// grid_eval's output: one record per (row, entry, keep ratio), the run's header,
// the summary over entries (mean and median per split, group, row and keep
// ratio), the merge with the results file already there, and the printed tables.
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "eval_util.hpp"
#include "flashcache/flashcache.hpp"
#include "flashcache/policies/baselines.hpp"
#include "grid_entries.hpp"
#include "grid_evaluate.hpp"
#include "grid_sweep.hpp"
#include "grid_variants.hpp"
#include "results_io.hpp"

namespace flashcache::quality::grid {

namespace fs = std::filesystem;
namespace fc = flashcache;
namespace fp = flashcache::policies;
using json = nlohmann::ordered_json;

inline json make_record(const Variant& v, const Entry& e, double ratio, const Result& r, int seeds) {
  const fc::Options o = variant_options(v);
  json j;
  j["label"] = v.label();
  j["split"] = e.split;
  j["entry"] = e.name;
  j["image_size"] = e.image_size;
  j["images"] = e.images;
  j["group"] = e.group();
  j["tokens"] = e.cache.tokens;
  j["keep_ratio"] = ratio;
  j["kept_per_head"] = r.budget;
  j["error"] = r.error();
  j["layer_errors"] = r.layer;
  j["layers"] = e.cache.model_layers;
  if (r.seed_std >= 0) j["error_std_over_seeds"] = r.seed_std;
  j["options"] = variant_json(v, o, fp::PolicyOptions{}, v.policy == fp::Policy::random ? seeds : 1);
  return j;
}

// The rows' records at the zone and share chosen (or given); *splits_run: the entries' splits.
inline json make_records(const std::vector<std::string>& labels, fc::GridZone zone, double base_share,
                         const std::vector<Entry>& entries, const std::vector<double>& ratios, const Results& results,
                         int seeds, std::set<std::string>* splits_run) {
  json records = json::array();
  for (const auto& l : labels) {
    const Variant v = make_variant(l, zone, base_share);
    for (const auto& e : entries) {
      splits_run->insert(e.split);
      for (double r : ratios) {
        auto it = results.find(v.key());
        if (it == results.end()) fail("internal: no result for " + v.key());
        records.push_back(make_record(v, e, r, it->second.at(e.name).at(r), seeds));
      }
    }
  }
  return records;
}

// What the run measured, after provenance(): the caches, the choice, the protocol, the entries.
inline json run_header(json header, const std::string& caches, const std::string& src, const std::string& zone_text,
                       double base_share, const std::string& choice_source, const std::vector<double>& ratios,
                       int seeds, const std::vector<Entry>& entries) {
  header["caches"] = fs::relative(fs::absolute(caches), src).string();
  header["zone"] = zone_text;
  header["base_share"] = base_share;
  header["choice_source"] = choice_source;
  header["ratios"] = ratios;
  header["random_seeds"] = seeds;
  header["metric"] =
      "error: per layer sqrt(sum ||A(q,K',V') - A(q,K,V)||^2 / sum ||A(q,K,V)||^2) over all query heads and all N "
      "queries (non-causal, float64), then the mean over the entry's layers (layer_errors hold the per-layer "
      "values); random: the mean over seeds";
  header["protocol"] =
      "all N tokens compressed; queries: all N tokens, non-causal, attending to the kept tokens only; every row "
      "keeps n = round(keep_ratio * N) tokens per KV head in every layer (uniform), the CLS tokens protected "
      "(counted in n); sink 0, window 0, window_share 0 for every row but defaults and defaults-grid, which "
      "select with flashcache::Options{} as a user calls it (their sink and recent window, counted in n; "
      "defaults-grid with the entry's spans as --grid); snapkv and h2o score with these same "
      "queries (causal accumulation, as the library implements them), so they saw the evaluated queries, the "
      "other rows saw no queries";
  header["rows"] =
      "flashcache-1d-*: Options::paper() scores along tokens (global, or blocked over 64 tokens), no grids; "
      "flashcache-2d-*: the image spans (ImageSpans) = the entry's spans, 2D DCT low-pass over each patch grid (global, or "
      "8 x 8 tiles), gamma 0.2; +base: grid_base_share (2D) or base_share (1D) = base_share above; random seeds "
      "0..S-1 averaged; snapkv observation window 32, pool 7";
  header["entries"] = json::array();
  for (const auto& e : entries)
    header["entries"].push_back({{"name", e.name},
                                 {"split", e.split},
                                 {"group", e.group()},
                                 {"image_size", e.image_size},
                                 {"images", e.meta.value("images", json::array())},
                                 {"tokens", e.cache.tokens},
                                 {"grid", e.grid_json()},
                                 {"cls_tokens", e.cls},
                                 {"shape_k", {e.cache.layers, e.cache.heads, e.cache.tokens, e.cache.head_dim}}});
  return header;
}

// Mean and median over entries of each (split, group, label, keep).
inline json summarize(const json& records) {
  std::map<std::tuple<std::string, std::string, std::string, double>, std::vector<double>> by;
  for (const auto& r : records) {
    const std::string label = r["label"].get<std::string>();
    for (const std::string& g : {std::string("all"), r["group"].get<std::string>()})
      by[{r["split"].get<std::string>(), g, label, r["keep_ratio"].get<double>()}].push_back(r["error"].get<double>());
  }
  json out = json::array();
  for (const auto& [k, errs] : by)
    out.push_back({{"split", std::get<0>(k)},
                   {"group", std::get<1>(k)},
                   {"label", std::get<2>(k)},
                   {"keep_ratio", std::get<3>(k)},
                   {"entries", errs.size()},
                   {"mean", mean_of(errs)},
                   {"median", median_of(errs)}});
  return out;
}

// The results file: this run's records and header beside the old file's. Records of
// the other splits stay; a new dev sweep replaces the old one, and held-out records
// measured under a different choice go (the held-out run must follow the dev choice).
inline json merge_results(const json& doc, const std::string& split, const std::set<std::string>& splits_run,
                          const DevChoice* sweep, const json& header, const json& records) {
  const bool choice_changed =
      sweep && doc.contains("choice") &&
      (doc["choice"].value("zone", "") != sweep->zone || doc["choice"].value("base_share", -1.0) != sweep->base_share);
  const json merged = merge_records(
      doc,
      [&](const json& r) {
        const std::string s = r.value("split", "");
        return !splits_run.count(s) && !(choice_changed && s == "heldout");
      },
      records);
  if (choice_changed) std::fprintf(stderr, "grid_eval: the dev choice changed; dropped old held-out records\n");
  json headers = old_headers(doc);
  if (choice_changed) headers.erase("heldout");
  headers[split] = header;
  json result;
  result["about"] =
      "Image spans as 2D grids on ViT caches: bench/quality/grid_eval.cpp, run by "
      "bench/quality/run_grid.sh; described in bench/quality/README.md; report: tools/report/quality_grid.py";
  result["header"] = headers;
  if (sweep) {
    result["choice"] = sweep->sweep["choice"];
    result["dev_sweep"] = sweep->sweep;
  } else {
    if (doc.contains("choice")) result["choice"] = doc["choice"];
    if (doc.contains("dev_sweep")) result["dev_sweep"] = doc["dev_sweep"];
  }
  result["summary"] = summarize(merged);
  result["records"] = merged;
  return result;
}

inline void print_table(const json& summary, const std::string& split, const std::vector<std::string>& labels,
                        const std::vector<double>& ratios) {
  for (const char* group : {"all", "224", "448", "multi-image"}) {
    bool any = false;
    for (const auto& s : summary) any |= s["split"] == split && s["group"] == group;
    if (!any) continue;
    std::printf("\n%s, %s entries: mean (median) attention error over entries\n  %-28s", split.c_str(), group, "row");
    for (double r : ratios) std::printf(" %17.2f", r);
    std::printf("\n");
    for (const auto& label : labels) {
      std::printf("  %-28s", label.c_str());
      for (double r : ratios) {
        bool found = false;
        for (const auto& s : summary)
          if (s["split"] == split && s["group"] == group && s["label"] == label && s["keep_ratio"].get<double>() == r) {
            std::printf("   %6.4f (%6.4f)", s["mean"].get<double>(), s["median"].get<double>());
            found = true;
          }
        if (!found) std::printf(" %17s", "-");
      }
      std::printf("\n");
    }
  }
  std::fflush(stdout);
}

}  // namespace flashcache::quality::grid
