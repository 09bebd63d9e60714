// The `flashcache` command-line tool: argument parsing and error reporting.
// Every failure is one line on stderr, "flashcache: <what went wrong>", and a
// non-zero exit: 2 for bad options or input files, 1 when writing failed.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "cli_error.hpp"
#include "commands.hpp"
#include "flashcache/archive.hpp"
#include "flashcache/enum_names.hpp"
#include "flashcache/error.hpp"
#include "flashcache/grid.hpp"
#include "flashcache/options.hpp"
#include "flashcache/policies/baselines.hpp"
#include "flashcache/recall.hpp"
#include "flashcache/version.hpp"
#include "run_cli.hpp"

namespace {

using flashcache::Transform;
namespace cli = flashcache::cli;

// The names a flag of enum E accepts: the enum's table (flashcache/enum_names.hpp).
template <class E>
CLI::IsMember names_of() {
  std::vector<std::string> names;
  for (const auto& n : flashcache::EnumNames<E>::table) names.emplace_back(n.name);
  return CLI::IsMember(names);
}

void add_transform_options(CLI::App* cmd, cli::TransformArgs* t) {
  cmd->add_option("--gamma", t->gamma,
                  "Base ratio in (0, 1]: ceil(gamma * N) frequencies form the base (which ones: --base)")
      ->capture_default_str();
  cmd->add_option("--transform", "DCT over the whole sequence (global) or over blocks of --block tokens (blocked)")
      ->check(names_of<Transform>())
      ->each([t](const std::string& s) { t->transform = cli::enum_flag<Transform>("--transform", s); })
      ->default_str(to_string(t->transform));  // the library default (blocked)
  cmd->add_option("--block", t->block, "Tokens per block with --transform blocked")->capture_default_str();
  cmd->add_option("--base",
                  "Which ceil(gamma * N) frequencies form the base: the lowest (lowpass, the paper's), those of most "
                  "energy (peak), or half of each (mixed)")
      ->check(names_of<flashcache::Base>())
      ->each([t](const std::string& s) { t->base = cli::enum_flag<flashcache::Base>("--base", s); })
      ->default_str(to_string(t->base));  // the library default
}

// One line, whatever the message holds.
std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

int fail(int code, const std::string& message) {
  std::fprintf(stderr, "flashcache: %s\n", one_line(message).c_str());
  return code;
}

}  // namespace

int flashcache::cli::run_cli(int argc, char** argv) {
  CLI::App app{
      "Frequency-domain, outlier-aware KV cache compression (FlashCache, arXiv 2511.16786).\n"
      "K and V are C-order float32 or float16 .npy arrays of shape [L, H, N, d] or [H, N, d].",
      "flashcache"};
  app.set_version_flag("--version", FLASHCACHE_VERSION_STRING, "Print the version and exit");
  app.require_subcommand(1);

  cli::CompressArgs c;
  CLI::App* compress = app.add_subcommand(
      "compress",
      "Keep each layer's outlier tokens; write scores, budgets, kept indices and compact K', V' to --out.\n"
      "Without --keep-ratio or --keep, keeps 20% (--keep-ratio 0.2, the paper's setting).\n"
      "The output folder appears complete or not at all; an existing non-empty one is replaced only with --force.");
  compress->add_option("--k", c.k, "Keys, [L, H, N, d] or [H, N, d]")->required();
  compress->add_option("--v", c.v, "Values, same shape and dtype as the keys")->required();
  compress->add_option("--out", c.out, "Output folder")->required();
  CLI::Option* ratio = compress->add_option(
      "--keep-ratio", c.keep_ratio,
      "Keep this fraction of all tokens: round(R * L * N) in total, split across layers by energy (default 0.2)");
  CLI::Option* keep = compress->add_option("--keep", c.keep, "Keep N tokens per head in every layer (no allocation)");
  ratio->excludes(keep);
  CLI::Option* sink = compress->add_option("--sink", c.sink, "Always keep the first S tokens")->capture_default_str();
  CLI::Option* window =
      compress->add_option("--window", c.window, "Always keep the last W tokens")->capture_default_str();
  CLI::Option* window_share =
      compress
          ->add_option("--window-share", c.window_share,
                       "Then keep the last round(S * B) tokens, B the layer's budget per head (the larger of this "
                       "and --window applies)")
          ->capture_default_str();
  CLI::Option* base_share =
      compress
          ->add_option("--base-share", c.base_share,
                       "Spend round(S * B) of the rest on evenly spaced tokens (a sample of the smooth base)")
          ->capture_default_str();
  CLI::Option* normalize = compress
                               ->add_flag("--normalize-terms,!--no-normalize-terms", c.normalize_terms,
                                          "flashcache: divide the K and V terms of the score each by its head's mean")
                               ->capture_default_str();
  CLI::Option* mean_weight =
      compress
          ->add_option("--mean-weight", c.mean_weight,
                       "flashcache: the share of the score given to each token's distance from its head's mean K "
                       "and V (0: the residual alone, as the paper scores)")
          ->capture_default_str();
  CLI::Option* mean_mix =
      compress->add_option("--mean-mix", c.mean_mix, "flashcache: sum or max of the two score terms")
          ->check(names_of<flashcache::TailMix>())
          ->capture_default_str();
  CLI::Option* mean_distance =
      compress
          ->add_option("--mean-distance", c.mean_distance,
                       "flashcache: what --mean-weight measures: kv_squared (K and V from their means) or key_cosine "
                       "(1 - cos(key, the mean unit key), KeyDiff's)")
          ->check(names_of<flashcache::MeanDistance>())
          ->capture_default_str();
  CLI::Option* mean_full_keep =
      compress
          ->add_option("--mean-full-keep", c.mean_full_keep,
                       "flashcache: --mean-weight in full at keep ratios from this one up, falling linearly to none "
                       "at --mean-zero-keep (both 0: the same weight at every keep ratio)")
          ->capture_default_str();
  CLI::Option* mean_zero_keep = compress
                                    ->add_option("--mean-zero-keep", c.mean_zero_keep,
                                                 "flashcache: no distance from the mean at keep ratios up to this one")
                                    ->capture_default_str();
  CLI::Option* bridge =
      compress
          ->add_option("--bridge", c.bridge,
                       "flashcache: raise a token with a higher-scoring token within N tokens on each side to the "
                       "lower of the two, so that a run (a number's digits) is kept whole (0: none)")
          ->capture_default_str();
  CLI::Option* rope = compress->add_option(
      "--rope-theta", c.rope_theta, "flashcache: score keys rotated back to their pre-RoPE form, with this RoPE base");
  compress->add_option("--rope-layout", c.rope_layout, "With --rope-theta: pairs (i, i + d/2) or (2i, 2i + 1)")
      ->check(names_of<flashcache::RopeLayout>())
      ->capture_default_str();
  compress->add_option("--rope-first-position", c.rope_first_position, "With --rope-theta: position of token 0")
      ->capture_default_str();
  CLI::Option* paper = compress->add_flag(
      "--paper", c.paper,
      "The paper's algorithm exactly (Options::paper(): no sink, window or base sample, unweighted terms, keys as "
      "cached, global DCT, gamma 0.2, the residual alone)");
  for (CLI::Option* o : {sink, window, window_share, base_share, normalize, mean_weight, mean_mix, mean_distance,
                         mean_full_keep, mean_zero_keep, bridge, rope})
    paper->excludes(o);
  compress->add_option("--protect", c.protect, "Bool or uint8 mask of N tokens; nonzero = always kept");
  CLI::Option* grid = compress->add_option(
      "--grid", c.grids,
      "An image's tokens FIRST:ROWS:COLS (patch (r, c) at token FIRST + r * COLS + c), scored by a 2D DCT over its "
      "grid; repeat for each image (spans inside the sequence, not overlapping)");
  paper->excludes(grid);
  compress->add_option("--grid-zone", c.grid_zone, "With --grid: the 2D low-pass zone")
      ->check(names_of<flashcache::GridZone>())
      ->capture_default_str();
  compress
      ->add_option("--grid-tile", c.grid_tile,
                   "With --grid and --transform blocked: tiles of T x T patches (edge tiles at their own size)")
      ->capture_default_str();
  compress
      ->add_option("--grid-base-share", c.grid_base_share,
                   "With --grid: spend this share of each image's budget on a regular sub-grid of its patches")
      ->capture_default_str();
  add_transform_options(compress, &c.transform);
  compress->add_flag("--no-allocate", c.no_allocate,
                     "With --keep-ratio: every layer keeps round(R * N) instead of an energy-weighted share");
  compress
      ->add_option("--policy", c.policy,
                   "How tokens are scored: flashcache (outliers from the low-pass base), or a baseline: streaming "
                   "(most recent), knorm (lowest key norm), keydiff (keys least aligned with the mean key), random, "
                   "snapkv (attention of the last "
                   "--observation-window queries), h2o (accumulated attention). Baselines have no energy ratios: "
                   "with --keep-ratio their total is split in proportion to each layer's tokens")
      ->check(names_of<flashcache::policies::Policy>())
      ->capture_default_str();
  compress->add_option(
      "--q", c.q,
      "The prompt's queries, [L, Hq, N, d] or [Hq, N, d], same dtype, layers, tokens and head dim "
      "as K; Hq a multiple of K's heads (query head j uses KV head j / (Hq / H)). Needed by snapkv "
      "and h2o; with flashcache they switch on the query-informed score (ScoreOptions::query = tail: each "
      "key's largest attention probability from a prompt query, mixed with the residual)");
  compress->add_option("--tail-weight", c.tail_weight, "With flashcache and --q: the tail's share of the score")
      ->capture_default_str();
  compress->add_option("--tail-mix", c.tail_mix, "With flashcache and --q: sum or max of the two score terms")
      ->check(names_of<flashcache::TailMix>())
      ->capture_default_str();
  compress->add_option("--tail-stride", c.tail_stride, "With flashcache and --q: feed every S-th prompt query only")
      ->capture_default_str();
  compress
      ->add_option("--tail-min-distance", c.tail_min_distance,
                   "With flashcache and --q: a query counts for keys at least this many tokens before it")
      ->capture_default_str();
  compress->add_option("--tail-last", c.tail_last, "With flashcache and --q: feed the last N prompt queries (0: all)")
      ->capture_default_str();
  compress->add_option("--seed", c.seed, "Seed of --policy random")->capture_default_str();
  compress->add_option("--observation-window", c.observation_window, "Queries that vote in --policy snapkv")
      ->capture_default_str();
  compress->add_flag("--force", c.force, "Replace --out if it exists and is not empty");

  cli::RecallArgs rc;
  CLI::App* recall = app.add_subcommand(
      "recall",
      "A question asked after compression: score each (layer, KV head)'s evicted tokens with the question's queries "
      "(the largest attention probability over the kept, evicted and question keys) and write the best whole blocks "
      "as recalled_<l>.npy [H, --recall] (ascending indices into N, -1 after the last).");
  recall->add_option("--k", rc.k, "The context's keys after RoPE, float32 [L, H, N, d]")->required();
  recall->add_option("--kept", rc.kept, "compress's output folder (its kept_<l>.npy)")->required();
  recall->add_option("--q", rc.q, "The question's queries after RoPE, float32 [L, Hq, m, d]")->required();
  recall->add_option("--question-k", rc.question_k, "The question's keys after RoPE, float32 [L, H, m, d]")->required();
  recall->add_option("--out", rc.out, "Output folder")->required();
  recall->add_option("--recall", rc.recall, "Tokens brought back per (layer, KV head)")->capture_default_str();
  recall->add_option("--block", rc.block, "Evicted tokens per block, in position order")->capture_default_str();
  recall->add_flag("--shared", rc.shared,
                   "One ranking of positions for all layers and KV heads (a position scores the best any head that "
                   "evicted it gives it), as llama.cpp's cells need; each head gets the chosen positions it evicted");
  recall->add_option("--score", rc.score, "exact (the best token's probability) or digest (Quest's bound, per head)")
      ->check(names_of<flashcache::RecallScore>())
      ->capture_default_str();
  recall->add_flag("--force", rc.force, "Replace --out if it exists and is not empty");

  cli::InspectArgs i;
  CLI::App* inspect = app.add_subcommand(
      "inspect", "Print, per layer, the share of K and V energy below the low-pass cutoff and the ratio R_l.");
  inspect->add_option("--k", i.k, "Keys, [L, H, N, d] or [H, N, d]")->required();
  inspect->add_option("--v", i.v, "Values, same shape and dtype as the keys")->required();
  add_transform_options(inspect, &i.transform);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    return fail(cli::kExitUsage, std::string(e.what()) + " (see flashcache --help)");
  }
  c.has_keep_ratio = ratio->count() > 0;
  c.has_keep = keep->count() > 0;
  c.has_seed = compress->count("--seed") > 0;
  c.has_observation_window = compress->count("--observation-window") > 0;
  c.has_transform_option =
      compress->count("--gamma") + compress->count("--transform") + compress->count("--block") +
          compress->count("--base") + compress->count("--normalize-terms") + compress->count("--no-normalize-terms") +
          compress->count("--mean-weight") + compress->count("--mean-mix") + compress->count("--mean-distance") +
          compress->count("--mean-full-keep") + compress->count("--mean-zero-keep") + compress->count("--bridge") >
      0;
  c.has_tail_option = compress->count("--tail-weight") + compress->count("--tail-mix") +
                          compress->count("--tail-stride") + compress->count("--tail-min-distance") +
                          compress->count("--tail-last") >
                      0;
  c.has_grid_option = compress->count("--grid-zone") + compress->count("--grid-tile") > 0;
  c.has_rope_option =
      compress->count("--rope-theta") + compress->count("--rope-layout") + compress->count("--rope-first-position") > 0;

  try {
    if (compress->parsed()) return cli::run_compress(c);
    if (recall->parsed()) return cli::run_recall(rc);
    return cli::run_inspect(i);
  } catch (const cli::CliError& e) {
    return fail(e.code(), e.what());
  } catch (const flashcache::Error& e) {
    // Bad input files and options the library refused; its message already starts with "flashcache: ".
    const std::string what = e.what(), prefix = "flashcache: ";
    return fail(cli::kExitUsage, what.compare(0, prefix.size(), prefix) == 0 ? what.substr(prefix.size()) : what);
  } catch (const std::bad_alloc&) {
    return fail(cli::kExitFailure, "out of memory");
  } catch (const std::exception& e) {
    return fail(cli::kExitFailure, std::string("internal error: ") + e.what());
  }
}
