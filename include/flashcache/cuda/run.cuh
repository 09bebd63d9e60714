#pragma once
// One call's run: the workspace layout, the checks every entry point makes
// first, and the stages in order (each launched by its header in launch/).
//   0   sequence table         launch/sequence_table.cuh
//   1   scores                 launch/score_blocked.cuh | launch/score_global.cuh, launch/score_grid.cuh
//   1b  energy sums, R_l       launch/energy.cuh
//   1c  second terms mixed in  launch/mix_tails.cuh (ScoreOptions::mean_weight, query = tail)
//   2   budgets                launch/allocate.cuh
//   3   selection              launch/select.cuh
//   4   gather | compaction    launch/gather.cuh | launch/compact_paged.cuh
#include <cuda_runtime.h>

#include <cstddef>

#include "flashcache/cuda/can_implement.cuh"
#include "flashcache/cuda/global_transform.cuh"
#include "flashcache/cuda/launch/allocate.cuh"
#include "flashcache/cuda/launch/compact_paged.cuh"
#include "flashcache/cuda/launch/energy.cuh"
#include "flashcache/cuda/launch/gather.cuh"
#include "flashcache/cuda/launch/mix_tails.cuh"
#include "flashcache/cuda/launch/score_blocked.cuh"
#include "flashcache/cuda/launch/score_global.cuh"
#include "flashcache/cuda/launch/score_grid.cuh"
#include "flashcache/cuda/launch/select.cuh"
#include "flashcache/cuda/launch/sequence_table.cuh"
#include "flashcache/cuda/run_context.cuh"
#include "flashcache/cuda/workspace.cuh"

namespace flashcache::gpu {

template <class T>
Status workspace_layout(const Cache<T>& c, const Options& opt, const GlobalTransform* global, WorkspaceLayout* layout) {
  Shape shape;
  shape.num_pages = c.paged() ? c.pages.num_pages : 0;
  shape.layers = c.layers;
  shape.heads = c.heads;
  shape.head_dim = c.head_dim;
  shape.sequences = c.sequences;
  shape.capacity = c.capacity;
  shape.spans = c.spans;
  if (opt.score.transform == Transform::global) {
    if (global == nullptr) return make_error(Errc::invalid_option, "the global transform needs a GlobalTransform");
    return make_layout(shape, opt, global->max_length(), global->work_bytes(), layout);
  }
  return make_layout(shape, opt, 0, 0, layout);
}

namespace detail {

// can_implement, the layout, and the caller's workspace: what every run path checks first.
template <class T>
Status checked_layout(const Cache<T>& c, const Budget& budget, const Options& opt, const Outputs<T>& out,
                      const void* workspace, std::size_t workspace_bytes, const GlobalTransform* global,
                      CheckedCall* call, WorkspaceLayout* layout) {
  FLASHCACHE_RETURN_IF_ERROR(check_call(c, budget, opt, out, global, call));
  FLASHCACHE_RETURN_IF_ERROR(workspace_layout(c, opt, global, layout));
  if (workspace == nullptr || workspace_bytes < layout->total)
    return make_error(Errc::invalid_shape, "workspace of ", workspace_bytes, " bytes < ", layout->total, " needed");
  if (!aligned16(workspace)) return make_error(Errc::invalid_shape, "workspace must be 16-byte aligned");
  return Status::success();
}

// What every run path does first, once: the checks, the workspace layout and the
// RunContext; then `stages(run)` enqueues the stages that path runs.
template <class T, class Stages>
Status prepared_run(const Cache<T>& c, const Budget& budget, const Options& opt, const Outputs<T>& out,
                    void* workspace, std::size_t workspace_bytes, const GlobalTransform* global, Stages&& stages) {
  CheckedCall call;
  WorkspaceLayout layout;
  FLASHCACHE_RETURN_IF_ERROR(checked_layout(c, budget, opt, out, workspace, workspace_bytes, global, &call, &layout));
  const Workspace ws(workspace, layout);
  const RunContext<T> run(c, opt, ws, call);
  return stages(run);
}

// Stages 0-1c: the sequence table, scores, per-(layer, sequence) energy sums and protected counts,
// and the distance from the mean and the query tails mixed into the scores.
template <class T>
Status enqueue_scores(const RunContext<T>& run, const Budget& budget, const Outputs<T>& out, cudaStream_t stream,
                      const GlobalTransform* global) {
  // Before anything is enqueued: the transform serves one stream and workspace (global_transform.cuh).
  const bool is_global = run.opt.score.transform == Transform::global;
  if (is_global) FLASHCACHE_RETURN_IF_ERROR(global->bind(stream, run.ws.fft_work()));
  FLASHCACHE_RETURN_IF_ERROR(build_sequence_table(run, stream));
  if (is_global)
    FLASHCACHE_RETURN_IF_ERROR(score_global(run, *global, stream));
  else
    FLASHCACHE_RETURN_IF_ERROR(score_blocked(run, stream));
  if (!run.cache.spans.empty()) FLASHCACHE_RETURN_IF_ERROR(score_grids(run, stream));
  FLASHCACHE_RETURN_IF_ERROR(sum_energy(run, out.energy_ratio, stream));
  // A ratio keeps the same share of every sequence: where the weight has faded to 0 there
  // (the defaults at a keep of 0.25 or less) no sequence mixes, and neither kernel runs.
  const bool mean_fades_out =
      budget.is_ratio() && mean_weight_at(run.opt.score, budget.keep_ratio(run.cache.capacity)) == 0.0;
  if (run.opt.score.mean_weight > 0 && !mean_fades_out && run.cache.capacity > 0)
    FLASHCACHE_RETURN_IF_ERROR(mix_mean_distance(run, budget, stream));
  if (run.opt.score.query == QueryInput::tail && run.cache.capacity > 0) FLASHCACHE_RETURN_IF_ERROR(mix_tails(run, stream));
  return Status::success();
}

// Stages 2-4: budgets from the energy sums, selection, gather / compaction.
template <class T>
Status enqueue_selection(const RunContext<T>& run, const Budget& budget, const Outputs<T>& out, cudaStream_t stream) {
  std::int32_t* kept = out.kept != nullptr ? out.kept : run.ws.kept();
  std::int32_t* kept_indptr = out.kept_indptr != nullptr ? out.kept_indptr : run.ws.kept_indptr();
  FLASHCACHE_RETURN_IF_ERROR(allocate_budgets(run, budget, kept_indptr, stream));
  FLASHCACHE_RETURN_IF_ERROR(select_tokens(run, kept, kept_indptr, stream));
  if (out.k_out != nullptr && run.cache.capacity > 0)
    FLASHCACHE_RETURN_IF_ERROR(gather_kept(run, out, kept, kept_indptr, stream));
  if (out.compact_in_place) FLASHCACHE_RETURN_IF_ERROR(compact_in_place(run, out, kept, kept_indptr, stream));
  return Status::success();
}

}  // namespace detail
}  // namespace flashcache::gpu
