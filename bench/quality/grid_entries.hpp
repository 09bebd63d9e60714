#pragma once
// grid_eval's cache entries: the folders of --caches (index.json, or one folder
// per entry), each a cache of cache_io.hpp plus its image spans (meta.json's
// "grid" and "cls_tokens", or derived from its image ranges), checked against
// the index and the arrays.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "cache_io.hpp"
#include "eval_util.hpp"
#include "flashcache/flashcache.hpp"

namespace flashcache::quality::grid {

namespace fs = std::filesystem;
namespace fc = flashcache;
using json = nlohmann::ordered_json;

[[noreturn]] inline void fail(const std::string& m) { throw std::runtime_error(m); }

struct Entry {
  std::string name, dir, split;
  json meta;
  std::int64_t image_size = 0, images = 0;
  std::vector<fc::GridSpan> grids;
  std::vector<std::int64_t> cls;
  Cache cache;  // the arrays (dropped after the evaluation; the sizes stay)

  std::string group() const { return images > 1 ? "multi-image" : std::to_string(image_size); }
  json grid_json() const {
    json g = json::array();
    for (const auto& s : grids) g.push_back({s.first, s.rows, s.cols});
    return g;
  }
};

inline std::vector<fc::GridSpan> parse_grid(const json& g, const std::string& where) {
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
inline void derive_grid(Entry* e) {
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

// The index must tell the same story as the meta.
inline void check_index(const Entry& e, const json& index_entry) {
  if (index_entry.is_null()) return;
  const std::string& name = e.name;
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

// Spans inside the sequence, not overlapping; CLS tokens inside it and outside every span.
inline void check_spans(const Entry& e) {
  const std::string where = e.dir + "/meta.json";
  if (e.grids.empty()) fail(where + ": no image spans");
  if (auto s = fc::check_grid_spans(e.grids); !s.ok()) fail(where + ": " + s.message());
  if (auto s = fc::check_grids_fit(e.grids, e.cache.tokens); !s.ok()) fail(where + ": " + s.message());
  if (e.images != static_cast<std::int64_t>(e.grids.size()))
    fail(where + ": " + std::to_string(e.images) + " images but " + std::to_string(e.grids.size()) + " grid spans");
  std::set<std::int64_t> seen;
  for (std::int64_t c : e.cls) {
    if (c < 0 || c >= e.cache.tokens) fail(where + ": CLS token " + std::to_string(c) + " outside the sequence");
    for (const auto& g : e.grids)
      if (c >= g.first && c < g.end()) fail(where + ": CLS token " + std::to_string(c) + " lies inside a grid span");
    if (!seen.insert(c).second) fail(where + ": CLS token " + std::to_string(c) + " listed twice");
  }
}

// One entry: its meta.json and spans, checked against the index; with load_arrays
// also its arrays (cache_io.hpp), checked against both.
inline Entry load_entry(const std::string& name, const std::string& dir, const json& index_entry, bool load_arrays) {
  Entry e;
  e.name = name;
  e.dir = dir;
  e.meta = read_cache_meta(dir);
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
  check_index(e, index_entry);
  if (m.value("causal", false)) fail(where + ": causal is true; grid_eval evaluates non-causal ViT caches");
  if (!load_arrays) return e;

  e.cache = read_cache_with_meta(dir, e.meta);
  if (!index_entry.is_null() && index_entry.contains("tokens") &&
      index_entry["tokens"].get<std::int64_t>() != e.cache.tokens)
    fail(name + ": index.json says " + index_entry["tokens"].dump() + " tokens, the arrays have " +
         std::to_string(e.cache.tokens));
  check_spans(e);
  return e;
}

struct EntryRef {
  std::string name, dir;
  json index;  // the index's entry, or null
};

inline std::vector<EntryRef> list_entries(const std::string& caches) {
  if (!fs::is_directory(caches))
    fail(caches + ": no such folder (make the caches with tools/extract/make_grid_caches.py)");
  std::vector<EntryRef> out;
  const fs::path index = fs::path(caches) / "index.json";
  if (fs::exists(index)) {
    const json doc = read_json_file(index.string());
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

// The entries of --caches in --entries (all when empty) and of the split ("all": every split).
inline std::vector<EntryRef> choose_entries(const std::string& caches, const std::string& entries_text,
                                            const std::string& split) {
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
  return chosen;
}

}  // namespace flashcache::quality::grid
