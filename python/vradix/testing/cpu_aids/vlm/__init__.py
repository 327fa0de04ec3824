"""CPU aid for serving a tiny Qwen2-VL on SGLang's CPU engine: test only, never a product path.

SGLang 0.5.23's Qwen-VL multimodal processor (`multimodal/processors/qwen_vl.py`) imports the Qwen3.5 model module,
which on the CPU engine binds four `torch.ops.sgl_kernel.*_cpu` ops at import. The import-only `sgl_kernel` shim
registers no torch ops, so the import fails, SGLang skips the processor, and no Qwen-VL model can be served
("No processor registered for architecture"). `register()` defines exactly those ops, each raising when called:
Qwen2-VL never calls them (only Qwen3.5's forward does), and ops that already exist (a real sgl_kernel) are left alone.

Servers load this aid as a separate `sglang.srt.plugins` entry point (`vradix_vlm_aids`) from the folder `plugin/`,
which `server_env()` puts on PYTHONPATH; SGLang's launcher loads plugins before it builds the tokenizer manager.
"""
from __future__ import annotations

import os

from vradix.testing.cpu_aids.import_time_ops import define_unavailable_ops

#: the folder to put on PYTHONPATH so a server process loads this aid as a plugin
PLUGIN_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plugin")
#: the sgl_kernel CPU ops `sglang.srt.models.qwen3_5` binds at import on the CPU engine
IMPORT_TIME_OPS = ("fused_sigmoid_mul_cpu", "fused_qk_gemma_rmsnorm_cpu", "fused_qk_gemma_rmsnorm_with_gate_cpu",
                   "fused_qkvzba_split_reshape_cat_contiguous_cpu")


def _unavailable(name):
    def op(x):
        raise NotImplementedError(f"sgl_kernel.{name} is not available: vradix's CPU aid defines it for imports only")
    return op


def register() -> None:
    """Define each missing op of IMPORT_TIME_OPS in the `sgl_kernel` torch namespace (idempotent)."""
    define_unavailable_ops(IMPORT_TIME_OPS, _unavailable)


def server_env() -> dict:
    """The environment entries a server needs to load this aid (for `CpuServer(env=...)`): PYTHONPATH with the
    aid's plugin folder first."""
    return {"PYTHONPATH": os.pathsep.join(p for p in (PLUGIN_PATH, os.environ.get("PYTHONPATH")) if p)}
