#!/usr/bin/env bash
# What one compression costs inside llama.cpp (SmolLM2-135M, f16 cache, keep 0.2, the
# library's defaults), split into read, score, select and write, against llama.cpp's prefill of
# the same prompt at the same thread count (1 and 2), at 2,048, 3,678, 4,099 (prime), 8,191
# (prime), 8,192 and 16,384 tokens, through bench/llama_cpp/bench.sh. Each length is prefilled
# at each thread count; the compression runs twice on the restored state with one compressor: the
# first call grows its buffers (a one-shot call after a prefill), the second is warm (a long
# chat's later events). Writes bench/results/llama_cost.json, then bench/RESULTS.md. Run it on an
# otherwise idle machine: about 40 minutes on 2 cores.
#   bench/run_llama_cost.sh [build dir, default build-llama] [more flashcache_llama_bench options]
set -euo pipefail
cd "$(dirname "$0")/.."
notes="read_ms: llama_state_seq_get_data, parse and checks; score_ms: every layer's score (its rows converted"
notes+=" to float in position order) on the context's threads; select_ms: one keep-set over all layers;"
notes+=" write_ms: the kept cells' blob, llama_memory_seq_rm, llama_state_seq_set_data and the checks after it;"
notes+=" the share is compress_ms / prefill_ms at the same thread count; repeat 0 is a new compressor's first call"
notes+=" (cold buffers), repeat 1 its second on the same state (warm)"
LLAMA_BENCH_OUT=bench/results/llama_cost.json LLAMA_BENCH_NOTES="$notes" \
  LLAMA_BENCH_COMMAND="bench/run_llama_cost.sh $*" \
  bench/llama_cpp/bench.sh "${1:-build-llama}" --lengths 2048,3678,4099,8191,8192,16384 --threads 1,2 \
  --keeps 0.2 --decode 0 --repeat 2 "${@:2}"
python3 tools/report/make_results.py
echo "wrote bench/results/llama_cost.json and bench/RESULTS.md"
