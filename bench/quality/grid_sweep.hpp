#pragma once
// grid_eval's dev choice of the 2D low-pass zone and the base share: made by
// --sweep on dev entries (the pair with the lowest mean error over the 2D rows,
// the entries and the keep ratios), written into the results file, and read
// back from it by the held-out run, which must follow it.
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "eval_util.hpp"
#include "flashcache/flashcache.hpp"
#include "grid_entries.hpp"
#include "grid_evaluate.hpp"
#include "grid_variants.hpp"
#include "results_io.hpp"

namespace flashcache::quality::grid {

namespace fc = flashcache;
namespace fp = flashcache::policies;
using json = nlohmann::ordered_json;

// A held-out run takes the zone and share of the dev choice in the results file
// `doc` (read from `out`), refusing other values; returns where they came from.
inline std::string follow_dev_choice(const json& doc, const std::string& split, const std::string& out,
                                     std::string* zone_text, double* base_share) {
  if (split != "heldout") return "command line";
  if (doc.contains("choice")) {
    const std::string cz = doc.at("choice").at("zone").get<std::string>();
    const double cs = doc.at("choice").at("base_share").get<double>();
    if (!zone_text->empty() && *zone_text != cz)
      fail("--zone " + *zone_text + " differs from the dev choice " + cz + " in " + out);
    if (*base_share >= 0 && std::abs(*base_share - cs) > 1e-12)
      fail("--base-share " + share_text(*base_share) + " differs from the dev choice " + share_text(cs) + " in " + out);
    *zone_text = cz;
    *base_share = cs;
    return "dev choice in the results file";
  }
  if (zone_text->empty() || *base_share < 0)
    fail("held-out runs take the zone and base share chosen on dev: run --split dev --sweep into " + out +
         " first (or give --zone and --base-share)");
  return "command line";
}

struct DevChoice {
  std::string zone;
  double base_share = 0;
  double value = 0;
  json sweep;  // the results file's "dev_sweep" (its "choice" is the results file's "choice")
};

// The (zone, share) with the lowest mean error over the 2D rows, entries and keep ratios.
inline DevChoice choose_on_dev(const std::vector<Variant>& variants, const std::vector<Entry>& entries,
                               const std::vector<double>& ratios, const std::string& ratios_text,
                               const Results& results) {
  const auto error = [&](const Variant& v, const Entry& e, double r) {
    return results.at(v.key()).at(e.name).at(r).error();
  };
  const std::string metric =
      "mean over the dev entries (each: mean over layers), the keep ratios " + ratios_text +
      " and the 2D rows (flashcache-2d-global, flashcache-2d-tiles) of the relative attention error, at base "
      "share s (grid_base_share) and zone z; lowest wins, ties to the earlier (rectangle first, smaller share "
      "first)";
  json table = json::array();
  double best = INFINITY;
  fc::GridZone best_zone = fc::GridZone::rectangle;
  double best_share = 0;
  for (fc::GridZone z : kSweepZones)
    for (double s : kSweepShares) {
      std::vector<double> all;
      json per_row = json::object();
      for (const Variant& v : variants) {
        if (!v.grid2d || v.zone != z || v.share != s) continue;
        std::vector<double> mine;
        for (const auto& e : entries)
          for (double r : ratios) mine.push_back(error(v, e, r));
        per_row[v.family] = mean_of(mine);
        all.insert(all.end(), mine.begin(), mine.end());
      }
      const double value = mean_of(all);
      table.push_back({{"zone", fc::to_string(z)}, {"base_share", s}, {"value", value}, {"per_row", per_row}});
      if (value < best - 1e-15) best = value, best_zone = z, best_share = s;
    }
  // 1D rows at each share, for reference (their +base rows take the 2D choice).
  json table_1d = json::array();
  for (double s : kSweepShares) {
    json per_row = json::object();
    for (const Variant& v : variants) {
      if (v.policy != fp::Policy::flashcache || v.grid2d || v.share != s) continue;
      std::vector<double> mine;
      for (const auto& e : entries)
        for (double r : ratios) mine.push_back(error(v, e, r));
      per_row[v.family] = mean_of(mine);
    }
    table_1d.push_back({{"base_share", s}, {"per_row", per_row}});
  }
  // Every sweep variant per keep ratio: mean, median and the per-entry errors.
  json per_keep = json::array();
  for (const Variant& v : variants) {
    if (v.policy != fp::Policy::flashcache) continue;
    for (double r : ratios) {
      std::vector<double> errs;
      json per_entry = json::object();
      for (const auto& e : entries) {
        errs.push_back(error(v, e, r));
        per_entry[e.name] = errs.back();
      }
      per_keep.push_back({{"variant", v.key()},
                          {"family", v.family},
                          {"zone", v.grid2d ? fc::to_string(v.zone) : "n/a"},
                          {"base_share", v.share},
                          {"keep_ratio", r},
                          {"mean", mean_of(errs)},
                          {"median", median_of(errs)},
                          {"per_entry", per_entry}});
    }
  }
  DevChoice c;
  c.zone = fc::to_string(best_zone);
  c.base_share = best_share;
  c.value = best;
  json& doc = c.sweep;
  doc["metric"] = metric;
  doc["zones"] = {"rectangle", "triangle"};
  doc["shares"] = kSweepShares;
  doc["gamma"] = kGamma;
  doc["table"] = table;
  doc["table_1d"] = table_1d;
  doc["per_keep"] = per_keep;
  json choice;
  choice["zone"] = c.zone;
  choice["base_share"] = c.base_share;
  choice["metric"] = metric;
  choice["value"] = best;
  choice["made_on"] = "dev";
  choice["date"] = utc_now();
  choice["entries"] = json::array();
  for (const auto& e : entries) choice["entries"].push_back(e.name);
  doc["choice"] = choice;
  return c;
}

inline void print_dev_choice(const DevChoice& c) {
  const json& table = c.sweep["table"];
  std::printf("\ndev sweep (%s)\n  %-10s", c.sweep["metric"].get<std::string>().c_str(), "zone");
  for (double s : kSweepShares) std::printf("  share %-5g", s);
  std::printf("\n");
  for (fc::GridZone z : kSweepZones) {
    std::printf("  %-10s", fc::to_string(z));
    for (const auto& t : table)
      if (t["zone"] == fc::to_string(z)) std::printf("  %11.4f", t["value"].get<double>());
    std::printf("\n");
  }
  std::printf("choice: zone %s, base share %g (value %.4f)\n", c.zone.c_str(), c.base_share, c.value);
}

}  // namespace flashcache::quality::grid
