#pragma once
// Tensor parallel: the heads of each layer split over ranks.
//
// R_l and the layer floors need every rank's heads. Each rank runs
// score_async() on its heads, all-reduces the sums energy_sums() points at
// (energy: sum; protected_max: max; e.g. with NCCL on `stream`), then runs
// select_async(), which takes the ratios from the reduced sums. Every rank
// then computes the same budgets. One rank alone: compress_async().
#include <cuda_runtime.h>

#include <cstddef>

#include "flashcache/cuda/run.cuh"

namespace flashcache::gpu {

struct EnergySums {
  double* energy = nullptr;         // [layers][sequences][4]: K total, K high, V total, V high; reduce with sum
  int* protected_max = nullptr;     // [layers][sequences]: largest protected count of a head; reduce with max
  std::size_t layer_sequences = 0;  // layers x sequences (energy holds 4 doubles per entry)
};

template <class T>
Status energy_sums(const Cache<T>& c, const Options& opt, void* workspace, const GlobalTransform* global, EnergySums* sums) {
  WorkspaceLayout layout;
  FLASHCACHE_RETURN_IF_ERROR(workspace_layout(c, opt, global, &layout));
  if (workspace == nullptr || sums == nullptr) return make_error(Errc::invalid_shape, "energy_sums: null argument");
  const Workspace ws(workspace, layout);
  sums->energy = ws.energy();
  sums->protected_max = ws.protected_max();
  sums->layer_sequences = static_cast<std::size_t>(c.layers) * static_cast<std::size_t>(c.sequences);
  return Status::success();
}

// Phase 1 of a tensor-parallel run: the sequence table, scores and this rank's energy sums.
template <class T>
Status score_async(const Cache<T>& c, const Budget& budget, const Options& opt, const Outputs<T>& out, void* workspace,
                   std::size_t workspace_bytes, cudaStream_t stream, const GlobalTransform* global = nullptr) {
  return detail::prepared_run(
      c, budget, opt, out, workspace, workspace_bytes, global,
      [&](const detail::RunContext<T>& run) { return detail::enqueue_scores(run, budget, out, stream, global); });
}

// Phase 2, after the sums were reduced over the ranks: R_l from the sums,
// budgets, selection, gather / compaction (the same workspace as phase 1).
template <class T>
Status select_async(const Cache<T>& c, const Budget& budget, const Options& opt, const Outputs<T>& out, void* workspace,
                    std::size_t workspace_bytes, cudaStream_t stream, const GlobalTransform* global = nullptr) {
  return detail::prepared_run(c, budget, opt, out, workspace, workspace_bytes, global,
                              [&](const detail::RunContext<T>& run) {
                                FLASHCACHE_RETURN_IF_ERROR(detail::energy_ratios(run, out.energy_ratio, stream));
                                return detail::enqueue_selection(run, budget, out, stream);
                              });
}

}  // namespace flashcache::gpu
