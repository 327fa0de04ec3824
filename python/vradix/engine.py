"""Adapters between SGLang's scheduler objects and the vradix data path (admission → publication → reclaim → report).

Every function here is a hook body; `vradix.plugin.HOOKS` lists where each one attaches. They translate scheduler
state (queues, batches, weight-updater calls) into calls on the scheduler-independent steps in `admission`,
`publication`, `reclaim` and `overlap`, which the cache-level tests drive directly.
"""
from __future__ import annotations

import logging

from vradix import __version__, admission, guard, lora, overlap, provenance, publication, report
from vradix import ledger as kv_ledger
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
    unobserved = ledger_blind_spots(scheduler)
    if unobserved:
        # KV written by these paths bypasses run_batch's stamp; a strict guard would reject every such prefix.
        logger.warning("vradix: KV page ledger disabled (KV also arrives via %s); the epoch namespace still applies",
                       ", ".join(unobserved))
    state = attach(cache, with_ledger=not unobserved)
    state.label = current_label()
    state.metrics = report.metrics_for(scheduler)
    report.export_metrics(scheduler)
    logger.info("vradix %s active: epoch-namespaced radix cache (%s, tree core %s), epoch %d; KV page ledger %s "
                "(verify=%s, audit=%s)", __version__, type(cache).__name__, state.tree_core, state.epoch,
                "on" if state.ledger is not None else "off", state.guard.verify, state.guard.audit)


def ledger_blind_spots(scheduler) -> list[str]:
    """KV write paths the ledger does not observe in this engine (HiCache load-back, P/D transfer, speculative
    drafts)."""
    spots = []
    if getattr(scheduler, "enable_hierarchical_cache", False):
        spots.append("HiCache load-back")
    mode = getattr(getattr(scheduler, "disaggregation_mode", None), "value", "null")
    if mode not in ("null", None):
        spots.append(f"P/D disaggregation ({mode})")
    spec = getattr(scheduler, "spec_algorithm", None)
    if spec is not None and not getattr(spec, "is_none", lambda: True)():
        spots.append("speculative decoding")
    return spots


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


def verify_match(original, req, tree_cache, *args, **kwargs):
    """AROUND mem_cache.common.match_kv_cache (strict guard): a tree match whose pages were not written under the
    request's epoch is redone as a miss, before anything is locked or allocated for it."""
    result = original(req, tree_cache, *args, **kwargs)
    state = state_of(tree_cache)
    if (state is None or state.ledger is None or state.guard.verify != "strict" or req.prefix_len == 0
            or req.kv.holds_kv):
        return result
    expected = getattr(req, "_vradix_epoch", state.epoch)
    found = guard.matched_prefix_violations(state.ledger, tree_cache.prefix_device_indices(req), expected)
    state.guard_stats.prefixes_verified += 1
    if found.count == 0:
        return result
    guard.record_violation(state.guard_stats, (
        f"request {req.rid}: {found.count} of {req.prefix_len} matched prefix positions were not written under "
        f"epoch {expected} (first at position {found.first_pos}); recomputing it as a cache miss"))
    # Inserting would de-duplicate the recomputed KV onto the corrupt entry and point the request's row back at it.
    req.skip_radix_cache_insert = True
    return original(req, tree_cache, *args, **{**kwargs, "max_prefix_len": 0})


# ---- forward: what the ledger records ------------------------------------------------------------------------------
def stamp_forward_batch(scheduler, batch, *args, **kwargs):
    """BEFORE Scheduler.run_batch: the pages this forward writes are written under the current epoch's weights
    (publications drain in-flight batches first, so no forward straddles a weight change)."""
    state = state_of(scheduler.tree_cache)
    if state is not None and state.ledger is not None and batch is not None:
        state.ledger.stamp_written(getattr(batch, "out_cache_loc", None), state.epoch)


def sample_verify_prefill_batch(_result, batch, *args, **kwargs):
    """AFTER mem_cache.allocation.alloc_for_extend (sample guard): one fused check of the batch's reused prefixes,
    rows already written. Requests that crossed a publication hold older KV by contract and are not checked."""
    state = state_of(batch.tree_cache) if batch.tree_cache is not None else None
    if state is None or state.ledger is None or not guard.should_sample_batch(state.guard, state.guard_stats):
        return
    picked = [(r.kv.req_pool_idx, r.prefix_len, getattr(r, "_vradix_epoch", state.epoch)) for r in batch.reqs
              if r.prefix_len > 0 and not getattr(r, "_vradix_crossed", False)]
    if not picked:
        return
    rows, lens, epochs = map(list, zip(*picked))
    found = guard.batch_violations(state.ledger, batch.req_to_token_pool.req_to_token, rows, lens, epochs)
    state.guard_stats.batches_verified += 1
    if found.count:
        guard.record_violation(state.guard_stats, (
            f"prefill batch: {found.count} reused prefix positions not written under their request's epoch (first: "
            f"request {batch.reqs[found.first_index].rid} position {found.first_pos}) — detected after the fact "
            "(sample mode)"))


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
    live = live_requests(scheduler)
    inv = publication.bump(state, scheduler.tree_cache, live, list(scheduler.waiting_queue),
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
    state = state_of(tree_cache)
    if state is not None and state.ledger is not None and req.kv.holds_kv and provenance.crossed(req):
        # the row is freed by the release: read the device-side provenance witness first
        req._vradix_ledger_spans = kv_ledger.kv_spans(state.ledger, tree_cache.req_to_token_pool.req_to_token, req)
    result = original(req, tree_cache, *args, **kwargs)
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
            report.export_metrics(scheduler)
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
        block = report.state_block(scheduler)
        block["chunked_prefill_in_progress"] = scheduler.chunked_req is not None
        block["pool"] = pool_accounting(scheduler)
        if state.metrics is not None:
            state.metrics.export(block)
    result.internal_state["vradix"] = block
    return result


# ---- LoRA-scoped invalidation -------------------------------------------------------------------------------------------
def remember_adapter_insert(_result, cache, req, *args, **kwargs):
    """AFTER UnifiedRadixCache.checkpoint_into_tree: remember which adapter's namespace the insert went into."""
    state = state_of(cache)
    if state is not None:
        lora.remember_adapter_node(state, cache, req)


def count_adapter_load(result, scheduler, recv_req, *args, **kwargs):
    """AFTER Scheduler.load_lora_adapter(_from_tensors): a load mints a new lora_id, i.e. a fresh namespace."""
    state = state_of(scheduler.tree_cache)
    if state is not None and result.success:
        state.lora_events += 1
        logger.info("vradix: adapter %r loaded as lora_id %s: its requests match only KV of this load",
                    recv_req.lora_name, recv_req.lora_id)


def free_unloaded_adapter(result, scheduler, recv_req, *args, **kwargs):
    """AFTER Scheduler.unload_lora_adapter: free the entries of the unloaded adapter, and only those."""
    state = state_of(scheduler.tree_cache)
    if state is None or not result.success:
        return
    state.lora_events += 1
    freed = lora.free_adapter_entries(state, scheduler.tree_cache, recv_req.lora_id)
    state.lora_tokens_freed += freed
    logger.info("vradix: adapter %r (lora_id %s) unloaded: freed %d of its cached tokens; other namespaces untouched",
                recv_req.lora_name, recv_req.lora_id, freed)
    report.export_metrics(scheduler)


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
