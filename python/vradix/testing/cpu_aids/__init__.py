"""CPU aids for HiCache (L2 host pool, L3 storage) on SGLang's CPU engine: test and demo only, never a product path.

SGLang 0.5.23 builds HiCache's host pool for a GPU: it pins host memory (`cudaHostRegister`, and a pinned dummy page
for storage prefetch) and binds its device<->host copy ops only on CUDA/HIP/XPU. On the CPU engine both fail before
the first request. These aids replace exactly two things, and nothing in the tree, controller or storage logic:
1. `HostKVCache.__init__` is called with `pin_memory=False` (plain host memory; no CUDA driver call) and books its
   buffer against a fixed test budget (`TEST_HOST_BUDGET_BYTES`) instead of the machine's free memory less the
   10 GiB SGLang keeps back for a GPU server: a tiny-model pool takes kilobytes, and a test server must not fail to
   start because other servers of the suite hold memory;
2. `pool_host.mha.transfer_kv_direct` (the `--hicache-io-backend direct --hicache-mem-layout layer_first` copy) is a
   torch index copy, `dst[dst_indices] = src[src_indices]` per layer.
What a CPU run therefore does not exercise: the CUDA/JIT copy kernels and their `page_first` layouts, pinned-memory
DMA, and ordering races between the load/backup streams and the forward pass (CPU streams and events are no-ops).

Servers load these aids as a separate `sglang.srt.plugins` entry point (`vradix_cpu_aids`) from the folder
`plugin/`, which `vradix.testing.harness.server.CpuServer` puts on PYTHONPATH only for HiCache servers; cache-level tests call
`apply()` directly (and `kit_hicache_on_cpu()` around SGLang's test-kit HiCache init). `apply()` refuses to run
where CUDA is available.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import os
from unittest import mock

import torch

#: the folder to put on PYTHONPATH so a server process loads these aids as a plugin
PLUGIN_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plugin")
#: server flags that select the copy path the aids provide
HICACHE_CPU_FLAGS = ["--hicache-io-backend", "direct", "--hicache-mem-layout", "layer_first"]

#: the host memory a test host pool may take (cache-level tests build pools of kilobytes)
TEST_HOST_BUDGET_BYTES = 256 << 20

_applied = False


def transfer_kv_direct(src_layers, dst_layers, src_indices, dst_indices, page_size=1, **_):
    """Torch stand-in for sgl_kernel's `transfer_kv_direct`: copy the rows `src_indices` of every source layer into
    the rows `dst_indices` of the matching destination layer (token indices; `page_size` only groups them)."""
    src_idx = src_indices.to(torch.long)
    dst_idx = dst_indices.to(torch.long)
    for src, dst in zip(src_layers, dst_layers):
        dst[dst_idx.to(dst.device)] = src[src_idx.to(src.device)].to(dst.device)


def forcing_argument(fn, name: str, value):
    """`fn` with its argument `name` forced to `value`, however the caller passed it; marked (`_vradix_cpu_aid`) so an
    aid installed twice wraps once."""
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        bound.arguments[name] = value
        return fn(*bound.args, **bound.kwargs)

    setattr(wrapper, "_vradix_cpu_aid", True)  # the mark `forcing_argument`'s callers look for
    return wrapper


def _unpinned_on_test_budget(init):
    """`HostKVCache.__init__` with `pin_memory=False`, building its buffer inside SGLang's own
    `host_memory_budget_scope(TEST_HOST_BUDGET_BYTES)` (one scope per pool; marked like `forcing_argument`)."""
    from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope

    unpinned = forcing_argument(init, "pin_memory", False)

    @functools.wraps(init)
    def wrapper(*args, **kwargs):
        with host_memory_budget_scope(TEST_HOST_BUDGET_BYTES):
            return unpinned(*args, **kwargs)

    setattr(wrapper, "_vradix_cpu_aid", True)  # the mark `forcing_argument`'s callers look for
    return wrapper


def apply() -> None:
    """Install both aids in this process (idempotent). Raises RuntimeError on a machine with CUDA."""
    global _applied
    if _applied:
        return
    if torch.cuda.is_available():
        raise RuntimeError("vradix CPU aids are for CPU-only test machines; refusing to patch HiCache on a CUDA host")
    from sglang.srt.mem_cache.pool_host import base, mha

    if not getattr(base.HostKVCache.__init__, "_vradix_cpu_aid", False):
        base.HostKVCache.__init__ = _unpinned_on_test_budget(base.HostKVCache.__init__)
    mha.transfer_kv_direct = transfer_kv_direct
    _applied = True


def register() -> None:
    """`sglang.srt.plugins` entry point of the `vradix_cpu_aids` test plugin."""
    apply()


@contextlib.contextmanager
def kit_hicache_on_cpu():
    """Apply the aids and, inside the context, make SGLang's test kit (`sglang.test.kits.unified_radix_cache`)
    initialize HiCache on the copy path they provide: its `_init_hicache` builds `ServerArgs` with
    `hicache_io_backend="kernel"` and the default `page_first` layout, which need the CUDA copy kernels. Host pools
    built inside are booked against a fixed test budget, not against the machine's free memory (SGLang keeps 10 GiB
    back for a server, which would make a test depend on the machine's load)."""
    from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope
    from sglang.srt.server_args import ServerArgs
    from sglang.test.kits.unified_radix_cache import mixins

    apply()

    def direct_layer_first(**kwargs):
        return ServerArgs(**{**kwargs, "hicache_io_backend": "direct", "hicache_mem_layout": "layer_first"})

    with mock.patch.object(mixins, "ServerArgs", direct_layer_first), host_memory_budget_scope(TEST_HOST_BUDGET_BYTES):
        yield
