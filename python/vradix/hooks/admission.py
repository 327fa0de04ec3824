"""Step 1 hooks (scheduler process): stamp at admission, re-bind before a match, verify what a match adopts (and
what a load-back from the HiCache host pool adds to it)."""
from __future__ import annotations

from vradix import admission, guard, hicache_ledger, lora, request, sessions
from vradix.ledger import ledger_of
from vradix.namespace import ReservedNamespaceError
from vradix.state import state_of


def stamp_request(_result, scheduler, req, *args, **kwargs):
    """AFTER Scheduler._maybe_namespace_elastic_radix_cache: bind the request to the current epoch (a LoRA request
    also to its adapter's content identity, read from the adapter this scheduler loaded for its `lora_id`)."""
    state = state_of(scheduler.tree_cache)
    if state is None:
        return
    lora.identify_adapter(state, scheduler, getattr(req, "lora_id", None))
    try:
        admission.stamp(state, req)
    except ReservedNamespaceError as e:
        state.forged_keys_rejected += 1
        admission.stamp_refused(state, req)  # bound without the forged key, so it can match nothing foreign
        req.set_finish_with_abort(f"Invalid request: {e}")


def stamp_unstamped_on_queue(scheduler, req, *args, **kwargs):
    """BEFORE Scheduler._add_request_to_queue: SGLang queues some requests without passing the admission hook above
    (a request for a missing or closing session, one a session aborts at creation: aborted, but still matched and
    prefilled for one token). Bind those here, so every queued request carries its epoch before any match."""
    state = state_of(scheduler.tree_cache)
    if state is None or request.of(req) is not None:
        return
    stamp_request(None, scheduler, req)


def rebind_before_match(req, tree_cache, *args, **kwargs):
    """BEFORE mem_cache.common.match_kv_cache: a request holding no KV always matches under the current epoch."""
    state = state_of(tree_cache)
    if state is not None:
        admission.rebind_if_unheld(state, req)


def release_stale_session_slot(session, params, *args, **kwargs):
    """BEFORE StreamingSession.try_match_prefix: a slot whose record a turn kept across a publication is released
    before it can be lent to the session's next turn, which then matches in its own namespace (`vradix.sessions`)."""
    state = state_of(session.cache)
    if state is not None and params.req is not None:
        sessions.release_before_lend(state, session.cache, params.req)


def verify_match(original, req, tree_cache, *args, **kwargs):
    """AROUND mem_cache.common.match_kv_cache (strict guard): a tree match whose pages were not written under the
    request's epoch is redone as a miss, before anything is locked or allocated for it. A verdict the request already
    has for this match is reused (`guard.verdict_key`); inside a scheduling pass the check is deferred to the pass's
    end, where the pass's matches are checked together."""
    result = original(req, tree_cache, *args, **kwargs)
    state = state_of(tree_cache)
    if (state is None or state.ledger is None or state.guard.verify != "strict" or req.prefix_len == 0
            or req.kv.holds_kv):
        return result
    st = request.require(req)
    key = guard.verdict_key(state.ledger, req, st.epoch)
    if key is not None and st.verdict_key == key:
        state.guard_stats.verdicts_reused += 1
        ok = st.verdict_ok
    else:
        slots = tree_cache.prefix_device_indices(req)
        if state.pending_matches is not None:
            state.pending_matches.append(guard.PendingMatch(req, slots, st.epoch, key))
            return result
        ok = guard.verify_match(state.ledger, state.guard_stats, st, slots, st.epoch, key) == 0
        if not ok:
            record_match_violation(state, req, slots, st.epoch)
    if ok or state.guard.detect_only:
        # detection only: every rank must schedule the same prefix length; one rank's ledger alone cannot change it
        return result
    # Inserting would de-duplicate the recomputed KV onto the corrupt entry and point the request's row back at it.
    req.skip_radix_cache_insert = True
    return original(req, tree_cache, *args, **{**kwargs, "max_prefix_len": 0})


def verify_scheduling_pass(original, policy, *args, **kwargs):
    """AROUND SchedulePolicy.calc_priority (strict guard): the pass re-matches every waiting request; their checks run
    together at its end, in one gather/compare and one host read, and a violating match is redone as a miss then.
    The pass's order is a heuristic and allocates nothing, so checking after it sorted changes no safety property:
    the admitting match reuses (or recomputes) the verdict before anything is locked."""
    state = state_of(policy.tree_cache)
    if (state is None or state.ledger is None or state.guard.verify != "strict"
            or state.pending_matches is not None):
        return original(policy, *args, **kwargs)
    state.pending_matches = []
    try:
        result = original(policy, *args, **kwargs)
        pending = state.pending_matches
    finally:
        state.pending_matches = None
    # a request matched twice in the pass keeps its last match
    latest = list({id(p.req): p for p in pending}.values())
    counts = guard.verify_matches(state.ledger, state.guard_stats, latest)
    for p, n in zip(latest, counts):
        if n:
            record_match_violation(state, p.req, p.slots, p.epoch)
            if not state.guard.detect_only and p.req.prefix_len:
                match_kv_cache_as_miss(p.req, policy.tree_cache)
    return result


def record_match_violation(state, req, slots, epoch: int) -> None:
    found = guard.matched_prefix_violations(state.ledger, slots, epoch)  # the first position, for the log
    guard.record_violation(state.guard_stats, (
        f"request {req.rid}: {found.count} of {slots.numel()} matched prefix positions were not written under "
        f"epoch {epoch} (first at position {found.first_pos}); "
        + ("detected only (more than one TP/PP rank)" if state.guard.detect_only
           else "recomputing it as a cache miss")))


def match_kv_cache_as_miss(req, tree_cache) -> None:
    """Redo a pass's match of `req` as a miss, through SGLang's (hooked) match_kv_cache. Inserting would de-duplicate
    the recomputed KV onto the corrupt entry and point the request's row back at it."""
    from sglang.srt.mem_cache import common

    req.skip_radix_cache_insert = True
    common.match_kv_cache(req, tree_cache, max_prefix_len=0)


def sample_verify_prefill_batch(_result, batch, *args, **kwargs):
    """AFTER mem_cache.allocation.alloc_for_extend (sample guard): one fused check of the batch's reused prefixes,
    rows already written. Requests that crossed a publication hold older KV by contract and are not checked."""
    state = state_of(batch.tree_cache) if batch.tree_cache is not None else None
    if state is None or state.ledger is None or not guard.should_sample_batch(state.guard, state.guard_stats):
        return
    reusing = [(r, request.require(r)) for r in batch.reqs if r.prefix_len > 0]
    picked = [(r, st) for r, st in reusing if not st.crossed]
    if not picked:
        return
    rows = [r.kv.req_pool_idx for r, _ in picked]
    lens = [r.prefix_len for r, _ in picked]
    epochs = [st.epoch for _, st in picked]
    found = guard.batch_violations(state.ledger, batch.req_to_token_pool.req_to_token, rows, lens, epochs)
    state.guard_stats.batches_verified += 1
    if found.count:
        guard.record_violation(state.guard_stats, (
            f"prefill batch: {found.count} reused prefix positions not written under their request's epoch (first: "
            f"request {picked[found.first_index][0].rid} position {found.first_pos}) — detected after the fact "
            "(sample mode)"))


def verify_load_back(original, cache, params, *args, **kwargs):
    """AROUND UnifiedRadixCache.init_load_back (strict guard): the host copies a request is about to load back must
    carry its epoch (their pages' epochs travel with them, `vradix.hicache_ledger`). On a violation nothing is
    loaded: the request recomputes that span, as after a load-back SGLang declines, and is barred from inserting."""
    state = state_of(cache)
    req = params.req
    if (state is None or state.ledger is None or state.guard.verify != "strict" or req is None
            or params.host_hit_length <= 0):
        return original(cache, params, *args, **kwargs)
    host = ledger_of(hicache_ledger.kv_host_pool(cache))
    slots = hicache_ledger.host_copies_to_load(cache, params.best_match_node) if host is not None else None
    if slots is None or slots.numel() == 0:
        return original(cache, params, *args, **kwargs)
    expected = request.require(req).epoch
    found = guard.matched_prefix_violations(host, slots.to(host.device), expected)
    state.guard_stats.prefixes_verified += 1
    if found.count == 0:
        return original(cache, params, *args, **kwargs)
    guard.record_violation(state.guard_stats, (
        f"request {req.rid}: {found.count} of {slots.numel()} host-cached positions to load back were not written "
        f"under epoch {expected} (first at position {req.prefix_len + found.first_pos}); "
        + ("detected only (more than one TP/PP rank)" if state.guard.detect_only
           else "recomputing them instead of loading")))
    if state.guard.detect_only:
        return original(cache, params, *args, **kwargs)
    req.skip_radix_cache_insert = True
    return 0, req.last_node
