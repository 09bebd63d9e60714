# bench/gpu/gpu_tests.sh: the GPU test binaries, listed once for the scripts
# that build or run them: gpu_check.sh (on a device) and gpu_sim_check.sh
# (under the simulator). Sourced, not run.

# One binary per stage of the GPU pipeline (tests/gpu/test_<stage>.cu), the two
# units linked together, and the decode baseline's test.
FLASHCACHE_GPU_TESTS="compress score base grid select allocate compact_paged tensor_parallel query_tails two_units decode"

# gpu_test_bin BUILD NAME: where test_gpu_NAME lies in the build folder BUILD.
# The decode baseline's test lives with the benchmarks it serves.
gpu_test_bin() {
  if [[ $2 == decode ]]; then echo "$1/bench/gpu/test_gpu_decode"; else echo "$1/tests/gpu/test_gpu_$2"; fi
}

# gpu_test_sources ROOT NAME: the sources of test_gpu_NAME, for a build without
# CMake. Every stage binary also links the runners (tests/gpu/runners.cu), which
# such a build compiles once.
gpu_test_sources() {
  case $2 in
    two_units) echo "$1/tests/gpu/two_units_a.cu $1/tests/gpu/two_units_b.cu" ;;
    decode) echo "$1/bench/gpu/test_decode_attention.cu" ;;
    *) echo "$1/tests/gpu/test_$2.cu" ;;
  esac
}
gpu_test_needs_runners() { [[ $1 != two_units && $1 != decode ]]; }
