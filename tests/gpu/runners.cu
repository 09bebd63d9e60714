// The GPU tests' runners (gpu_testing.cuh), compiled once for the three element
// types: each instantiation is the whole pipeline, which every suite would
// otherwise compile again.
#define FLASHCACHE_GPU_TESTING_COMPILE_RUNNERS
#include "gpu_testing.cuh"

namespace flashcache::gpu_testing {
FLASHCACHE_GPU_TESTING_RUNNERS(template, float)
FLASHCACHE_GPU_TESTING_RUNNERS(template, half_t)
FLASHCACHE_GPU_TESTING_RUNNERS(template, bfloat16_t)
}  // namespace flashcache::gpu_testing
