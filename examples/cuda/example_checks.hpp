#pragma once
// Error checks shared by the CUDA examples: print the failed call and leave
// main() with exit code 1.
#include <cuda_runtime.h>

#include <cstdio>

#include "flashcache/error.hpp"

#define CHECK_CUDA(expr)                                               \
  do {                                                                 \
    const cudaError_t e_ = (expr);                                     \
    if (e_ != cudaSuccess) {                                           \
      std::fprintf(stderr, "%s: %s\n", #expr, cudaGetErrorString(e_)); \
      return 1;                                                        \
    }                                                                  \
  } while (0)
#define CHECK_STATUS(expr)                                           \
  do {                                                               \
    const flashcache::Status s_ = (expr);                            \
    if (!s_.ok()) {                                                  \
      std::fprintf(stderr, "%s: %s\n", #expr, s_.message().c_str()); \
      return 1;                                                      \
    }                                                                \
  } while (0)
