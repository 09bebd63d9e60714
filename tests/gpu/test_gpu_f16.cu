// The GPU pipeline against the CPU reference, half_t elements.
#include "gpu_cases.cuh"

namespace flashcache::gpu_testing {
using Types_f16 = ::testing::Types<half_t>;
INSTANTIATE_TYPED_TEST_SUITE_P(f16, GpuPipeline, Types_f16);
}  // namespace flashcache::gpu_testing
