"""The steps and the accounting check the cache-level tests run on a `cache_fixture.CacheFixture` with vradix attached
(`vradix.engine.attach`): requests admitted as SGLang's queue admits them, driven to the end, publications as epoch
bumps, and `check` after each step."""
from __future__ import annotations

from vradix.engine import state_of


def new_req(fx, state, tokens, **kw):
    """A request for `tokens`, admitted with the current epoch's namespace (`Engine.admit_or_raise`)."""
    req = fx.make_req(tokens, **kw)
    state.admit_or_raise(req)
    return req


def check(fx, live=()):
    """Allocator accounting after every step, plus: no slot is both free and owned, and no slot is free twice."""
    assert fx.busy_invariant_holds(list(live)), fx.accounting()
    free = free_slots(fx)
    assert len(free) == len(set(free)), "a slot is free twice"
    owned = set()
    for r in live:
        if r.kv.holds_kv:
            owned.update(fx.req_pool.req_to_token[r.kv.req_pool_idx, : r.kv.kv_committed_len].tolist())
    assert not owned & set(free), "a slot is both free and owned by a live request"
    stats = state_of(fx.cache).guard.stats
    assert stats.violations_caught == 0, stats.last_violation  # the strict ledger guard never fires on correct use


def free_slots(fx):
    """Every free KV slot of the fixture's allocator (a free page counts its `page_size` slots)."""
    a = fx.allocator
    if fx.page_size == 1:
        return a.free_pages.tolist()
    pages = a.free_pages.tolist()
    return [p * fx.page_size + i for p in pages for i in range(fx.page_size)]


def run_to_end(fx, state, tokens, **kw):
    """A new request for `tokens` admitted, prefilled and finished: the tokens its admission matched in the tree."""
    req = new_req(fx, state, tokens, **kw)
    hit = fx.admit(req)
    fx.prefill(req)
    fx.finish(req)
    return hit


def bump(fx, state, live=(), queued=()):
    """A publication as the epoch bump it makes (`Engine.bump`), labelled `v<next epoch>`."""
    return state.bump(fx.cache, list(live), list(queued), reason="test", label=f"v{state.epoch + 1}")
