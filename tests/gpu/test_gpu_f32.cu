// The GPU pipeline against the CPU reference, float elements.
#include "gpu_cases.cuh"

namespace flashcache::gpu_testing {
using Types_f32 = ::testing::Types<float>;
INSTANTIATE_TYPED_TEST_SUITE_P(f32, GpuPipeline, Types_f32);
}  // namespace flashcache::gpu_testing
