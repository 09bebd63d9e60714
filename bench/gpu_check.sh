#!/usr/bin/env bash
# bench/gpu_check.sh: on a machine with an NVIDIA GPU, build flashcache for
# sm_90, run the GPU tests (plus compute-sanitizer memcheck / racecheck /
# synccheck / initcheck on chosen filters), run the GPU benchmarks with the
# device's copy bandwidth (JSON under ${OUT:-bench/results}), the static
# report, and print a short table. Meant to finish in about 5 minutes on 16 cores.
#
#   bench/gpu_check.sh                 # on the GPU machine, from anywhere
#   bench/gpu_check.sh --prepare-deps  # HERE, on a machine that has them:
#                                      # copy Eigen, GTest, Google Benchmark
#                                      # into .deps/ so that they travel along
#
# The GPU machine may lack Eigen, GTest and Google Benchmark (nothing can be
# installed there). The script looks for them in ${FLASHCACHE_DEPS:-.deps}
# (a relocatable prefix, see --prepare-deps) and, failing a CMake configure,
# builds with nvcc directly whatever needs only the CUDA toolkit (the GPU
# benchmarks and the example) plus the tests if the GTest/Eigen headers are
# in the deps prefix. A prebuilt build folder can be given with
# FLASHCACHE_PREBUILT=dir (its tests/gpu/test_gpu_* and bench/gpu/test_gpu_decode are then run as they are).
#
# Environment: OUT (results folder), JOBS (default 16), FLASHCACHE_DEPS,
# FLASHCACHE_PREBUILT, FLASHCACHE_BUILD (build folder, default build-gpu-check).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEPS=${FLASHCACHE_DEPS:-$ROOT/.deps}
OUT_DIR=${OUT:-$ROOT/bench/results}
BUILD=${FLASHCACHE_BUILD:-$ROOT/build-gpu-check}
JOBS=${JOBS:-16}
START=$(date +%s)

elapsed() { echo $(( $(date +%s) - START )); }
say() { printf '\n== [%4ss] %s\n' "$(elapsed)" "$*"; }

# ---- --prepare-deps: run on a machine with the packages installed ----------
if [[ "${1:-}" == "--prepare-deps" ]]; then
  dest=${2:-$DEPS}
  arch_lib=/usr/lib/x86_64-linux-gnu
  mkdir -p "$dest/include" "$dest/share" "$dest/lib/x86_64-linux-gnu/cmake"
  cp -r /usr/include/eigen3 "$dest/include/" && mkdir -p "$dest/share/eigen3" &&
    cp -r /usr/share/eigen3/cmake "$dest/share/eigen3/" || echo "Eigen3 not found"
  for pkg in gtest gmock benchmark; do
    [[ -d /usr/include/$pkg ]] && cp -r /usr/include/$pkg "$dest/include/"
  done
  cp -a "$arch_lib"/libgtest*.a "$arch_lib"/libgmock*.a "$dest/lib/x86_64-linux-gnu/" 2>/dev/null || echo "GTest libraries not found"
  cp -a "$arch_lib"/libbenchmark* "$dest/lib/x86_64-linux-gnu/" 2>/dev/null || echo "Google Benchmark not found"
  for cfg in GTest benchmark; do
    [[ -d $arch_lib/cmake/$cfg ]] && cp -r "$arch_lib/cmake/$cfg" "$dest/lib/x86_64-linux-gnu/cmake/"
  done
  du -sh "$dest"
  echo "Prepared $dest. It travels with the working tree when it is not git-ignored;"
  echo "otherwise pass it in the device call's 'carry' list."
  exit 0
fi

mkdir -p "$OUT_DIR"
LOG=$OUT_DIR/gpu_check.log
: >"$LOG"
declare -A RESULT
SANITIZED=()  # the compute-sanitizer runs, in their order, for the table

say "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$LOG" || true
nvcc --version 2>&1 | tail -2 | tee -a "$LOG" || true
export LD_LIBRARY_PATH="$DEPS/lib/x86_64-linux-gnu:$DEPS/lib:${LD_LIBRARY_PATH:-}"

# ---- build -----------------------------------------------------------------------
BIN=""         # folder with tests/gpu, bench/gpu, examples/cuda binaries
TESTS_BUILT=0
# shellcheck source=bench/gpu/gpu_tests.sh
source "$ROOT/bench/gpu/gpu_tests.sh"  # FLASHCACHE_GPU_TESTS, gpu_test_bin, gpu_test_sources
test_bin() { gpu_test_bin "$BIN" "$1"; }
if [[ -n "${FLASHCACHE_PREBUILT:-}" ]]; then
  BIN=$FLASHCACHE_PREBUILT
  TESTS_BUILT=1
  RESULT[build]="prebuilt ($BIN)"
else
  say "configure (CMake, sm_90)"
  if timeout 120 cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DCMAKE_PREFIX_PATH="$DEPS" -DFLASHCACHE_BUILD_CLI=OFF >>"$LOG" 2>&1; then
    say "build (-j$JOBS)"
    gpu_targets="$(for t in $FLASHCACHE_GPU_TESTS; do printf 'test_gpu_%s ' "$t"; done)flashcache_bench_gpu flashcache_cuda_example"
    if timeout 360 cmake --build "$BUILD" -j"$JOBS" >>"$LOG" 2>&1; then
      RESULT[build]="cmake: everything"
    elif timeout 240 cmake --build "$BUILD" -j"$JOBS" --target $gpu_targets >>"$LOG" 2>&1; then
      RESULT[build]="cmake: GPU targets only (the full build failed, see log)"
    else
      RESULT[build]="FAILED (see $LOG)"
    fi
    BIN=$BUILD
    [[ -x $BUILD/tests/gpu/test_gpu_score ]] && TESTS_BUILT=1
  else
    say "configure failed (missing Eigen/GTest/benchmark?): building with nvcc directly"
    BIN=$BUILD/direct
    mkdir -p "$BIN/tests/gpu" "$BIN/bench/gpu" "$BIN/examples/cuda"
    NVCC=(nvcc -std=c++17 -O3 -arch=sm_90 --expt-relaxed-constexpr -diag-suppress=177 -I"$ROOT/include" -I"$ROOT/kernels")
    pids=()
    "${NVCC[@]}" "$ROOT/bench/gpu/bench_gpu.cu" -o "$BIN/bench/gpu/flashcache_bench_gpu" -lcufft >>"$LOG" 2>&1 & pids+=($!)
    "${NVCC[@]}" "$ROOT/examples/cuda/compress_gpu.cu" -o "$BIN/examples/cuda/flashcache_cuda_example" -lcufft >>"$LOG" 2>&1 & pids+=($!)
    if [[ -d $DEPS/include/gtest && -d $DEPS/include/eigen3 ]]; then
      GTEST_NVCC=("${NVCC[@]}" -I"$ROOT/tests" -I"$DEPS/include" -I"$DEPS/include/eigen3")
      # The runners (each the whole pipeline for one element type) once, then every binary.
      "${GTEST_NVCC[@]}" -c "$ROOT/tests/gpu/runners.cu" -o "$BIN/tests/gpu/runners.o" >>"$LOG" 2>&1 ||
        echo "the GPU tests' runners did not build (see $LOG)" | tee -a "$LOG"
      for t in $FLASHCACHE_GPU_TESTS; do
        read -r -a src <<<"$(gpu_test_sources "$ROOT" "$t")"
        gpu_test_needs_runners "$t" && src+=("$BIN/tests/gpu/runners.o")
        "${GTEST_NVCC[@]}" "${src[@]}" \
          -o "$(test_bin "$t")" -L"$DEPS/lib/x86_64-linux-gnu" -lgtest_main -lgtest -lcufft -lpthread \
          >>"$LOG" 2>&1 & pids+=($!)
      done
      TESTS_BUILT=1
    else
      echo "GTest/Eigen headers not in $DEPS: the GPU tests cannot be built here (run --prepare-deps where they exist)" | tee -a "$LOG"
    fi
    failed=0
    for p in "${pids[@]}"; do wait "$p" || failed=1; done
    RESULT[build]=$([[ $failed == 0 ]] && echo "nvcc direct" || echo "nvcc direct, with FAILURES (see log)")
  fi
fi
echo "build: ${RESULT[build]}"

# ---- GPU tests -------------------------------------------------------------------------
if [[ $TESTS_BUILT == 1 ]]; then
  say "GPU tests"
  pass=0; fail=0
  for t in $FLASHCACHE_GPU_TESTS; do
    exe=$(test_bin "$t")
    if [[ ! -x $exe ]]; then echo "missing $exe"; fail=$((fail + 1)); continue; fi
    if timeout 240 "$exe" --gtest_brief=1 --gtest_output="json:$OUT_DIR/gpu_tests_$t.json" >>"$LOG" 2>&1; then
      pass=$((pass + 1)); echo "  test_gpu_$t: passed"
    else
      fail=$((fail + 1)); echo "  test_gpu_$t: FAILED (see $LOG)"
    fi
  done
  RESULT[tests]="$pass executables passed, $fail failed"
else
  RESULT[tests]="not built"
fi

# ---- compute-sanitizer ----------------------------------------------------------------
# memcheck, racecheck, synccheck and initcheck over the NaN placements (the
# blocked kernel's deferred blocks and the edges scan), the global path,
# paging with compaction, device-side refusals and graph capture.
if command -v compute-sanitizer >/dev/null && [[ -x $BIN/tests/gpu/test_gpu_score ]]; then
  if (( $(elapsed) < 330 )); then
    say "compute-sanitizer"
    nan_rows="*/f32.NonFiniteRowsAtBlockStartsMatchTheCpu"
    for spec in "memcheck|score|*/bf16.GlobalScoresAwkwardLengths:$nan_rows:GpuGlobalTransform.ZeroLength*" \
                "memcheck|select|*/bf16.BudgetsNoneAllAndCounts" \
                "memcheck|compact_paged|*/bf16.PagedCachesCompactInPlace:GpuPagedChecks.*" \
                "memcheck|compress|*/bf16.CapturesInACudaGraph" \
                "racecheck|score|*/bf16.GlobalScoresAwkwardLengths:$nan_rows" \
                "racecheck|select|*/bf16.BudgetsNoneAllAndCounts" \
                "synccheck|score|$nan_rows" \
                "synccheck|compact_paged|*/bf16.PagedCachesCompactInPlace" \
                "initcheck|score|*/bf16.GlobalScoresAwkwardLengths:$nan_rows:GpuGlobalTransform.ZeroLength*" \
                "initcheck|select|*/bf16.BudgetsNoneAllAndCounts" \
                "memcheck|query_tails|GpuQueryTails.*" "racecheck|query_tails|GpuQueryTails.*"; do
      IFS='|' read -r tool which filter <<<"$spec"
      exe=$(test_bin "$which")
      key=${tool}_$which
      SANITIZED+=("$key")
      [[ -x $exe ]] || { RESULT[$key]="no test_gpu_$which"; continue; }
      if timeout 150 compute-sanitizer --tool "$tool" --error-exitcode 99 "$exe" --gtest_filter="$filter" \
          >"$OUT_DIR/sanitizer_$key.log" 2>&1; then
        RESULT[$key]="clean"
      else
        RESULT[$key]="ISSUES or timeout (exit $?, see sanitizer_$key.log)"
      fi
      echo "  $tool on $which: ${RESULT[$key]}"
    done
  else
    RESULT[sanitizers]="skipped (time)"
  fi
else
  RESULT[sanitizers]="skipped (no compute-sanitizer or no test binary)"
fi
# The decode-attention baseline (bench/gpu/decode_attention.cuh) on its smaller cases.
if command -v compute-sanitizer >/dev/null && [[ -x $(test_bin decode) ]]; then
  if (( $(elapsed) < 400 )); then
    exe=$(test_bin decode)
    for spec in "memcheck:*_n7:*_n257:GpuDecodeEdges.*" "racecheck:*_d128_g7_*:GpuDecodeEdges.NoTokens*"; do
      tool=${spec%%:*}; filter=${spec#*:}
      if timeout 90 compute-sanitizer --tool "$tool" --error-exitcode 99 "$exe" --gtest_filter="$filter" \
          >"$OUT_DIR/sanitizer_decode_$tool.log" 2>&1; then
        RESULT[decode_$tool]="clean"
      else
        RESULT[decode_$tool]="ISSUES or timeout (exit $?, see sanitizer_decode_$tool.log)"
      fi
      echo "  decode $tool: ${RESULT[decode_$tool]}"
    done
  else
    RESULT[decode_memcheck]="skipped (time)"
  fi
fi

# ---- example ---------------------------------------------------------------------------
if [[ -x $BIN/examples/cuda/flashcache_cuda_example ]]; then
  say "example"
  timeout 60 "$BIN/examples/cuda/flashcache_cuda_example" 2>&1 | tee -a "$LOG" | head -8
  RESULT[example]=$([[ ${PIPESTATUS[0]} == 0 ]] && echo ok || echo FAILED)
fi

# ---- benchmarks ------------------------------------------------------------------------
JSON=$OUT_DIR/gpu_bench.json
if [[ -x $BIN/bench/gpu/flashcache_bench_gpu ]]; then
  say "benchmarks"
  if timeout 180 "$BIN/bench/gpu/flashcache_bench_gpu" "$JSON" >>"$LOG" 2>&1; then RESULT[bench]="ok"; else RESULT[bench]="FAILED (see log)"; fi
else
  RESULT[bench]="not built"
fi

# ---- static report (registers, spills, SASS; the same as CI's) ---------------------------
if (( $(elapsed) < 480 )); then
  say "static report"
  if timeout 240 "$ROOT/bench/gpu/static_report.sh" --out "$OUT_DIR/static_sm90.json" --work "$BUILD/static" >>"$LOG" 2>&1; then
    RESULT[static]="ok ($OUT_DIR/static_sm90.json)"
  else
    RESULT[static]="FAILED or timeout (see log)"
  fi
fi

# ---- table ---------------------------------------------------------------------------
say "summary"
for key in build tests sanitizers "${SANITIZED[@]}" decode_memcheck decode_racecheck example bench static; do
  [[ -n "${RESULT[$key]:-}" ]] && printf '  %-24s %s\n' "$key" "${RESULT[$key]}"
done
if [[ -s $JSON ]]; then
  python3 - "$JSON" <<'PY' || cat "$JSON"
import json, sys
runs = json.load(open(sys.argv[1]))["benchmarks"]
by = {}
for r in runs:
    name, tokens = r["name"].rsplit("/", 1)
    by[(name, int(tokens))] = r
print(f"\n  {'benchmark':<18}{'tokens':>8}{'ms':>10}{'GB moved':>10}{'GB/s':>9}{'% copy':>8}")
for (name, tokens), r in sorted(by.items(), key=lambda x: (x[0][1], x[0][0])):
    if name.startswith("decode_attention/"):
        continue  # their own table below
    copy = by.get(("memcpy_d2d", tokens))
    pct = 100 * r["bytes_per_second"] / copy["bytes_per_second"] if copy else float("nan")
    print(f"  {name:<18}{tokens:>8}{r['real_time']:>10.3f}{r['bytes']/1e9:>10.3f}{r['bytes_per_second']/1e9:>9.0f}{pct:>7.0f}%")
def ms(name, n):
    return by[(name, n)]["real_time"] if (name, n) in by else None
checks = []
b8, b64, g8, g64 = ms("compress_blocked", 8192), ms("compress_blocked", 65536), ms("compress_global", 8192), ms("compress_global", 65536)
if b8 is not None: checks.append(("blocked 8K <= 0.5 ms", b8 <= 0.5, f"{b8:.3f} ms"))
if b64 is not None and ("memcpy_d2d", 65536) in by:
    pct = 100 * by[("compress_blocked", 65536)]["bytes_per_second"] / by[("memcpy_d2d", 65536)]["bytes_per_second"]
    checks.append(("blocked 64K >= 60% of copy", pct >= 60, f"{pct:.0f}%"))
for n, b, g in ((8192, b8, g8), (65536, b64, g64)):
    if b and g: checks.append((f"global <= 3x blocked ({n})", g <= 3 * b, f"{g / b:.2f}x"))
# Decode attention: the attention step alone, full cache vs compressed (same run).
decode = sorted((r for r in runs if r["name"].startswith("decode_attention/")),
                key=lambda r: (r["batch"], r["tokens"], -r["keep_ratio"]))
if decode:
    copy64 = by.get(("memcpy_d2d", 65536))
    print("\n  decode attention, one Qwen2.5-VL-7B layer (28 q / 4 KV heads, d 128, bf16), split-K baseline")
    print(f"  {'batch':>5}{'tokens':>7}{'keep':>6}{'kept':>7}{'splits':>7}{'ms':>9}{'KV MB':>8}{'GB/s':>7}"
          f"{'% copy':>7}{'speed-up':>9}{'MB saved':>9}")
    for r in decode:
        gbs = r["bytes_per_second"] / 1e9
        pct = 100 * r["bytes_per_second"] / copy64["bytes_per_second"] if copy64 else float("nan")
        sp = r.get("speedup_vs_full")
        print(f"  {r['batch']:>5}{r['tokens']:>7}{r['keep_ratio']:>6.2g}{r['kept_tokens']:>7}{r['splits']:>7}"
              f"{r['real_time']:>9.4f}{r['kv_bytes']/1e6:>8.1f}{gbs:>7.0f}{pct:>6.0f}%"
              f"{(f'{sp:.2f}x' if sp is not None else 'n/a'):>9}{r['kv_bytes_saved']/1e6:>9.1f}")
    target = [r for r in decode if r["batch"] == 16 and r["tokens"] == 32768 and r["keep_ratio"] == 0.2]
    sp = target[0].get("speedup_vs_full") if target else None
    if sp is not None:
        checks.append(("decode 0.2/32K/b16 >= 3x full", sp >= 3, f"{sp:.2f}x"))
    else:
        checks.append(("decode 0.2/32K/b16 >= 3x full", False, "not measured"))
print("\n  targets")
for what, ok, value in checks:
    print(f"  {'met ' if ok else 'MISS'} {what:<30} {value}")
PY
fi
echo
echo "done in $(elapsed) s; log: $LOG, results: $OUT_DIR"
