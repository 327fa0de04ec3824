"""Data-path step 3 (reclaim) — the HiCache host tier (L2) at a publication: stale host copies are freed lock-aware, like device KV.

With `--enable-hierarchical-cache`, SGLang backs tree nodes up to host memory (write-through on insert, or on device
eviction under write-back). Device eviction then *demotes* a backed-up node: it stays in the tree, matchable by its
namespace, and holds host pages. After a publication nothing can match a stale node again, so its host pages would be
freed only by host-pool pressure (LRU). vradix frees them at the bump instead, with SGLang's own host eviction:

1. `settle_transfers`: finish the D->H backups and the started H->D load-backs still in flight. Until its ack a
   transfer pins its node (a write-through backup and a load-back lock it, a load-back also host-locks it), so a stale
   node pinned across the bump would be unlocked later and left to LRU. A publication already waits for the forward
   pass (`overlap.drain_inflight_batch`); waiting for the copies too is of the same order. A load-back that the forward
   has not started yet is left alone (starting it early would let the forward skip its wait for the copy).
2. the device reclaim (`reclaim.free_all_unlocked`) evicts every unlocked stale node; SGLang demotes the backed-up ones
   to host (under write-back it first backs up the unbacked ones: its eviction is "back up, then demote").
3. `free_stale_host`: one `evict_host` over the whole host pool. The new namespace is still empty, so every host copy
   that nothing pins is stale: the host-only nodes, and the host copies of stale nodes that crossing requests still
   hold on device. SGLang frees the latter ("host duplicates") in its write-back host eviction only; under
   write-through vradix runs that same eviction by selecting write-back for the duration of the call
   (`host_duplicate_reclaim`), when it is safe: nothing in flight, no L3 storage (see `duplicates_reclaimable`).

Invariant between bumps (HiCache, no L3): no node of an older epoch holds a host copy. Nothing backs up a stale node
after the bump (crossing requests never insert, and stale nodes are locked, so never evicted), so a crossing request's
release frees its stale path from the device without demoting it (`reclaim.free_released_path`): its host copies
were freed at the bump. Once every request finished, the host pool is whole again: `available == total`
(`pool_figures`, `idle_leaks`).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Optional


def enabled(cache) -> bool:
    """Whether `cache` keeps KV in a HiCache host pool (L2, "cache" host-memory mode)."""
    return (getattr(cache, "cache_controller", None) is not None
            and getattr(cache, "host_memory_mode", "cache") == "cache"
            and getattr(cache, "linker", None) is None
            and getattr(cache, "buffer_pipeline", None) is None)


def host_pool(cache):
    return cache.cache_controller.mem_pool_host


def available(cache) -> Optional[int]:
    """Free host-pool tokens, or None without a host tier."""
    return host_pool(cache).available_size() if enabled(cache) else None


@dataclass
class HostFreed:
    """The host-pool tokens a `counting_freed` block gave back: set when the block ends; None without a host tier."""

    tokens: Optional[int] = None


@contextmanager
def counting_freed(cache):
    """Count the host-pool tokens the block gives back (free tokens after minus before; the block allocates none)."""
    before = available(cache)
    freed = HostFreed()
    yield freed
    if before is not None:
        freed.tokens = available(cache) - before


def settle_transfers(cache) -> None:
    """Finish every D->H backup still queued or unacknowledged, and every H->D load-back already started, so that no
    in-flight transfer pins a node across the bump. Each TP rank issued the same transfers, so each finishes the same
    ones (no cross-rank count is needed)."""
    if not enabled(cache):
        return
    cache.writing_check(write_back=True)  # SGLang's blocking wait: submit queued backups, wait for every ack
    acks = cache.cache_controller.ack_load_queue
    for ack in acks:
        ack.finish_event.synchronize()
    if acks:
        cache.loading_check(finish_count=len(acks))


def duplicates_reclaimable(cache) -> bool:
    """Whether freeing every host copy of a device-resident node is safe: each one must go, or write-through's
    invariant "a backed-up node's parent is backed up" would break (SGLang deletes an unbacked leaf outright, and a
    host-only child left under it would be orphaned). SGLang skips a duplicate that a transfer or a host lock pins:
    so nothing may be in flight (after `settle_transfers`, only a load-back the forward has not started) and no L3
    storage may be attached (its backups and prefetches host-lock nodes)."""
    return not (cache.ongoing_load_back or cache.ongoing_write_through or cache.enable_storage)


@contextmanager
def host_duplicate_reclaim(cache):
    """Run the block under SGLang's write-back host eviction, which frees host duplicates before host-only leaves
    (`drive_host_eviction`). The tree's write policy is read only by inserts and evictions, none of which run inside
    the block (the scheduler thread is in the bump)."""
    before = cache.is_write_back
    cache.is_write_back = True
    try:
        yield
    finally:
        cache.is_write_back = before


def free_stale_host(cache) -> int:
    """At a bump, after the device reclaim: evict every host copy nothing pins (all stale: the new namespace is
    empty). Returns host tokens freed."""
    if not enabled(cache):
        return 0
    everything = host_pool(cache).size
    if duplicates_reclaimable(cache):
        with host_duplicate_reclaim(cache):
            return cache.evict_host(everything)
    return cache.evict_host(everything)


def stale_left(cache) -> int:
    """Right after `free_stale_host`: host-pool tokens still in use. All are stale (the new namespace is empty) and
    none can be matched again; SGLang skipped them because something holds them: a storage (L3) backup in flight
    host-locks its node until its ack, and with storage attached the host copies of nodes crossing requests hold on
    device stay (`duplicates_reclaimable`). The host pool's own eviction frees them once nothing holds them."""
    pool = host_pool(cache)
    return pool.size - pool.available_size()


def pool_figures(cache) -> Optional[dict]:
    """The host pool's terms (tokens), or None without a host tier. `used` is what the tree (and any transfer in
    flight) holds; when the engine is idle right after a bump, nothing is left to hold it: `available == total`."""
    if not enabled(cache):
        return None
    pool = host_pool(cache)
    cc = cache.cache_controller
    return {
        "total": pool.size,
        "available": pool.available_size(),
        "used": pool.size - pool.available_size(),
        "transfers_in_flight": len(cache.ongoing_write_through) + len(cache.ongoing_load_back),
        "queued_backups": len(cc.write_queue),
        "write_policy": "write_back" if cache.is_write_back else "write_through",
    }


def idle_leaks(cache) -> list[str]:
    """The strict host-pool check for an idle engine whose tree holds nothing (once every request finished, after a
    bump or a flush): every host page is free and no transfer is in flight. SGLang checks only the device pools when
    idle (`available + evictable + protected == total`); this is the host counterpart. Returns the violations (empty:
    ok)."""
    figures = pool_figures(cache)
    if figures is None:
        return []
    leaks = []
    if figures["available"] != figures["total"]:
        leaks.append(f"host pool: {figures['used']} of {figures['total']} tokens still held")
    if figures["transfers_in_flight"] or figures["queued_backups"]:
        leaks.append(f"host pool: {figures['transfers_in_flight']} transfer(s) unacknowledged, "
                     f"{figures['queued_backups']} backup(s) queued")
    return leaks
