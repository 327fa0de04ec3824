"""CPU aids for HiCache's `page_first_direct` host layout, the one SGLang's Mamba host pool accepts: test only, for
cache-level tests of a hybrid (FULL + MAMBA) cache with a host tier, never a product path nor a server plugin.

SGLang 0.5.23's `MambaPoolHost` asserts a `page_first`/`page_first_direct` layout, and with `--hicache-io-backend
direct` both host pools (`pool_host.mha` for the attention KV, `pool_host.mamba` for the recurrent state) copy through
two sgl_kernel ops that are bound only on CUDA/HIP. `apply()` adds, on top of `cpu_aids.apply()`:
1. torch stand-ins for `transfer_kv_per_layer_direct_pf_lf` (host page-first -> one device layer, the load-back) and
   `transfer_kv_all_layer_direct_lf_pf` (every device layer -> host page-first, the backup), bound in both modules;
2. `MambaPoolHost.__init__` with `pin_memory=False` (it does not go through `HostKVCache.__init__`, which
   `cpu_aids.apply()` already unpins).
Nothing in the tree, the controller or the components is replaced. What a CPU run does not exercise: the CUDA copy
kernels, pinned-memory DMA, the load/backup streams racing the forward pass (CPU streams and events are no-ops, so a
copy has landed when its call returns) and the mooncake transfer writing a request's state concurrently with a
restore. `apply()` refuses to run where CUDA is available (through `cpu_aids.apply()`).
"""
from __future__ import annotations

import torch

from vradix.testing import cpu_aids

#: `--hicache-io-backend` / `--hicache-mem-layout` of the copy path these aids provide
IO_BACKEND, MEM_LAYOUT = "direct", "page_first_direct"

_applied = False


def _token_rows(indices: torch.Tensor, page_size: int):
    idx = indices.to(torch.long)
    return idx // page_size, idx % page_size


def transfer_kv_per_layer_direct_pf_lf(src_ptrs, dst_ptrs, src_indices, dst_indices, layer_id, page_size=1, **_):
    """Stand-in for the sgl_kernel op: each `src` is a host buffer `[page, layer, page_size, ...]`; copy its token
    rows `src_indices` of `layer_id` into the rows `dst_indices` of the matching device layer `dst` `[token, ...]`."""
    pages, offsets = _token_rows(src_indices, page_size)
    dst_idx = dst_indices.to(torch.long)
    for src, dst in zip(src_ptrs, dst_ptrs):
        dst[dst_idx.to(dst.device)] = src[pages, layer_id, offsets].to(dst.device)


def transfer_kv_all_layer_direct_lf_pf(src_ptrs, dst_ptrs, src_indices, dst_indices, page_size=1, **_):
    """Stand-in for the sgl_kernel op: `src_ptrs` are the device layers of every destination in turn (for the KV pool
    K layers then V layers; for a Mamba state one buffer's layers); copy their rows `src_indices` into the token rows
    `dst_indices` of the host buffers `[page, layer, page_size, ...]`."""
    pages, offsets = _token_rows(dst_indices, page_size)
    src_idx = src_indices.to(torch.long)
    num_layers = len(src_ptrs) // len(dst_ptrs)
    for j, dst in enumerate(dst_ptrs):
        for layer in range(num_layers):
            src = src_ptrs[j * num_layers + layer]
            dst[pages, layer, offsets] = src[src_idx.to(src.device)].to(dst.device)


def apply() -> None:
    """Install the aids in this process (idempotent). Raises RuntimeError on a machine with CUDA."""
    global _applied
    if _applied:
        return
    cpu_aids.apply()
    from sglang.srt.mem_cache.pool_host import mamba, mha

    for module in (mha, mamba):
        module.transfer_kv_per_layer_direct_pf_lf = transfer_kv_per_layer_direct_pf_lf
        module.transfer_kv_all_layer_direct_lf_pf = transfer_kv_all_layer_direct_lf_pf
    if not getattr(mamba.MambaPoolHost.__init__, "_vradix_cpu_aid", False):
        mamba.MambaPoolHost.__init__ = cpu_aids._unpinned_on_test_budget(mamba.MambaPoolHost.__init__)
    _applied = True
