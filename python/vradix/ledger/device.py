"""The KV page ledger: a device tensor recording which weight epoch wrote every KV page of the token pool.

The tree-level namespace (`admission`/`publication`) is what keeps requests off stale KV; the ledger is an
independent record used to *check* that (`guard`), to report provenance (`spans`) and to find stale pages in bulk
without walking the tree (`guard.audit`).

Invariants (for the allocators vradix supports: SGLang's token and paged allocators):
* `page_epoch[p] == FREE` once page p has been freed (or never written since the pool was cleared);
* otherwise `page_epoch[p]` is the epoch of the weights whose forward pass last wrote a slot of page p.

Kept in step with the allocator at the cheapest points that see every write and every free:
* writes: once per forward batch, on `batch.out_cache_loc` (one scatter per batch, on the scheduler's stream, which
  orders it after the alloc and before the next free of those slots);
* frees: on the allocator's `free` / `free_page_ids` (a free group marks at `free` time and again at group end;
  marking twice is harmless), and `clear` marks everything free;
* HiCache copies (load-back writes device KV without a forward pass): the destination pages take the epochs of the
  host copies they load (`vradix.ledger.host`, which keeps the host pool's ledger).

The strict guard reads the ledger right before each extend forward (`vradix.ledger.guard`, the backstop): every change to
`page_epoch` goes through the methods below, or through the HiCache carry.
"""
from __future__ import annotations

import logging
from typing import Optional

import torch

from vradix import kernels
from vradix.kernels import FREE

logger = logging.getLogger("vradix")

#: allocator classes whose every free goes through the hooked methods
SUPPORTED_ALLOCATORS = ("TokenToKVPoolAllocator", "PagedTokenToKVPoolAllocator")


class PageLedger:
    """`page_epoch` (int32, one entry per page incl. the padding page 0) on the allocator's device, and `kernels`,
    the kernel implementation for it, resolved once here (`kernels.bind`: `VRADIX_KERNELS` is read now, and an
    unavailable forced implementation raises now, when the ledger is attached). A ledger's kernels never change;
    every stamp, free, check, span and audit of this ledger (and of its `HostLedger`) calls them directly."""

    def __init__(self, allocator):
        self.allocator = allocator
        self.page_size = int(allocator.page_size)
        self.device = torch.device(allocator.device)
        self.page_epoch = torch.full((self.num_pages_of(allocator),), FREE, dtype=torch.int32, device=self.device)
        self.kernels: kernels.Bound = kernels.bind(self.page_epoch)

    @staticmethod
    def num_pages_of(allocator) -> int:
        return int(allocator.size) // int(allocator.page_size) + 2

    def stamp_written(self, loc: Optional[torch.Tensor], epoch: int) -> None:
        """The forward pass about to run under `epoch` writes the KV slots `loc`."""
        if loc is not None and loc.numel():
            self.kernels.stamp(self.page_epoch, loc, int(epoch), self.page_size)

    def mark_freed_slots(self, loc: torch.Tensor) -> None:
        if loc.numel():
            self.kernels.stamp(self.page_epoch, loc, FREE, self.page_size)

    def mark_freed_pages(self, page_ids: torch.Tensor) -> None:
        if page_ids.numel():
            self.kernels.stamp(self.page_epoch, page_ids, FREE, 1)

    def mark_all_free(self) -> None:
        n = self.num_pages_of(self.allocator)
        if n != self.page_epoch.numel():  # the allocator was resized
            self.page_epoch = torch.full((n,), FREE, dtype=torch.int32, device=self.device)
        else:
            self.page_epoch.fill_(FREE)


def attach(allocator) -> Optional[PageLedger]:
    """Give `allocator` a ledger, or None (logged) for allocator kinds whose frees vradix does not observe."""
    if type(allocator).__name__ not in SUPPORTED_ALLOCATORS:
        logger.warning("vradix: KV page ledger disabled for %s (supported: %s); the epoch namespace still applies",
                       type(allocator).__name__, ", ".join(SUPPORTED_ALLOCATORS))
        return None
    ledger = PageLedger(allocator)
    allocator._vradix_ledger = ledger
    return ledger


def ledger_of(allocator) -> Optional[PageLedger]:
    return getattr(allocator, "_vradix_ledger", None)


def kv_spans(ledger: PageLedger, req_to_token: torch.Tensor, req) -> list[tuple[int, int, int]]:
    """Run-length provenance of a live request's KV: [(epoch, start, end)] over its allocated positions, end
    exclusive, from the `spans` kernel. Page granularity: with page_size > 1 the page a crossing request was on when
    the weights changed reports the later epoch for its earlier positions too."""
    kv = req.kv
    if not kv.holds_kv or kv.kv_allocated_len <= 0:
        return []
    return ledger.kernels.spans(ledger.page_epoch, req_to_token, int(kv.req_pool_idx), int(kv.kv_allocated_len),
                                ledger.page_size)
