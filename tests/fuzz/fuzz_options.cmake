# FLASHCACHE_FUZZ=ON: included by the top-level CMakeLists.txt before any target
# is defined. Every C++ target of this build gets coverage instrumentation and
# ASan + UBSan, so the CLI code the fuzzers call in-process is instrumented too;
# only the fuzz_* executables link libFuzzer (tests/fuzz/CMakeLists.txt).
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR
    "FLASHCACHE_FUZZ=ON needs clang (libFuzzer), but the C++ compiler is ${CMAKE_CXX_COMPILER_ID} "
    "(${CMAKE_CXX_COMPILER}). Configure a fresh build folder with -DCMAKE_CXX_COMPILER=clang++ "
    "(Debian: apt-get install clang libclang-rt-14-dev), or use tests/fuzz/run_fuzz.sh.")
endif()
# Line tables, whatever the build type: a crash's stack names file and line (full -g costs a fifth more
# compile time for nothing a report uses).
set(FLASHCACHE_FUZZ_FLAGS -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all
    -fno-omit-frame-pointer -gline-tables-only)
add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:${FLASHCACHE_FUZZ_FLAGS}>")
# clang 14 flags `finite &= a & b` on bools in include/flashcache/score/rows.hpp, which
# GCC (the project's compiler) accepts; kept visible as a warning, not an error.
add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-Wno-error=bitwise-instead-of-logical>")
add_link_options(-fsanitize=address,undefined)
