"""Adapters between SGLang's scheduler objects and the vradix data path (admission → publication → reclaim → report).

Every function here is a hook body; `vradix.plugin.HOOKS` lists where each one attaches. They translate scheduler
state (queues, batches, weight-updater calls) into calls on the scheduler-independent steps in `admission`,
`publication`, `reclaim` and `overlap`, which the cache-level tests drive directly.
"""
from __future__ import annotations

import logging

from vradix import __version__, admission, overlap, publication, reclaim
from vradix.namespace import ReservedNamespaceError
from vradix.state import Invalidation, UpdateScope, attach, state_of

logger = logging.getLogger("vradix")


# ---- engine start ---------------------------------------------------------------------------------------------------
def attach_to_scheduler(_result, scheduler, *args, **kwargs):
    """AFTER Scheduler.__init__: version the tree cache, or say loudly why vradix is a no-op / refuses."""
    cache = scheduler.tree_cache
    if not cache.supports_prefix_sharing():
        logger.info("vradix %s: radix cache is disabled; vradix is a no-op (nothing to version)", __version__)
        return
    tree_core = getattr(cache, "tree_core", None)
    if tree_core is None or not hasattr(tree_core, "collect_path_info"):
        raise RuntimeError(
            f"vradix {__version__} cannot version {type(cache).__name__} (it supports SGLang's UnifiedRadixCache). "
            "Refusing to serve an unversioned prefix cache: use the default radix backend, pass "
            "--disable-radix-cache, or set VRADIX_DISABLE=1 for stock behaviour.")
    state = attach(cache)
    logger.info("vradix %s active: epoch-namespaced radix cache (%s, tree core %s), epoch %d",
                __version__, type(cache).__name__, state.tree_core, state.epoch)


# ---- admission ------------------------------------------------------------------------------------------------------
def stamp_request(_result, scheduler, req, *args, **kwargs):
    """AFTER Scheduler._maybe_namespace_elastic_radix_cache: bind the request to the current epoch."""
    state = state_of(scheduler.tree_cache)
    if state is None:
        return
    try:
        admission.stamp(state, req)
    except ReservedNamespaceError as e:
        state.forged_keys_rejected += 1
        req.set_finish_with_abort(f"Invalid request: {e}")


def rebind_before_match(req, tree_cache, *args, **kwargs):
    """BEFORE mem_cache.common.match_kv_cache: a request holding no KV always matches under the current epoch."""
    state = state_of(tree_cache)
    if state is not None:
        admission.rebind_if_unheld(state, req)


# ---- publication ----------------------------------------------------------------------------------------------------
def live_requests(scheduler) -> set:
    reqs = {*scheduler.collect_inflight_reqs(), *scheduler.waiting_queue}
    if scheduler.chunked_req is not None:
        reqs.add(scheduler.chunked_req)
    coordinator = getattr(scheduler, "hisparse_coordinator", None)
    if coordinator is not None:
        reqs.update(act.req for act in coordinator.ack_staging_queue)
    return reqs


def bump_scheduler(scheduler, *, reason: str, label=None, is_publication: bool = True) -> Invalidation:
    state = state_of(scheduler.tree_cache)
    inv = publication.bump(state, scheduler.tree_cache, live_requests(scheduler), list(scheduler.waiting_queue),
                           reason=reason, label=label, is_publication=is_publication)
    logger.info(inv.summary() + " in %.3f ms", inv.latency_ms)
    return inv


def current_label():
    from sglang.srt.runtime_context import get_serving
    return get_serving().weight_version


def publish_after_version_record(original, updater, weight_version, *args, **kwargs):
    """AROUND SchedulerWeightUpdaterManager.record_weight_version_after_update: the success point of every
    update_weights_* call (weights changed, flush not yet run). Bumps exactly once per update."""
    result = original(updater, weight_version, *args, **kwargs)
    scheduler = updater.scheduler
    state = state_of(scheduler.tree_cache) if scheduler is not None else None
    if state is not None:
        scope = state.update_scope
        inv = bump_scheduler(scheduler, reason=scope.source if scope else "weight update", label=current_label())
        if scope is not None:
            scope.bumped = inv
    return result


def publish_on_version_change(original, scheduler, new_version, *args, **kwargs):
    """AROUND Scheduler.record_weight_version_change: `/update_weight_version` alone is a publication."""
    state = state_of(scheduler.tree_cache)
    if state is None or state.update_scope is not None:
        return original(scheduler, new_version, *args, **kwargs)
    before = current_label()
    overlap.drain_inflight_batch(scheduler)
    result = original(scheduler, new_version, *args, **kwargs)
    if new_version is not None and new_version != before:
        bump_scheduler(scheduler, reason="update_weight_version", label=current_label())
    return result


def _update_handler(source: str, needs_session: bool, failure_output=None):
    """`failure_output(message)` builds the failed response of this update path; when given, an exception raised by
    the update (e.g. a malformed `load_format`, which stock SGLang lets kill the scheduler) becomes a failed update
    with a clear message and a conservative bump, and the engine keeps serving."""
    def around_update(original, updater, recv_req, *args, **kwargs):
        scheduler = updater.scheduler
        overlap.drain_inflight_batch(scheduler)
        state = state_of(scheduler.tree_cache) if scheduler is not None else None
        if state is None:
            return original(updater, recv_req, *args, **kwargs)
        may_touch_weights = not needs_session or updater._session is not None
        state.update_scope = scope = UpdateScope(source=source)
        try:
            try:
                out = original(updater, recv_req, *args, **kwargs)
            except Exception as e:
                if failure_output is None:
                    raise
                message = f"{source} failed: {type(e).__name__}: {e}"
                logger.error("vradix: %s (reported as a failed update instead of stopping the engine)", message)
                out = failure_output(message)
            if scope.bumped is None and may_touch_weights and not out.success:
                scope.bumped = bump_scheduler(scheduler, reason=f"failed {source} (conservative)",
                                              label=current_label())
        finally:
            state.update_scope = None
        if scope.bumped is not None:
            out.message = f"{out.message} [{scope.bumped.summary()}]"
        return out

    around_update.__name__ = f"publish_{source}"
    return around_update


def _failed_disk_update(message: str):
    from sglang.srt.managers.io_struct import UpdateWeightFromDiskReqOutput
    return UpdateWeightFromDiskReqOutput(success=False, message=message, num_paused_requests=0)


publish_update_from_disk = _update_handler("update_weights_from_disk", needs_session=False,
                                           failure_output=_failed_disk_update)
publish_update_from_distributed = _update_handler("update_weights_from_distributed", needs_session=True)
publish_update_from_tensor = _update_handler("update_weights_from_tensor", needs_session=True)
publish_update_from_ipc = _update_handler("update_weights_from_ipc", needs_session=False)


def drain_before_weight_session(updater, *args, **kwargs):
    """BEFORE begin_weight_update: P2P/RDMA writes may start right after it; nothing may be in flight."""
    if updater.scheduler is not None:
        overlap.drain_inflight_batch(updater.scheduler)


def publish_on_session_end(original, updater, recv_req, *args, **kwargs):
    """AROUND end_weight_update: a session in which no update_weights_* call loaded weights was a P2P/RDMA write."""
    session = updater._session
    out = original(updater, recv_req, *args, **kwargs)
    scheduler = updater.scheduler
    if (out.success and session is not None and not session.loaded_weights and scheduler is not None
            and state_of(scheduler.tree_cache) is not None):
        inv = bump_scheduler(scheduler, reason="end_weight_update (P2P/RDMA)", label=current_label())
        out.message = f"{out.message} [{inv.summary()}]"
    return out


def drain_before_in_place_pause(scheduler, recv_req, *args, **kwargs):
    """BEFORE Scheduler.pause_generation: an in_place pause first finishes the batch already launched."""
    if recv_req.mode == "in_place":
        overlap.drain_inflight_batch(scheduler)


# ---- bad input: publication labels (launcher process, before anything is sent to the scheduler) -----------------
def reject_bad_version_label(tokenizer_manager, obj, *args, **kwargs):
    """BEFORE TokenizerControlMixin.update_weight_version: an invalid label raises InvalidLabelError, which
    `/update_weight_version` answers with HTTP 400; the epoch and the label stay as they were."""
    publication.check_label(obj.new_version)


async def reject_bad_update_label(original, tokenizer_manager, obj, *args, **kwargs):
    """AROUND TokenizerManager.update_weights_from_disk: refuse an invalid `weight_version` before the weights are
    touched (and before `abort_all_requests` aborts anything). The endpoint answers HTTP 400."""
    try:
        publication.check_label(obj.weight_version)
    except publication.InvalidLabelError as e:
        return False, str(e), 0
    return await original(tokenizer_manager, obj, *args, **kwargs)


# ---- reclaim ----------------------------------------------------------------------------------------------------------
def reclaim_on_release(original, req, tree_cache, *args, **kwargs):
    """AROUND mem_cache.common.release_kv_cache: free the stale path a crossing request just unlocked."""
    lock = getattr(req, "lock", None)
    node = lock.node if lock is not None else None
    result = original(req, tree_cache, *args, **kwargs)
    state = state_of(tree_cache)
    if state is not None:
        publication.on_release(state, tree_cache, req, node)
    return result


def lock_aware_flush(original, scheduler, *args, **kwargs):
    """AROUND Scheduler.flush_cache: with KV holders present, invalidate lock-aware instead of refusing."""
    state = state_of(scheduler.tree_cache)
    if state is None:
        return original(scheduler, *args, **kwargs)
    if scheduler.is_fully_idle(ignore_waiting=scheduler._engine_paused):
        cached = scheduler.tree_cache.evictable_size() + scheduler.tree_cache.protected_size()
        ok = original(scheduler, *args, **kwargs)
        if ok:
            state.flushes += 1
            state.stale_tokens_freed_total += cached
            state.last = Invalidation(state.epoch, state.epoch, state.label, "flush (idle reset)", tokens_freed=cached)
        return ok
    scope = state.update_scope
    if scope is not None and scope.bumped is not None:
        # the publication that asked for this flush already invalidated everything older, lock-aware
        return True
    bump_scheduler(scheduler, reason="lock-aware flush", is_publication=False)
    return True


def report_flush(result, wrapper, *args, **kwargs):
    """AFTER SchedulerFlushWrapper.handle: say what the flush did."""
    scheduler = getattr(wrapper._flush_cache, "__self__", None)
    state = state_of(scheduler.tree_cache) if scheduler is not None else None
    if result is not None and result.success and state is not None and state.last is not None:
        result.message = state.last.summary()
    return result


# ---- report ------------------------------------------------------------------------------------------------------------
def report_server_info(result, internal_state, *args, **kwargs):
    """AFTER InternalState.get_internal_state: a `vradix` block in /get_server_info."""
    scheduler = internal_state.scheduler
    cache = scheduler.tree_cache
    state = state_of(cache)
    if state is None:
        block = {"active": False, "version": __version__, "reason": "radix cache disabled"}
    else:
        block = state.as_dict(reclaim.stale_tokens_pinned(cache, publication.holder_nodes(state)))
        block["chunked_prefill_in_progress"] = scheduler.chunked_req is not None
        block["pool"] = pool_accounting(scheduler)
    result.internal_state["vradix"] = block
    return result


def pool_accounting(scheduler) -> dict:
    """The terms of SGLang's idle memory check, read on the scheduler thread (one consistent snapshot).

    When `idle` is true, no request holds KV, so `available + evictable + protected == total` and
    `req_slots_free == req_slots_total` must hold exactly (clients use this as a strict leak check)."""
    cache = scheduler.tree_cache
    return {
        "total": scheduler.max_total_num_tokens,
        "available": scheduler.token_to_kv_pool_allocator.available_size(),
        "evictable": cache.evictable_size(),
        "protected": cache.protected_size(),
        "req_slots_free": len(scheduler.req_to_token_pool.free_slots),
        "req_slots_total": scheduler.req_to_token_pool.size,
        "waiting_requests": len(scheduler.waiting_queue),
        "running_requests": len(scheduler.running_batch.reqs),
        "paused": bool(scheduler._engine_paused),
        "idle": bool(scheduler.is_fully_idle()),
    }
