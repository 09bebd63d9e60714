#!/usr/bin/env bash
# The whole quality evaluation, from a fresh checkout (Debian, root or sudo):
#   1. system packages (tools/install_deps.sh) and the pinned Python packages
#      (tools/extract/requirements*.txt: numpy, the two model packages, matplotlib, ...);
#   2. builds the flashcache CLI and quality_eval (CPU only) in build-quality-eval/;
#   3. quality_eval: attention error of held-out queries + energy below the cutoff
#      on tests/fixtures (about 20 s);
#   4. tools/extract/eval_end_to_end.py: SmolLM2-135M, all 30 layers, NLL of held-out
#      continuations and needle retrieval with the prompt cache compressed by the CLI
#      (about 6 to 10 minutes on 2 cores);
#   5. the plots (bench/results/quality_*.png) and bench/RESULTS.md.
# Writes bench/results/quality.json. Environment: JOBS (build jobs, default 2),
# BUILD_DIR (default build-quality-eval), SKIP_INSTALL=1 (skip steps 1),
# SKIP_RESULTS_MD=1 (do not regenerate bench/RESULTS.md).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
BUILD_DIR="${BUILD_DIR:-build-quality-eval}"
JOBS="${JOBS:-2}"
OUT=bench/results/quality.json

if [ "${SKIP_INSTALL:-0}" != 1 ]; then
  tools/install_deps.sh
  python3 -m pip install -q -r tools/extract/requirements.txt
  python3 -m pip install -q --no-deps -r tools/extract/requirements-nodeps.txt
fi

cmake -S bench/quality -B "$BUILD_DIR" -DFLASHCACHE_CUDA=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j"$JOBS" --target flashcache_cli quality_eval

"$BUILD_DIR"/quality_eval --out "$OUT"
python3 tools/extract/eval_end_to_end.py --cli "$BUILD_DIR"/flashcache/tools/cli/flashcache --out "$OUT"
python3 tools/report/quality.py --json "$OUT" --plots >/dev/null
if [ "${SKIP_RESULTS_MD:-0}" != 1 ]; then
  python3 tools/report/make_results.py
  echo "run.sh: wrote $OUT, bench/results/quality_*.png and bench/RESULTS.md"
else
  echo "run.sh: wrote $OUT and bench/results/quality_*.png"
fi
