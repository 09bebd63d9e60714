#!/usr/bin/env bash
# Decode speed of llama.cpp (llama-cpp-python 0.3.36's libllama) over the full and the
# FlashCache-compacted KV cache of one sequence: prompts of 2K, 4K and 8K tokens, keep 0.2
# and 0.1, 1 and 2 threads; compression time vs prefill time; KV bytes before and after.
# Each length is prefilled at each thread count and its state restored per configuration.
# Writes bench/results/llama_cpp.json (another file, its notes and its recorded command: LLAMA_BENCH_OUT,
# LLAMA_BENCH_NOTES and LLAMA_BENCH_COMMAND, as bench/run_llama_cost.sh sets them).
#   bench/llama_cpp/bench.sh [build dir, default build-llama] [flashcache_llama_bench options,
#                            e.g. --lengths 2048,8192 --threads 2 --decode 32]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-llama}
shift || true
cmake -S . -B "$build" -DFLASHCACHE_CUDA=OFF >/dev/null
cmake --build "$build" -j2 --target flashcache_llama_bench >/dev/null
llama_build="pip install llama-cpp-python==0.3.36 (CMAKE_ARGS=-DLLAVA_BUILD=OFF): Release, GGML_NATIVE=ON"
llama_build+=" (-march=native), CPU backend only, OpenMP; run with use_extra_bufts=false (no repacking/AMX: the AMX"
llama_build+=" kernels GGML_NATIVE picks die with SIGILL in this VM); f16 K and V cache, flash attention auto (on"
llama_build+=" for the CPU)"
out=${LLAMA_BENCH_OUT:-bench/results/llama_cpp.json}
notes="n_kv_after is derived from llama.cpp's own log (LLAMA_KV_CACHE_DEBUG=1: the highest used cell + 1 at"
notes+=" the first decode step's slot search) padded to 256; cells_after are cells of the sequence after"
notes+=" compaction; keep_ratio 1 is the full cache; compress_ms covers get_data, parse, score, select,"
notes+=" write, seq_rm, set_data and verification"
bench/run_prose_bench.py --program "$build"/bench/llama_cpp/flashcache_llama_bench \
  --out "$out" --command "${LLAMA_BENCH_COMMAND:-bench/llama_cpp/bench.sh $*}" \
  --field "llama_build=$llama_build" --field "notes=${LLAMA_BENCH_NOTES:-$notes}" \
  -- "$@"
python3 - "$out" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
for r in doc["runs"]:
    print("{prompt_tokens:5d} tokens, {threads} threads, keep {keep_ratio:4}: cells {cells_before}->{cells_after}, "
          "n_kv {n_kv_after}, prefill {prefill_ms:.0f} ms, compress {compress_ms:.0f} ms, "
          "decode {decode_tokens_per_s:.2f} tok/s".format(**r))
PY
