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

// 1 when the translation unit is compiled with C++ exceptions. The no-throw
// core (score, plan, select, gather, batch) compiles either way; the throwing
// front door (compress, compress_model, score_layer, throw_if_error) only
// exists when this is 1, so an engine built with -fno-exceptions sees no throw.
#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
#define FLASHCACHE_EXCEPTIONS 1
#else
#define FLASHCACHE_EXCEPTIONS 0
#endif
