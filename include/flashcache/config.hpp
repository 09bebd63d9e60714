#pragma once
// Compiler glue shared by host and device code.

#if defined(__CUDACC__) || defined(__HIPCC__)
#define FLASHCACHE_HOST_DEVICE __host__ __device__
#else
#define FLASHCACHE_HOST_DEVICE
#endif

#define FLASHCACHE_INLINE FLASHCACHE_HOST_DEVICE inline

// No-alias promise for hot loops the compiler should vectorise.
#if defined(_MSC_VER)
#define FLASHCACHE_RESTRICT __restrict
#else
#define FLASHCACHE_RESTRICT __restrict__
#endif
