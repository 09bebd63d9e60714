#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (FLASHCACHE_FUZZ=ON, in build-fuzz/)
# and runs each for a bounded time from its committed seed corpus. Fails on any
# crash, timeout, leak or sanitizer report; the input that caused it is kept in
# $FUZZ_ARTIFACTS (default build-fuzz/artifacts). Prints, per target,
# executions and coverage (edges) from libFuzzer's final stats.
#
#   tests/fuzz/run_fuzz.sh                      # every target, 60 s each
#   FUZZ_SECONDS=10 tests/fuzz/run_fuzz.sh fuzz_npy
#   FUZZ_JOBS=2 tests/fuzz/run_fuzz.sh          # two targets at a time (each is one process, one core)
#
# Installs clang and its fuzzer runtime from Debian when missing (idempotent).
set -euo pipefail
cd "$(dirname "$0")/../.."

seconds=${FUZZ_SECONDS:-60}
jobs=${FUZZ_JOBS:-1}
build=${FUZZ_BUILD_DIR:-build-fuzz}
artifacts=${FUZZ_ARTIFACTS:-$build/artifacts}
targets=("$@")
((${#targets[@]})) || targets=(fuzz_npy fuzz_cli fuzz_compress fuzz_gguf fuzz_llama_state)

tools/install_deps.sh clang libclang-rt-14-dev  # clang and its fuzzer runtime

# -O1, as OSS-Fuzz builds its targets: quicker to build than -O2, and the sanitizers' checks stay in.
# Debug information is fuzz_options.cmake's (line tables, for every build type).
cmake -S . -B "$build" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLASHCACHE_FUZZ=ON \
      "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -DNDEBUG" \
      -DFLASHCACHE_CUDA=OFF -DFLASHCACHE_BUILD_TESTS=OFF -DFLASHCACHE_BUILD_BENCH=OFF -DFLASHCACHE_BUILD_EXAMPLES=OFF \
      -DFLASHCACHE_PYTHON=OFF >/dev/null
# Every target: one target that depends on them all, so that they compile side by side.
if (($#)); then build_targets=("${targets[@]}"); else build_targets=(flashcache_fuzz_targets); fi
nice -n 19 cmake --build "$build" -j2 --target "${build_targets[@]}"

# Scratch files (the targets' inputs, libFuzzer's new corpus units) in memory when possible.
shm=/dev/shm
[ -d "$shm" ] && [ -w "$shm" ] || shm=${TMPDIR:-/tmp}
work=$(mktemp -d "$shm/flashcache-run-fuzz-XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$artifacts"
artifacts=$(cd "$artifacts" && pwd)  # fuzz_cli changes directory while it runs

# One target: libFuzzer from the seeds for `seconds`; its exit status in $work/$t/rc.
fuzz_one() {
  local t=$1 seeds=tests/fuzz/corpus/$1 extra=() rc=0
  case $t in
    fuzz_npy) extra=(-dict=tests/fuzz/npy.dict -max_len=4096) ;;
    fuzz_cli) extra=(-dict=tests/fuzz/cli.dict -max_len=8192) ;;
    fuzz_compress) extra=(-max_len=1024) ;;
    fuzz_gguf) extra=(-dict=tests/fuzz/gguf.dict -max_len=8192) ;;
    fuzz_llama_state) extra=(-max_len=32768) ;;  # the real seed (1 token, 30 layers) is ~24 KB
  esac
  mkdir -p "$work/$t/corpus" "$work/$t/tmp"
  TMPDIR=$work/$t/tmp nice -n 19 "$build/tests/fuzz/$t" "$work/$t/corpus" "$seeds" "${extra[@]}" \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -close_fd_mask=3 -print_final_stats=1 \
    -artifact_prefix="$artifacts/$t-" >"$work/$t/log" 2>&1 || rc=$?
  echo "$rc" >"$work/$t/rc"
}

for t in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
  fuzz_one "$t" &
done
wait

status=0
for t in "${targets[@]}"; do
  log=$work/$t/log
  rc=$(cat "$work/$t/rc")
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  edges=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  if ((rc != 0)) || grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer|libFuzzer)|runtime error:' "$log"; then
    echo "run_fuzz: $t FAILED (exit $rc); the input is under $artifacts/; log tail:"
    tail -n 40 "$log"
    status=1
  else
    echo "run_fuzz: $t ok: ${runs:-?} executions in ${seconds} s, coverage ${edges:-?} edges"
  fi
done
exit $status
