"""Data-path step 2 (publication) — HiCache L3 storage prefetches across a publication.

SGLang starts a storage prefetch for a request when it is queued (`Scheduler._prefetch_kvcache`): a hit query on the
L3 store, then a copy of the hit pages into host memory, all keyed by the request's `extra_key` at that moment. When
the copy completes, the pages land in the tree as host nodes under that key
(`UnifiedRadixCache._handle_prefetch_result`, from the scheduler's event poll or its admission check). A publication
re-binds every queued request that holds no KV to the new namespace (`Engine.rebind_if_unheld`), so a prefetch
started before it fetches the old weights' KV for a request that can no longer use it. Three steps keep that KV out:

1. `end_queued_attempts`, at a publication, before the bump: every queued request that holds no KV (exactly those the
   bump re-binds) ends its cache attempt as SGLang ends an aborted one (`finish(handle, ABORT)`, i.e.
   `release_aborted_request`): its prefetch is terminated, its host pages are freed (at once, or by the prefetch's
   final ack when the copy is still running), its anchor's host lock is dropped, and any L3 tokens already credited
   to it are forgotten. It then starts a new attempt (`advance_cache_request_handle`, SGLang's own step when it
   re-queues a P/D prefill request), so a late hit or ack of the revoked prefetch finds no owner, and its storage
   lookup budget restarts as after a retraction. This runs before the bump's reclaim, so that no stale anchor is
   host-locked when stale nodes are freed, and before a reset (nothing held), which would drop that state blindly.
2. `reissue`, after the bump: the re-bound requests' storage lookups are issued again under the new namespace
   (`Scheduler._prefetch_kvcache`), when that namespace may already be in a store: a fingerprint or declared identity
   used for the first time in this process (`may_be_stored`). A nonce's keys are in no store, and a namespace that
   carries the epoch (an identity this process already used) is shared with another process only by coincidence, so
   neither is looked up again.
3. `stale`/`discard`, the landing guard: a prefetch whose key is not of the current epoch is never inserted; its host
   pages go back to the pool. This covers prefetches the bump did not see (a request outside the waiting queue, e.g.
   a P/D prefill request in its bootstrap queue, is re-bound at its next match) and callers of `Engine.bump` alone.

Invariant: after a publication no prefetch keyed by an older namespace lands in the tree, and each revoked
prefetch's host pages return to the pool exactly once, so once transfers settle the host pool holds only the tree's
pages.
"""
from __future__ import annotations

from typing import Iterable

from vradix import identity, request
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from vradix.engine import Engine


def storage_lookups(scheduler) -> bool:
    """Whether the scheduler looks requests up in an external KV store when they are queued."""
    cache = scheduler.tree_cache
    return bool(getattr(scheduler, "enable_hicache_storage", False) or getattr(scheduler, "enable_lmcache", False)
                or getattr(cache, "linker", None) is not None)


def end_queued_attempts(cache, queued: Iterable) -> int:
    """Before a bump: end the cache attempt of every queued request that holds no KV and start a new one (see the
    module docstring, step 1). Returns how many had a prefetch in flight."""
    from sglang.srt.mem_cache.base_prefix_cache import CacheRequestOutcome

    revoked = 0
    for req in queued:
        if request.holds_kv(req):
            continue
        handle = req.cache_request_handle
        revoked += handle in getattr(cache, "ongoing_prefetch", ())
        cache.finish(handle, CacheRequestOutcome.ABORT)
        req.advance_cache_request_handle()
        # a fresh lookup budget, as SGLang gives a retracted request when it re-queues it
        req.storage_prefetch_retry_attempts = 0
        req.storage_prefetch_last_match_len = None
        req.staged_prefetch_plan = None
    return revoked


def may_be_stored(state: Engine) -> bool:
    """Whether the current namespace's keys may already be in a store: its identity is proven or declared (equal
    identities build equal keys across processes) and this process uses it for the first time (no epoch suffix)."""
    current = state.identities[state.epoch]
    return (current.identity.source != "nonce"
            and current.prefix == identity.namespace(current.identity.weight_id, scope=state.scope))


def reissue(scheduler, state: Engine, queued: Iterable) -> int:
    """After a bump: look the re-bound queued requests up again under their new namespace, when it may be stored.
    Returns how many lookups were issued. Not on a P/D decode role: SGLang looks a decode request up in storage only
    when its pre-allocation matches it (`DecodePreallocQueue._start_hicache_prefetch`, which also sizes the promise
    to prefill), and by then it is bound to the new namespace; a queue-time lookup there would be a second prefetch
    for one request, outside decode's restore accounting."""
    if not may_be_stored(state) or is_decode_role(scheduler):
        return 0
    issued = 0
    for req in queued:
        if request.holds_kv(req) or req.finished():
            continue
        scheduler._prefetch_kvcache(req)
        issued += 1
    return issued


def is_decode_role(scheduler) -> bool:
    return getattr(getattr(scheduler, "disaggregation_mode", None), "value", None) == "decode"


def stale(state: Engine, extra_key) -> bool:
    """Whether a prefetch keyed by `extra_key` can no longer be used: its namespace is not the current epoch's. Every
    request that holds no KV matches under the current epoch. The one kind that prefetches while holding KV, a P/D
    decode request restoring its promised prefix from L3, crosses the publication: its old-namespace pages are
    discarded too, so its restore comes up short and SGLang fails the request (`HiCacheRestoreResult.FAILED`) rather
    than serve an incomplete restore."""
    return state.epoch_of(extra_key) != state.epoch


def discard(cache, operation) -> None:
    """Retire a completed prefetch without inserting it, the way SGLang retires one it cannot use (its hybrid
    all-or-nothing discard): release the copied pages `[0, completed)` (the caller's ack path releases the rest), drop
    the anchor's host lock and the prefetch's occupancy, and credit the request with no L3 tokens."""
    request = operation.handle
    info = cache.ongoing_prefetch[request]
    cache._finish_storage_prefetch(request, fulfilled_tokens=0, reason="dropped")
    aux = [x for xfers in info.comp_xfers.values() for x in xfers] if operation.pool_transfers_done else None
    cache._retire_ongoing_prefetch(request, info.host_indices[: operation.completed_tokens], aux)
    cache.prefetch_loaded_tokens_by_reqid[request] = 0
    cache.prefetch_loaded_storage_start_by_reqid.pop(request, None)
