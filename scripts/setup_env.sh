#!/usr/bin/env bash
# Build .venv from nothing: sglang==0.5.23 (--no-deps), torch==2.14.1, the minimal CPU serving/test deps under a
# constraints file derived from sglang's own metadata, vradix editable, and the import-only sgl_kernel shim.
# Idempotent: a stamp file keyed on this script + setup.py skips the work on reruns (one line of output).
# Quiet: every step's full output (pip's included) goes to $VENV/setup.log; the terminal gets one line when the build
# starts and a summary at the end. A failed step prints the log's last lines and its path, and exits nonzero.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${VRADIX_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3.11}"
STAMP="$VENV/.vradix-setup-stamp"
KEY="$(cat "$0" "$ROOT/pyproject.toml" "$ROOT/setup.py" "$ROOT/scripts/derive_constraints.py" | sha256sum | cut -c1-16)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$KEY" ]; then
  echo "[setup] .venv up to date"; exit 0
fi
LOG="$VENV/setup.log"
TAIL_LINES=40
START=$SECONDS
mkdir -p "$VENV"
: > "$LOG"
trap 'fail "unexpected error at line $LINENO"' ERR

fail() {
  echo "[setup] FAILED after $((SECONDS - START))s: $1" >&2
  echo "[setup] last $TAIL_LINES lines of $LOG:" >&2
  tail -n "$TAIL_LINES" "$LOG" | sed 's/^/    /' >&2
  echo "[setup] full log: $LOG" >&2
  exit 1
}

# step DESCRIPTION COMMAND...: run COMMAND with its stdout and stderr appended to the log
step() {
  local what="$1"; shift
  printf '\n==> %s\n$ %s\n' "$what" "$*" >> "$LOG"
  "$@" >> "$LOG" 2>&1 || fail "$what"
}

echo "[setup] building $VENV (a few minutes; full output in $LOG)"
[ -x "$VENV/bin/python" ] || step "create the venv with $PY" "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off)
step "upgrade pip, setuptools, wheel" "${PIP[@]}" -U "pip>=24" setuptools wheel
step "install torch 2.14.1" "${PIP[@]}" torch==2.14.1 torchvision==0.29.1
step "install sglang 0.5.23 (no dependencies)" "${PIP[@]}" --no-deps sglang==0.5.23
step "derive constraints from sglang's metadata" \
  bash -c '"$1" "$2" > "$3"' _ "$VENV/bin/python" "$ROOT/scripts/derive_constraints.py" "$VENV/constraints.txt"
step "install the CPU serving and test dependencies" "${PIP[@]}" -c "$VENV/constraints.txt" \
  numpy orjson psutil pybase64 requests packaging pillow pydantic msgspec pyzmq tqdm \
  IPython aiohttp dill transformers sentencepiece compressed-tensors gguf openai \
  partial_json_parser setproctitle einops apache-tvm-ffi triton \
  fastapi starlette uvicorn uvloop python-multipart jsonschema xgrammar soundfile \
  datasets "python-dateutil<3" pytest pytest-timeout pytest-xdist hypothesis prometheus-client matplotlib ruff==0.17.6 mypy==2.4.1
# SGLang's Ray scheduler actor (fail-closed test) and the model gateway `smg` (publish-through-gateway tests)
step "install ray and smg" "${PIP[@]}" -c "$VENV/constraints.txt" ray==2.60.0 smg==1.13.0
# P/D on CPU: the mooncake transfer engine over TCP (its loader needs libibverbs; docs/pd.md)
if ! dpkg -s libibverbs1 >/dev/null 2>&1; then
  SUDO=(); [ "$(id -u)" = 0 ] || SUDO=(sudo -n)
  step "apt-get install libibverbs1" bash -c '"$@" apt-get update -qq && DEBIAN_FRONTEND=noninteractive "$@" apt-get install -y -qq libibverbs1' _ "${SUDO[@]}"
fi
step "install the mooncake transfer engine (CPU build)" "${PIP[@]}" --no-deps mooncake-transfer-engine-non-cuda==0.3.13.post1
SITE="$("$VENV/bin/python" -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')"
# the import-only sgl_kernel shim (CPU serving/test aid; every call raises)
step "place the sgl_kernel shim" bash -c 'rm -rf "$2/sgl_kernel" && cp -r "$1" "$2/sgl_kernel"' _ \
  "$ROOT/python/vradix/testing/cpu_aids/sgl_kernel_shim" "$SITE"
step "install vradix (editable)" env VRADIX_BUILD_CUDA="${VRADIX_BUILD_CUDA:-0}" \
  "${PIP[@]}" -c "$VENV/constraints.txt" --no-build-isolation --no-deps -e "$ROOT"
# an editable install does not run build_py: place the SGLANG_PLUGINS startup check the wheel ships
step "place the SGLANG_PLUGINS startup check" cp "$ROOT/python/vradix-plugin-check.pth" "$SITE/"
step "check the imports" "$VENV/bin/python" -c "import sglang, torch, vradix"
SUMMARY="$("$VENV/bin/python" - <<'EOF'
from importlib.metadata import distributions, version
import vradix
print(f"sglang {version('sglang')}, torch {version('torch')}, vradix {vradix.__version__} (editable), "
      f"{len({d.metadata['Name'].lower() for d in distributions()})} distributions in all")
EOF
)"
echo "$KEY" > "$STAMP"
echo "[setup] done in $((SECONDS - START))s: $SUMMARY"
echo "[setup] full log: $LOG"
