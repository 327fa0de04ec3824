"""Reclaim hooks (data-path step 3, scheduler process): free stale KV when a crossing request releases it
(`release_tracked`, from `hooks.serving.release`); reclaim the
stale KV a bump deferred (`vradix.core.deferred_reclaim`): a slice per scheduler iteration, stale first whenever SGLang
evicts, the rest when the engine is idle."""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable

from vradix import request
from vradix.core import provenance, deferred_reclaim, staleness
from vradix.observability import metrics
from vradix.ledger import device as kv_ledger
from vradix.engine import state_of

if TYPE_CHECKING:
    from vradix.engine import Engine


def release_tracked(state: "Engine", original: Callable, req, tree_cache, *args: Any, **kwargs: Any) -> Any:
    """The release of a request that is not plain (`Engine.release_is_plain`: crossing, bounded, or awaited by the
    deferred reclaim; `hooks.serving.release`): free the stale path it just unlocked, keep its ledger spans for its
    provenance, report a bounded request's reuse."""
    lock = getattr(req, "lock", None)
    node = lock.node if lock is not None else None
    bounded = staleness.is_bounded(request.of(req))
    if state.ledger is not None and req.kv.holds_kv and (provenance.spans_several_epochs(req) or bounded):
        # the row is freed by the release: read the device-side provenance witness first
        r2t = tree_cache.req_to_token_pool.req_to_token
        request.require(req).keep_ledger_spans(kv_ledger.kv_spans(state.ledger, r2t, req))
    was_crossing = id(req) in state.crossing
    pending = was_crossing and state.deferred.active
    evictable_before = tree_cache.evictable_size() if pending else 0
    result = original(req, tree_cache, *args, **kwargs)
    state.on_release(tree_cache, req, node)
    if bounded:
        state.staleness.report_at_release(state, req)
    if pending:
        state.deferred.note_release(evictable_before, tree_cache.evictable_size())
    if was_crossing or bounded:
        metrics.refresh()  # crossing requests, pinned and freed stale tokens, stale reuse changed
    return result


def reclaim_stale_first(original, cache, params, *args, **kwargs):
    """AROUND UnifiedRadixCache._evict (every eviction: `evict`, `evict_for_alloc`): free stale KV first, whatever
    SGLang's eviction policy: KV that aged out of the window (the deferred reclaim), then, with a staleness window,
    in-window KV of older namespaces (`deferred_reclaim.evict_older_in_window`), and let SGLang evict only what is
    still needed. An allocation's availability target (`evict_for_alloc`) was fixed before this call, so SGLang's walk
    counts these frees toward it."""
    state = state_of(cache)
    if (state is None or params.num_tokens <= 0
            or not (state.deferred.active or state.staleness.window > 0)):
        return original(cache, params, *args, **kwargs)
    freed = state.deferred.reclaim(state, cache, params.num_tokens)
    freed += deferred_reclaim.evict_older_in_window(state, cache, params.num_tokens - freed)
    result = original(cache, replace(params, num_tokens=max(0, params.num_tokens - freed)), *args, **kwargs)
    result.num_tokens_evicted += freed
    return result


def reclaim_slice(scheduler, *args, **kwargs):
    """BEFORE Scheduler.get_next_batch_to_run (once per scheduler iteration that is not paused): one bounded slice of
    the deferred reclaim, before the scheduler sizes its next batch."""
    state = state_of(scheduler.tree_cache)
    if state is not None and state.deferred.active and state.deferred.step(state, scheduler.tree_cache):
        metrics.export_metrics(scheduler)


def finish_reclaim_when_idle(scheduler, *args, **kwargs):
    """BEFORE Scheduler.on_idle: a fully idle engine finishes the deferred reclaim before SGLang's idle check and its
    idle sleep (the loop may block on its socket until the next request)."""
    state = state_of(scheduler.tree_cache)
    if (state is not None and state.deferred.active and scheduler.is_fully_idle()
            and state.deferred.finish(state, scheduler.tree_cache)):
        metrics.export_metrics(scheduler)
