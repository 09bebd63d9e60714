#!/usr/bin/env bash
# Decode speed of flashcache_engine with the full and the compressed KV cache:
# prompts of 2K, 4K and 8K tokens, keep 0.2 and 0.1, 1 and 2 threads.
# Writes bench/results/engine.json (render it with tools/report/engine.py).
#   examples/engine/bench.sh [build dir, default build-engine] [extra flashcache_engine_bench options]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-engine}
shift || true
cmake -S . -B "$build" -DFLASHCACHE_CUDA=OFF >/dev/null
cmake --build "$build" -j2 --target flashcache_engine_bench >/dev/null
# The prompt: the project's own prose (English text, code and tables), repeated to length.
prompt=$(mktemp)
trap 'rm -f "$prompt" "$prompt.json"' EXIT
cat README.md tools/extract/README.md include/flashcache/cuda/README.md > "$prompt"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
"$build"/examples/engine/flashcache_engine_bench --prompt-file "$prompt" "$@" > "$prompt.json"
python3 - "$prompt.json" "$load_before" "$*" <<'PY'
import datetime, json, os, platform, sys
doc = json.load(open(sys.argv[1]))
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
doc["machine"] = {"cpus": os.cpu_count(), "cpu": cpu, "system": platform.platform(),
                  "loadavg_before": sys.argv[2], "loadavg_after": " ".join(open("/proc/loadavg").read().split()[:3])}
doc["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
doc["command"] = ("examples/engine/bench.sh " + sys.argv[3]).strip()
doc["prompt_source"] = "README.md + tools/extract/README.md + include/flashcache/cuda/README.md, tokens repeated to length"
os.makedirs("bench/results", exist_ok=True)
with open("bench/results/engine.json", "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
print("wrote bench/results/engine.json")
PY
