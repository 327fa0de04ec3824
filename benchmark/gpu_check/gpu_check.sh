#!/usr/bin/env bash
# One prepared GPU check for the KV page-epoch kernels (run on a CUDA machine, e.g. through the device tool):
#   1. build vradix._C in place for the local GPU (sm_90 by default) with that machine's CUDA torch;
#   2. run the kernel tests on CUDA: the CUDA extension, Triton and the torch reference must agree;
#   3. run benchmark/kernels/bench_kernels.py (bandwidth vs peak, verify vs attention);
#   4. the same for the weight fingerprint: test/kernels/test_fingerprint.py on CUDA, then
#      benchmark/kernels/bench_fingerprint.py, and the layout-invariant identity's cost per TP rank on the GPU
#      (benchmark/kernels/bench_identity.py --device cuda).
# Needs only torch + triton + nvcc + pytest (no sglang). Writes logs to ${OUT:-build/gpu_check}.
source "$(dirname "$0")/cuda_env.sh"
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  "$PY" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  START=$(date +%s)
  build_extension
  echo "[gpu_check] extension built (or found) in $(( $(date +%s) - START )) s"
  "$PY" -c "from vradix import kernels; import torch; print('[gpu_check] cuda ext:', kernels.cuda_ext() is not None, 'impl for cuda tensors:', kernels.impl_for(torch.zeros(1, device='cuda')))"
  "$PY" -m pytest --noconftest -q -p no:cacheprovider test/kernels/test_kernels.py
  "$PY" benchmark/kernels/bench_kernels.py --json "$OUT/bench_kernels.json"
  "$PY" -m pytest --noconftest -q -p no:cacheprovider test/kernels/test_fingerprint.py
  "$PY" benchmark/kernels/bench_fingerprint.py --mib 4096 --cpu-mib 64 --json "$OUT/bench_fingerprint.json"
  "$PY" benchmark/kernels/bench_identity.py --device cuda --mib 4096 --tensors 288 --json "$OUT/bench_identity.json"
} 2>&1 | tee "$OUT/gpu_check.log"
