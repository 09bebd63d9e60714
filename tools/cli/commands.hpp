#pragma once
// The CLI's subcommands: their arguments, as parsed by main(), and their entry
// points. Each returns the exit code or throws CliError / flashcache::Error.
#include <cstdint>
#include <string>
#include <vector>

#include "flashcache/options.hpp"
#include "flashcache/query_tail.hpp"

namespace flashcache::cli {

// Defaults are the library's Options defaults.
struct TransformArgs {
  double gamma = ScoreOptions{}.gamma;
  Transform transform = ScoreOptions{}.transform;
  std::int64_t block = ScoreOptions{}.block_size;
  Base base = ScoreOptions{}.base;
};

struct CompressArgs {
  std::string k, v, out, protect;     // protect: empty for none
  std::string policy = "flashcache";  // flashcache, streaming, knorm, keydiff, random, snapkv, h2o
  std::string q;                      // queries for snapkv / h2o, and flashcache's query tails; empty for none
  // flashcache with --q: Options::with_query_tail() and its feed, but for what is given.
  double tail_weight = Options::with_query_tail().score.tail_weight;
  std::string tail_mix = to_string(Options::with_query_tail().score.tail_mix);
  std::int64_t tail_stride = QueryTailOptions{}.stride;
  std::int64_t tail_min_distance = QueryTailOptions{}.min_distance;
  std::int64_t tail_last = kTailLastQueries;
  std::uint64_t seed = 0;                // random
  std::int64_t observation_window = 32;  // snapkv
  bool has_keep_ratio = false, has_keep = false;
  double keep_ratio = 0.2;  // also the default when neither --keep-ratio nor --keep is given
  std::int64_t keep = 0;
  std::int64_t sink = SelectOptions{}.sink, window = SelectOptions{}.window;
  double window_share = SelectOptions{}.window_share, base_share = SelectOptions{}.base_share;
  bool normalize_terms = ScoreOptions{}.normalize_terms;
  double mean_weight = ScoreOptions{}.mean_weight;  // flashcache: the distance from the head's mean, mixed in
  std::string mean_mix = to_string(ScoreOptions{}.mean_mix);
  std::string mean_distance = to_string(ScoreOptions{}.mean_distance);
  double mean_full_keep = ScoreOptions{}.mean_full_keep;  // flashcache: the weight follows the keep ratio
  double mean_zero_keep = ScoreOptions{}.mean_zero_keep;
  std::int64_t bridge = ScoreOptions{}.bridge;  // flashcache: fill short holes in runs of high scores
  double rope_theta = 0;  // > 0: score keys de-rotated with this RoPE base
  std::string rope_layout = "half";
  std::int64_t rope_first_position = 0;
  bool paper = false;              // Options::paper(): the paper's algorithm exactly
  std::vector<std::string> grids;  // --grid FIRST:ROWS:COLS, one per image
  std::string grid_zone = to_string(ScoreOptions{}.grid_zone);
  std::int64_t grid_tile = ScoreOptions{}.grid_tile;
  double grid_base_share = SelectOptions{}.grid_base_share;
  TransformArgs transform;
  bool no_allocate = false;
  bool force = false;
  // Which of the policy-specific options were given on the command line, so
  // that one meant for another policy is refused rather than ignored.
  bool has_seed = false, has_observation_window = false, has_transform_option = false, has_rope_option = false;
  bool has_tail_option = false;  // --tail-* (flashcache with --q)
  bool has_grid_option = false;  // --grid-zone or --grid-tile (scoring options of flashcache)
};

struct InspectArgs {
  std::string k, v;
  TransformArgs transform;
};

// A question asked after compression: its queries bring back evicted tokens per (layer, KV head).
struct RecallArgs {
  std::string k, kept, q, question_k, out;  // kept: compress's output folder (kept_<l>.npy)
  std::int64_t recall = 32;                 // tokens per (layer, KV head)
  std::int64_t block = 16;                  // evicted tokens per block, in position order
  bool shared = false;                      // one ranking of positions for every layer and KV head
  std::string score = "exact";              // exact | digest (RecallScore)
  bool force = false;
};

int run_compress(const CompressArgs& args);
int run_recall(const RecallArgs& args);
int run_inspect(const InspectArgs& args);

// The library's checks of `o` (check_options), a failure a usage error that
// names the flags that set the fields.
void check_options_as_flags(const Options& o);
// Checks --gamma and --block (check_options_as_flags).
void check_transform_args(const TransformArgs& t);
Options to_options(const TransformArgs& t);

}  // namespace flashcache::cli
