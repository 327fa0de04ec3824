"""Streaming sessions (`--enable-streaming-session`) across a publication, at cache level: SGLang's real
UnifiedRadixCache (Rust and Python TreeCores, page sizes 1 and 16) with its real `StreamingSession` slots and
`Session` objects, driven through the scheduler's own mem_cache functions (`match_kv_cache`, `alloc`,
`maybe_hand_to_session`, `checkpoint_kv_cache`, `release_kv_cache`). Memory is checked with SGLang's own idle check
(`SchedulerInvariantChecker` over a `SchedulerPoolStatsObserver`, which count what session slots hold)."""

from sglang.srt.managers.scheduler_components.invariant_checker import SchedulerInvariantChecker
from sglang.srt.managers.scheduler_components.pool_stats_observer import SchedulerPoolStatsObserver
from sglang.srt.mem_cache import common
from sglang.srt.session.session_controller import Session

from vradix.core import provenance
from vradix.ledger import guard
from vradix.testing.harness.cache_fixture import seq


def open_session(sid: str = "s1") -> Session:
    return Session(1 << 20, sid, streaming=True)


def match_turn(fx, state, session, tokens):
    """A turn of `session` admitted by the scheduler: stamped, then matched (a slot lends its record here)."""
    req = fx.make_req(tokens)
    req.session = session
    state.admit_or_raise(req)
    common.match_kv_cache(req, fx.cache, req.origin_input_ids, max_prefix_len=len(tokens) - 1)
    return req


def start_turn(fx, state, session, tokens):
    """A turn matched, admitted and prefilled (`admit_turn`). Returns (turn, its prefix hit)."""
    req = match_turn(fx, state, session, tokens)
    hit = req.prefix_len
    admit_turn(fx, req)
    return req, hit


def admit_turn(fx, req) -> None:
    """Lock and row as `PrefillAdder` + `alloc_for_extend` do (a borrowing turn runs on the slot's row), then prefill
    the turn (its first row allocation hands the record to the session: `maybe_hand_to_session`) and checkpoint it.
    The admission is announced through the real `_commit_prefill_admission` AFTER hook (the cache inspector's count):
    a borrowing turn stands on the slot's virtual node, which is no tree node."""
    if not borrows(fx, req):
        assert req.prefix_len == 0  # a turn without a slot here always finds its tree namespace empty
        req.kv.cache_protected_len = 0
    req.lock = fx.cache.lock(req.last_node)  # None on a slot's virtual node: the slot holds the lock
    fx._admitted(req)
    fx.req_pool.alloc([req])
    req.extend_end = req.prefix_len
    fx.prefill(req, checkpoint=False)
    fx.cache.maybe_hand_to_session(req)
    common.checkpoint_kv_cache(req, fx.cache)


def finish_turn(fx, req, outputs=(7,)):
    for t in outputs:
        fx.decode(req, t)
    fx.finish(req)  # the slot keeps the record (`try_cache_finished_req`)


def next_input(req, new_tokens):
    """What SGLang's `Session.create_req` builds for the next streaming turn: history + previous output + new."""
    return list(req.origin_input_ids) + list(req.output_ids) + list(new_tokens)


def borrows(fx, req) -> bool:
    return fx.cache.session.borrowed_slot(req) is not None


def lent_prefix_violations(fx, state, req, hit: int) -> int:
    """Positions of the turn's reused prefix `[0, hit)` whose page the KV page ledger says another epoch wrote."""
    slots = fx.req_pool.req_to_token[req.kv.req_pool_idx, :hit].to(state.ledger.page_epoch.device)
    return guard.matched_prefix_violations(state.ledger, slots, provenance.prefix_cache(req)["epoch"]).count


def idle_check(fx):
    """SGLang's strict idle memory check (`Scheduler` at idle: `_check_all_pools` then `_check_req_pool`), over the
    fixture's real cache, allocator and request pool; it raises on a token or request-row leak."""
    observer = SchedulerPoolStatsObserver(
        tree_cache=fx.cache, token_to_kv_pool_allocator=fx.allocator, req_to_token_pool=fx.req_pool,
        session_controller=None, hisparse_coordinator=None, is_hybrid_swa=False, is_hybrid_ssm=False,
        enable_hisparse=False, full_tokens_per_layer=None, swa_tokens_per_layer=None, max_total_num_tokens=fx.total)
    checker = SchedulerInvariantChecker(
        is_hybrid_swa=False, is_hybrid_ssm=False, disaggregation_mode=None, page_size=fx.page_size,
        full_tokens_per_layer=None, swa_tokens_per_layer=None, max_total_num_tokens=fx.total, tree_cache=fx.cache,
        token_to_kv_pool_allocator=fx.allocator, req_to_token_pool=fx.req_pool, pool_stats_observer=observer,
        get_last_batch=lambda: None, get_running_batch=lambda: None, scheduler_stage_metrics=None)
    leak, messages = checker._check_all_pools(observer.get_pool_stats())
    if leak:
        checker._report_leak("pool", "\n".join(messages))
    checker._check_req_pool()


def bump(fx, state, live=(), queued=()):
    return state.bump(fx.cache, list(live), list(queued), reason="test", label=f"v{state.epoch + 1}")


def test_turn_after_publication_never_borrows_the_old_slot_record(env):
    """Hole 1: turn 1 writes 64 tokens at epoch 0, a publication, then turn 2: SGLang would lend it the slot's whole
    record (prefix 65, all of it old weights). vradix releases the slot at the bump (nothing leaked) and turn 2
    re-prefills its history under the new epoch; the next turn in the same epoch borrows the slot again."""
    fx, state = env
    session = open_session()
    t1, _ = start_turn(fx, state, session, seq(10, 64))
    finish_turn(fx, t1)
    idle_check(fx)
    bump(fx, state)
    probe = match_turn(fx, state, session, next_input(t1, [99]))  # a scheduling pass's match of turn 2
    assert (probe.prefix_len, borrows(fx, probe)) == (0, False)
    assert fx.cache.session_records() == {}  # the old record is gone ...
    assert fx.allocator.available_size() == fx.total and len(fx.req_pool.free_slots) == fx.req_pool.size
    idle_check(fx)  # ... and freed, every token and row

    t2, hit = start_turn(fx, state, session, next_input(t1, [99]))
    assert hit == 0  # normal path: a full prefill of the history under the new weights
    assert request_epochs(t2) == [1]
    finish_turn(fx, t2)
    t3, hit = start_turn(fx, state, session, next_input(t2, [98]))
    assert borrows(fx, t3) and hit == len(next_input(t2, []))
    assert lent_prefix_violations(fx, state, t3, hit) == 0  # exact reuse within the epoch: all of it epoch 1
    finish_turn(fx, t3)
    idle_check(fx)
    assert state.guard.stats.violations_caught == 0


def request_epochs(req) -> list:
    return [entry.epoch for entry in req._vradix.kv_history]


def test_bump_with_an_idle_slot_leaks_no_token_and_no_row(env):
    """Hole 2: a 10-token turn publishes nothing into the tree (below a page at page size 16), so nothing is locked
    and the bump takes its tree-reset shortcut, which drops session slots without freeing them. vradix releases the
    slot first: SGLang's strict idle check accounts for every token and request row after the bump."""
    fx, state = env
    t1, _ = start_turn(fx, state, open_session(), seq(10, 10))
    finish_turn(fx, t1)
    idle_check(fx)
    inv = bump(fx, state)
    idle_check(fx)
    assert fx.allocator.available_size() == fx.total and len(fx.req_pool.free_slots) == fx.req_pool.size
    assert inv.session_slots_released == 1 and state.sessions.slots_released == 1


def test_turn_running_across_a_publication_keeps_its_kv_and_its_slot_is_never_lent_again(env):
    """A turn decoding while the weights change is a crossing request: it keeps its KV (old prefix + new positions)
    and never inserts it. Its record goes back to the slot when it finishes; the session's next turn must not borrow
    it: the slot is released then (row, pages and the stale tree path its lock kept) and the turn re-prefills."""
    fx, state = env
    session = open_session()
    t1, _ = start_turn(fx, state, session, seq(10, 64))
    finish_turn(fx, t1)
    t2, hit = start_turn(fx, state, session, next_input(t1, [99]))
    assert borrows(fx, t2) and hit == 65  # same epoch: exact reuse of the slot record
    fx.decode(t2, 5)
    inv = bump(fx, state, live=[t2])
    assert borrows(fx, t2) and t2.kv.holds_kv  # it keeps its own KV ...
    assert t2.skip_radix_cache_insert  # ... and never inserts it
    finish_turn(fx, t2, outputs=(6,))
    assert request_epochs(t2) == [0, 1]  # provenance: old prefix, new positions
    idle_check(fx)  # the slot holds the record (session-held), nothing else

    t3, hit = start_turn(fx, state, session, next_input(t2, [98]))
    assert hit == 0 and request_epochs(t3) == [1]  # the mixed record was not lent: a full re-prefill
    assert inv.session_slots_released == 0 and state.sessions.slots_released == 1  # released at the lend, not before
    assert state.sessions.stale_slots == {}
    assert fx.cache.evictable_size() == 0  # the stale prompt the old slot's lock kept was freed with it
    finish_turn(fx, t3)
    idle_check(fx)
    fx.cache.release_session(session.session_id)  # close: everything is back
    assert fx.allocator.available_size() + fx.cache.evictable_size() == fx.total
    assert len(fx.req_pool.free_slots) == fx.req_pool.size
    assert state.guard.stats.violations_caught == 0


def test_queued_turn_gives_back_the_record_a_scheduling_pass_lent_it(env):
    """A waiting turn matched by a scheduling pass but not admitted yet already holds the slot's record (SGLang lends
    it at the match). At a bump it has computed nothing: it gives the record back, is re-bound to the new epoch like
    any queued request (not marked crossing), and its next match takes the normal path."""
    fx, state = env
    session = open_session()
    t1, _ = start_turn(fx, state, session, seq(10, 64))
    finish_turn(fx, t1)
    t2 = match_turn(fx, state, session, next_input(t1, [99]))
    assert borrows(fx, t2) and t2.kv.holds_kv
    inv = bump(fx, state, live=[t2], queued=[t2])
    assert inv.requeued_rebound == 1 and inv.crossing_requests == 0 and not t2.skip_radix_cache_insert
    assert not t2.kv.holds_kv and request_epochs(t2) == [1]
    idle_check(fx)
    assert fx.allocator.available_size() == fx.total and len(fx.req_pool.free_slots) == fx.req_pool.size
    common.match_kv_cache(t2, fx.cache, t2.origin_input_ids, max_prefix_len=len(t2.origin_input_ids) - 1)
    assert t2.prefix_len == 0 and not borrows(fx, t2)
    admit_turn(fx, t2)
    finish_turn(fx, t2)
    idle_check(fx)


def test_a_window_refuses_streaming_sessions_because_an_exact_turn_would_borrow_a_bounded_turns_record(env):
    """With a window, a bounded turn adopts an older epoch's namespace, and the session slot keeps its record (old
    prefix + the turn's own KV). SGLang lends that record to the session's next turn whatever its bound, so an exact
    turn would read epoch-0 KV while bound to epoch 1: with the ledger on the backstop fails a well-formed request,
    with it off the stale KV is served as current. So `--enable-streaming-session` with a window does not start."""
    from types import SimpleNamespace

    import pytest

    from vradix.core import staleness

    fx, state = env
    state.staleness.window = 1  # what an engine without the refusal would run
    session = open_session()
    t1, _ = start_turn(fx, state, session, seq(10, 64))
    finish_turn(fx, t1)
    bump(fx, state)  # the idle slot is released; turn 1's prompt stays in epoch 0's namespace, inside the window
    t2 = fx.make_req(next_input(t1, [99]))
    t2.session = session
    t2.sampling_params.custom_params = {staleness.PARAM: 1}
    state.admit_or_raise(t2)
    assert fx.admit(t2) >= 64 and t2._vradix.epoch == 0  # the bounded turn adopts epoch 0's namespace ...
    fx.prefill(t2)
    finish_turn(fx, t2)  # ... and its record, epoch-0 KV included, goes to a new slot
    t3 = fx.make_req(next_input(t2, [98]))  # an exact turn (bound 0)
    t3.session = session
    t3.sampling_params.custom_params = {staleness.PARAM: 0}
    state.admit_or_raise(t3)
    common.match_kv_cache(t3, fx.cache, t3.origin_input_ids, max_prefix_len=len(t3.origin_input_ids) - 1)
    assert t3._vradix.max_staleness == 0 and t3._vradix.epoch == 1
    assert borrows(fx, t3) and lent_prefix_violations(fx, state, t3, t3.prefix_len) >= 64, (
        "the exact turn was not lent the bounded turn's record")

    args = SimpleNamespace(enable_streaming_session=True)
    with pytest.raises(staleness.StalenessError, match="--enable-streaming-session.*Start without"):
        staleness.check_server(args, 1)
    staleness.check_server(args, 0)
