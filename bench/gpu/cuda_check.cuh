#pragma once
// The GPU benchmark programs' check of a CUDA runtime call: a failed call is named with its
// error and the program exits 1 (a benchmark has nothing to recover).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define BENCH_CHECK(expr)                                                     \
  do {                                                                        \
    const cudaError_t e_ = (expr);                                            \
    if (e_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "%s failed: %s\n", #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                           \
    }                                                                         \
  } while (0)
