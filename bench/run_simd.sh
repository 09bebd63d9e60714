#!/usr/bin/env bash
# The chosen score's per-layer cost (awkward lengths and SIMD): one SmolLM2 layer's query tails
# and query-free score at smooth and awkward prompt lengths (bench_cpu's BM_QueryTail and
# BM_ScoreSmolLayer, beside BM_CopySmolLayer: a copy of the same bytes), from the generic x86-64
# build and from FLASHCACHE_NATIVE=ON, in one run (the two builds one after the other), into
# bench/results/cpu_simd.json; then bench/RESULTS.md.
# Run it on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
filter='BM_QueryTail|BM_ScoreSmolLayer|BM_CopySmolLayer'
flags=(-DFLASHCACHE_CUDA=OFF -DFLASHCACHE_BUILD_TESTS=OFF -DFLASHCACHE_BUILD_EXAMPLES=OFF -DFLASHCACHE_BUILD_CLI=OFF)
cmake -S . -B build-simd-generic "${flags[@]}" -DFLASHCACHE_NATIVE=OFF >/dev/null
cmake -S . -B build-simd-native "${flags[@]}" -DFLASHCACHE_NATIVE=ON >/dev/null
cmake --build build-simd-generic -j2 --target bench_cpu
cmake --build build-simd-native -j2 --target bench_cpu
work=$(mktemp -d)
for build in generic native; do
  "build-simd-$build/bench/bench_cpu" --benchmark_filter="$filter" --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true --benchmark_out="$work/$build.json" --benchmark_out_format=json
done
python3 - "$work" <<'PY'
import datetime, json, os, sys
work = sys.argv[1]
doc = {"command": "bench/run_simd.sh", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
       "flags": {"generic": "the compiler's default (x86-64)", "native": "FLASHCACHE_NATIVE=ON: -march=native -mno-avx512f"}}
for build in ("generic", "native"):
    with open(os.path.join(work, build + ".json")) as f:
        doc[build] = json.load(f)
with open("bench/results/cpu_simd.json", "w") as f:
    json.dump(doc, f, indent=1)
PY
rm -rf "$work"
python3 tools/report/make_results.py
echo "wrote bench/results/cpu_simd.json and bench/RESULTS.md"
