"""The KV page ledger with HiCache: a page's epoch travels with its copies between device, host and storage.

HiCache writes device KV without a forward pass (load-back from the host pool), and fills host pages without one
(backup from device, prefetch from L3 storage), so `run_batch`'s stamp never sees those writes. vradix therefore
keeps a second ledger over the host KV pool (`HostLedger`, attached to the pool as the device ledger is to its
allocator) and moves epochs along with the data, at the points where SGLang pairs host and device slots:

* backup (device -> host): when `HybridCacheController.write` queues the copy, each destination host page gets the
  epoch of the device page it copies (`carry`). The source pages sit in the radix tree, which never rewrites a
  slot it holds, so their epoch at queue time is the epoch of what the copy will read.
* load-back (host -> device): when `HybridCacheController.load` queues the copy, each destination device page gets
  the epoch of the host page it copies. This happens before the tree commits the loaded slots, so no match ever
  sees them unstamped.
* prefetch (L3 -> host): L3 keeps no ledger. A stored page is found by a hash chain seeded with its key's
  `extra_key` (`storage_namespace_seed`), whose namespace is built from a global `weight_id`, so when SGLang inserts
  prefetched pages into the tree (`UnifiedRadixCache._handle_prefetch_result`), they get the epoch of this engine
  that serves that namespace (`Engine.epoch_of`), or `FREE` when none does (no namespace, or another engine's
  weights), which no request's epoch equals.
* frees: a freed host page is `FREE`; clearing the host pool frees every page.

Invariant (for the supported host pools, `unobservable_host_pool`): `host_epoch[h] == FREE` once host page h has
been freed, otherwise the epoch of the KV it holds, as carried from the device ledger or named by its L3 key.
Carrying the copy's own epoch, rather than reading it off the tree node that holds the copy, keeps the ledger an
independent witness: a page that reached a node of another epoch is still caught after a round trip through host.
"""
from __future__ import annotations

from typing import Optional

import torch

from vradix import kernels
from vradix.kernels import FREE
from vradix.ledger.device import PageLedger, ledger_of


class HostLedger:
    """`page_epoch` (int32) over the host KV pool's slots, at the device ledger's page granularity, on the device
    ledger's device (so a carry is device work ordered on the scheduler's stream, with no host sync), with the
    device ledger's kernels (`PageLedger.kernels`, resolved once, for the same device)."""

    def __init__(self, host_pool, device_ledger: PageLedger):
        self.host_pool = host_pool
        self.page_size = device_ledger.page_size
        self.device = device_ledger.device
        self.page_epoch = torch.full((self.num_pages_of(host_pool),), FREE, dtype=torch.int32, device=self.device)
        self.kernels: kernels.Bound = device_ledger.kernels

    def num_pages_of(self, host_pool) -> int:
        return int(host_pool.logical_size) // self.page_size + 1

    def stamp_fetched(self, slots: torch.Tensor, epoch: Optional[int]) -> None:
        """`slots` now hold KV fetched from storage under the namespace of `epoch` (None: of no epoch of this
        engine)."""
        if slots.numel():  # an implementation's own stamp may not take an empty launch
            self.kernels.stamp(self.page_epoch, slots.to(self.device), FREE if epoch is None else int(epoch),
                               self.page_size)

    def mark_freed_slots(self, slots: torch.Tensor) -> None:
        if slots.numel():
            self.kernels.stamp(self.page_epoch, slots.to(self.device), FREE, self.page_size)

    def mark_all_free(self) -> None:
        self.page_epoch.fill_(FREE)


def carry(src_epoch: torch.Tensor, src_slots: torch.Tensor, dst_epoch: torch.Tensor, dst_slots: torch.Tensor,
          page_size: int) -> None:
    """A copy of KV slots `src_slots` into `dst_slots` (paired by position) was queued: each destination page takes
    its source page's epoch. Every slot of a page is copied from one source page (both pools allocate whole pages),
    so a page listed once per slot receives one value."""
    if dst_slots.numel() == 0:
        return
    dev = dst_epoch.device
    src_pages = src_slots.to(device=dev, dtype=torch.int64) // page_size
    dst_pages = dst_slots.to(device=dev, dtype=torch.int64) // page_size
    dst_epoch[dst_pages] = src_epoch[src_pages]


def unobservable_host_pool(cache) -> Optional[str]:
    """Why the host KV pool of `cache`'s HiCache cannot carry a ledger, or None when it can: its frees must go through
    `HostKVCache.free`/`clear` (hooked), and its slots must map onto device ledger pages one to one."""
    from sglang.srt.mem_cache.pool_host.base import HostKVCache

    host_pool = kv_host_pool(cache)
    if host_pool is None:
        return "a HiCache controller without a host pool group"
    if getattr(cache, "host_memory_mode", "cache") == "buffer_only":
        # its pipeline stages storage pages through host buffers it keeps and reuses; not checked against the ledger
        return "HiCache buffer-only host memory (staging buffers)"
    cls = type(host_pool)
    for method in ("free", "clear"):
        owner = next(k for k in cls.__mro__ if method in vars(k))
        if owner is not HostKVCache:
            return f"HiCache host pool {cls.__name__} (its {method} is not HostKVCache.{method})"
    if int(getattr(host_pool, "dcp_size", 1)) != 1:
        return "HiCache with decode context parallelism (host slot ids are widened)"
    device_page = int(cache.token_to_kv_pool_allocator.page_size)
    if int(host_pool.page_size) % device_page:
        return f"HiCache host page size {host_pool.page_size} not a multiple of the device page size {device_page}"
    return None


def kv_host_pool(cache):
    """The host pool that holds the FULL KV of `cache`'s HiCache (the anchor of its host pool group), or None."""
    group = getattr(getattr(cache, "cache_controller", None), "mem_pool_host", None)
    anchor = getattr(group, "anchor_entry", None)
    return getattr(anchor, "host_pool", None)


def attach(cache, device_ledger: PageLedger) -> HostLedger:
    """Give the host KV pool of `cache`'s HiCache a ledger (call only when `unobservable_host_pool` is None)."""
    host_pool = kv_host_pool(cache)
    host_ledger = HostLedger(host_pool, device_ledger)
    host_pool._vradix_ledger = host_ledger
    return host_ledger


def ledgers_of(controller) -> tuple[Optional[PageLedger], Optional[HostLedger]]:
    """(device ledger, host ledger) of a HybridCacheController's KV pools; either may be None."""
    host_pool = getattr(getattr(controller.mem_pool_host, "anchor_entry", None), "host_pool", None)
    return ledger_of(controller.mem_pool_device_allocator), host_ledger_of(host_pool)


def host_ledger_of(host_pool) -> Optional[HostLedger]:
    """The ledger `attach` gave `host_pool` (None: none)."""
    return getattr(host_pool, "_vradix_ledger", None)


def host_copies_to_load(cache, node_id) -> torch.Tensor:
    """The host slots a load-back of `node_id` copies to the device (the FULL transfer `load_back` builds): the host
    copies of the nodes on its path that are not on the device."""
    from sglang.srt.mem_cache.unified_cache.components.base import CacheTransferPhase, ComponentType

    transfers = cache.tree_core.build_hicache_transfers(ComponentType.FULL, node_id, CacheTransferPhase.LOAD_BACK)
    if not transfers:
        return torch.empty(0, dtype=torch.int64)
    return transfers[0].host_indices
