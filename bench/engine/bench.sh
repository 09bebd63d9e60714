#!/usr/bin/env bash
# Decode speed of flashcache_engine with the full and the compressed KV cache:
# prompts of 2K, 4K and 8K tokens, keep 0.2 and 0.1, 1 and 2 threads.
# Writes bench/results/engine.json (render it with tools/report/engine.py).
#   bench/engine/bench.sh [build dir, default build-engine] [extra flashcache_engine_bench options]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-engine}
shift || true
cmake -S . -B "$build" -DFLASHCACHE_CUDA=OFF >/dev/null
cmake --build "$build" -j2 --target flashcache_engine_bench >/dev/null
bench/run_prose_bench.py --program "$build"/bench/engine/flashcache_engine_bench --out bench/results/engine.json \
  --command "bench/engine/bench.sh $*" -- "$@"
