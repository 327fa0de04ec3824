#!/usr/bin/env bash
# Build .venv from nothing: sglang==0.5.23 (--no-deps), torch==2.14.1, the minimal CPU serving/test deps under a
# constraints file derived from sglang's own metadata, vradix editable, and the import-only sgl_kernel shim.
# Idempotent: a stamp file keyed on this script + setup.py skips the work on reruns.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${VRADIX_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3.11}"
STAMP="$VENV/.vradix-setup-stamp"
KEY="$(cat "$0" "$ROOT/setup.py" "$ROOT/scripts/derive_constraints.py" | sha256sum | cut -c1-16)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$KEY" ]; then
  echo "[setup] .venv up to date"; exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
"${PIP[@]}" -U "pip>=24" setuptools wheel
"${PIP[@]}" torch==2.14.1 torchvision==0.29.1
"${PIP[@]}" --no-deps sglang==0.5.23
"$VENV/bin/python" "$ROOT/scripts/derive_constraints.py" > "$VENV/constraints.txt"
"${PIP[@]}" -c "$VENV/constraints.txt" \
  numpy orjson psutil pybase64 requests packaging pillow pydantic msgspec pyzmq tqdm \
  IPython aiohttp dill transformers sentencepiece compressed-tensors gguf openai \
  partial_json_parser setproctitle einops apache-tvm-ffi triton \
  fastapi starlette uvicorn uvloop python-multipart jsonschema xgrammar soundfile \
  datasets "python-dateutil<3" pytest pytest-timeout hypothesis prometheus-client matplotlib
# the import-only sgl_kernel shim (CPU serving/test aid; every call raises)
SITE="$("$VENV/bin/python" -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')"
rm -rf "$SITE/sgl_kernel"; cp -r "$ROOT/python/vradix/testing/sgl_kernel_shim" "$SITE/sgl_kernel"
VRADIX_BUILD_CUDA="${VRADIX_BUILD_CUDA:-0}" "${PIP[@]}" -c "$VENV/constraints.txt" --no-build-isolation --no-deps -e "$ROOT"
# an editable install does not run build_py: place the SGLANG_PLUGINS startup check the wheel ships
cp "$ROOT/python/vradix-plugin-check.pth" "$SITE/"
"$VENV/bin/python" -c "import sglang, torch, vradix; print('[setup] sglang', sglang.__version__, 'torch', torch.__version__, 'vradix', vradix.__version__)"
echo "$KEY" > "$STAMP"
