"""CPU aid for P/D disaggregation with the mooncake transfer engine over TCP: test and demo only, never a product path.

A prefill/decode pair moves real KV on SGLang's CPU engine with `--disaggregation-transfer-backend mooncake_tcp`
(SGLang sets `MC_FORCE_TCP=1`), the PyPI wheel `mooncake-transfer-engine-non-cuda` and the Debian library
`libibverbs1` (the wheel's `.so` links it even when no RDMA device is used). One thing in SGLang 0.5.23 assumes a GPU
on that path: `MooncakeKVSender.supports_host_tensor_indices = True` makes prefill copy a chunk's page indices into a
*pinned* host tensor and record a `torch.cuda.Event` (`disaggregation/prefill.py`), and the prefill scheduler dies with
"Found no NVIDIA driver". This aid sets the class attribute to False, so prefill takes SGLang's own synchronous path
(`kv_to_page_indices`). Nothing in the transfer protocol, the bootstrap or the KV copy itself is replaced. Prefill also
needs `--disable-overlap-schedule` (its early-send path records a CUDA event); `vradix.testing.harness.pd` passes it.

What a CPU run therefore does not exercise: RDMA (and NIXL/Mori) transfer, GPU memory registration, the asynchronous
D2H page-index copy and its event, `SGLANG_DISAGG_STAGING_BUFFER`, prefill's overlap early-send, and any timing that
depends on real network or GPU concurrency (here both roles share one loopback host).

Servers load this aid as the `sglang.srt.plugins` entry point `vradix_cpu_aids_pd` from the folder `pd_plugin/`, which
`vradix.testing.harness.pd` puts on PYTHONPATH only for P/D servers. `apply()` refuses to run where CUDA is available.
"""
from __future__ import annotations

import os

import torch

#: the folder to put on PYTHONPATH so a P/D server process loads this aid as a plugin
PLUGIN_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pd_plugin")


def apply() -> None:
    """Make prefill compute page indices synchronously on the host (idempotent). Raises RuntimeError with CUDA."""
    if torch.cuda.is_available():
        raise RuntimeError("vradix CPU aids are for CPU-only test machines; refusing to patch mooncake on a CUDA host")
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVSender

    MooncakeKVSender.supports_host_tensor_indices = False


def register() -> None:
    """`sglang.srt.plugins` entry point of the `vradix_cpu_aids_pd` test plugin."""
    apply()
