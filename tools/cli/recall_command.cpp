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

void check(const Status& s, const char* what) {
  if (!s.ok()) throw Error(make_error(s.code(), what, ": ", s.message()));
}

// One (layer, KV head) at a time: its evicted tokens in an Archive of one layer
// and one KV head, in position order and blocks, scored by the head's query
// group over the kept, evicted and question keys. The buffers are reused.
class HeadScorer {
 public:
  HeadScorer(const npy::Array& k, const npy::Array& q, const npy::Array& qk)
      : keys_(k.data<float>()),
        queries_(q.data<float>()),
        question_(qk.data<float>()),
        H_(k.shape[1]),
        N_(k.shape[2]),
        d_(k.shape[3]),
        Hq_(q.shape[1]),
        m_(q.shape[2]) {}

  // Scores head h of layer l, whose kept tokens are `mine` [budget] (ascending):
  // archive() then holds its evicted tokens and scores() one score per block.
  void score(std::int64_t l, std::int64_t h, const std::int64_t* mine, std::int64_t budget, std::int64_t block,
             RecallScore kind) {
    const float* head = keys_ + (l * H_ + h) * N_ * d_;
    positions_.clear();
    for (std::int64_t t = 0, i = 0; t < N_; ++t) {
      if (i < budget && mine[i] == t) {
        ++i;
        continue;
      }
      positions_.push_back(static_cast<std::int32_t>(t));
    }
    resident_.resize(static_cast<std::size_t>(budget * d_));
    for (std::int64_t i = 0; i < budget; ++i)
      std::copy(head + mine[i] * d_, head + (mine[i] + 1) * d_, &resident_[i * d_]);
    const auto e = static_cast<std::int64_t>(positions_.size());
    rows_.resize(static_cast<std::size_t>(e * d_));
    for (std::int64_t i = 0; i < e; ++i)
      std::copy(head + positions_[i] * d_, head + (positions_[i] + 1) * d_, &rows_[i * d_]);
    check(archive_.reset({1, 1, d_, RowType::f32, RowType::f32}, {block, 0}), l, h);
    const void* row_table[] = {rows_.data()};  // V is not read by a recall: the K rows stand in
    check(archive_.append(positions_.data(), e, row_table, d_ * 4, row_table, d_ * 4), l, h);
    check(scorer_.reset(archive_, RecallScope::shared, kind), l, h);
    const std::int64_t group = Hq_ / H_;
    const auto qv = hnd<const float>(queries_ + (l * Hq_ + h * group) * m_ * d_, Heads(group), Tokens(m_), HeadDim(d_));
    const auto rv = hnd<const float>(resident_.data(), Heads(1), Tokens(budget), HeadDim(d_));
    const auto kv = hnd<const float>(question_ + (l * H_ + h) * m_ * d_, Heads(1), Tokens(m_), HeadDim(d_));
    check(scorer_.add_layer(0, qv, rv, kv), l, h);
    scores_.resize(static_cast<std::size_t>(archive_.blocks()));
    check(scorer_.block_scores(scores_.data(), archive_.blocks()), l, h);
  }

  const Archive& archive() const { return archive_; }
  const std::vector<float>& scores() const { return scores_; }

 private:
  const float *keys_, *queries_, *question_;
  std::int64_t H_, N_, d_, Hq_, m_;
  std::vector<std::int32_t> positions_;
  std::vector<float> resident_, rows_, scores_;
  Archive archive_;
  RecallScorer scorer_;
};

// The positions of the chosen blocks, ascending.
void chosen_positions(const Archive& archive, const std::vector<std::int64_t>& chosen, std::vector<std::int64_t>* out) {
  out->clear();
  for (const std::int64_t b : chosen)
    for (std::int64_t t = archive.block_first(b); t < archive.block_first(b) + archive.block_tokens(b); ++t)
      out->push_back(archive.positions()[t]);
}

}  // namespace

int run_recall(const RecallArgs& a) {
  if (a.recall < 0) throw CliError(kExitUsage, "--recall " + std::to_string(a.recall) + " is negative");
  if (a.block < 1) throw CliError(kExitUsage, "--block " + std::to_string(a.block) + " (at least 1)");
  const RecallScore kind = enum_flag<RecallScore>("--score", a.score);
  if (a.shared && kind == RecallScore::digest)
    throw CliError(kExitUsage,
                   "--score digest with --shared: a digest bounds one head's block, and --shared ranks "
                   "single tokens across heads; use --score exact");
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

  std::vector<std::vector<std::int64_t>> kept(static_cast<std::size_t>(L));
  std::vector<std::int64_t> budgets(static_cast<std::size_t>(L));
  for (std::int64_t l = 0; l < L; ++l) kept[l] = read_kept(a.kept, l, H, N, &budgets[l]);

  HeadScorer head(k, q, qk);
  std::vector<std::vector<std::int64_t>> recalled(
      static_cast<std::size_t>(L), std::vector<std::int64_t>(static_cast<std::size_t>(H * a.recall), -1));
  std::vector<std::int64_t> counts, chosen, order, picked;
  if (!a.shared) {
    for (std::int64_t l = 0; l < L; ++l)
      for (std::int64_t h = 0; h < H; ++h) {
        head.score(l, h, kept[l].data() + h * budgets[l], budgets[l], a.block, kind);
        check(select_recall(head.archive(), head.scores().data(), a.recall, &chosen, &order), l, h);
        chosen_positions(head.archive(), chosen, &picked);
        std::copy(picked.begin(), picked.end(), recalled[l].begin() + h * a.recall);
        counts.push_back(static_cast<std::int64_t>(picked.size()));
      }
  } else {
    // One ranking of positions: a position's score is the best any (layer, KV
    // head) that evicted it gives it; blocks of --block neighbouring evicted
    // positions; each head gets the chosen positions it evicted.
    std::vector<float> best(static_cast<std::size_t>(N), -1.0f);
    for (std::int64_t l = 0; l < L; ++l)
      for (std::int64_t h = 0; h < H; ++h) {
        head.score(l, h, kept[l].data() + h * budgets[l], budgets[l], 1, kind);
        for (std::int64_t t = 0; t < head.archive().tokens(); ++t) {
          float& b = best[static_cast<std::size_t>(head.archive().positions()[t])];
          b = std::max({b, 0.0f, head.scores()[static_cast<std::size_t>(t)]});
        }
      }
    std::vector<std::int32_t> positions;
    std::vector<float> token_scores;
    for (std::int64_t t = 0; t < N; ++t)
      if (best[static_cast<std::size_t>(t)] >= 0.0f) {
        positions.push_back(static_cast<std::int32_t>(t));
        token_scores.push_back(best[static_cast<std::size_t>(t)]);
      }
    Archive pool;  // positions only: a one-channel row of zeros stands in for K and V
    const auto e = static_cast<std::int64_t>(positions.size());
    std::vector<float> zeros(static_cast<std::size_t>(e), 0.0f);
    const void* row_table[] = {zeros.data()};
    check(pool.reset({1, 1, 1, RowType::f32, RowType::f32}, {a.block, 0}), "shared blocks");
    check(pool.append(positions.data(), e, row_table, 4, row_table, 4), "shared blocks");
    std::vector<float> block_scores(static_cast<std::size_t>(pool.blocks()), 0.0f);
    for (std::int64_t b = 0; b < pool.blocks(); ++b)
      for (std::int64_t t = pool.block_first(b); t < pool.block_first(b) + pool.block_tokens(b); ++t)
        block_scores[b] = std::max(block_scores[b], token_scores[static_cast<std::size_t>(t)]);
    check(select_recall(pool, block_scores.data(), a.recall, &chosen, &order), "shared blocks");
    chosen_positions(pool, chosen, &picked);
    for (std::int64_t l = 0; l < L; ++l)
      for (std::int64_t h = 0; h < H; ++h) {
        const std::int64_t* mine = kept[l].data() + h * budgets[l];
        std::int64_t n = 0;
        for (const std::int64_t t : picked)
          if (!std::binary_search(mine, mine + budgets[l], t)) recalled[l][h * a.recall + n++] = t;
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
    j["scope"] = a.shared ? "shared" : "per_head";
    j["score"] = a.score;
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
