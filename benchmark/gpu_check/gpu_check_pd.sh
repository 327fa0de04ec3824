#!/usr/bin/env bash
# One prepared GPU check for P/D disaggregation (run on a CUDA node, e.g. through the device tool), covering what the
# CPU suite cannot: a hybrid (Mamba2) model's P/D transfer and decode L3 restore with SGLang's CUDA/Triton kernels,
# and DCP decode with L3 (needs 2 GPUs; reported as SKIP on one). The checks: benchmark/gpu_check/gpu_check_pd.py.
# Needs sglang 0.5.23 (CUDA torch), sglang-vradix installed, mooncake-transfer-engine (CUDA build) and smg; the node
# needs no registry access. Prints one PASS/FAIL/SKIP line per check; writes logs to ${OUT:-build/gpu_check_pd}.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-build/gpu_check_pd}"; mkdir -p "$OUT"
PY="${PY:-python3}"
unset VRADIX_DISABLE TRITON_INTERPRET SGLANG_USE_CPU_ENGINE
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  "$PY" -c "import sglang, torch, vradix; print('sglang', sglang.__version__, 'torch', torch.__version__, 'vradix', vradix.__version__)"
  "$PY" -c "import mooncake, smg" || { echo "[gpu_check_pd] FAIL setup: mooncake-transfer-engine and smg are required"; exit 1; }
  "$PY" benchmark/gpu_check/gpu_check_pd.py --out "$OUT" "$@"
} 2>&1 | tee "$OUT/gpu_check_pd.log"
