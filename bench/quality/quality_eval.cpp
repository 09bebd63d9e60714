// quality_eval: FlashCache beside the baseline policies on real KV caches.
//
// For each fixture (tests/fixtures/<name>: k, v, q .npy [L, H, N, d] + meta.json),
// each keep ratio and each policy row, the cache's compressible part is
// compressed and the relative error of the attention output of held-out
// queries is measured per layer (attention_error.hpp):
//
//   LLM (meta has prompt_range / continuation_range, causal): the prompt
//     [0, P) is compressed; the queries are those of the continuation tokens
//     [P, N), each attending causally to the kept prompt tokens plus the
//     (uncompressed) continuation tokens before it. SnapKV and H2O score with
//     the prompt's queries only: the evaluated queries are held out from every
//     policy.
//   ViT (no continuation, non-causal): all N tokens are compressed and the
//     queries of all N tokens attend (non-causally) to the kept tokens. There
//     is nothing to hold out: SnapKV and H2O score with these same queries, so
//     on the ViT they saw the evaluation queries (in-sample), the others did not.
//
// Every row keeps the same number of tokens in total: n = round(r * P) per
// head and layer, n * L in all (dynamic allocation re-splits n * L over the
// layers). The paper preset otherwise (Options::paper(): gamma 0.2, sink 0, window 0, block 64);
// SnapKV observation window 32, pool 7; random averaged over --random-seeds.
// Nothing is fitted to the data.
//
// Also per fixture: the share of K and V energy below the low-pass cutoff
// (gamma 0.2, global DCT over the compressed tokens), raw and with controls
// (energy.hpp).
//
// Output: --out (default bench/results/quality.json), {"header", "records"};
// records of the other parts (end_to_end, written by
// tools/extract/eval_end_to_end.py) already in that file are kept.
//
// The fixtures are read by cache_io.hpp, the results file written by
// results_io.hpp.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "attention_error.hpp"
#include "cache_io.hpp"
#include "energy.hpp"
#include "eval_util.hpp"
#include "flashcache/flashcache.hpp"
#include "flashcache/policies/baselines.hpp"
#include "results_io.hpp"

#ifndef FLASHCACHE_SOURCE_DIR
#error "FLASHCACHE_SOURCE_DIR must name the repository root"
#endif

namespace {

namespace fs = std::filesystem;
namespace fc = flashcache;
namespace fp = flashcache::policies;
namespace fq = flashcache::quality;
using json = nlohmann::ordered_json;

// ------------------------------------------------------------------ fixtures

struct Fixture {
  std::string name;
  fq::Cache cache;           // k, v, q [L, H, N, d] and meta.json (cache_io.hpp)
  fq::AttentionSetup setup;  // per layer
  std::string token_kind;    // "text" or "visual"
  std::string protocol;
};

Fixture load_fixture(const std::string& root, const std::string& name) {
  Fixture f;
  f.name = name;
  f.cache = fq::read_cache((fs::path(root) / name).string());
  const fq::Cache& c = f.cache;
  const json& meta = c.meta;

  fq::AttentionSetup& s = f.setup;
  s.q_heads = c.q_heads;
  s.kv_heads = c.heads;
  s.tokens = c.tokens;
  s.head_dim = c.head_dim;
  s.causal = meta.value("causal", true);
  s.scale = c.scale;
  if (meta.contains("prompt_range") && meta.contains("continuation_range")) {
    s.prompt = meta["prompt_range"][1].get<std::int64_t>();
    s.query_begin = meta["continuation_range"][0].get<std::int64_t>();
    s.query_end = meta["continuation_range"][1].get<std::int64_t>();
    f.token_kind = "text";
    f.protocol = "prompt tokens [0, " + std::to_string(s.prompt) +
                 ") compressed; held-out queries: continuation tokens [" + std::to_string(s.query_begin) + ", " +
                 std::to_string(s.query_end) +
                 "), causal, attending to the kept prompt tokens and the uncompressed continuation tokens before them; "
                 "snapkv/h2o scored with prompt queries only (no policy saw the evaluated queries)";
  } else {
    if (s.causal) throw std::runtime_error(c.dir + ": a causal fixture needs prompt_range and continuation_range");
    s.prompt = c.tokens;
    s.query_begin = 0;
    s.query_end = c.tokens;
    f.token_kind = "visual";
    f.protocol = "all " + std::to_string(c.tokens) +
                 " tokens compressed; queries: all tokens, non-causal, attending to the kept tokens only; "
                 "snapkv/h2o scored with these same queries (their causal form, as the library implements "
                 "them), so on this model they saw the evaluation queries; the other policies saw no queries";
  }
  return f;
}

// The fixture as the header lists it.
json fixture_json(const Fixture& f, const std::string& src) {
  const fq::Cache& c = f.cache;
  json fx;
  fx["name"] = f.name;
  fx["path"] = fs::relative(fs::absolute(c.dir), src).string();
  fx["model"] = c.meta.value("model", "");
  fx["shape_k"] = {c.layers, c.heads, c.tokens, c.head_dim};
  fx["q_heads"] = c.q_heads;
  fx["model_layers"] = c.meta.value("layers", std::vector<int>{});
  fx["tokens"] = f.token_kind;
  fx["protocol"] = f.protocol;
  return fx;
}

// ---------------------------------------------------------------- policy rows

struct Row {
  std::string label;
  fp::Policy policy;
  fc::Transform transform = fc::Transform::global;
  fc::Allocation allocation = fc::Allocation::uniform;
};

const std::vector<Row>& all_rows() {
  static const std::vector<Row> rows = {
      {"flashcache-global", fp::Policy::flashcache, fc::Transform::global, fc::Allocation::dynamic},
      {"flashcache-blocked", fp::Policy::flashcache, fc::Transform::blocked, fc::Allocation::dynamic},
      {"flashcache-global-noalloc", fp::Policy::flashcache, fc::Transform::global, fc::Allocation::uniform},
      {"flashcache-blocked-noalloc", fp::Policy::flashcache, fc::Transform::blocked, fc::Allocation::uniform},
      {"streaming", fp::Policy::streaming},
      {"knorm", fp::Policy::knorm},
      {"random", fp::Policy::random},
      {"snapkv", fp::Policy::snapkv},
      {"h2o", fp::Policy::h2o},
  };
  return rows;
}

json row_options(const Row& r, const fc::Options& o, const fp::PolicyOptions& po, int seeds) {
  json j;
  j["label"] = r.label;
  if (r.policy == fp::Policy::flashcache) {
    j["transform"] = fc::to_string(r.transform);
    if (r.transform == fc::Transform::blocked) j["block"] = o.score.block_size;
    j["allocation"] = fc::to_string(r.allocation);
    j["gamma"] = o.score.gamma;
  }
  j["sink"] = o.select.sink;
  j["window"] = o.select.window;
  if (r.policy == fp::Policy::random) j["seeds"] = seeds;
  if (r.policy == fp::Policy::snapkv) {
    j["observation_window"] = po.observation_window;
    j["pool_kernel"] = po.pool_kernel;
  }
  return j;
}

// The rows of --rows (all when empty), in all_rows() order.
std::vector<Row> choose_rows(const std::string& rows_text) {
  std::vector<Row> rows;
  for (const Row& r : all_rows())
    if (rows_text.empty() || ("," + rows_text + ",").find("," + r.label + ",") != std::string::npos)
      rows.push_back(r);
  if (rows.empty()) throw std::runtime_error("--rows matches no row");
  return rows;
}

// ------------------------------------------------------------------- output

// What the run measures, after provenance(); the fixtures are added as they are read.
json run_header(json header, int seeds) {
  header["metric"] =
      "attn_rel_err: per layer sqrt(sum ||A(q,K',V') - A(q,K,V)||^2 / sum ||A(q,K,V)||^2) over all query heads "
      "and held-out queries (float64), then the mean over the fixture's layers (records with 'layer' hold the "
      "per-layer values)";
  header["budget"] =
      "every row keeps n = round(keep_ratio * compressed tokens) per KV head and layer, n * L in all; "
      "allocation dynamic re-splits n * L over the layers by R_l";
  header["defaults"] =
      "gamma 0.2, sink 0, window 0, block 64 (blocked), snapkv observation window 32 and pool 7, "
      "random: mean over seeds 0.." +
      std::to_string(seeds - 1) + "; nothing fitted";
  header["fixtures"] = json::array();
  return header;
}

json record(const std::string& part, const std::string& model, const std::string& policy, json options, json keep_ratio,
            const std::string& metric, double value, json layer = nullptr) {
  json r;
  r["part"] = part;
  r["model"] = model;
  r["policy"] = policy;
  r["options"] = std::move(options);
  r["keep_ratio"] = std::move(keep_ratio);
  r["metric"] = metric;
  r["value"] = value;
  if (!layer.is_null()) r["layer"] = std::move(layer);
  return r;
}

// --------------------------------------------------------------- evaluation

// Per-layer relative attention error of one compressed model.
std::vector<double> layer_errors(const Fixture& f, const fc::CompressedModel<float>& m) {
  const fq::Cache& c = f.cache;
  std::vector<double> out;
  for (std::int64_t l = 0; l < c.layers; ++l) {
    const auto& layer = m.layers[static_cast<std::size_t>(l)];
    const fq::ErrorSums s =
        fq::attention_error(c.q_layer(l), c.k_layer(l), c.v_layer(l), f.setup, layer.kept.data(), layer.budget);
    out.push_back(s.relative());
  }
  return out;
}

void evaluate_attention(const Fixture& f, const std::vector<double>& ratios, const std::vector<Row>& rows, int seeds,
                        json* records) {
  const fq::Cache& c = f.cache;
  const auto kp = c.k_views(f.setup.prompt), vp = c.v_views(f.setup.prompt);
  const auto qp = c.q_views(f.setup.prompt);  // prompt queries only: never the held-out ones
  std::printf("\n%s: %lld layers x %lld KV heads (%lld query heads) x %lld tokens x %lld dims\n  %s\n", f.name.c_str(),
              static_cast<long long>(c.layers), static_cast<long long>(c.heads), static_cast<long long>(c.q_heads),
              static_cast<long long>(c.tokens), static_cast<long long>(c.head_dim), f.protocol.c_str());
  std::printf("  %-28s", "attention rel. error");
  for (double r : ratios) std::printf(" %9.2f", r);
  std::printf("\n");
  for (const Row& row : rows) {
    std::printf("  %-28s", row.label.c_str());
    for (double ratio : ratios) {
      const std::int64_t n = std::llround(ratio * static_cast<double>(f.setup.prompt));
      // The paper preset (gamma 0.2, sink 0, window 0, block 64): the options these committed
      // fixture results were measured with, before the defaults changed (bench/quality/README.md).
      fc::Options opt = fc::Options::paper();
      opt.score.transform = row.transform;
      opt.allocate.mode = row.allocation;
      fp::PolicyOptions po;  // seed 0, observation window 32, pool 7
      const int runs = row.policy == fp::Policy::random ? seeds : 1;
      std::vector<double> per_layer(static_cast<std::size_t>(c.layers), 0.0);
      std::vector<double> overall;
      std::int64_t kept_total = 0;
      double first_kept = 0;  // share of (layer, KV head) pairs that kept token 0
      for (int run = 0; run < runs; ++run) {
        po.seed = static_cast<std::uint64_t>(run);
        const auto model =
            fp::compress_model<float, const float>(row.policy, qp, kp, vp, fc::Budget::tokens(n), opt, po);
        kept_total = model.tokens_after();
        for (const auto& layer : model.layers)
          for (std::int64_t h = 0; h < layer.heads; ++h)
            first_kept +=
                (layer.budget > 0 && layer.kept_head(h)[0] == 0) / static_cast<double>(runs * c.layers * layer.heads);
        const auto e = layer_errors(f, model);
        for (std::size_t l = 0; l < e.size(); ++l) per_layer[l] += e[l] / runs;
        overall.push_back(fq::mean_of(e));
      }
      json options = row_options(row, opt, po, runs);
      options["kept_per_head_total"] = kept_total;  // over layers; n * L for every row
      options["prompt_tokens"] = f.setup.prompt;
      const std::string policy = fp::to_string(row.policy);
      records->push_back(record("attention", f.name, policy, options, ratio, "attn_rel_err", fq::mean_of(per_layer)));
      if (runs > 1) {
        double var = 0;
        for (double x : overall) var += (x - fq::mean_of(overall)) * (x - fq::mean_of(overall));
        records->push_back(record("attention", f.name, policy, options, ratio, "attn_rel_err_std_over_seeds",
                                  std::sqrt(var / static_cast<double>(runs - 1))));
      }
      records->push_back(record("attention", f.name, policy, options, ratio, "first_token_kept_share", first_kept));
      for (std::size_t l = 0; l < per_layer.size(); ++l)
        records->push_back(record("attention", f.name, policy, options, ratio, "attn_rel_err", per_layer[l],
                                  c.model_layer(static_cast<std::int64_t>(l))));
      std::printf(" %9.4f", fq::mean_of(per_layer));
      std::fflush(stdout);
    }
    std::printf("\n");
  }
}

void evaluate_energy(const Fixture& f, double gamma, json* records) {
  const fq::Cache& c = f.cache;
  const std::int64_t n = f.setup.prompt, d = c.head_dim;
  std::printf("  energy below the cutoff (gamma %g, global DCT over %lld %s tokens): ", gamma,
              static_cast<long long>(n), f.token_kind.c_str());
  for (auto variant : {fq::EnergyVariant::raw, fq::EnergyVariant::centered, fq::EnergyVariant::shuffled,
                       fq::EnergyVariant::centered_shuffled}) {
    const auto energy_options = [&](const char* tensor) {
      return json{{"tensor", tensor},
                  {"variant", fq::to_string(variant)},
                  {"tokens", f.token_kind},
                  {"gamma", gamma},
                  {"token_count", n}};
    };
    const auto share_of = [](const fc::HeadEnergy& e, const char* tensor) {
      return tensor[0] == 'K' ? fq::low_share(e.k_high, e.k_total) : fq::low_share(e.v_high, e.v_total);
    };
    fc::HeadEnergy all;
    std::int64_t k_over_90 = 0, heads_seen = 0;
    for (std::int64_t l = 0; l < c.layers; ++l) {
      // This layer's compressed tokens, [H][n][d] contiguous.
      std::vector<float> kl, vl;
      for (std::int64_t h = 0; h < c.heads; ++h) {
        const float* kh = c.k_layer(l) + h * c.tokens * d;
        const float* vh = c.v_layer(l) + h * c.tokens * d;
        kl.insert(kl.end(), kh, kh + n * d);
        vl.insert(vl.end(), vh, vh + n * d);
      }
      const auto kx = fq::energy_variant(kl.data(), c.heads, n, d, variant);
      const auto vx = fq::energy_variant(vl.data(), c.heads, n, d, variant);
      fc::HeadEnergy layer;
      for (const auto& e : fq::layer_energy(kx.data(), vx.data(), c.heads, n, d, gamma)) {
        layer.k_total += e.k_total;
        layer.k_high += e.k_high;
        layer.v_total += e.v_total;
        layer.v_high += e.v_high;
        k_over_90 += fq::low_share(e.k_high, e.k_total) > 0.9;
        ++heads_seen;
      }
      all.k_total += layer.k_total;
      all.k_high += layer.k_high;
      all.v_total += layer.v_total;
      all.v_high += layer.v_high;
      const int ml = c.model_layer(l);
      for (const char* t : {"K", "V"})
        records->push_back(record("energy", f.name, "none", energy_options(t), nullptr, "energy_below_cutoff",
                                  share_of(layer, t), ml));
    }
    for (const char* t : {"K", "V"}) {
      const double share = share_of(all, t);
      records->push_back(record("energy", f.name, "none", energy_options(t), nullptr, "energy_below_cutoff", share));
      std::printf("%s %s %.3f  ", t, fq::to_string(variant), share);
    }
    json o = {{"tensor", "K"}, {"variant", fq::to_string(variant)}, {"tokens", f.token_kind}, {"gamma", gamma}};
    records->push_back(record("energy", f.name, "none", o, nullptr, "share_of_heads_over_0.9",
                              static_cast<double>(k_over_90) / static_cast<double>(heads_seen)));
  }
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "FlashCache beside the baseline policies on the real KV fixtures: relative attention-output error of "
      "held-out queries, and the energy below the low-pass cutoff."};
  std::string fixtures = std::string(FLASHCACHE_SOURCE_DIR) + "/tests/fixtures";
  std::string out = std::string(FLASHCACHE_SOURCE_DIR) + "/bench/results/quality.json";
  std::string models = "smollm2_prompt,vit_s", ratios_text = "0.05,0.1,0.2,0.4", rows_text;
  int seeds = 5;
  app.add_option("--fixtures", fixtures, "Folder of fixture folders")->capture_default_str();
  app.add_option("--models", models, "Fixture names, comma-separated")->capture_default_str();
  app.add_option("--ratios", ratios_text, "Keep ratios, comma-separated")->capture_default_str();
  app.add_option("--rows", rows_text, "Policy rows (labels), comma-separated; default all");
  app.add_option("--random-seeds", seeds, "Seeds 0..S-1 averaged for the random policy")->capture_default_str();
  app.add_option("--out", out, "Output JSON (its end_to_end part, if any, is kept)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  try {
    std::vector<double> ratios;
    for (const auto& r : fq::split_list(ratios_text)) ratios.push_back(std::stod(r));
    const std::vector<Row> rows = choose_rows(rows_text);
    if (seeds < 1) throw std::runtime_error("--random-seeds must be at least 1");

    const std::string src = FLASHCACHE_SOURCE_DIR;
    json header = run_header(fq::provenance(argc, argv, src), seeds);

    json records = json::array();
    const auto t0 = std::chrono::steady_clock::now();
    for (const auto& name : fq::split_list(models)) {
      const Fixture f = load_fixture(fixtures, name);
      header["fixtures"].push_back(fixture_json(f, src));
      evaluate_attention(f, ratios, rows, seeds, &records);
      evaluate_energy(f, fc::Options::paper().score.gamma, &records);
    }
    header["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    // Keep the other parts of an existing file (end_to_end).
    const json doc = fq::read_old_results(out);
    json result;
    result["header"] = fq::old_headers(doc);
    result["header"]["attention"] = header;
    result["records"] = fq::merge_records(
        doc,
        [](const json& r) { return r.value("part", "") != "attention" && r.value("part", "") != "energy"; },
        records);
    fq::write_json(out, result);
    std::printf("\nwrote %zu records to %s (%.1f s)\n", records.size(), out.c_str(), header["seconds"].get<double>());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "quality_eval: %s\n", e.what());
    return 1;
  }
  return 0;
}
