"""Prefill scheduling hooks (scheduler process): compute each uncached prefix once (`vradix.core.dedup`)."""
from __future__ import annotations

from sglang.srt.managers.schedule_policy import IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD, AddReqResult

from vradix.core import dedup
from vradix.core.state import state_of


def track_prefill_pass(original, scheduler, *args, **kwargs):
    """AROUND Scheduler._get_new_batch_prefill_raw: one pass of prefill admission, with the prefixes already being
    computed (launched batches, the continuing chunk) as its pending set. SGLang's own in-batch threshold (tokens,
    at least a page) decides what sharing is worth a wait."""
    state = state_of(scheduler.tree_cache)
    if state is None or not state.dedup.enabled or not dedup.applies_to(scheduler.tree_cache):
        return original(scheduler, *args, **kwargs)
    threshold = max(IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD, scheduler.page_size, 1)
    state.dedup.start_pass(dedup.begin_pass(scheduler, threshold))
    try:
        return original(scheduler, *args, **kwargs)
    finally:
        state.dedup.end_pass()


def hold_back_duplicate_prefill(original, adder, req, *args, **kwargs):
    """AROUND PrefillAdder.add_one_req: a request whose uncached prefix a pending request is computing is skipped
    for this pass (CONTINUE without admitting it, as SGLang's loop skips a request); an admitted one joins the pass's
    pending set."""
    state = state_of(adder.tree_cache)
    p = state.dedup.current if state is not None else None
    if p is None:
        return original(adder, req, *args, **kwargs)
    if dedup.should_hold_back(p, req, state.dedup.stats):
        return AddReqResult.CONTINUE
    result = original(adder, req, *args, **kwargs)
    if adder.can_run_list and adder.can_run_list[-1] is req:
        p.add(req)
    return result
