"""Prefill scheduling hooks (scheduler process): compute each uncached prefix once (`vradix.core.dedup`)."""
from __future__ import annotations

from sglang.srt.managers.schedule_policy import AddReqResult

from vradix.core import dedup
from vradix.engine import state_of


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
