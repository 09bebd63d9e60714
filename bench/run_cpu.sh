#!/usr/bin/env bash
# Runs the CPU benchmark suite (a few minutes on 2 cores) and regenerates
# bench/RESULTS.md from its JSON. Run it on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
cmake -S . -B build >/dev/null
cmake --build build -j2 --target bench_cpu
build/bench/bench_cpu --benchmark_out=bench/results/cpu.json --benchmark_out_format=json "$@"
python3 tools/report/make_results.py
echo "wrote bench/results/cpu.json and bench/RESULTS.md"
