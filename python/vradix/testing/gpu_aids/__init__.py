"""GPU aid: SGLang 0.5.23 serving on a CUDA machine that has torch and Triton but neither `sgl_kernel` nor FlashInfer
(the carried runtime of `make gpu-bundle`, docs/gpu-bundle.md). Test and measurement only, never a product path.

SGLang takes its CUDA kernels from two wheels a bare CUDA machine lacks: `sgl_kernel` (norms, activations, rotary,
sampling helpers) and FlashInfer (attention, sampling). The CPU aids take the same route on CPU; on a GPU it is:
- the import-only `sgl_kernel` shim of the CPU aids (`vradix/testing/cpu_aids/sgl_kernel_shim`, every call raises)
  installed as `sgl_kernel`, with the three submodules SGLang imports at module level on CUDA (`SHIM_SUBMODULES`:
  `quantization`, `kvcacheio`, and `utils`, whose `is_arch_support_pdl()` says no), so SGLang's CUDA-gated imports
  succeed;
- `GPU_FLAGS`: SGLang's Triton attention backend and PyTorch sampling backend (no FlashInfer), CUDA graphs off
  (a graph would capture whatever a shimmed op raised at capture);
- `GPU_ENV`: every fused op (`sglang.kernels.fused_op.BaseFusedOp`) on its torch forward
  (`SGLANG_FORCE_FUSED_OP_BACKEND=torch`, SGLang's own debug switch), so no op reaches an `sgl_kernel` call.

Where a real `sgl_kernel` is installed the aid refuses to load (`refuse_real_sgl_kernel`): SGLang's own kernels
are then the thing to measure, and the shim must not shadow them. The servers load the refusal as a
`sglang.srt.plugins` entry point (`vradix_gpu_aids`, from the folder `PLUGIN_PATH`), so it runs in every scheduler.
`python -m vradix.testing.gpu_aids install-shim SITE` places the shim (the bundle's install script runs it).
`sync_probe` counts a server's device synchronisations by owner (the GPU serving check).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
from pathlib import Path
from typing import Dict, List, Optional

#: the import-only shim, shared with the CPU aids (installed under the name `sgl_kernel`)
SHIM_PATH = Path(__file__).resolve().parents[1] / "cpu_aids" / "sgl_kernel_shim"
#: the submodules SGLang 0.5.23 imports from `sgl_kernel` at module level on CUDA, without an ImportError fallback
#: (found by importing the serving path with CUDA reported available: `test_gpu_aids.py`), added to the shim here
SHIM_SUBMODULES = Path(__file__).resolve().parent / "shim_submodules"
#: what the shim's `__init__.py` says of itself; a `sgl_kernel` without it is the real library
SHIM_MARK = "+vradix-shim"
#: the folder to put on PYTHONPATH so a server process loads the refusal as a plugin
PLUGIN_PATH = str(Path(__file__).resolve().parent / "plugin")
#: server flags of the route: Triton attention, PyTorch sampling, no CUDA graphs
GPU_FLAGS: List[str] = [
    "--device", "cuda", "--attention-backend", "triton", "--sampling-backend", "pytorch",
    "--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled",
]
#: server environment of the route: every fused op on its torch forward
GPU_ENV: Dict[str, str] = {"SGLANG_FORCE_FUSED_OP_BACKEND": "torch"}


class RealSglKernel(RuntimeError):
    """A real `sgl_kernel` is importable where the GPU aid was asked to load."""


def real_sgl_kernel(path: Optional[List[str]] = None) -> Optional[str]:
    """Where the real `sgl_kernel` importable from `path` (default `sys.path`) lives, or None when there is none or
    it is the shim. Reads the package's `__init__.py`; imports nothing (a real one loads CUDA libraries)."""
    if path is None:
        spec = importlib.util.find_spec("sgl_kernel")
        origin = spec.origin if spec is not None else None
    else:
        origin = next((str(Path(p) / "sgl_kernel" / "__init__.py") for p in path
                       if (Path(p) / "sgl_kernel" / "__init__.py").is_file()), None)
    if origin is None or not os.path.isfile(origin):
        return None
    with open(origin, encoding="utf-8", errors="replace") as f:
        return None if SHIM_MARK in f.read() else os.path.dirname(origin)


def refuse_real_sgl_kernel(path: Optional[List[str]] = None) -> None:
    """Raise `RealSglKernel` where a real `sgl_kernel` is importable (see `real_sgl_kernel`)."""
    where = real_sgl_kernel(path)
    if where is not None:
        raise RealSglKernel(
            f"a real sgl_kernel is installed at {where}: serve with SGLang's own kernels (drop the GPU aid's flags, "
            "environment and plugin); the vradix GPU aid is only for machines without sgl_kernel")


def install_shim(site: Path) -> Path:
    """Copy the shim to `site/sgl_kernel` (replacing an earlier shim), after refusing a real `sgl_kernel` on
    `sys.path` or in `site`. Returns the installed package's folder."""
    refuse_real_sgl_kernel()
    refuse_real_sgl_kernel([str(site)])
    dest = Path(site) / "sgl_kernel"
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(SHIM_PATH, dest, ignore=shutil.ignore_patterns("__pycache__"))
    for sub in SHIM_SUBMODULES.glob("*.py"):
        shutil.copy(sub, dest / sub.name)
    return dest


def server_env(env: Dict[str, str]) -> Dict[str, str]:
    """`env` with the route's settings (`GPU_ENV`, set where `env` has none) and the refusal plugin on PYTHONPATH
    (once: a plugin found twice would load twice)."""
    out = dict(env)
    for name, value in GPU_ENV.items():
        out.setdefault(name, value)
    paths = [p for p in (out.get("PYTHONPATH") or "").split(os.pathsep) if p]
    out["PYTHONPATH"] = os.pathsep.join(paths if PLUGIN_PATH in paths else [PLUGIN_PATH, *paths])
    return out


def register() -> None:
    """`sglang.srt.plugins` entry point of the `vradix_gpu_aids` plugin: refuse to serve over a real `sgl_kernel`;
    with `VRADIX_GPU_SYNC_PROBE` set, count the process's device synchronisations (`sync_probe`)."""
    from vradix.testing.gpu_aids import sync_probe

    refuse_real_sgl_kernel()
    sync_probe.install_from_env()


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m vradix.testing.gpu_aids", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("install-shim", help="place the import-only sgl_kernel shim in SITE").add_argument("site")
    sub.add_parser("check", help="exit 1 where a real sgl_kernel is importable")
    a = p.parse_args(argv)
    try:
        if a.cmd == "install-shim":
            print(f"[gpu_aids] sgl_kernel shim installed at {install_shim(Path(a.site))}")
        else:
            refuse_real_sgl_kernel()
            print("[gpu_aids] no real sgl_kernel importable")
    except RealSglKernel as e:
        print(f"[gpu_aids] refused: {e}", file=sys.stderr)
        return 1
    return 0
