// The GPU pipeline against the CPU reference, bfloat16_t elements.
#include "gpu_cases.cuh"

namespace flashcache::gpu_testing {
using Types_bf16 = ::testing::Types<bfloat16_t>;
INSTANTIATE_TYPED_TEST_SUITE_P(bf16, GpuPipeline, Types_bf16);
}  // namespace flashcache::gpu_testing
