// The layer allocator on the GPU (flashcache/cuda/kernels/allocate.cuh): a lone
// dynamic layer's floor as the CPU's BudgetPlanner has it (host), and a ragged
// batch with protection, NaNs and both allocations against the CPU (device).
#include <gtest/gtest.h>

#include "element_types.cuh"
#include "flashcache/plan.hpp"
#include "gpu_testing.cuh"
#include "host_fixture.cuh"

namespace flashcache::gpu_testing {
namespace {

using host::expect_error;

// Budgets against the CPU, for each element type.
FLASHCACHE_ELEMENT_TYPED_SUITE(GpuAllocate);

TYPED_TEST(GpuAllocate, RaggedBatchWithProtectionNaNsAndDynamicAllocation) {
  FLASHCACHE_REQUIRE_DEVICE();
  for (Transform transform : {Transform::blocked, Transform::global})
    for (Allocation allocation : {Allocation::dynamic, Allocation::uniform}) {
      Case c;
      c.name = std::string(to_string(transform)) + " / " + to_string(allocation);
      c.layers = 3;
      c.heads = 2;
      c.head_dim = 64;
      c.lengths = {0, 33, 300, 1000, 57};
      c.opt = transform == Transform::blocked ? blocked(64) : global_transform();
      c.opt.allocate.mode = allocation;
      c.opt.select.sink = 1;
      c.opt.select.window = 2;
      c.opt.allocate.min_layer_ratio = 0.05;
      c.mask_every = 50;
      c.nan_tokens = 6;
      c.budget = Budget::ratio(0.3);
      c.seed = 1234;
      run_and_check<TypeParam>(c);
    }
}

}  // namespace
}  // namespace flashcache::gpu_testing

namespace flashcache::gpu_testing::host {
namespace {

// One layer with Allocation::dynamic: allocate_kernel resolves the budget on
// its own, but refuses it below the min_layer_ratio floor, as the CPU's
// BudgetPlanner (check_allocation) does, with the same numbers in the message;
// a budget below only the protected count is select_kernel's to report
// (budget_below_always_kept). Allocation::uniform has no floor, on either side.
TEST(GpuAllocate, OneDynamicLayerKeepsTheCpusMinLayerRatioFloor) {
  namespace kn = fcc::kernels;
  using DeviceErrc = kn::DeviceErrc;
  int refused = 0;
  for (std::int64_t n : {1, 30, 100, 4097})
    for (double ratio_floor : {0.0, 0.05, 0.1, 0.5, 1.0})
      for (std::int64_t protect : {0, 3, 20})
        for (const Budget& budget :
             {Budget::ratio(0.0), Budget::ratio(0.02), Budget::ratio(0.1), Budget::ratio(0.3), Budget::ratio(1.0),
              Budget::tokens(0), Budget::tokens(1), Budget::tokens(5), Budget::tokens(50)}) {
          const long long want =
              flashcache::rules::layer_budget(budget.is_ratio(), budget.ratio_value(), budget.token_count(), n);
          if (want > n) continue;  // budget_exceeds_tokens, before any floor
          const std::int64_t protected_count = std::min(protect, n);
          SCOPED_TRACE("n " + std::to_string(n) + " min_layer_ratio " + std::to_string(ratio_floor) + " protected " +
                       std::to_string(protected_count) + " budget " + std::to_string(want));
          flashcache::LayerSummary summary;
          summary.tokens = n;
          summary.protected_count = protected_count;
          Options o;
          o.allocate.min_layer_ratio = ratio_floor;
          for (flashcache::Allocation allocation : {flashcache::Allocation::dynamic, flashcache::Allocation::uniform}) {
            o.allocate.mode = allocation;
            const bool dynamic = allocation == flashcache::Allocation::dynamic;
            std::int64_t planned = -1;
            flashcache::BudgetPlanner planner;
            const Status cpu = planner.plan(&summary, 1, budget, o.allocate, &planned);
            const long long missed = kn::lone_layer_floor_missed(dynamic, want, protected_count, ratio_floor, n);
            if (missed > 0) {
              ++refused;
              const std::string words = "total budget " + std::to_string(want) + " < " + std::to_string(missed);
              expect_error(cpu, Errc::invalid_budget, words);
              int w[kn::kStatusWords] = {static_cast<int>(DeviceErrc::total_below_floors), 0, static_cast<int>(want),
                                         static_cast<int>(missed)};
              expect_error(fcc::describe_device_status(w), Errc::invalid_budget, words);
            } else if (!cpu.ok()) {
              EXPECT_TRUE(dynamic) << cpu.message();
              EXPECT_LT(want, protected_count) << cpu.message();  // select_kernel refuses it
            } else {
              EXPECT_EQ(planned, want);
            }
          }
        }
  EXPECT_GT(refused, 20);
}

}  // namespace
}  // namespace flashcache::gpu_testing::host
