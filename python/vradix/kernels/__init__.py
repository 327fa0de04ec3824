"""One dispatch for the KV page-epoch kernels: CUDA extension → Triton → torch reference, resolved once per ledger.

`bind(page_epoch)` resolves the implementation for a ledger's `page_epoch` tensor once, when the ledger is built
(`vradix.ledger.device.PageLedger`, whose `HostLedger` shares it), reading `VRADIX_KERNELS` then and never again:
the `Bound` it returns holds the chosen implementation's own functions (`reference`, `triton_impl` or the CUDA
extension's), so a ledger's stamp, free, check, spans and audit call them directly, with no setting read and no
dispatch per call, and never enter this module. A ledger's kernels never change: a later change to `VRADIX_KERNELS`
applies to ledgers built after it.

The choice (`impl_for`): `auto` picks the CUDA extension (`vradix._C`, built by setup.py) for CUDA tensors when it
is importable, else Triton for CUDA tensors, else the torch reference; for CPU tensors it also picks the host forms
(`on_host`: numpy views, results read at once). `VRADIX_KERNELS=cuda|triton|torch` forces one implementation (an
unavailable one is an error, not a silent fallback: `bind` raises it when the ledger is attached, before the engine
serves). CPU tensors use Triton only when a caller (the tests, under `TRITON_INTERPRET=1`) asks for it.

The module-level functions (`stamp`, `verify`, `rows_outside_epochs`, `spans`, `invalidate`) bind per call, for the
tests and for callers that name an implementation (`impl=`); the weight fingerprint (`vradix.kernels.fingerprint`)
dispatches its digest through the same `impl_for`.
"""
from __future__ import annotations

import functools
import os
from typing import Callable, NamedTuple, Optional

import torch

from vradix import settings
from vradix.kernels import reference
from vradix.kernels.reference import FREE, NO_VIOLATION

IMPLS = ("cuda", "triton", "torch")


class Violations(NamedTuple):
    """Result of `verify` on the host: offending positions and the first one, as (batch index, position)."""
    count: int  # type: ignore[assignment]  # the field's public name shadows tuple.count, which nothing calls
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
    """The implementation `impl` (`VRADIX_KERNELS` when None; `auto` resolved) picks for tensors on `t`'s device.
    Raises for an unknown one (ValueError) or one unavailable there (RuntimeError)."""
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
    if impl == "torch":
        return reference
    return {"cuda": cuda_ext, "triton": triton_module}[impl]()


def on_host(*tensors: torch.Tensor, impl: Optional[str] = None) -> bool:
    """Whether the kernels may take their host forms (numpy views): every tensor is a CPU tensor and no
    implementation is forced (`VRADIX_KERNELS=auto`). A host form reads its result at once; that is no device
    synchronisation, as there is no device. `VRADIX_KERNELS=torch` runs the device forms on CPU too."""
    return (impl or settings.value("VRADIX_KERNELS")) == "auto" and all(t.device.type == "cpu" for t in tensors)


class Bound(NamedTuple):
    """A ledger's kernels, resolved once (`bind`): `name` the implementation, `host` whether the host forms apply,
    and that implementation's own functions (the CUDA extension's, `triton_impl`'s or `reference`'s; where one has
    no such step, the reference's host-side part runs around it: the lists' copy of `rows_outside_epochs`, the runs
    of the CUDA `spans`). Calling one never enters this module or reads a setting. Arguments are passed as the
    implementations take them: Python ints for epochs, page sizes, rows and lengths (the caller converts).

        stamp(page_epoch, loc, epoch, page_size) -> None
        verify(page_epoch, req_to_token, rows, prefix_lens, expected_epochs, page_size, max_prefix_len) -> int64[3]
        rows_outside_epochs(page_epoch, req_to_token, rows, lens, lo, hi, page_size) -> int64 tensor | host list
        spans(page_epoch, req_to_token, row, length, page_size) -> [(epoch, start, end)]
        invalidate(page_epoch, epoch, pinned_mask) -> int64 page ids
    """

    name: str
    host: bool
    stamp: Callable
    verify: Callable
    rows_outside_epochs: Callable
    spans: Callable
    invalidate: Callable


def bind(page_epoch: torch.Tensor, impl: Optional[str] = None) -> Bound:
    """The kernels for a ledger whose epochs live in `page_epoch`'s device, chosen now (`impl`, else
    `VRADIX_KERNELS`, read once here) and fixed for the ledger's life. Raises, at bind, for an unknown (ValueError)
    or unavailable (RuntimeError) implementation."""
    choice = impl or settings.value("VRADIX_KERNELS")
    name = impl_for(page_epoch, choice)
    host = on_host(page_epoch, impl=choice)
    mod = _module(name)
    if host:
        rows_outside = reference.host_rows_outside_epochs
    elif name in ("cuda", "triton") and available("triton", page_epoch.device):
        # the CUDA extension has no kernel of its own for this: its pick runs Triton's single launch
        rows_outside = functools.partial(reference.device_rows_outside_epochs,
                                         kernel=triton_module().rows_outside_epochs)
    else:
        rows_outside = reference.device_rows_outside_epochs
    spans_of = functools.partial(reference.spans, gather=mod.row_epochs) if name == "cuda" else mod.spans
    return Bound(name=name, host=host, stamp=reference.host_stamp if host else mod.stamp, verify=mod.verify,
                 rows_outside_epochs=rows_outside, spans=spans_of, invalidate=mod.invalidate)


def stamp(page_epoch: torch.Tensor, loc: torch.Tensor, epoch: int, page_size: int, impl: Optional[str] = None):
    """Mark the pages of the KV slots `loc` as written under `epoch` (or `FREE`). Nothing is read back."""
    if loc.numel():
        bind(page_epoch, impl).stamp(page_epoch, loc, int(epoch), int(page_size))


def verify_async(page_epoch, req_to_token, rows, prefix_lens, expected_epochs, page_size,
                 max_prefix_len: Optional[int] = None, impl: Optional[str] = None) -> torch.Tensor:
    """`verify` without the host read: an int64 device tensor [count, first_index, first_pos]."""
    bound = bind(page_epoch, impl)
    if max_prefix_len is None:  # the grid width; a caller that knows it on the host saves this device sync
        max_prefix_len = int(prefix_lens.max().item()) if rows.numel() else 0
    return bound.verify(page_epoch, req_to_token, rows, prefix_lens, expected_epochs, int(page_size),
                        int(max_prefix_len))


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
    return bind(page_epoch, impl).rows_outside_epochs(page_epoch, req_to_token, rows, lens, lo, hi, int(page_size))


def spans(page_epoch, req_to_token, row: int, length: int, page_size: int,
          impl: Optional[str] = None) -> list[tuple[int, int, int]]:
    """Run-length provenance [(epoch, start, end)] of the first `length` KV positions of `row`."""
    if length <= 0:
        return []
    return bind(page_epoch, impl).spans(page_epoch, req_to_token, int(row), int(length), int(page_size))


def invalidate(page_epoch: torch.Tensor, epoch: int, pinned_mask: Optional[torch.Tensor],
               impl: Optional[str] = None) -> torch.Tensor:
    """Ascending ids of pages stamped with an epoch older than `epoch` that `pinned_mask` does not pin."""
    return bind(page_epoch, impl).invalidate(page_epoch, int(epoch), pinned_mask)


__all__ = ["FREE", "NO_VIOLATION", "IMPLS", "Violations", "Bound", "bind", "available", "impl_for", "on_host", "stamp",
           "verify", "verify_async", "rows_outside_epochs", "spans", "invalidate", "cuda_ext"]
