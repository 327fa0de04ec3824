"""Step 3 hooks (scheduler process): free stale KV when a crossing request releases it; flush lock-aware."""
from __future__ import annotations

from vradix import epochs, host_tier, mm_embeddings, provenance, report, request
from vradix import ledger as kv_ledger
from vradix.hooks.publication import bump_scheduler, current_label
from vradix.state import Invalidation, state_of


def reclaim_on_release(original, req, tree_cache, *args, **kwargs):
    """AROUND mem_cache.common.release_kv_cache: free the stale path a crossing request just unlocked."""
    lock = getattr(req, "lock", None)
    node = lock.node if lock is not None else None
    state = state_of(tree_cache)
    if state is not None and state.ledger is not None and req.kv.holds_kv and provenance.crossed(req):
        # the row is freed by the release: read the device-side provenance witness first
        r2t = tree_cache.req_to_token_pool.req_to_token
        request.require(req).ledger_spans = kv_ledger.kv_spans(state.ledger, r2t, req)
    result = original(req, tree_cache, *args, **kwargs)
    if state is not None:
        epochs.on_release(state, tree_cache, req, node)
    return result


def lock_aware_flush(original, scheduler, *args, **kwargs):
    """AROUND Scheduler.flush_cache: with KV holders present, invalidate lock-aware instead of refusing.

    Never a second bump for one publication: the flush an update call asks for after its bump is that bump, and a
    flush inside a weight-update session is the session's bump at `end_weight_update`."""
    state = state_of(scheduler.tree_cache)
    if state is None:
        return original(scheduler, *args, **kwargs)
    scope = state.update_scope
    if state.session is not None or (scope is not None and scope.bumped is not None):
        return True
    if scheduler.is_fully_idle(ignore_waiting=scheduler._engine_paused):
        cached = scheduler.tree_cache.evictable_size() + scheduler.tree_cache.protected_size()
        host_before = host_tier.available(scheduler.tree_cache)
        ok = original(scheduler, *args, **kwargs)
        if ok:
            state.flushes += 1
            state.stale_tokens_freed_total += cached
            state.last = Invalidation(state.epoch, state.epoch, state.label, "flush (idle reset)", tokens_freed=cached,
                                      mm_embeddings_cleared=mm_embeddings.clear_all())
            if host_before is not None:
                state.last.host_tokens_freed = host_tier.available(scheduler.tree_cache) - host_before
                state.stale_host_tokens_freed_total += state.last.host_tokens_freed
            report.export_metrics(scheduler)
        return ok
    if scope is not None:
        # SGLang flushes after an update whose target runner loaded although the call failed (a draft runner after
        # it): the weights may have changed, so this flush is that update's one, conservative, publication bump
        scope.bumped = bump_scheduler(scheduler, reason=f"failed {scope.source} (conservative)", label=current_label())
        return True
    bump_scheduler(scheduler, reason="lock-aware flush", is_publication=False)
    return True
