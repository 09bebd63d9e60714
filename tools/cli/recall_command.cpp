// `flashcache recall`: a question asked after compression brings back, per
// layer and KV head, the evicted tokens its queries attend to most
// (flashcache/recall.hpp), from the full keys and what `compress` kept.
//
// Each (layer, KV head) keeps its own tokens, so each has its own evicted set:
// an Archive of one layer and one KV head holds that set in position order,
// in blocks of --block consecutive evicted tokens, and the head's query group
// scores it over the kept, evicted and question keys (exact, causal). The best
// whole blocks within --recall tokens come back.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_error.hpp"
#include "commands.hpp"
#include "flashcache/archive.hpp"
#include "flashcache/recall.hpp"
#include "npy/npy.hpp"
#include "output_dir.hpp"

namespace flashcache::cli {

namespace {

npy::Array read_float(const std::string& path, std::size_t dims, const char* what) {
  npy::Array a = npy::read(path);
  if (!a.is<float>())
    throw CliError(kExitUsage, std::string(what) + " " + path + " is " + npy::dtype_name(a.dtype) +
                                   ": recall reads float32 arrays");
  if (a.shape.size() != dims)
    throw CliError(kExitUsage, std::string(what) + " " + path + " has shape " + npy::shape_string(a.shape) + ", not " +
                                   std::to_string(dims) + "-D");
  return a;
}

// Layer l's kept indices [H][B] from compress's folder, as int64, checked against N.
std::vector<std::int64_t> read_kept(const std::string& dir, std::int64_t l, std::int64_t heads, std::int64_t tokens,
                                    std::int64_t* budget) {
  const std::string path = dir + "/kept_" + std::to_string(l) + ".npy";
  const npy::Array a = npy::read(path);
  if (a.shape.size() != 2 || a.shape[0] != heads)
    throw CliError(kExitUsage, path + " has shape " + npy::shape_string(a.shape) + ", not [" + std::to_string(heads) +
                                   ", B] (compress's kept indices)");
  *budget = a.shape[1];
  std::vector<std::int64_t> out(static_cast<std::size_t>(a.size()));
  if (a.is<std::int32_t>()) {
    std::copy(a.data<std::int32_t>(), a.data<std::int32_t>() + a.size(), out.begin());
  } else if (a.is<std::int64_t>()) {
    std::copy(a.data<std::int64_t>(), a.data<std::int64_t>() + a.size(), out.begin());
  } else {
    throw CliError(kExitUsage, path + " is " + npy::dtype_name(a.dtype) + ", not int32 or int64");
  }
  for (std::int64_t h = 0; h < heads; ++h)
    for (std::int64_t i = 0; i < *budget; ++i) {
      const std::int64_t t = out[static_cast<std::size_t>(h * *budget + i)];
      if (t < 0 || t >= tokens || (i > 0 && t <= out[static_cast<std::size_t>(h * *budget + i - 1)]))
        throw CliError(kExitUsage, path + ": head " + std::to_string(h) + " index " + std::to_string(i) + " is " +
                                       std::to_string(t) + " (ascending, distinct, below " + std::to_string(tokens) +
                                       ")");
    }
  return out;
}

void check(const Status& s, std::int64_t l, std::int64_t h) {
  if (!s.ok()) throw Error(make_error(s.code(), "layer ", l, ", KV head ", h, ": ", s.message()));
}

}  // namespace

int run_recall(const RecallArgs& a) {
  if (a.recall < 0) throw CliError(kExitUsage, "--recall " + std::to_string(a.recall) + " is negative");
  if (a.block < 1) throw CliError(kExitUsage, "--block " + std::to_string(a.block) + " (at least 1)");
  StagedDir::check_target(a.out, a.force);
  const npy::Array k = read_float(a.k, 4, "--k");
  const npy::Array q = read_float(a.q, 4, "--q");
  const npy::Array qk = read_float(a.question_k, 4, "--question-k");
  const std::int64_t L = k.shape[0], H = k.shape[1], N = k.shape[2], d = k.shape[3];
  const std::int64_t Hq = q.shape[1], m = q.shape[2];
  if (q.shape[0] != L || q.shape[3] != d || Hq % H != 0 || m < 1)
    throw CliError(kExitUsage, "--q " + a.q + " has shape " + npy::shape_string(q.shape) + "; --k is " +
                                   npy::shape_string(k.shape) + " (want [L, Hq, m, d], Hq a multiple of H)");
  if (qk.shape != std::vector<std::int64_t>{L, H, m, d})
    throw CliError(kExitUsage, "--question-k " + a.question_k + " has shape " + npy::shape_string(qk.shape) +
                                   ", not [" + std::to_string(L) + ", " + std::to_string(H) + ", " + std::to_string(m) +
                                   ", " + std::to_string(d) + "]");
  const std::int64_t group = Hq / H;
  const float* keys = k.data<float>();
  const float* queries = q.data<float>();
  const float* question = qk.data<float>();

  std::vector<std::vector<std::int64_t>> recalled(static_cast<std::size_t>(L));
  std::vector<std::int64_t> counts;
  std::vector<float> resident, rows, scores;
  std::vector<std::int32_t> positions;
  std::vector<std::int64_t> chosen, order, evicted;
  Archive archive;
  RecallScorer scorer;
  for (std::int64_t l = 0; l < L; ++l) {
    std::int64_t budget = 0;
    const std::vector<std::int64_t> kept = read_kept(a.kept, l, H, N, &budget);
    std::vector<std::int64_t>& out = recalled[static_cast<std::size_t>(l)];
    out.assign(static_cast<std::size_t>(H * a.recall), -1);
    for (std::int64_t h = 0; h < H; ++h) {
      const float* head = keys + (l * H + h) * N * d;
      const std::int64_t* mine = kept.data() + h * budget;
      evicted.clear();
      for (std::int64_t t = 0, i = 0; t < N; ++t) {
        if (i < budget && mine[i] == t) {
          ++i;
          continue;
        }
        evicted.push_back(t);
      }
      resident.resize(static_cast<std::size_t>(budget * d));
      for (std::int64_t i = 0; i < budget; ++i)
        std::copy(head + mine[i] * d, head + (mine[i] + 1) * d, resident.data() + i * d);
      const auto e = static_cast<std::int64_t>(evicted.size());
      positions.resize(static_cast<std::size_t>(e));
      rows.resize(static_cast<std::size_t>(e * d));
      for (std::int64_t i = 0; i < e; ++i) {
        positions[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(evicted[static_cast<std::size_t>(i)]);
        std::copy(head + evicted[static_cast<std::size_t>(i)] * d,
                  head + (evicted[static_cast<std::size_t>(i)] + 1) * d, rows.data() + i * d);
      }
      check(archive.reset({1, 1, d, RowType::f32, RowType::f32}, {a.block, 0}), l, h);
      const void* row_table[] = {rows.data()};  // V is not read by a recall: the K rows stand in
      check(archive.append(positions.data(), e, row_table, d * 4, row_table, d * 4), l, h);
      check(scorer.reset(archive), l, h);
      const auto qv = hnd<const float>(queries + (l * Hq + h * group) * m * d, Heads(group), Tokens(m), HeadDim(d));
      const auto rv = hnd<const float>(resident.data(), Heads(1), Tokens(budget), HeadDim(d));
      const auto kv = hnd<const float>(question + (l * H + h) * m * d, Heads(1), Tokens(m), HeadDim(d));
      check(scorer.add_layer(0, qv, rv, kv), l, h);
      scores.resize(static_cast<std::size_t>(archive.blocks()));
      check(scorer.block_scores(scores.data(), archive.blocks()), l, h);
      check(select_recall(archive, scores.data(), a.recall, &chosen, &order), l, h);
      std::int64_t n = 0;
      for (const std::int64_t b : chosen)
        for (std::int64_t t = archive.block_first(b); t < archive.block_first(b) + archive.block_tokens(b); ++t)
          out[static_cast<std::size_t>(h * a.recall + n++)] = archive.positions()[t];
      counts.push_back(n);
    }
  }

  StagedDir dir(a.out, a.force);
  try {
    for (std::int64_t l = 0; l < L; ++l)
      npy::write((dir.path() / ("recalled_" + std::to_string(l) + ".npy")).string(), {H, a.recall},
                 recalled[static_cast<std::size_t>(l)].data());
    nlohmann::json j;
    j["recall"] = a.recall;
    j["block"] = a.block;
    j["shape"] = {{"layers", L}, {"heads", H}, {"tokens", N}, {"head_dim", d}, {"query_heads", Hq}, {"queries", m}};
    j["recalled"] = counts;  // per (layer, KV head), layer-major
    write_text_file(dir.path() / "summary.json", j.dump(2) + "\n");
  } catch (const Error& e) {
    throw CliError(kExitFailure, std::string(e.what()).substr(std::string("flashcache: ").size()));
  }
  dir.commit();
  std::int64_t total = 0;
  for (const std::int64_t c : counts) total += c;
  std::printf("wrote %s: %lld tokens recalled over %lld layers x %lld KV heads (at most %lld each)\n", a.out.c_str(),
              static_cast<long long>(total), static_cast<long long>(L), static_cast<long long>(H),
              static_cast<long long>(a.recall));
  return 0;
}

}  // namespace flashcache::cli
