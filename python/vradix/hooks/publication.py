"""Step 2 hooks (scheduler process): every way the weights (or their label) change bumps the epoch once."""
from __future__ import annotations

import logging

from vradix import epochs, guard, overlap, report
from vradix.state import Invalidation, UpdateScope, state_of

logger = logging.getLogger("vradix")


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
    live = live_requests(scheduler)
    inv = epochs.bump(state, scheduler.tree_cache, live, list(scheduler.waiting_queue),
                           reason=reason, label=label, is_publication=is_publication)
    if state.ledger is not None:
        guard.audit(state.guard, state.guard_stats, state.ledger, scheduler.req_to_token_pool.req_to_token, live,
                    state.epoch)
    logger.info(inv.summary() + " in %.3f ms", inv.latency_ms)
    report.export_metrics(scheduler)
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
    """AROUND Scheduler.record_weight_version_change: `/update_weight_version` alone is a epochs."""
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
