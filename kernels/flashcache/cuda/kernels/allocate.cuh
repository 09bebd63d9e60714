#pragma once
// Stage 2, allocate: tokens kept per (layer, sequence), on the device, so that
// no host round trip separates scoring from selection.
//
// Same rules as the CPU front door (flashcache.hpp):
//   - one layer, or Allocation::uniform: every layer resolves the budget on
//     its own (round(ratio * N) or the count, which must not exceed N); one
//     layer with Allocation::dynamic still has its floor (lone_layer_floor_missed);
//   - several layers with Allocation::dynamic: the model-wide total
//     (round(ratio * L N) or L x count) is split by allocate_budgets(), the
//     same host/device arithmetic the CPU uses, with floors
//     max(protected count, ceil(min_layer_ratio * N)).
// One thread per sequence, then one thread per layer scans the budgets into
// the kept-row offsets of each layer.
#include "flashcache/cuda/kernels/common.cuh"
#include "flashcache/allocate.hpp"
#include "flashcache/rules.hpp"

namespace flashcache::gpu::kernels {

struct AllocateParams {
  int layers = 0;
  int sequences = 0;
  bool is_ratio = true;
  double ratio = 0;
  long long count = 0;
  bool dynamic = true;
  double min_layer_ratio = 0;
  const std::int32_t* len = nullptr;     // [B]
  const double* energy_ratio = nullptr;  // [L][B]
  const int* protected_max = nullptr;    // [L][B]
  // Scratch, [B][L] each: the contiguous per-sequence arrays allocate_budgets() takes.
  double* scratch_ratio = nullptr;
  std::int64_t* scratch_tokens = nullptr;
  std::int64_t* scratch_floor = nullptr;
  std::int64_t* scratch_out = nullptr;
  std::int32_t* budget = nullptr;       // [L][B]
  std::int32_t* kept_indptr = nullptr;  // [L][B+1]
  int* status = nullptr;
};

inline constexpr int kAllocateThreads = 256;

// A layer that resolves its budget `want` on its own, with Allocation::dynamic
// (one layer): the floor it falls below, else 0. The CPU's BudgetPlanner refuses
// a total below rules::layer_floor (check_allocation); here the min_layer_ratio
// share decides (the protected count is select's to report, naming the
// protected tokens) and the floor returned for the message is the CPU's.
// Allocation::uniform has no floor: always 0.
FLASHCACHE_INLINE long long lone_layer_floor_missed(bool dynamic, long long want, long long protected_max,
                                                    double min_layer_ratio, long long n) {
  if (!dynamic || want >= flashcache::rules::layer_floor(0, min_layer_ratio, n)) return 0;
  return flashcache::rules::layer_floor(protected_max, min_layer_ratio, n);
}

// A template (never instantiated with another argument) so that the kernel has
// vague linkage: any number of translation units may include this header.
template <int kOneDefinition = 0>
__global__ void __launch_bounds__(kAllocateThreads) allocate_kernel(AllocateParams p) {
  const int tid = static_cast<int>(threadIdx.x);
  if (stop_requested(p.status)) return;
  const int L = p.layers, B = p.sequences;
  for (int b = tid; b < B; b += kAllocateThreads) {
    const long long n = p.len[b];
    long long want = flashcache::rules::layer_budget(p.is_ratio, p.ratio, p.count, n);
    if (!p.is_ratio && want > n) {
      raise(p.status, DeviceErrc::budget_exceeds_tokens, b, want, n);
      want = n;
    }
    if (!(p.dynamic && L > 1)) {
      if (L == 1) {
        const long long floor = lone_layer_floor_missed(p.dynamic, want, p.protected_max[b], p.min_layer_ratio, n);
        if (floor > 0) {
          raise(p.status, DeviceErrc::total_below_floors, b, want, floor);
          want = 0;  // later stages stop anyway
        }
      }
      for (int l = 0; l < L; ++l) p.budget[std::int64_t{l} * B + b] = static_cast<std::int32_t>(want);
      continue;
    }
    // Failures below leave zero budgets behind (later stages stop anyway).
    for (int l = 0; l < L; ++l) p.budget[std::int64_t{l} * B + b] = 0;
    double* ratio = p.scratch_ratio + std::int64_t{b} * L;
    std::int64_t* tokens = p.scratch_tokens + std::int64_t{b} * L;
    std::int64_t* floor = p.scratch_floor + std::int64_t{b} * L;
    std::int64_t* out = p.scratch_out + std::int64_t{b} * L;
    const long long total = flashcache::rules::model_total(p.is_ratio, p.ratio, want, n * L, L);
    long long floor_sum = 0;
    bool ratios_ok = true;
    for (int l = 0; l < L; ++l) {
      const std::int64_t at = std::int64_t{l} * B + b;
      ratio[l] = p.energy_ratio[at];
      if (!isfinite(ratio[l]) || ratio[l] < 0) {
        raise(p.status, DeviceErrc::bad_energy_ratio, l, b);
        ratios_ok = false;
      }
      tokens[l] = n;
      floor[l] = flashcache::rules::layer_floor(p.protected_max[at], p.min_layer_ratio, n);
      floor_sum += floor[l];
    }
    if (!ratios_ok) continue;
    if (total < floor_sum) {
      raise(p.status, DeviceErrc::total_below_floors, b, total, floor_sum);
      continue;
    }
    flashcache::allocate_budgets(L, ratio, tokens, floor, total, out);
    for (int l = 0; l < L; ++l) p.budget[std::int64_t{l} * B + b] = static_cast<std::int32_t>(out[l]);
  }
  __syncthreads();
  for (int l = tid; l < L; l += kAllocateThreads) {
    std::int32_t* indptr = p.kept_indptr + std::int64_t{l} * (B + 1);
    long long running = 0;
    for (int b = 0; b < B; ++b) {
      indptr[b] = static_cast<std::int32_t>(running);
      running += p.budget[std::int64_t{l} * B + b];
    }
    indptr[B] = static_cast<std::int32_t>(running);
  }
}

}  // namespace flashcache::gpu::kernels
