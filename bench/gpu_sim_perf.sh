#!/usr/bin/env bash
# bench/gpu_sim_perf.sh: one layer's GPU stages (global and blocked compression,
# a copy of the same bytes, one decode-attention step) under GPGPU-Sim's
# PERFORMANCE model of a V100-class GPU (SM7_QV100, -gpgpu_ptx_sim_mode 0), on a
# machine without a GPU. It reports simulated cycles, DRAM bytes, cache hit
# rates and stalls per kernel: a model's numbers, never a GPU time.
#
#   bench/gpu_sim_perf.sh                 # N = 1024 2048 4096 tokens, one after another
#   SIZES=1024 bench/gpu_sim_perf.sh      # one size
#   TIMEOUT=3600 SIZES="2048 4096" bench/gpu_sim_perf.sh
#   STAGES=blocked,copy,decode SIZES=4096 bench/gpu_sim_perf.sh   # some stages only
#   GPU=v100 bench/gpu_sim_perf.sh        # the full 80-SM V100 (see below: wrong results today)
#
# Needs the simulator build that bench/gpu_sim_check.sh needs ($GPUSIM_DIR,
# default /tmp/gpusim: env118.sh, cuda-11.8/, gpgpu-sim/; tests/gpu/README.md)
# and g++-11. Builds flashcache_sim_perf (bench/gpu/sim_perf.cu) in $BUILD
# (default build-sim, configured as gpu_sim_check.sh configures it:
# FLASHCACHE_GPU_SIM=ON, so the global transform's FFTs run on the host and
# cost no simulated cycle), runs it once per size with a time limit ($TIMEOUT
# seconds, default 3600; the simulator is single-threaded, so sizes run one at a
# time), keeps each log in $BUILD/gpusim-perf-logs-$GPU/sim_perf_N.log, and writes
# $OUT (default bench/results/gpu_sim_perf.json) from every log there
# (bench/gpu_sim_perf.py). tools/report/gpu_sim_perf.py renders it.
#
# With CHECK=1 (the default) each size first runs in functional mode too, and
# the program's "sim_perf: check" lines (sequence table, kept rows, hashes of
# the scores, kept indices and decode output) must match between the two modes:
# cycle counts of a run that computed something else would mean nothing.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SIM=${GPUSIM_DIR:-/tmp/gpusim}
BUILD=${BUILD:-$ROOT/build-sim}
TIMEOUT=${TIMEOUT:-3600}
JOBS=${JOBS:-1}
SIZES=${SIZES:-1024 2048 4096}
OUT=${OUT:-$ROOT/bench/results/gpu_sim_perf.json}
CHECK=${CHECK:-1}
STAGES=${STAGES:-global,blocked,copy,decode}
QV100=$SIM/gpgpu-sim/configs/tested-cfgs/SM7_QV100

die() { echo "gpu_sim_perf: $*" >&2; exit 2; }
# shellcheck source=bench/gpu/sim_build.sh
source "$ROOT/bench/gpu/sim_build.sh"  # gpusim_missing, gpusim_configure
if missing=$(gpusim_missing "$SIM"); then die "$missing"; fi
for n in $SIZES; do
  [[ $n =~ ^[0-9]+$ ]] || die "SIZES holds '$n', not a token count"
done

echo "== configure and build flashcache_sim_perf ($BUILD, sm_70, FLASHCACHE_GPU_SIM=ON)"
# gpu_sim_check.sh's configure line, so that both scripts share one build.
gpusim_configure "$ROOT" "$BUILD" "$SIM" || exit 1
nice -n 10 cmake --build "$BUILD" -j"$JOBS" --target flashcache_sim_perf >"$BUILD/gpusim-perf-build.log" 2>&1 ||
  { grep -E "error|Error" "$BUILD/gpusim-perf-build.log" | head -20; exit 1; }
BIN=$BUILD/bench/gpu/flashcache_sim_perf
[[ -x $BIN ]] || die "the build made no $BIN"

# The simulator reads gpgpusim.config from the folder it runs in: SM7_QV100 with
# gpu_sim_check.sh's 227 KB of shared memory per block (H100/H200's opt-in
# limit, which the blocked kernel's larger shapes need), in performance mode,
# and in functional mode for the check.
#
# GPU=small (the default) scales that V100 down to 4 SMs. GPGPU-Sim's timing
# model keeps the results of __syncthreads_or/and/count (bar.red) in a per-SM
# array of 32 CTA slots but indexes it with hw_cta_id * SMs + sid
# (src/cuda-sim/cuda-sim.cc:2105, abstract_hardware_model.h:1384) and never
# clears it: with 80 SMs almost every CTA reads memory past the array, and the
# library's stop_requested() (kernels/flashcache/cuda/kernels/common.cuh:67),
# a __syncthreads_or at the top of nearly every kernel, then returns at random:
# CTAs skip their work, the results differ from functional mode, and the gather
# crashes. SMs x CTAs per SM <= 32 keeps the index in range: 4 SMs of up to 8
# CTAs (a V100 SM's 2048 threads in 256-thread CTAs), with 2 of the 32 DRAM
# channels (so about the V100's DRAM bandwidth per SM; the IPOLY channel hash
# needs 16 or more channels, so linear indexing). GPU=v100 runs the full 80-SM
# config, whose results the check finds different until the simulator is fixed.
GPU=${GPU:-small}
case $GPU in
  small | v100) ;;
  *) die "GPU must be small or v100, not '$GPU'" ;;
esac
CFG=$BUILD/gpusim-perf-config-$GPU
FUNC=$BUILD/gpusim-perf-functional-config-$GPU
LOGS=$BUILD/gpusim-perf-logs-$GPU
mkdir -p "$CFG" "$FUNC" "$LOGS"
# write_config DIR MODE (0 performance, 1 functional)
write_config() {
  cp "$QV100"/* "$1/"
  cat >>"$1/gpgpusim.config" <<EOF

# bench/gpu_sim_perf.sh
-gpgpu_ptx_sim_mode $2
-gpgpu_shmem_size 232448
-gpgpu_shmem_sizeDefault 232448
-gpgpu_shmem_per_block 232448
-gpgpu_shmem_option 0,8,16,32,64,100,132,164,196,227
EOF
  if [[ $GPU == small ]]; then
    cat >>"$1/gpgpusim.config" <<EOF
-gpgpu_n_clusters 4
-gpgpu_shader_cta 8
-gpgpu_n_mem 2
-gpgpu_memory_partition_indexing 0
EOF
  fi
}
write_config "$CFG" 0
write_config "$FUNC" 1
# Twice the configured L2, so that the scrub before each stage leaves none of its data there.
SCRUB=$(python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); import gpu_sim_perf as g
print(2 * g.machine_model(g.parse_config(sys.argv[2]))["l2_bytes"])' "$ROOT/bench" "$CFG/gpgpusim.config")

# simulate DIR N LOG: one run of the program under the simulator configured in DIR.
simulate() {
  local dir=$1 n=$2 log=$3
  # No positional arguments into the sourced script: GPGPU-Sim's setup_environment
  # reads a $1 as its build type.
  # shellcheck source=/dev/null  # the simulator's, outside the project
  (set -- && set +u && source "$SIM/env118.sh" && cd "$dir" &&
     timeout "$TIMEOUT" nice -n 10 stdbuf -o0 "$BIN" "$n" "$SCRUB" "$STAGES" >"$log" 2>&1)
}
checks() { grep -a '^sim_perf: check' "$1" || true; }

for n in $SIZES; do
  log=$LOGS/sim_perf_$n.log
  ref=$LOGS/functional_$n.log
  check=skipped
  if [[ $CHECK == 1 ]]; then
    echo "== N = $n tokens, functional mode (the reference for the check): $ref"
    simulate "$FUNC" "$n" "$ref" || die "the functional run failed: $(tail -3 "$ref" | tr '\n' ' ')"
  fi
  echo "== N = $n tokens, performance mode (limit ${TIMEOUT}s): $log"
  start=$(date +%s)
  rc=0
  simulate "$CFG" "$n" "$log" || rc=$?
  seconds=$(( $(date +%s) - start ))
  if [[ $CHECK == 1 ]]; then
    check=DIFFERENT
    if [[ -n $(checks "$log") ]] && diff <(checks "$ref") <(checks "$log") >/dev/null; then check=same; fi
  fi
  # tree: the commit the program was built from (-dirty: with uncommitted changes), so that sizes run
  # at different times say which kernels they measured.
  printf 'rc=%s seconds=%s date=%s check=%s tree=%s command=%s\n' "$rc" "$seconds" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
    "$check" "$(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo unknown)" \
    "GPU=$GPU SIZES=$n STAGES=$STAGES bench/gpu_sim_perf.sh" >"$log.exit"
  grep -a -q 'GPGPU-Sim' "$log" || echo "   NOT SIMULATED: GPGPU-Sim's libcudart was not loaded"
  case $rc in
    0) echo "   done in ${seconds}s; results against the functional run: $check" ;;
    124) echo "   timed out after ${TIMEOUT}s (the log keeps the kernels that finished)" ;;
    *) echo "   exit $rc after ${seconds}s: $(tail -3 "$log" | tr '\n' ' ')" ;;
  esac
  if [[ $check == DIFFERENT ]]; then
    echo "   the performance-mode run computed something other than the functional one:"
    diff <(checks "$ref") <(checks "$log") | sed 's/^/     /' || true
  fi
done

shopt -s nullglob
logs=("$LOGS"/sim_perf_*.log)
((${#logs[@]})) || die "no logs in $LOGS"
python3 "$ROOT/bench/gpu_sim_perf.py" "${logs[@]}" --config "$CFG/gpgpusim.config" --simulator "$SIM" \
  --commit "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)" --out "$OUT"
python3 "$ROOT/tools/report/gpu_sim_perf.py" "$OUT"
