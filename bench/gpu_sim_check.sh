#!/usr/bin/env bash
# bench/gpu_sim_check.sh: the GPU tests under GPGPU-Sim in functional mode, on a
# machine without a GPU. It checks results, never speed: no time it prints is a
# GPU time.
#
#   bench/gpu_sim_check.sh                      # every GPU test binary
#   bench/gpu_sim_check.sh compress score       # test_gpu_compress and test_gpu_score only
#   FILTER='*/bf16.*' bench/gpu_sim_check.sh score select   # one element type
#   PARALLEL=2 bench/gpu_sim_check.sh           # two binaries at a time
#
# Needs a simulator build in $GPUSIM_DIR (default /tmp/gpusim), as the
# simulator tool beside the project makes it (docs: tests/gpu/README.md):
#   env118.sh          sourced before each run: GPGPU-Sim's libcudart first on the library path
#   cuda-11.8/         a CUDA 11.8 toolchain (nvcc, headers, cudart, cuFFT); GPGPU-Sim
#                      builds against no newer one, and CUDA 13 cannot target sm_70
#   gpgpu-sim/         the simulator, built, with its configs/
# and g++-11 (CUDA 11.8 refuses newer host compilers).
#
# The project is configured with FLASHCACHE_GPU_SIM=ON for sm_70 in $BUILD
# (default build-sim): the global transform's FFTs run on the host there, and
# the tests that need CUDA graphs skip by name. The simulated GPU is a V100 with
# an H100/H200's 227 KB of shared memory per block, so the shapes that need it run.
# Each binary runs with a time limit ($TIMEOUT seconds, default 3600), $PARALLEL
# of them at a time (default 1: the simulator is single-threaded); the table
# at the end gives each binary's passed, failed and skipped tests, and logs go to
# $BUILD/gpusim-logs. $BUILD/gpusim-results.json holds every test's outcome and
# each skip's reason (bench/gpu_sim_results.py); to record a run, copy it to
# bench/results/gpu_sim.json and run tools/report/make_results.py.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SIM=${GPUSIM_DIR:-/tmp/gpusim}
BUILD=${BUILD:-$ROOT/build-sim}
TIMEOUT=${TIMEOUT:-3600}
JOBS=${JOBS:-2}
PARALLEL=${PARALLEL:-1}
# shellcheck source=bench/gpu/gpu_tests.sh
source "$ROOT/bench/gpu/gpu_tests.sh"  # FLASHCACHE_GPU_TESTS, gpu_test_bin
# shellcheck source=bench/gpu/sim_build.sh
source "$ROOT/bench/gpu/sim_build.sh"  # gpusim_missing, gpusim_configure
BINARIES=${*:-$FLASHCACHE_GPU_TESTS}

if missing=$(gpusim_missing "$SIM"); then echo "gpu_sim_check: $missing"; exit 2; fi

echo "== configure and build ($BUILD, sm_70, FLASHCACHE_GPU_SIM=ON)"
gpusim_configure "$ROOT" "$BUILD" "$SIM" || exit 1
targets=$(for b in $BINARIES; do printf 'test_gpu_%s ' "$b"; done)
# shellcheck disable=SC2086
nice -n 10 cmake --build "$BUILD" -j"$JOBS" --target $targets >"$BUILD/gpusim-build.log" 2>&1 ||
  { grep -E "error|Error" "$BUILD/gpusim-build.log" | head -20; exit 1; }

# The simulator reads gpgpusim.config from the folder it runs in: a V100 (SM7_QV100)
# in functional mode, with 227 KB of shared memory per block (H100/H200's opt-in
# limit; the V100's 96 KB refuses the larger blocked and image-span shapes).
CFG=$BUILD/gpusim-config
mkdir -p "$CFG" "$BUILD/gpusim-logs"
cp "$SIM"/gpgpu-sim/configs/tested-cfgs/SM7_QV100/* "$CFG/"
cat >>"$CFG/gpgpusim.config" <<'EOF'

# bench/gpu_sim_check.sh
-gpgpu_ptx_sim_mode 1
-gpgpu_shmem_size 232448
-gpgpu_shmem_sizeDefault 232448
-gpgpu_shmem_per_block 232448
-gpgpu_shmem_option 0,8,16,32,64,100,132,164,196,227
EOF

# run_one NAME: one binary under the simulator, its log and its exit (code=seconds).
run_one() {
  local b=$1 bin log start rc=0
  bin=$(gpu_test_bin "$BUILD" "$b")
  log=$BUILD/gpusim-logs/test_gpu_$b.log
  start=$(date +%s)
  # No positional arguments into the sourced script: GPGPU-Sim's setup_environment
  # reads a $1 as its build type, and this function's $1 is a binary's name.
  (set -- && set +u && source "$SIM/env118.sh" && cd "$CFG" &&
     timeout "$TIMEOUT" stdbuf -o0 "$bin" --gtest_filter="${FILTER:-*}" >"$log" 2>&1) || rc=$?
  echo "$rc=$(( $(date +%s) - start ))" >"$log.exit"
}
for b in $BINARIES; do
  while (( $(jobs -rp | wc -l) >= PARALLEL )); do wait -n; done
  echo "== test_gpu_$b (limit ${TIMEOUT}s)"
  run_one "$b" &
done
wait

printf '\n%-26s %7s %7s %8s %8s  %s\n' binary passed failed skipped seconds result >"$BUILD/gpusim-table.txt"
exits=()
for b in $BINARIES; do
  log=$BUILD/gpusim-logs/test_gpu_$b.log
  IFS='=' read -r rc seconds <"$log.exit"
  exits+=(--exit "test_gpu_$b=$rc=$seconds")
  passed=$(grep -a -c '^\[       OK \]' "$log")
  failed=$(grep -a -cE '^\[  FAILED  \] .*\([0-9]+ ms\)$' "$log")
  skipped=$(grep -a -cE '^\[  SKIPPED \] .*\([0-9]+ ms\)$' "$log")
  case $rc in
    0) result=ok ;;
    124) result="timed out after ${TIMEOUT}s" ;;
    1) result="tests failed" ;;
    *) result="exit $rc (crashed: $(grep -a -E '^\[ RUN      \]' "$log" | tail -1 | cut -c14-))" ;;
  esac
  # Without the simulator's banner another libcudart ran, and every device test skipped.
  grep -a -q 'GPGPU-Sim' "$log" || result="NOT SIMULATED: GPGPU-Sim's libcudart was not loaded ($result)"
  printf '%-26s %7s %7s %8s %8s  %s\n' "test_gpu_$b" "$passed" "$failed" "$skipped" "$seconds" "$result" |
    tee -a "$BUILD/gpusim-table.txt"
  grep -a -E '^\[  FAILED  \] .*\([0-9]+ ms\)$' "$log" | sed 's/^/    /'
done
python3 "$ROOT/bench/gpu_sim_results.py" "$BUILD/gpusim-logs" "$BUILD/gpusim-results.json" --simulator "$SIM" \
  --config "$CFG/gpgpusim.config" --commit "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)" "${exits[@]}" ||
  echo "gpu_sim_check: could not write $BUILD/gpusim-results.json"
echo
echo "GPGPU-Sim, functional mode (results only; no time here is a GPU time). Logs: $BUILD/gpusim-logs"
cat "$BUILD/gpusim-table.txt"
