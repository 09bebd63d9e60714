#!/usr/bin/env bash
# The 2D-grid evaluation (image spans scored as 2D grids), from a checkout with the caches made:
#   1. builds grid_eval (CPU only) in build-grid-eval/;
#   2. makes the ViT caches if they are missing (tools/extract/make_grid_caches.py, the
#      split of bench/quality/grid_split.json) unless SKIP_CACHES=1;
#   3. dev: sweeps the 2D low-pass zone (rectangle, triangle) x base share (0, 1/4, 1/2, 3/4),
#      writes the sweep and the choice into bench/results/quality_grid.json;
#   4. held-out: once, with the dev choice read from that file;
#   5. prints the markdown section and writes bench/results/quality_grid.png
#      (tools/report/quality_grid.py).
# About 3 minutes on one core (single process). Environment: BUILD_DIR (default
# build-grid-eval), CACHES (default build-grid/caches), OUT (default
# bench/results/quality_grid.json), JOBS (build jobs, default 2), SKIP_CACHES=1.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
BUILD_DIR="${BUILD_DIR:-build-grid-eval}"
CACHES="${CACHES:-build-grid/caches}"
OUT="${OUT:-bench/results/quality_grid.json}"
JOBS="${JOBS:-2}"

cmake -S bench/quality -B "$BUILD_DIR" -DFLASHCACHE_CUDA=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j"$JOBS" --target grid_eval

if [ ! -f "$CACHES/index.json" ]; then
  if [ "${SKIP_CACHES:-0}" = 1 ]; then
    echo "run_grid.sh: no $CACHES/index.json (make it with tools/extract/make_grid_caches.py)" >&2
    exit 1
  fi
  python3 tools/extract/make_grid_caches.py --split bench/quality/grid_split.json --out "$CACHES"
fi

start=$(date +%s)
# Dev: every choice is made here, before the held-out entries are read.
"$BUILD_DIR"/grid_eval --caches "$CACHES" --split dev --sweep --out "$OUT"
# Held-out: once, with the zone and base share of the dev choice in $OUT.
"$BUILD_DIR"/grid_eval --caches "$CACHES" --split heldout --out "$OUT"
echo "run_grid.sh: dev + held-out in $(( $(date +%s) - start )) s"

python3 tools/report/quality_grid.py --json "$OUT" --plot "$(dirname "$OUT")/quality_grid.png"
