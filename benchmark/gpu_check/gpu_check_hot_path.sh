#!/usr/bin/env bash
# One prepared GPU check for the hot path (run on a CUDA machine, e.g. through the device tool; no SGLang needed):
#   1. build vradix._C in place for the local GPU (sm_90 by default) with that machine's CUDA torch, if not built;
#   2. benchmark/gpu_check/gpu_check_hot_path.py: what vradix adds to a scheduler iteration on the device (the
#      backstop's gather/compare, the ledger stamp, frees) under torch.cuda.set_sync_debug_mode("error") for every
#      kernel implementation, each verdict read at its result and checked against the host; then their timings
#      against the HBM bound.
# Needs only torch + triton + nvcc. Writes logs to ${OUT:-build/gpu_check}. About a minute after the build.
source "$(dirname "$0")/cuda_env.sh"
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  build_extension
  "$PY" benchmark/gpu_check/gpu_check_hot_path.py --json "$OUT/gpu_check_hot_path.json" "$@"
} 2>&1 | tee "$OUT/gpu_check_hot_path.log"
