# Sourced by the kernel-level GPU checks: run from the repository root, logs under ${OUT:-build/gpu_check}, the
# interpreter ${PY:-python3}, vradix from this checkout, Triton compiled (not interpreted), CUDA_HOME found from nvcc,
# and `build_extension`: vradix._C built in place for the local GPU (sm_90 by default) unless it already imports.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT="${OUT:-build/gpu_check}"; mkdir -p "$OUT"
PY="${PY:-python3}"
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" TRITON_INTERPRET=0 PYTHONPATH="$PWD/python"
[ -n "${CUDA_HOME:-}" ] || for c in /usr/local/cuda "$(dirname "$(dirname "$(command -v nvcc)")")"; do
  [ -f "$c/include/cuda_runtime.h" ] && export CUDA_HOME="$c" && break; done

build_extension() {
  "$PY" -c "import vradix._C" 2>/dev/null || VRADIX_BUILD_CUDA=1 MAX_JOBS=16 "$PY" setup.py -q build_ext --inplace
}
