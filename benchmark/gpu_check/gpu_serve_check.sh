#!/usr/bin/env bash
# One prepared GPU check for vradix inside SGLang 0.5.23 (run once per lent session through the device tool, one
# call of at most 8 minutes; docs/gpu-bundle.md). The device machine has CUDA torch and Triton but no SGLang and no
# registry, so the runtime is carried: `make gpu-bundle` here, then carry build/gpu-bundle.
#   1. unpack ${BUNDLE:-build/gpu-bundle/vradix-gpu-bundle.tar.xz} and install it offline over ${PY:-python3}'s
#      torch (its install.sh; the sgl_kernel shim of the GPU aid, which refuses a real sgl_kernel);
#   2. build vradix._C in place for the local GPU (cuda_env.sh's build_extension), so the served ledger can run the
#      CUDA kernels; the servers run this checkout's vradix (PYTHONPATH) with the bundle's SGLang;
#   3. benchmark/gpu_check/gpu_serve_check.py --device cuda: the publication scenario (stock wrong, vradix equal to a
#      fresh server), the ledger's kernels in the served engine, device synchronisations under overlap scheduling by
#      owner, steady state vradix vs stock (tokens/s and scheduler CPU per request), on bf16 tiny models made there;
#      one JSON, $OUT/gpu_serve_check.json;
#   4. if time is left and mooncake/smg are importable, gpu_check_pd.sh; else the reason is logged.
# `--cpu-dry-run` runs steps 1 and 3 on SGLang's CPU engine (no GPU; BUNDLE built for this machine's Python and PY a
# python with the torch stack), which is how the plumbing is checked without a GPU.
# Device tool: carry ["build/gpu-bundle"], command `bash benchmark/gpu_check/gpu_serve_check.sh`, timeout_s 540.
DRY=""; [ "${1:-}" = "--cpu-dry-run" ] && DRY="--cpu-dry-run" && shift
source "$(dirname "$0")/cuda_env.sh"
OUT="$(cd "$OUT" && pwd)"
BUNDLE="${BUNDLE:-build/gpu-bundle/vradix-gpu-bundle.tar.xz}"
WORK="${WORK:-$(mktemp -d /tmp/vradix-gpu-serve.XXXXXX)}"
BUDGET_S="${BUDGET_S:-470}"  # the whole script, within the 8 minutes
START=$(date +%s)
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  [ -f "$BUNDLE" ] || { echo "[gpu_serve_check] FAIL setup: no bundle at $BUNDLE (make gpu-bundle; carry build/gpu-bundle)"; exit 1; }
  tar xJf "$BUNDLE" -C "$WORK"
  bash "$WORK/vradix-gpu-bundle/install.sh" "$WORK/venv" "$PY"
  VPY="$WORK/venv/bin/python"
  echo "[gpu_serve_check] installed in $(( $(date +%s) - START )) s"
  if [ -z "$DRY" ]; then
    if build_extension; then echo "[gpu_serve_check] vradix._C built (or found) at $(( $(date +%s) - START )) s"
    else echo "[gpu_serve_check] vradix._C did not build: the served ledger runs its Triton kernels (the JSON says which)"; fi
  fi
  rc=0
  timeout "$(left)" "$VPY" benchmark/gpu_check/gpu_serve_check.py $DRY --python "$VPY" \
    --json "$OUT/gpu_serve_check.json" "$@" || rc=$?
  if [ -n "$DRY" ]; then
    echo "[gpu_serve_check] P/D check: not part of the dry run"
  elif ! "$VPY" -c "import mooncake, smg" 2>/dev/null; then
    echo "[gpu_serve_check] P/D check SKIP: mooncake-transfer-engine (CUDA build) and smg are not in the bundle"
  elif [ "$(left)" -gt 60 ]; then
    OUT="$OUT/pd" PY="$VPY" timeout "$(left)" bash benchmark/gpu_check/gpu_check_pd.sh || true
  else
    echo "[gpu_serve_check] P/D check SKIP: $(left) s left"
  fi
  echo "[gpu_serve_check] done in $(( $(date +%s) - START )) s, rc=$rc"
  exit $rc
} 2>&1 | tee "$OUT/gpu_serve_check.log"
exit "${PIPESTATUS[0]}"
