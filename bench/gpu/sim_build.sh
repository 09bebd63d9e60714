# shellcheck shell=bash
# bench/gpu/sim_build.sh: what the simulator scripts (gpu_sim_check.sh, gpu_sim_perf.sh) need of a
# GPGPU-Sim build, and the one configure line of the build folder they share. Sourced, not run.

# gpusim_missing SIM: prints what the simulator build in SIM lacks (or g++-11, CUDA 11.8's newest
# host compiler) and succeeds; fails, printing nothing, when everything is there.
gpusim_missing() {
  local need
  for need in "$1/env118.sh" "$1/cuda-11.8/bin/nvcc" "$1/gpgpu-sim/configs/tested-cfgs/SM7_QV100/gpgpusim.config"; do
    [[ -e $need ]] || { echo "$need is missing: build the simulator first (tests/gpu/README.md)"; return 0; }
  done
  command -v g++-11 >/dev/null || { echo "g++-11 is missing (CUDA 11.8's newest host compiler)"; return 0; }
  return 1
}

# gpusim_configure ROOT BUILD SIM: configures BUILD for the simulator (sm_70 with SIM's CUDA 11.8,
# FLASHCACHE_GPU_SIM=ON), its log in BUILD/gpusim-configure.log; on failure prints its tail and fails.
gpusim_configure() {
  local cuda=$3/cuda-11.8
  mkdir -p "$2"
  cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release -DFLASHCACHE_GPU_SIM=ON \
    -DCMAKE_CUDA_COMPILER="$cuda/bin/nvcc" -DCMAKE_CUDA_HOST_COMPILER=g++-11 -DCMAKE_CUDA_ARCHITECTURES=70 \
    -DCMAKE_CUDA_RUNTIME_LIBRARY=Shared -DCUDAToolkit_ROOT="$cuda" \
    -DFLASHCACHE_BUILD_BENCH=ON -DFLASHCACHE_BUILD_EXAMPLES=OFF -DFLASHCACHE_BUILD_CLI=OFF -DFLASHCACHE_INSTALL=OFF \
    -DFLASHCACHE_NO_PYTHON_LLAMA=ON -DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST >"$2/gpusim-configure.log" 2>&1 ||
    { tail -20 "$2/gpusim-configure.log"; return 1; }
}
