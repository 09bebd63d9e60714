#pragma once
// The caller's workspace, carved into named regions (CUB's two-phase style:
// ask for the size, allocate once, pass it to every run). The carve-up is
// plain host arithmetic on the problem's shape, so it needs no device.
#include <cstddef>
#include <cstdint>

#include "flashcache/error.hpp"
#include "flashcache/grid.hpp"
#include "flashcache/options.hpp"

namespace flashcache::gpu {

// The sizes the workspace depends on.
struct Shape {
  int layers = 0;
  std::int64_t heads = 0;
  std::int64_t head_dim = 0;
  int sequences = 0;
  std::int64_t capacity = 0;   // packed tokens bound
  std::int64_t num_pages = 0;  // paged caches: the pool's pages (the ownership bitmap); 0 otherwise
  ImageSpans spans;            // the request's image spans (Cache::spans)
};

// Byte offsets of every region; 0-sized regions still get an (unused) offset.
struct WorkspaceLayout {
  std::int64_t tile = 1;        // tokens per energy slot
  std::int64_t slot_count = 0;  // energy slots per (layer, head)
  std::size_t status = 0, seq_len = 0, seq_offset = 0, seq_slots = 0;
  std::size_t scores = 0, energy_part = 0, protected_part = 0;
  std::size_t energy = 0, ratio = 0, protected_max = 0, budget = 0;
  std::size_t scratch_ratio = 0, scratch_tokens = 0, scratch_floor = 0, scratch_out = 0;
  std::size_t kept = 0, kept_indptr = 0;
  std::size_t substitutes = 0, spectrum = 0, fft_work = 0;  // global transform only
  // Global transform with a base chosen by energy (ScoreOptions::base peak, mixed)
  // only, for the longest sequence, reused by every (layer, sequence):
  // frequency energies float [2][H][max_length] (K, V) and the choice, bytes [2][H][max_length].
  std::size_t base_energy = 0, base_chosen = 0;
  std::size_t first_good = 0, last_good = 0, source = 0;    // blocked transform only: [L][H][slot_count]
  std::size_t page_owners = 0;                              // paged only: one bit per page of the pool
  // Image spans (Cache::spans) only: tiles of the 2D pass, the row each
  // span token's transform reads (blocked; the global path has substitutes),
  // and per-(layer, head, sequence, tile) energy partials and unrankable counts.
  std::int64_t grid_tiles = 0;
  std::size_t grid_source = 0, grid_energy = 0, grid_protected = 0;
  std::size_t base_mark = 0;      // a base sample only (samples_base): [L][H][capacity] bytes
  std::size_t mean_distance = 0;  // ScoreOptions::mean_weight only: [L][H][capacity] floats
  std::size_t total = 0;
};

namespace detail {
inline constexpr std::size_t kRegionAlign = 256;
inline std::size_t take(std::size_t* at, std::size_t bytes) {
  const std::size_t start = *at;
  *at += (bytes + kRegionAlign - 1) / kRegionAlign * kRegionAlign;
  return start;
}
}  // namespace detail

// Tokens per energy slot of the global residual pass (flashcache/cuda/kernels/score_global.cuh).
inline constexpr std::int64_t kGlobalSlotTokens = 32;

// Whether selection takes a base sample (select.hpp's keep_base_sample):
// base_share, or grid_base_share inside image spans.
inline bool samples_base(const SelectOptions& opt, ImageSpans spans) {
  return opt.base_share > 0 || (!spans.empty() && opt.grid_base_share > 0);
}

// Tiles of the 2D pass over the image spans: grid_tile x grid_tile tiles of
// each span with Transform::blocked (edge tiles at their own size), one per
// span with Transform::global; 0 without spans.
inline std::int64_t grid_tile_count(ImageSpans spans, const ScoreOptions& opt) {
  std::int64_t tiles = 0;
  for (const GridSpan& g : spans)
    if (g.rows >= 1 && g.cols >= 1 && (opt.transform == Transform::global || opt.grid_tile >= 1))
      tiles += span_tiling(g, opt).count();
  return tiles;
}

// The carve-up for `shape` under `opt`. For the global transform,
// `max_length` is the longest sequence and `fft_work_bytes` the cuFFT work
// area (both from the GlobalTransform).
inline Status make_layout(const Shape& s, const Options& opt, std::int64_t max_length, std::size_t fft_work_bytes,
                          WorkspaceLayout* out) {
  if (s.layers < 1 || s.heads < 1 || s.head_dim < 1 || s.sequences < 1 || s.capacity < 0)
    return make_error(Errc::invalid_shape, "workspace: layers ", s.layers, ", heads ", s.heads, ", head_dim ",
                      s.head_dim, ", sequences ", s.sequences, " must be >= 1 and capacity ", s.capacity, " >= 0");
  if (opt.score.transform == Transform::blocked && opt.score.block_size < 1)
    return make_error(Errc::invalid_option, "block_size ", opt.score.block_size, " must be at least 1");
  WorkspaceLayout w;
  w.tile = opt.score.transform == Transform::blocked ? opt.score.block_size : kGlobalSlotTokens;
  // Sum over sequences of ceil(len / tile) <= floor(capacity / tile) + sequences.
  w.slot_count = s.capacity / w.tile + s.sequences;
  const auto L = static_cast<std::size_t>(s.layers), H = static_cast<std::size_t>(s.heads);
  const auto B = static_cast<std::size_t>(s.sequences), N = static_cast<std::size_t>(s.capacity);
  const auto slots = static_cast<std::size_t>(w.slot_count);
  std::size_t at = 0;
  w.status = detail::take(&at, 8 * sizeof(int));
  w.seq_len = detail::take(&at, B * 4);
  w.seq_offset = detail::take(&at, (B + 1) * 4);
  w.seq_slots = detail::take(&at, (B + 1) * 4);
  w.scores = detail::take(&at, L * H * N * 4);
  w.energy_part = detail::take(&at, L * H * slots * 16);
  w.protected_part = detail::take(&at, L * H * slots * 4);
  w.energy = detail::take(&at, L * B * 4 * 8);
  w.ratio = detail::take(&at, L * B * 8);
  w.protected_max = detail::take(&at, L * B * 4);
  w.budget = detail::take(&at, L * B * 4);
  w.scratch_ratio = detail::take(&at, B * L * 8);
  w.scratch_tokens = detail::take(&at, B * L * 8);
  w.scratch_floor = detail::take(&at, B * L * 8);
  w.scratch_out = detail::take(&at, B * L * 8);
  w.kept = detail::take(&at, L * H * N * 4);
  w.kept_indptr = detail::take(&at, L * (B + 1) * 4);
  if (opt.score.transform == Transform::global) {
    if (max_length < 0 || max_length > s.capacity)
      return make_error(Errc::invalid_shape, "workspace: longest sequence ", max_length, " is outside [0, capacity ",
                        s.capacity, "]");
    w.substitutes = detail::take(&at, L * H * N * 4);
    w.spectrum = detail::take(&at, H * static_cast<std::size_t>(s.head_dim) * static_cast<std::size_t>(max_length) * 8);
    w.fft_work = detail::take(&at, fft_work_bytes);
    if (opt.score.base != Base::lowpass) {
      const std::size_t frequencies = 2 * H * static_cast<std::size_t>(max_length);
      w.base_energy = detail::take(&at, frequencies * 4);
      w.base_chosen = detail::take(&at, frequencies);
    }
  } else {
    w.first_good = detail::take(&at, L * H * slots * 4);
    w.last_good = detail::take(&at, L * H * slots * 4);
    w.source = detail::take(&at, L * H * slots * 4);
  }
  w.grid_tiles = grid_tile_count(s.spans, opt.score);
  if (w.grid_tiles > 0) {
    if (opt.score.transform == Transform::blocked) w.grid_source = detail::take(&at, L * H * N * 4);
    const std::size_t parts = L * H * B * static_cast<std::size_t>(w.grid_tiles);
    w.grid_energy = detail::take(&at, parts * 8);
    w.grid_protected = detail::take(&at, parts * 4);
  }
  if (samples_base(opt.select, s.spans)) w.base_mark = detail::take(&at, L * H * N);
  if (opt.score.mean_weight > 0) w.mean_distance = detail::take(&at, L * H * N * 4);
  w.page_owners = detail::take(&at, (static_cast<std::size_t>(s.num_pages) + 31) / 32 * 4);
  w.total = at;
  *out = w;
  return Status::success();
}

// Typed access to the regions of a workspace, e.g. to read scores back.
class Workspace {
 public:
  Workspace(void* base, const WorkspaceLayout& layout) : base_(static_cast<unsigned char*>(base)), layout_(layout) {}

  int* status() const { return at<int>(layout_.status); }
  std::int32_t* seq_len() const { return at<std::int32_t>(layout_.seq_len); }
  std::int32_t* seq_offset() const { return at<std::int32_t>(layout_.seq_offset); }
  std::int32_t* seq_slots() const { return at<std::int32_t>(layout_.seq_slots); }
  float* scores() const { return at<float>(layout_.scores); }  // [L][H][capacity]
  void* energy_part() const { return at<unsigned char>(layout_.energy_part); }
  int* protected_part() const { return at<int>(layout_.protected_part); }
  double* energy() const { return at<double>(layout_.energy); }          // [L][B][4]: K total, K high, V total, V high
  double* ratio() const { return at<double>(layout_.ratio); }            // [L][B]
  int* protected_max() const { return at<int>(layout_.protected_max); }  // [L][B]
  std::int32_t* budget() const { return at<std::int32_t>(layout_.budget); }  // [L][B]
  double* scratch_ratio() const { return at<double>(layout_.scratch_ratio); }
  std::int64_t* scratch_tokens() const { return at<std::int64_t>(layout_.scratch_tokens); }
  std::int64_t* scratch_floor() const { return at<std::int64_t>(layout_.scratch_floor); }
  std::int64_t* scratch_out() const { return at<std::int64_t>(layout_.scratch_out); }
  std::int32_t* kept() const { return at<std::int32_t>(layout_.kept); }
  std::int32_t* kept_indptr() const { return at<std::int32_t>(layout_.kept_indptr); }
  std::int32_t* substitutes() const { return at<std::int32_t>(layout_.substitutes); }
  void* spectrum() const { return at<unsigned char>(layout_.spectrum); }
  void* fft_work() const { return at<unsigned char>(layout_.fft_work); }
  float* base_energy() const { return at<float>(layout_.base_energy); }                // [2][H][max_length]
  std::uint8_t* base_chosen() const { return at<std::uint8_t>(layout_.base_chosen); }  // [2][H][max_length]
  std::int32_t* first_good() const { return at<std::int32_t>(layout_.first_good); }
  std::int32_t* last_good() const { return at<std::int32_t>(layout_.last_good); }
  std::int32_t* source() const { return at<std::int32_t>(layout_.source); }
  std::uint32_t* page_owners() const { return at<std::uint32_t>(layout_.page_owners); }
  float* mean_distance() const { return at<float>(layout_.mean_distance); }            // [L][H][capacity]
  std::int32_t* grid_source() const { return at<std::int32_t>(layout_.grid_source); }  // [L][H][capacity]
  void* grid_energy() const { return at<unsigned char>(layout_.grid_energy); }         // float2 [L][H][B][tiles]
  int* grid_protected() const { return at<int>(layout_.grid_protected); }              // [L][H][B][tiles]
  std::uint8_t* base_mark() const { return at<std::uint8_t>(layout_.base_mark); }      // [L][H][capacity]
  const WorkspaceLayout& layout() const { return layout_; }

 private:
  template <class U>
  U* at(std::size_t offset) const {
    return reinterpret_cast<U*>(base_ + offset);
  }
  unsigned char* base_;
  WorkspaceLayout layout_;
};

}  // namespace flashcache::gpu
