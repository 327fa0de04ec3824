"""Admission hooks (data-path step 1, scheduler process): stamp at admission, re-bind before a match, and verify what a load-back from
the HiCache host pool would add to a match (what a match adopts is checked before the forward, `hooks.ledger`)."""
from __future__ import annotations

from vradix import request
from vradix.core import admission, lora, sessions, staleness
from vradix.ledger import guard, host as host_ledger
from vradix.ledger.device import ledger_of
from vradix.identity import ReservedNamespaceError
from vradix.core.state import state_of


def stamp_request(_result, scheduler, req, *args, **kwargs):
    """AFTER Scheduler._maybe_namespace_elastic_radix_cache: bind the request to the current epoch (a LoRA request
    also to its adapter's content identity, read from the adapter this scheduler loaded for its `lora_id`)."""
    state = state_of(scheduler.tree_cache)
    if state is None:
        return
    lora.identify_adapter(state, scheduler, getattr(req, "lora_id", None))
    try:
        admission.stamp(state, req)
    except staleness.StalenessError as e:
        req.set_finish_with_abort(f"Invalid request: {e}")
    except ReservedNamespaceError as e:
        state.count_forged_key()
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
        admission.prepare_for_match(state, tree_cache, req, kwargs.get("token_ids", args[0] if args else None))


def release_stale_session_slot(session, params, *args, **kwargs):
    """BEFORE StreamingSession.try_match_prefix: a slot whose record a turn kept across a publication is released
    before it can be lent to the session's next turn, which then matches in its own namespace (`vradix.core.sessions`)."""
    state = state_of(session.cache)
    if state is not None and params.req is not None:
        sessions.release_before_lend(state, session.cache, params.req)


def verify_load_back(original, cache, params, *args, **kwargs):
    """AROUND UnifiedRadixCache.init_load_back (strict guard): the host copies a request is about to load back must
    carry its epoch (their pages' epochs travel with them, `vradix.ledger.host`). On a violation nothing is
    loaded: the request recomputes that span, as after a load-back SGLang declines, and is barred from inserting."""
    state = state_of(cache)
    req = params.req
    if (state is None or state.ledger is None or state.guard.config.verify != "strict" or req is None
            or params.host_hit_length <= 0):
        return original(cache, params, *args, **kwargs)
    host = ledger_of(host_ledger.kv_host_pool(cache))
    slots = host_ledger.host_copies_to_load(cache, params.best_match_node) if host is not None else None
    if slots is None or slots.numel() == 0:
        return original(cache, params, *args, **kwargs)
    expected = request.require(req).epoch
    found = guard.matched_prefix_violations(host, slots.to(host.device), expected)
    state.guard.stats.prefixes_verified += 1
    if found.count == 0:
        return original(cache, params, *args, **kwargs)
    guard.record_violation(state.guard.stats, (
        f"request {req.rid}: {found.count} of {slots.numel()} host-cached positions to load back were not written "
        f"under epoch {expected} (first at position {req.prefix_len + found.first_pos}); "
        + (guard.DETECTED_ONLY if state.guard.config.detect_only
           else "recomputing them instead of loading")))
    if state.guard.config.detect_only:
        return original(cache, params, *args, **kwargs)
    req.skip_radix_cache_insert = True
    return 0, req.last_node
