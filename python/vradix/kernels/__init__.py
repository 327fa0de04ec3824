"""One dispatch for the KV page-epoch kernels: CUDA extension → Triton → torch reference.

`impl_for(tensor)` picks the CUDA extension (`vradix._C`, built by setup.py) for CUDA tensors when it is importable,
else Triton for CUDA tensors, else the torch reference. CPU tensors always use the torch reference unless a caller
(the tests, under `TRITON_INTERPRET=1`) asks for `impl="triton"` explicitly. `VRADIX_KERNELS=cuda|triton|torch`
forces one implementation for every call (an unavailable one is an error, not a silent fallback). The weight
fingerprint (`vradix.kernels.fingerprint`) dispatches its digest through the same `impl_for`.
"""
from __future__ import annotations

import functools
import os
from typing import NamedTuple, Optional

import torch

from vradix import settings
from vradix.kernels import reference
from vradix.kernels.reference import FREE, NO_VIOLATION

IMPLS = ("cuda", "triton", "torch")


class Violations(NamedTuple):
    """Result of `verify` on the host: offending positions and the first one, as (batch index, position)."""
    count: int
    first_index: int
    first_pos: int


@functools.lru_cache(maxsize=None)
def cuda_ext():
    """The compiled `vradix._C` module, or None when it was not built (CPU installs)."""
    try:
        from vradix import _C
    except ImportError:
        return None
    return _C


@functools.lru_cache(maxsize=None)
def triton_module():
    try:
        from vradix.kernels import triton_impl as mod
    except Exception:  # no triton, or a triton that cannot load on this machine
        return None
    return mod


def available(impl: str, device: torch.device) -> bool:
    if impl == "torch":
        return True
    if impl == "cuda":
        return device.type == "cuda" and cuda_ext() is not None
    if impl == "triton":
        return triton_module() is not None and (device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1")
    raise ValueError(f"unknown kernel implementation {impl!r}; expected one of {IMPLS}")


def impl_for(t: torch.Tensor, impl: Optional[str] = None) -> str:
    impl = impl or settings.value("VRADIX_KERNELS")
    if impl != "auto":
        if not available(impl, t.device):
            raise RuntimeError(f"vradix kernel implementation {impl!r} is not available for {t.device} tensors")
        return impl
    for candidate in ("cuda", "triton"):
        if t.device.type == "cuda" and available(candidate, t.device):
            return candidate
    return "torch"


def _module(impl: str):
    if impl == "torch":  # the common case on every stamp and free: no lookup table or call
        return reference
    return {"cuda": cuda_ext, "triton": triton_module}[impl]()


def on_host(*tensors: torch.Tensor, impl: Optional[str] = None) -> bool:
    """Whether the kernels may take their host forms (numpy views): every tensor is a CPU tensor and no
    implementation is forced (`VRADIX_KERNELS=auto`). A host form reads its result at once; that is no device
    synchronisation, as there is no device. `VRADIX_KERNELS=torch` runs the device forms on CPU too."""
    return (impl or settings.value("VRADIX_KERNELS")) == "auto" and all(t.device.type == "cpu" for t in tensors)


def stamp(page_epoch: torch.Tensor, loc: torch.Tensor, epoch: int, page_size: int, impl: Optional[str] = None):
    """Mark the pages of the KV slots `loc` as written under `epoch` (or `FREE`). Nothing is read back."""
    if not loc.numel():
        return
    if on_host(page_epoch, loc, impl=impl):
        reference.host_stamp(page_epoch, loc, int(epoch), int(page_size))
    else:
        _module(impl_for(page_epoch, impl)).stamp(page_epoch, loc, int(epoch), int(page_size))


def verify_async(page_epoch, req_to_token, rows, prefix_lens, expected_epochs, page_size,
                 max_prefix_len: Optional[int] = None, impl: Optional[str] = None) -> torch.Tensor:
    """`verify` without the host read: an int64 device tensor [count, first_index, first_pos]."""
    name = impl_for(page_epoch, impl)
    if max_prefix_len is None:  # the grid width; a caller that knows it on the host saves this device sync
        max_prefix_len = int(prefix_lens.max().item()) if rows.numel() else 0
    if name == "cuda":
        return cuda_ext().verify(page_epoch, req_to_token, rows, prefix_lens, expected_epochs, page_size,
                                 max_prefix_len)
    return _module(name).verify(page_epoch, req_to_token, rows, prefix_lens, expected_epochs, page_size,
                                max_prefix_len=max_prefix_len)


def verify(page_epoch, req_to_token, rows, prefix_lens, expected_epochs, page_size,
           max_prefix_len: Optional[int] = None, impl: Optional[str] = None) -> Violations:
    """Fused gather/compare/reduce over the matched prefixes of a batch (see `reference.verify`)."""
    out = verify_async(page_epoch, req_to_token, rows, prefix_lens, expected_epochs, page_size, max_prefix_len, impl)
    return Violations(*out.tolist())


def rows_outside_epochs(page_epoch: torch.Tensor, req_to_token: torch.Tensor, rows: list[int], lens: list[int],
                        lo: list[int], hi: list[int], page_size: int, impl: Optional[str] = None):
    """Per row, the count of its first `lens[i]` positions on pages whose epoch is outside [lo[i], hi[i]]: one
    gather/compare over the batch, nothing read back. Returns an int64 device tensor, or, for a ledger in host
    memory (`on_host`), the counts as a host list. The forward backstop checks an extend batch's prefixes through
    it. The host lists travel in one non-blocking copy; Triton runs it in one launch (also where the CUDA extension
    is picked: it has no kernel of its own for this), the torch reference in a handful."""
    if not rows:
        return []
    if on_host(page_epoch, req_to_token, impl=impl):
        return reference.host_rows_outside_epochs(page_epoch, req_to_token, rows, lens, lo, hi, int(page_size))
    meta = torch.tensor([rows, lens, lo, hi], dtype=torch.int64).to(page_epoch.device, non_blocking=True)
    name = impl_for(page_epoch, impl)
    if name in ("cuda", "triton") and triton_module() is not None and available("triton", page_epoch.device):
        return triton_module().rows_outside_epochs(page_epoch, req_to_token, meta, max(lens), int(page_size))
    return reference.rows_outside_epochs(page_epoch, req_to_token, meta, max(lens), int(page_size))


def spans(page_epoch, req_to_token, row: int, length: int, page_size: int,
          impl: Optional[str] = None) -> list[tuple[int, int, int]]:
    """Run-length provenance [(epoch, start, end)] of the first `length` KV positions of `row`."""
    if length <= 0:
        return []
    name = impl_for(page_epoch, impl)
    if name == "cuda":
        return reference.runs_of(cuda_ext().row_epochs(page_epoch, req_to_token, int(row), int(length), page_size))
    return _module(name).spans(page_epoch, req_to_token, int(row), int(length), page_size)


def invalidate(page_epoch: torch.Tensor, epoch: int, pinned_mask: Optional[torch.Tensor],
               impl: Optional[str] = None) -> torch.Tensor:
    """Ascending ids of pages stamped with an epoch older than `epoch` that `pinned_mask` does not pin."""
    name = impl_for(page_epoch, impl)
    if name == "cuda":
        return cuda_ext().invalidate(page_epoch, int(epoch), pinned_mask)
    return _module(name).invalidate(page_epoch, int(epoch), pinned_mask)


__all__ = ["FREE", "NO_VIOLATION", "IMPLS", "Violations", "available", "impl_for", "on_host", "stamp", "verify",
           "verify_async", "rows_outside_epochs", "spans", "invalidate", "cuda_ext"]
