"""Admission hooks (data-path step 1, scheduler process): stamp at admission, re-bind before a match, and verify what a load-back from
the HiCache host pool would add to a match (what a match adopts is checked before the forward, `hooks.ledger`)."""
from __future__ import annotations

from vradix import request
from vradix.ledger import guard, host as host_ledger
from vradix.ledger.device import ledger_of
from vradix.engine import state_of


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
