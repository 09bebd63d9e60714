// grid_eval: image spans as 2D grids on ViT caches.
//
// For every cache entry of a split (build-grid/caches/<entry>: k, v, q .npy
// float16 [L, H, N, d], meta.json with "split", "image_size", "grid" and
// "cls_tokens"; index.json lists the entries), every layer and every keep
// ratio r, each row keeps n = round(r * N) tokens per KV head and layer (the
// same n for every row and layer: rows differ only in their scores). The CLS
// tokens are protected (a ProtectMask) and count toward n; sink, window and
// window_share are 0 for every row. All N tokens are compressed and the
// queries of all N tokens attend, non-causally, to the kept tokens only:
// quality_eval's ViT protocol. SnapKV and H2O score with these same queries
// (in the causal form the library implements), so they saw the evaluated
// queries; the other rows saw none.
//
// Rows:
//   flashcache-1d-global, flashcache-1d-blocked (block 64): the paper's 1D
//     scores (Options::paper(), no grids);
//   flashcache-2d-global, flashcache-2d-tiles (grid_tile 8): the image spans (ImageSpans) =
//     the entry's spans, 2D low-pass zone --zone at gamma 0.2;
//   each with "+base": grid_base_share (2D) or base_share (1D) = --base-share;
//   random (seeds 0..4 averaged), knorm, keydiff, snapkv (window 32, pool 7),
//   h2o.
//
// --sweep (dev only) evaluates every zone (rectangle, triangle) x base share
// (0, 1/4, 1/2, 3/4) for the 2D rows (and the shares for the 1D rows), picks
// the pair with the lowest mean dev error over the 2D rows, the dev entries
// and the keep ratios, and writes the sweep and the choice; the held-out run
// then takes the choice from the same --out file.
//
// The same stages compress_model runs (score, then select with uniform
// allocation), with each layer's scores computed once and selected at every
// keep ratio. The attention error is attention_error.hpp's measure, computed
// with Eigen GEMMs over the layer's full softmax numerators, which are shared
// by all rows (LayerAttention); --verify checks layer 0 against
// attention_error() itself.
//
// The steps, one header each: grid_entries.hpp (the entries and their caches,
// read by cache_io.hpp), grid_variants.hpp (rows, variants and their options),
// grid_evaluate.hpp (scores, selection, errors), grid_sweep.hpp (the dev
// choice), grid_report.hpp (records, header, summary, merge, tables); the
// results file through results_io.hpp.
#include <CLI/CLI.hpp>
#include <Eigen/Core>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "eval_util.hpp"
#include "grid_entries.hpp"
#include "grid_evaluate.hpp"
#include "grid_report.hpp"
#include "grid_sweep.hpp"
#include "grid_variants.hpp"
#include "results_io.hpp"

#ifndef FLASHCACHE_SOURCE_DIR
#error "FLASHCACHE_SOURCE_DIR must name the repository root"
#endif

namespace fq = flashcache::quality;
namespace fg = flashcache::quality::grid;
using json = nlohmann::ordered_json;
using fg::fail;

int main(int argc, char** argv) {
  CLI::App app{
      "Image spans as 2D grids on ViT caches: relative attention-output error of 1D and 2D FlashCache rows "
      "(with and without the base sample) beside the baselines, per cache entry and layer."};
  const std::string src = FLASHCACHE_SOURCE_DIR;
  std::string caches = src + "/build-grid/caches", split = "dev", rows_text, zone_text, entries_text;
  std::string out = src + "/bench/results/quality_grid.json", ratios_text = "0.05,0.1,0.2,0.4";
  double base_share = -1;
  int seeds = 5;
  bool sweep = false, verify = false;
  app.add_option("--caches", caches, "Folder of cache entries (index.json, or one folder per entry)")
      ->capture_default_str();
  app.add_option("--split", split, "dev, heldout or all (entries of every split, for ad-hoc runs)")
      ->capture_default_str();
  app.add_option("--rows", rows_text, "Rows (labels), comma-separated; default all");
  app.add_option("--zone", zone_text, "2D low-pass zone: rectangle or triangle (held-out: the dev choice)");
  app.add_option("--base-share", base_share, "Base share of the +base rows (held-out: the dev choice)");
  app.add_flag("--sweep", sweep, "dev only: sweep zone x base share {0, 0.25, 0.5, 0.75}, write the choice");
  app.add_option("--entries", entries_text, "Entry names, comma-separated; default all of the split");
  app.add_option("--ratios", ratios_text, "Keep ratios, comma-separated")->capture_default_str();
  app.add_option("--random-seeds", seeds, "Seeds 0..S-1 averaged for the random row")->capture_default_str();
  app.add_flag("--verify", verify, "Check every layer-0 error against attention_error.hpp (slow on big entries)");
  app.add_option("--out", out, "Output JSON; records of the other splits already there are kept")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  try {
    const auto t0 = std::chrono::steady_clock::now();
    Eigen::setNbThreads(1);
    if (split != "dev" && split != "heldout" && split != "all") fail("--split must be dev, heldout or all");
    if (sweep && split != "dev") fail("--sweep is for the dev split only: choices are made on dev entries");
    if (sweep && (!zone_text.empty() || base_share >= 0)) fail("--sweep chooses the zone and base share itself");
    if (seeds < 1) fail("--random-seeds must be at least 1");
    if (base_share >= 0 && base_share > 1) fail("--base-share must lie in [0, 1]");
    std::vector<double> ratios;
    for (const auto& r : fq::split_list(ratios_text)) {
      ratios.push_back(std::stod(r));
      if (!(ratios.back() > 0 && ratios.back() <= 1)) fail("keep ratios must lie in (0, 1]");
    }

    // The existing results file: other splits are kept, the dev choice is read.
    const json doc = fq::read_old_results(out);
    const std::string choice_source = fg::follow_dev_choice(doc, split, out, &zone_text, &base_share);
    if (!sweep && (zone_text.empty() || base_share < 0)) fail("give --zone and --base-share, or --sweep (dev)");

    const std::vector<std::string> labels = fg::choose_labels(rows_text);
    const std::vector<fg::Variant> variants = fg::make_variants(labels, sweep, zone_text, base_share);
    const std::vector<fg::EntryRef> chosen = fg::choose_entries(caches, entries_text, split);

    std::fprintf(stderr, "grid_eval: %zu %s entries, %zu variants, keep ratios %s\n", chosen.size(), split.c_str(),
                 variants.size(), ratios_text.c_str());
    fg::Results results;
    std::vector<fg::Entry> entries;  // metadata of the evaluated entries (arrays dropped)
    for (std::size_t i = 0; i < chosen.size(); ++i) {
      const auto te = std::chrono::steady_clock::now();
      fg::Entry e = fg::load_entry(chosen[i].name, chosen[i].dir, chosen[i].index, true);
      fg::evaluate_entry(e, variants, ratios, seeds, verify, &results);
      e.cache.drop_arrays();
      std::fprintf(stderr, "  [%zu/%zu] %-64s %5lld tokens %zu spans  %6.1f s\n", i + 1, chosen.size(), e.name.c_str(),
                   static_cast<long long>(e.cache.tokens), e.grids.size(),
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - te).count());
      entries.push_back(std::move(e));
    }

    // The dev choice: the (zone, share) with the lowest mean error over the 2D rows, entries and keep ratios.
    fg::DevChoice choice;
    if (sweep) {
      choice = fg::choose_on_dev(variants, entries, ratios, ratios_text, results);
      fg::print_dev_choice(choice);
      zone_text = choice.zone;
      base_share = choice.base_share;
    }

    std::set<std::string> splits_run;
    const json records =
        fg::make_records(labels, fg::parse_zone(zone_text), base_share, entries, ratios, results, seeds, &splits_run);
    json header = fg::run_header(fq::provenance(argc, argv, src), caches, src, zone_text, base_share,
                                 sweep ? "this run's dev sweep" : choice_source, ratios, seeds, entries);
    header["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const json result = fg::merge_results(doc, split, splits_run, sweep ? &choice : nullptr, header, records);
    fq::write_json(out, result);

    std::printf("\nrows at zone %s, base share %g\n", zone_text.c_str(), base_share);
    for (const auto& s : splits_run) fg::print_table(result["summary"], s, labels, ratios);
    std::printf("\nwrote %zu records to %s (%.1f s)\n", records.size(), out.c_str(), header["seconds"].get<double>());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "grid_eval: %s\n", e.what());
    return 1;
  }
  return 0;
}
