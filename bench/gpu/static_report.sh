#!/usr/bin/env bash
# bench/gpu/static_report.sh: a static view of the GPU kernels for sm_90 from
# the compiler alone (no GPU): per kernel instantiation registers, spills,
# static and dynamic shared memory and the CTAs per SM they allow; the SASS
# instructions of the blocked scorer's frequency step; a bytes-and-FLOPs model
# of the Qwen2.5-VL-7B cache at 8K tokens on an H200. Writes JSON
# (bench/gpu/static_report.py says what is in it).
#
#   bench/gpu/static_report.sh [--out FILE] [--work DIR]
#
# Needs nvcc (PATH or /usr/local/cuda/bin) and python3. The SASS comes from
# cuobjdump: the toolkit's, else NVIDIA's PyPI wheel installed once into a
# venv under the work folder; without it the SASS fields are null.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=$ROOT/bench/results/static_sm90.json
WORK=$ROOT/build-static
while (($#)); do
  case $1 in
    --out) OUT=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    *) echo "usage: $0 [--out FILE] [--work DIR]" >&2; exit 2 ;;
  esac
done
case $OUT in /*) ;; *) OUT=$PWD/$OUT ;; esac
mkdir -p "$WORK" "$(dirname "$OUT")"

NVCC=$(command -v nvcc || true)
[[ -z $NVCC && -x /usr/local/cuda/bin/nvcc ]] && NVCC=/usr/local/cuda/bin/nvcc
if [[ -z $NVCC ]]; then echo "static report: nvcc not found" >&2; exit 1; fi
EIGEN=$(pkg-config --cflags-only-I eigen3 2>/dev/null || echo -I/usr/include/eigen3)

echo "static report: compiling every kernel for sm_90 (a few minutes on 2 cores)"
# shellcheck disable=SC2086  # EIGEN is a list of flags
nice -n 19 "$NVCC" -std=c++17 -arch=sm_90 -cubin -O3 --expt-relaxed-constexpr -Xptxas -v \
  -I"$ROOT/include" -I"$ROOT/kernels" $EIGEN "$ROOT/bench/gpu/static_kernels.cu" \
  -o "$WORK/static_kernels.cubin" >"$WORK/ptxas.log" 2>&1 || { tail -20 "$WORK/ptxas.log" >&2; exit 1; }

# cuobjdump -sass runs nvdisasm: both from the toolkit, else both from PyPI.
CUOBJDUMP=$(command -v cuobjdump || true)
[[ -z $CUOBJDUMP && -x $(dirname "$NVCC")/cuobjdump ]] && CUOBJDUMP=$(dirname "$NVCC")/cuobjdump
if [[ -z $CUOBJDUMP ]] || ! { command -v nvdisasm >/dev/null || [[ -x $(dirname "$CUOBJDUMP")/nvdisasm ]]; }; then
  CUOBJDUMP=$(find "$WORK/venv" -name cuobjdump -type f 2>/dev/null | head -1 || true)
  if [[ -z $CUOBJDUMP || ! -x $(dirname "$CUOBJDUMP")/nvdisasm ]]; then
    (python3 -m venv "$WORK/venv" && "$WORK/venv/bin/pip" install -q nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm) >&2 ||
      echo "static report: no cuobjdump/nvdisasm (pip install failed); SASS fields stay null" >&2
    CUOBJDUMP=$(find "$WORK/venv" -name cuobjdump -type f 2>/dev/null | head -1 || true)
  fi
fi
[[ -n $CUOBJDUMP ]] && export PATH="$(dirname "$CUOBJDUMP"):$PATH"
SASS_ARGS=()
if [[ -n $CUOBJDUMP ]] && "$CUOBJDUMP" -sass "$WORK/static_kernels.cubin" >"$WORK/sass.txt" 2>/dev/null; then
  SASS_ARGS=(--sass "$WORK/sass.txt")
fi

python3 "$ROOT/bench/gpu/static_report.py" --ptxas "$WORK/ptxas.log" "${SASS_ARGS[@]}" --out "$OUT" \
  --nvcc-version "$("$NVCC" --version | tail -1)"
