#!/usr/bin/env bash
# Compile csrc/ into vradix._C with the venv's CUDA torch (compile check on CPU machines; the real build on GPU ones).
# Usage: scripts/build_csrc.sh [OUT_DIR]   (default build/csrc-sm90; TORCH_CUDA_ARCH_LIST defaults to 9.0)
# Cached: skips the compile when csrc/ and setup.py are unchanged since the last successful build into OUT_DIR.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-$ROOT/build/csrc-sm90}"
PY="${PY:-$ROOT/.venv/bin/python}"
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
if [ -z "${CUDA_HOME:-}" ]; then
  for c in /usr/local/cuda "$(dirname "$(dirname "$(readlink -f "$(command -v nvcc || echo /nonexistent)")")")"; do
    if [ -x "$c/bin/nvcc" ] && [ -d "$c/include" ] && [ -f "$c/include/cuda_runtime.h" ]; then export CUDA_HOME="$c"; break; fi
  done
  [ -n "${CUDA_HOME:-}" ] || { echo "[csrc] no CUDA toolkit found (nvcc + include/): set CUDA_HOME" >&2; exit 2; }
fi
KEY="$(cat "$ROOT"/csrc/* "$ROOT/setup.py" | sha256sum | cut -c1-16)-$TORCH_CUDA_ARCH_LIST"
if [ -f "$OUT/.stamp" ] && [ "$(cat "$OUT/.stamp")" = "$KEY" ] && ls "$OUT"/vradix/_C*.so >/dev/null 2>&1; then
  echo "[csrc] up to date: $(ls "$OUT"/vradix/_C*.so)"; exit 0
fi
mkdir -p "$OUT"
echo "[csrc] compiling csrc/ for sm_${TORCH_CUDA_ARCH_LIST/./} with CUDA_HOME=$CUDA_HOME (a few minutes)"
cd "$ROOT"
START=$(date +%s)
VRADIX_BUILD_CUDA=1 MAX_JOBS="${MAX_JOBS:-2}" "$PY" setup.py -q build_ext --build-lib "$OUT" --build-temp "$OUT/tmp"
rm -rf "$OUT/tmp" build/lib* 2>/dev/null || true
echo "$KEY" > "$OUT/.stamp"
echo "[csrc] built $(ls "$OUT"/vradix/_C*.so) in $(( $(date +%s) - START )) s"
