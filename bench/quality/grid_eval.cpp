// grid_eval: image spans as 2D grids (issue #11) on ViT caches.
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
//   flashcache-2d-global, flashcache-2d-tiles (grid_tile 8): Options::grids =
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
// by all rows; --verify checks layer 0 against attention_error.hpp itself.
#include <CLI/CLI.hpp>
#include <Eigen/Core>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "attention_error.hpp"
#include "eval_util.hpp"
#include "flashcache/flashcache.hpp"
#include "flashcache/policies/baselines.hpp"
#include "npy/npy.hpp"

#ifndef FLASHCACHE_SOURCE_DIR
#error "FLASHCACHE_SOURCE_DIR must name the repository root"
#endif

namespace {

namespace fs = std::filesystem;
namespace fc = flashcache;
namespace fp = flashcache::policies;
namespace fq = flashcache::quality;
using fq::load_floats;
using fq::mean_of;
using fq::median_of;
using fq::run_text;
using fq::split_list;
using fq::utc_now;
using json = nlohmann::ordered_json;
using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic>;  // column-major

constexpr double kGamma = 0.2;
constexpr std::int64_t kBlock = 64;
constexpr std::int64_t kTile = 8;
const std::vector<double> kSweepShares = {0.0, 0.25, 0.5, 0.75};
const std::vector<fc::GridZone> kSweepZones = {fc::GridZone::rectangle, fc::GridZone::triangle};

[[noreturn]] void fail(const std::string& m) { throw std::runtime_error(m); }

std::string share_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

// ------------------------------------------------------------------- entries

struct Entry {
  std::string name, dir, split;
  json meta;
  std::int64_t image_size = 0, images = 0;
  std::vector<fc::GridSpan> grids;
  std::vector<std::int64_t> cls;
  std::int64_t layers = 0, heads = 0, q_heads = 0, tokens = 0, head_dim = 0;
  double scale = 0;
  std::vector<int> model_layers;
  std::vector<float> k, v, q;  // [L][H][N][d], [L][Hq][N][d]

  std::string group() const { return images > 1 ? "multi-image" : std::to_string(image_size); }
  const float* layer(const std::vector<float>& x, std::int64_t h, std::int64_t l) const {
    return x.data() + l * h * tokens * head_dim;
  }
  json grid_json() const {
    json g = json::array();
    for (const auto& s : grids) g.push_back({s.first, s.rows, s.cols});
    return g;
  }
};

std::string shape_text(const std::vector<std::int64_t>& s) {
  std::string t = "[";
  for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

std::vector<fc::GridSpan> parse_grid(const json& g, const std::string& where) {
  if (!g.is_array()) fail(where + ": \"grid\" must be a list of [first, rows, cols]");
  std::vector<fc::GridSpan> out;
  for (const auto& s : g) {
    if (!s.is_array() || s.size() != 3) fail(where + ": each grid span must be [first, rows, cols]");
    out.push_back({s[0].get<std::int64_t>(), s[1].get<std::int64_t>(), s[2].get<std::int64_t>()});
  }
  return out;
}

// Meta without "grid" (the committed fixture): each image range [a, b) is a
// CLS token then (image_size / patch_size)^2 patches in raster order.
void derive_grid(Entry* e) {
  const json& m = e->meta;
  if (!m.contains("image_token_ranges") || !m.contains("patch_size") || !m.contains("image_size"))
    fail(e->dir + "/meta.json: no \"grid\", and no image_token_ranges / image_size / patch_size to derive it from");
  const std::int64_t side = m["image_size"].get<std::int64_t>() / m["patch_size"].get<std::int64_t>();
  for (const auto& r : m["image_token_ranges"]) {
    const std::int64_t a = r[0].get<std::int64_t>(), b = r[1].get<std::int64_t>();
    if (b - a != 1 + side * side)
      fail(e->dir + "/meta.json: image range [" + std::to_string(a) + ", " + std::to_string(b) +
           ") is not a CLS token plus " + std::to_string(side) + " x " + std::to_string(side) + " patches");
    e->cls.push_back(a);
    e->grids.push_back({a + 1, side, side});
  }
}

Entry load_entry(const std::string& name, const std::string& dir, const json& index_entry, bool load_arrays) {
  Entry e;
  e.name = name;
  e.dir = dir;
  std::ifstream in(fs::path(dir) / "meta.json");
  if (!in) fail(dir + "/meta.json: cannot open");
  try {
    e.meta = json::parse(in);
  } catch (const std::exception& x) {
    fail(dir + "/meta.json: not JSON (" + x.what() + ")");
  }
  const json& m = e.meta;
  const std::string where = dir + "/meta.json";
  e.split = m.value("split", index_entry.is_object() ? index_entry.value("split", std::string("none")) : "none");
  if (m.contains("grid")) {
    e.grids = parse_grid(m["grid"], where);
    if (!m.contains("cls_tokens")) fail(where + ": has \"grid\" but no \"cls_tokens\"");
    e.cls = m["cls_tokens"].get<std::vector<std::int64_t>>();
  } else {
    derive_grid(&e);
  }
  e.image_size = m.value("image_size", std::int64_t{0});
  e.images =
      m.contains("images") ? static_cast<std::int64_t>(m["images"].size()) : static_cast<std::int64_t>(e.grids.size());
  // The index must tell the same story as the meta.
  if (!index_entry.is_null()) {
    if (index_entry.contains("split") && index_entry["split"] != e.split)
      fail(name + ": index.json says split " + index_entry["split"].dump() + ", meta.json says \"" + e.split + "\"");
    if (index_entry.contains("grid")) {
      const auto g = parse_grid(index_entry["grid"], "index.json " + name);
      bool same = g.size() == e.grids.size();
      for (std::size_t i = 0; same && i < g.size(); ++i)
        same = g[i].first == e.grids[i].first && g[i].rows == e.grids[i].rows && g[i].cols == e.grids[i].cols;
      if (!same) fail(name + ": index.json's grid " + index_entry["grid"].dump() + " differs from meta.json's");
    }
    if (index_entry.contains("cls_tokens") && index_entry["cls_tokens"].get<std::vector<std::int64_t>>() != e.cls)
      fail(name + ": index.json's cls_tokens differ from meta.json's");
    if (index_entry.contains("image_size") && index_entry["image_size"].get<std::int64_t>() != e.image_size)
      fail(name + ": index.json's image_size differs from meta.json's");
  }
  if (m.value("causal", false)) fail(where + ": causal is true; grid_eval evaluates non-causal ViT caches");
  if (!load_arrays) return e;

  std::vector<std::int64_t> ks, vs, qs;
  e.k = load_floats(dir + "/k.npy", &ks);
  e.v = load_floats(dir + "/v.npy", &vs);
  e.q = load_floats(dir + "/q.npy", &qs);
  if (ks != vs || qs[0] != ks[0] || qs[2] != ks[2] || qs[3] != ks[3])
    fail(dir + ": k " + shape_text(ks) + ", v " + shape_text(vs) + ", q " + shape_text(qs) + " disagree");
  if (m.contains("shapes"))
    for (const auto& [key, s] :
         std::vector<std::pair<std::string, std::vector<std::int64_t>*>>{{"k", &ks}, {"v", &vs}, {"q", &qs}})
      if (m["shapes"].contains(key) && m["shapes"][key].get<std::vector<std::int64_t>>() != *s)
        fail(where + ": shapes." + key + " " + m["shapes"][key].dump() + " but " + key + ".npy is " + shape_text(*s));
  e.layers = ks[0];
  e.heads = ks[1];
  e.q_heads = qs[1];
  e.tokens = ks[2];
  e.head_dim = ks[3];
  if (e.q_heads % e.heads != 0) fail(dir + ": query heads are not a multiple of KV heads");
  const auto check_count = [&](const char* key, std::int64_t have) {
    if (m.contains(key) && m[key].get<std::int64_t>() != have)
      fail(where + ": " + key + " " + m[key].dump() + " but the arrays have " + std::to_string(have));
  };
  check_count("num_tokens", e.tokens);
  check_count("num_kv_heads", e.heads);
  check_count("num_q_heads", e.q_heads);
  check_count("head_dim", e.head_dim);
  if (!index_entry.is_null() && index_entry.contains("tokens") && index_entry["tokens"].get<std::int64_t>() != e.tokens)
    fail(name + ": index.json says " + index_entry["tokens"].dump() + " tokens, the arrays have " +
         std::to_string(e.tokens));
  e.model_layers = m.value("layers", std::vector<int>{});
  if (!e.model_layers.empty() && static_cast<std::int64_t>(e.model_layers.size()) != e.layers)
    fail(where + ": lists " + std::to_string(e.model_layers.size()) + " layers, the arrays have " +
         std::to_string(e.layers));
  e.scale = m.value("softmax_scale", 1.0 / std::sqrt(static_cast<double>(e.head_dim)));

  // Spans inside the sequence, not overlapping; CLS tokens inside it and outside every span.
  if (e.grids.empty()) fail(where + ": no image spans");
  if (auto s = fc::check_grid_spans(e.grids); !s.ok()) fail(where + ": " + s.message());
  if (auto s = fc::check_grids_fit(e.grids, e.tokens); !s.ok()) fail(where + ": " + s.message());
  if (e.images != static_cast<std::int64_t>(e.grids.size()))
    fail(where + ": " + std::to_string(e.images) + " images but " + std::to_string(e.grids.size()) + " grid spans");
  std::set<std::int64_t> seen;
  for (std::int64_t c : e.cls) {
    if (c < 0 || c >= e.tokens) fail(where + ": CLS token " + std::to_string(c) + " outside the sequence");
    for (const auto& g : e.grids)
      if (c >= g.first && c < g.end()) fail(where + ": CLS token " + std::to_string(c) + " lies inside a grid span");
    if (!seen.insert(c).second) fail(where + ": CLS token " + std::to_string(c) + " listed twice");
  }
  return e;
}

struct EntryRef {
  std::string name, dir;
  json index;  // the index's entry, or null
};

std::vector<EntryRef> list_entries(const std::string& caches) {
  if (!fs::is_directory(caches))
    fail(caches + ": no such folder (make the caches with tools/extract/make_grid_caches.py)");
  std::vector<EntryRef> out;
  const fs::path index = fs::path(caches) / "index.json";
  if (fs::exists(index)) {
    std::ifstream in(index);
    json doc;
    try {
      doc = json::parse(in);
    } catch (const std::exception& x) {
      fail(index.string() + ": not JSON (" + x.what() + ")");
    }
    if (!doc.contains("entries") || !doc["entries"].is_array()) fail(index.string() + ": no \"entries\" list");
    for (const auto& e : doc["entries"]) {
      if (!e.contains("name")) fail(index.string() + ": an entry without \"name\"");
      const std::string name = e["name"].get<std::string>();
      out.push_back({name, (fs::path(caches) / e.value("dir", name)).string(), e});
    }
  } else {
    for (const auto& d : fs::directory_iterator(caches))
      if (d.is_directory() && fs::exists(d.path() / "meta.json"))
        out.push_back({d.path().filename().string(), d.path().string(), nullptr});
    std::sort(out.begin(), out.end(), [](const EntryRef& a, const EntryRef& b) { return a.name < b.name; });
  }
  if (out.empty()) fail(caches + ": no cache entries");
  return out;
}

// --------------------------------------------------------- attention error

// One layer's exact attention, kept for every row: per query head the
// softmax numerators E(i, j) = exp(s_ij - max_j s_ij) of all N x N logits
// (s = q . k * scale, in double), and the full outputs. A kept set's output
// is then E(:, kept) V(kept) / rowsum(E(:, kept)): one gather and one GEMM
// (a ones column of V gives the row sums).
class LayerAttention {
 public:
  LayerAttention(const Entry& e, std::int64_t l) : n_(e.tokens), d_(e.head_dim), group_(e.q_heads / e.heads) {
    const auto to_mat = [&](const float* x) {
      Mat m(n_, d_);
      for (std::int64_t t = 0; t < n_; ++t)
        for (std::int64_t c = 0; c < d_; ++c) m(t, c) = x[t * d_ + c];
      return m;
    };
    const float* q = e.layer(e.q, e.q_heads, l);
    const float* k = e.layer(e.k, e.heads, l);
    const float* v = e.layer(e.v, e.heads, l);
    scale_ = e.scale;
    for (std::int64_t h = 0; h < e.heads; ++h) {
      k_.push_back(to_mat(k + h * n_ * d_));
      Mat v1(n_, d_ + 1);
      v1.leftCols(d_) = to_mat(v + h * n_ * d_);
      v1.col(d_).setOnes();
      v1_.push_back(std::move(v1));
    }
    for (std::int64_t qh = 0; qh < e.q_heads; ++qh) {
      q_.push_back(to_mat(q + qh * n_ * d_));
      const std::int64_t h = qh / group_;
      Mat s = (q_.back() * k_[static_cast<std::size_t>(h)].transpose()) * scale_;
      const Eigen::VectorXd top = s.rowwise().maxCoeff();
      s.colwise() -= top;
      Mat numer = s.array().exp().matrix();
      Mat r = numer * v1_[static_cast<std::size_t>(h)];
      Mat o = r.leftCols(d_).array().colwise() / r.col(d_).array();
      ref_sq_ += o.squaredNorm();
      numer_.push_back(std::move(numer));
      out_.push_back(std::move(o));
    }
  }

  // Relative error of the outputs with head h keeping kept[h * budget ...].
  double relative_error(const std::vector<std::int32_t>& kept, std::int64_t budget) {
    double diff_sq = 0;
    for (std::size_t qh = 0; qh < numer_.size(); ++qh) {
      const std::int64_t h = static_cast<std::int64_t>(qh) / group_;
      const Mat& o = out_[qh];
      if (budget == 0) {  // nothing to attend to: a zero output
        diff_sq += o.squaredNorm();
        continue;
      }
      const std::int32_t* idx = kept.data() + h * budget;
      ek_.resize(n_, budget);
      vk_.resize(budget, d_ + 1);
      for (std::int64_t a = 0; a < budget; ++a) {
        ek_.col(a) = numer_[qh].col(idx[a]);
        vk_.row(a) = v1_[static_cast<std::size_t>(h)].row(idx[a]);
      }
      r_.noalias() = ek_ * vk_;
      for (std::int64_t i = 0; i < n_; ++i) {
        const double denom = r_(i, d_);
        if (denom > 1e-250) {
          for (std::int64_t c = 0; c < d_; ++c) {
            const double x = r_(i, c) / denom - o(i, c);
            diff_sq += x * x;
          }
        } else {  // every kept key far below the row's best: recompute from the logits
          diff_sq += direct_row_error(qh, h, i, idx, budget);
        }
      }
    }
    return ref_sq_ > 0 ? std::sqrt(diff_sq / ref_sq_) : 0.0;
  }

 private:
  double direct_row_error(std::size_t qh, std::int64_t h, std::int64_t i, const std::int32_t* idx,
                          std::int64_t budget) const {
    std::vector<double> logit(static_cast<std::size_t>(budget));
    double top = -INFINITY;
    for (std::int64_t a = 0; a < budget; ++a) {
      logit[static_cast<std::size_t>(a)] = q_[qh].row(i).dot(k_[static_cast<std::size_t>(h)].row(idx[a])) * scale_;
      top = std::max(top, logit[static_cast<std::size_t>(a)]);
    }
    double sum = 0;
    for (double& x : logit) sum += (x = std::exp(x - top));
    Eigen::RowVectorXd acc = Eigen::RowVectorXd::Zero(d_);
    for (std::int64_t a = 0; a < budget; ++a)
      acc += (logit[static_cast<std::size_t>(a)] / sum) * v1_[static_cast<std::size_t>(h)].row(idx[a]).head(d_);
    return (acc - out_[qh].row(i)).squaredNorm();
  }

  std::int64_t n_, d_, group_;
  double scale_ = 0, ref_sq_ = 0;
  std::vector<Mat> q_, k_, v1_, numer_, out_;
  Mat ek_, vk_, r_;
};

// ----------------------------------------------------------------- variants

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

const std::vector<std::string>& row_labels() {
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

Variant make_variant(const std::string& label, fc::GridZone zone, double share) {
  Variant v;
  v.base = label.size() > 5 && label.compare(label.size() - 5, 5, "+base") == 0;
  v.family = v.base ? label.substr(0, label.size() - 5) : label;
  if (v.family == "defaults" || v.family == "defaults-grid") {
    if (v.base) fail("row " + label + ": the defaults rows take no +base");
    v.defaults = true;
    v.grid2d = v.family == "defaults-grid";
    v.transform = fc::Options{}.transform;
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

fc::Options variant_options(const Variant& v, const Entry& e) {
  if (v.defaults) {  // what `flashcache compress --keep-ratio r [--grid ...]` selects, layer by layer
    fc::Options o;
    if (v.grid2d) o.grids = e.grids;
    return o;
  }
  fc::Options o = fc::Options::paper();
  o.gamma = kGamma;
  o.sink = 0;
  o.window = 0;
  o.window_share = 0.0;
  o.allocation = fc::Allocation::uniform;
  o.transform = v.transform;
  o.block_size = kBlock;
  o.grid_tile = kTile;
  if (v.grid2d) {
    o.grids = e.grids;
    o.grid_zone = v.zone;
    o.grid_base_share = v.share;
  } else if (v.policy == fp::Policy::flashcache) {
    o.base_share = v.share;
  }
  return o;
}

json variant_json(const Variant& v, const fc::Options& o, const fp::PolicyOptions& po, int seeds) {
  json j;
  j["policy"] = fp::to_string(v.policy);
  if (v.defaults) {
    j["options"] = "flashcache::Options{} (the library's defaults)";
    j["grids"] = v.grid2d ? "the entry's spans" : "none";
    j["base"] = fc::to_string(o.base);
    j["transform"] = fc::to_string(o.transform);
    j["sink"] = o.sink;
    j["window_share"] = o.window_share;
    j["grid_base_share"] = o.grid_base_share;
  } else if (v.policy == fp::Policy::flashcache) {
    j["scores"] = v.grid2d ? "2d" : "1d";
    j["transform"] = fc::to_string(v.transform);
    if (!v.grid2d && v.transform == fc::Transform::blocked) j["block_size"] = o.block_size;
    j["gamma"] = o.gamma;
    if (v.grid2d) {
      j["grids"] = "the entry's spans";
      j["grid_zone"] = fc::to_string(o.grid_zone);
      if (v.transform == fc::Transform::blocked) j["grid_tile"] = o.grid_tile;
      j["grid_base_share"] = o.grid_base_share;
    } else {
      j["base_share"] = o.base_share;
    }
    j["normalize_terms"] = o.normalize_terms;
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

// Per variant, entry and keep ratio: the per-layer errors (random: the mean over
// seeds) and, for random, the spread of the layer means over seeds.
struct Result {
  std::vector<double> layer;
  double seed_std = -1;
  std::int64_t budget = 0;
  double error() const { return mean_of(layer); }
};
using Results = std::map<std::string, std::map<std::string, std::map<double, Result>>>;  // key, entry, keep

void evaluate_entry(const Entry& e, const std::vector<Variant>& variants, const std::vector<double>& ratios, int seeds,
                    bool verify, Results* results) {
  std::vector<std::uint8_t> protect(static_cast<std::size_t>(e.tokens), 0);
  for (std::int64_t c : e.cls) protect[static_cast<std::size_t>(c)] = 1;
  const fc::ProtectMask mask(protect);
  fp::PolicyOptions po;  // observation window 32, pool 7
  fc::SelectWorkspace ws;
  std::vector<std::int32_t> kept;
  // per variant key, ratio: [layer][seed] errors
  std::map<std::string, std::map<double, std::vector<std::vector<double>>>> raw;
  for (std::int64_t l = 0; l < e.layers; ++l) {
    LayerAttention att(e, l);
    const std::int64_t n = e.tokens, d = e.head_dim;
    const fc::KVView<const float> kv(e.layer(e.k, e.heads, l), e.heads, n, d, n * d, d);
    const fc::KVView<const float> vv(e.layer(e.v, e.heads, l), e.heads, n, d, n * d, d);
    const fc::KVView<const float> qv(e.layer(e.q, e.q_heads, l), e.q_heads, n, d, n * d, d);
    std::map<std::string, std::vector<fc::LayerScores>> scored;  // score key -> per seed
    fq::AttentionSetup setup{e.q_heads, e.heads, n, d, n, 0, n, false, e.scale};
    for (const Variant& v : variants) {
      const fc::Options opt = variant_options(v, e);
      const int runs = v.policy == fp::Policy::random ? seeds : 1;
      auto& scores = scored[v.score_key()];
      if (scores.empty())
        for (int s = 0; s < runs; ++s) {
          po.seed = static_cast<std::uint64_t>(s);
          fc::LayerScores ls;
          fc::throw_if_error(fp::score_with_policy<float>(v.policy, qv, kv, vv, opt, po, &ls));
          scores.push_back(std::move(ls));
        }
      for (double ratio : ratios) {
        const std::int64_t budget = std::llround(ratio * static_cast<double>(n));
        auto& slot = raw[v.key()][ratio];
        slot.emplace_back();
        for (const fc::LayerScores& ls : scores) {
          kept.assign(static_cast<std::size_t>(e.heads * budget), 0);
          fc::throw_if_error(fc::select_tokens(ls.view(), budget, opt, mask, &ws, fc::KeptView{kept.data(), budget}));
          const double err = att.relative_error(kept, budget);
          if (verify && l == 0) {
            const fq::ErrorSums ref = fq::attention_error(e.layer(e.q, e.q_heads, l), e.layer(e.k, e.heads, l),
                                                          e.layer(e.v, e.heads, l), setup, kept.data(), budget);
            if (std::abs(ref.relative() - err) > 1e-9 * std::max(1.0, ref.relative()))
              fail("--verify: " + e.name + " " + v.key() + " keep " + share_text(ratio) + ": GEMM error " +
                   std::to_string(err) + " vs attention_error.hpp " + std::to_string(ref.relative()));
          }
          slot.back().push_back(err);
        }
        (*results)[v.key()][e.name][ratio].budget = budget;
      }
    }
  }
  for (auto& [key, by_ratio] : raw)
    for (auto& [ratio, per_layer] : by_ratio) {
      Result& r = (*results)[key][e.name][ratio];
      const std::size_t runs = per_layer.front().size();
      r.layer.clear();
      for (const auto& seedwise : per_layer) r.layer.push_back(mean_of(seedwise));
      if (runs > 1) {
        std::vector<double> per_seed(runs, 0.0);
        for (const auto& seedwise : per_layer)
          for (std::size_t s = 0; s < runs; ++s) per_seed[s] += seedwise[s] / static_cast<double>(per_layer.size());
        const double m = mean_of(per_seed);
        double var = 0;
        for (double x : per_seed) var += (x - m) * (x - m);
        r.seed_std = std::sqrt(var / static_cast<double>(runs - 1));
      }
    }
}

// ------------------------------------------------------------------ output

json make_record(const Variant& v, const Entry& e, double ratio, const Result& r, int seeds) {
  const fc::Options o = variant_options(v, e);
  json j;
  j["label"] = v.label();
  j["split"] = e.split;
  j["entry"] = e.name;
  j["image_size"] = e.image_size;
  j["images"] = e.images;
  j["group"] = e.group();
  j["tokens"] = e.tokens;
  j["keep_ratio"] = ratio;
  j["kept_per_head"] = r.budget;
  j["error"] = r.error();
  j["layer_errors"] = r.layer;
  j["layers"] = e.model_layers;
  if (r.seed_std >= 0) j["error_std_over_seeds"] = r.seed_std;
  j["options"] = variant_json(v, o, fp::PolicyOptions{}, v.policy == fp::Policy::random ? seeds : 1);
  return j;
}

// Mean and median over entries of each (split, group, label, keep).
json summarize(const json& records) {
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

void print_table(const json& summary, const std::string& split, const std::vector<std::string>& labels,
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

fc::GridZone parse_zone(const std::string& z) {
  if (z == "rectangle") return fc::GridZone::rectangle;
  if (z == "triangle") return fc::GridZone::triangle;
  fail("--zone must be rectangle or triangle, got '" + z + "'");
}

}  // namespace

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
    for (const auto& r : split_list(ratios_text)) {
      ratios.push_back(std::stod(r));
      if (!(ratios.back() > 0 && ratios.back() <= 1)) fail("keep ratios must lie in (0, 1]");
    }

    // The existing results file: other splits are kept, the dev choice is read.
    json doc = json::object();
    if (std::ifstream old(out); old) {
      try {
        doc = json::parse(old);
      } catch (const std::exception&) {
        doc = json::object();
      }
      if (!doc.is_object()) doc = json::object();
    }
    std::string choice_source = "command line";
    if (split == "heldout") {
      const bool has_choice = doc.contains("choice");
      if (has_choice) {
        const std::string cz = doc["choice"]["zone"].get<std::string>();
        const double cs = doc["choice"]["base_share"].get<double>();
        if (!zone_text.empty() && zone_text != cz)
          fail("--zone " + zone_text + " differs from the dev choice " + cz + " in " + out);
        if (base_share >= 0 && std::abs(base_share - cs) > 1e-12)
          fail("--base-share " + share_text(base_share) + " differs from the dev choice " + share_text(cs) + " in " +
               out);
        zone_text = cz;
        base_share = cs;
        choice_source = "dev choice in the results file";
      } else if (zone_text.empty() || base_share < 0) {
        fail("held-out runs take the zone and base share chosen on dev: run --split dev --sweep into " + out +
             " first (or give --zone and --base-share)");
      }
    }
    if (!sweep && (zone_text.empty() || base_share < 0)) fail("give --zone and --base-share, or --sweep (dev)");

    std::vector<std::string> labels;
    for (const auto& l : row_labels())
      if (rows_text.empty() || ("," + rows_text + ",").find("," + l + ",") != std::string::npos) labels.push_back(l);
    for (const auto& r : split_list(rows_text))
      if (std::find(labels.begin(), labels.end(), r) == labels.end()) fail("--rows: unknown row '" + r + "'");
    if (labels.empty()) fail("--rows matches no row");

    // The variants to evaluate: the rows, or with --sweep every zone x share of the flashcache families.
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

    // Entries of the split.
    const auto refs = list_entries(caches);
    std::vector<std::string> wanted = split_list(entries_text);
    for (const auto& w : wanted)
      if (std::none_of(refs.begin(), refs.end(), [&](const EntryRef& r) { return r.name == w; }))
        fail("--entries: no entry '" + w + "' in " + caches);
    std::vector<EntryRef> chosen;
    for (const auto& r : refs) {
      if (!wanted.empty() && std::find(wanted.begin(), wanted.end(), r.name) == wanted.end()) continue;
      const Entry meta_only = load_entry(r.name, r.dir, r.index, false);
      if (split == "all" || meta_only.split == split) chosen.push_back(r);
    }
    if (chosen.empty()) fail("no entry of split '" + split + "' in " + caches);

    std::fprintf(stderr, "grid_eval: %zu %s entries, %zu variants, keep ratios %s\n", chosen.size(), split.c_str(),
                 variants.size(), ratios_text.c_str());
    Results results;
    std::vector<Entry> entries;  // metadata of the evaluated entries (arrays dropped)
    for (std::size_t i = 0; i < chosen.size(); ++i) {
      const auto te = std::chrono::steady_clock::now();
      Entry e = load_entry(chosen[i].name, chosen[i].dir, chosen[i].index, true);
      evaluate_entry(e, variants, ratios, seeds, verify, &results);
      e.k.clear();
      e.v.clear();
      e.q.clear();
      e.k.shrink_to_fit();
      e.v.shrink_to_fit();
      e.q.shrink_to_fit();
      std::fprintf(stderr, "  [%zu/%zu] %-64s %5lld tokens %zu spans  %6.1f s\n", i + 1, chosen.size(), e.name.c_str(),
                   static_cast<long long>(e.tokens), e.grids.size(),
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - te).count());
      entries.push_back(std::move(e));
    }

    // The dev choice: the (zone, share) with the lowest mean error over the 2D rows, entries and keep ratios.
    json sweep_doc;
    if (sweep) {
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
              for (double r : ratios) mine.push_back(results[v.key()][e.name][r].error());
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
            for (double r : ratios) mine.push_back(results[v.key()][e.name][r].error());
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
            errs.push_back(results[v.key()][e.name][r].error());
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
      sweep_doc["metric"] = metric;
      sweep_doc["zones"] = {"rectangle", "triangle"};
      sweep_doc["shares"] = kSweepShares;
      sweep_doc["gamma"] = kGamma;
      sweep_doc["table"] = table;
      sweep_doc["table_1d"] = table_1d;
      sweep_doc["per_keep"] = per_keep;
      zone_text = fc::to_string(best_zone);
      base_share = best_share;
      json choice;
      choice["zone"] = zone_text;
      choice["base_share"] = base_share;
      choice["metric"] = metric;
      choice["value"] = best;
      choice["made_on"] = "dev";
      choice["date"] = utc_now();
      choice["entries"] = json::array();
      for (const auto& e : entries) choice["entries"].push_back(e.name);
      sweep_doc["choice"] = choice;
      std::printf("\ndev sweep (%s)\n  %-10s", metric.c_str(), "zone");
      for (double s : kSweepShares) std::printf("  share %-5g", s);
      std::printf("\n");
      for (fc::GridZone z : kSweepZones) {
        std::printf("  %-10s", fc::to_string(z));
        for (const auto& t : table)
          if (t["zone"] == fc::to_string(z)) std::printf("  %11.4f", t["value"].get<double>());
        std::printf("\n");
      }
      std::printf("choice: zone %s, base share %g (value %.4f)\n", zone_text.c_str(), base_share, best);
    }

    // The rows' records, with the zone and share chosen (or given).
    const fc::GridZone zone = parse_zone(zone_text);
    json records = json::array();
    std::set<std::string> splits_run;
    for (const auto& l : labels) {
      const Variant v = make_variant(l, zone, base_share);
      for (const auto& e : entries) {
        splits_run.insert(e.split);
        for (double r : ratios) {
          auto it = results.find(v.key());
          if (it == results.end()) fail("internal: no result for " + v.key());
          records.push_back(make_record(v, e, r, it->second.at(e.name).at(r), seeds));
        }
      }
    }

    std::string command;
    for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
    json header;
    header["date"] = utc_now();
    header["command"] = command;
    header["git_revision"] = run_text("git -C '" + src + "' rev-parse HEAD 2>/dev/null");
    header["git_dirty"] = !run_text("git -C '" + src + "' status --porcelain --untracked-files=no 2>/dev/null").empty();
    header["library"] = FLASHCACHE_VERSION_STRING;
    header["caches"] = fs::relative(fs::absolute(caches), src).string();
    header["zone"] = zone_text;
    header["base_share"] = base_share;
    header["choice_source"] = sweep ? "this run's dev sweep" : choice_source;
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
        "flashcache-2d-*: Options::grids = the entry's spans, 2D DCT low-pass over each patch grid (global, or "
        "8 x 8 tiles), gamma 0.2; +base: grid_base_share (2D) or base_share (1D) = base_share above; random seeds "
        "0..S-1 averaged; snapkv observation window 32, pool 7";
    header["entries"] = json::array();
    for (const auto& e : entries)
      header["entries"].push_back({{"name", e.name},
                                   {"split", e.split},
                                   {"group", e.group()},
                                   {"image_size", e.image_size},
                                   {"images", e.meta.value("images", json::array())},
                                   {"tokens", e.tokens},
                                   {"grid", e.grid_json()},
                                   {"cls_tokens", e.cls},
                                   {"shape_k", {e.layers, e.heads, e.tokens, e.head_dim}}});
    header["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    // Merge: records of the other splits stay; a new dev sweep replaces the old one, and held-out records
    // measured under a different choice go (the held-out run must follow the dev choice).
    json merged = json::array();
    const bool choice_changed =
        sweep && doc.contains("choice") &&
        (doc["choice"].value("zone", "") != zone_text || doc["choice"].value("base_share", -1.0) != base_share);
    if (doc.contains("records"))
      for (const auto& r : doc["records"]) {
        const std::string s = r.value("split", "");
        if (splits_run.count(s)) continue;
        if (choice_changed && s == "heldout") continue;
        merged.push_back(r);
      }
    if (choice_changed) std::fprintf(stderr, "grid_eval: the dev choice changed; dropped old held-out records\n");
    for (auto& r : records) merged.push_back(r);
    json headers = doc.contains("header") && doc["header"].is_object() ? doc["header"] : json::object();
    if (choice_changed) headers.erase("heldout");
    headers[split] = header;
    json result;
    result["about"] =
        "Image spans as 2D grids (issue #11) on ViT caches: bench/quality/grid_eval.cpp, run by "
        "bench/quality/run_grid.sh; described in bench/quality/README.md; report: tools/report/quality_grid.py";
    result["header"] = headers;
    if (sweep) {
      result["choice"] = sweep_doc["choice"];
      result["dev_sweep"] = sweep_doc;
    } else {
      if (doc.contains("choice")) result["choice"] = doc["choice"];
      if (doc.contains("dev_sweep")) result["dev_sweep"] = doc["dev_sweep"];
    }
    result["summary"] = summarize(merged);
    result["records"] = merged;
    if (!fs::path(out).parent_path().empty()) fs::create_directories(fs::path(out).parent_path());
    std::ofstream o(out);
    o << result.dump(1) << "\n";
    if (!o) fail("cannot write " + out);

    std::printf("\nrows at zone %s, base share %g\n", zone_text.c_str(), base_share);
    for (const auto& s : splits_run) print_table(result["summary"], s, labels, ratios);
    std::printf("\nwrote %zu records to %s (%.1f s)\n", records.size(), out.c_str(), header["seconds"].get<double>());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "grid_eval: %s\n", e.what());
    return 1;
  }
  return 0;
}
