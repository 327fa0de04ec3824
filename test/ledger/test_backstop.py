"""The strict guard's backstop at the last point before the forward, on SGLang's real
UnifiedRadixCache, pools and streaming session (both tree cores, page sizes 1 and 16).

Each test puts KV that was not written under a request's epoch in front of its forward through one path — a
corrupted tree entry, a streaming session's record lent across a publication, a crossing request's row — and shows
what the backstop does with it: the request fails with an error naming vradix, the epochs and the count of bad
positions, and inserts nothing. A crossing request's own KV (older epochs, by contract) passes. Every forward here
goes through the real `Scheduler.run_batch` BEFORE hooks (`CacheFixture.prefill`).
"""
import torch
from sglang.srt.managers.schedule_batch import FINISH_ABORT
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.session.session_controller import Session

from vradix import kernels
from vradix.core import sessions
from vradix.ledger.guard import GuardConfig
from vradix.hooks.serving import at_result, before_forward
from vradix.request import of as state_of_req
from vradix.testing.harness.cache_fixture import ForwardWrite, seq


def admitted(fx, state, tokens, session=None):
    req = fx.make_req(tokens)
    req.session = session
    state.admit_or_raise(req)
    return req, fx.admit(req)


def cached_tokens(fx):
    return fx.cache.evictable_size() + fx.cache.protected_size()


def assert_failed_by_backstop(req, bad: int, of: int, want: str, found: str):
    reason = req.discard_output_reason
    assert isinstance(reason, FINISH_ABORT), "the forward ran on KV of other weights and nothing stopped it"
    msg = reason.message
    assert msg.startswith("vradix KV backstop") and f"{bad} of {of} prefix KV positions" in msg, msg
    assert f"not written under {want}" in msg and f"found epoch(s) {found}" in msg, msg
    assert req.skip_radix_cache_insert


def test_a_corrupted_tree_entry_fails_the_request_at_the_forward_and_inserts_nothing(env):
    """The tree offers a prefix one of whose pages says other weights wrote it: the match adopts it (no match-time
    check any more), the backstop fails the request before the forward, and it inserts nothing."""
    fx, state = env
    P = seq(10, 64)
    w, _ = admitted(fx, state, P + [1])
    fx.prefill(w)
    fx.finish(w)
    ok, hit = admitted(fx, state, P + [2])
    fx.prefill(ok)
    assert hit == 64 and ok.discard_output_reason is None  # control: a clean prefix passes
    fx.finish(ok)
    cached = fx.cache.tree_core.collect_full_device_indices(w.last_node, fx.cache.root_node_handle(w.extra_key))
    state.ledger.page_epoch[int(cached[40]) // fx.page_size] = 7
    before = cached_tokens(fx)
    bad, hit = admitted(fx, state, P + [3, 4, 5])
    assert hit == 64
    fx.prefill(bad)
    assert_failed_by_backstop(bad, fx.page_size, 64, "epoch 0", "[7]")
    assert state.guard.stats.violations_caught == 1 and "failing the request" in state.guard.stats.last_violation
    fx.finish(bad)
    assert isinstance(bad.finished_reason, FINISH_ABORT)
    assert cached_tokens(fx) == before, "the failed request inserted KV computed over the corrupt prefix"
    assert fx.idle_invariant_holds()


def test_a_session_record_lent_across_a_publication_fails_the_next_turn(env, monkeypatch):
    """A streaming session keeps its turn's record (row and KV) in its slot; SGLang lends it to the next turn
    before any tree lookup, so the namespace never sees it. vradix's session step releases such a slot at the bump
    (`vradix.core.sessions`); with that step switched off, the slot stands for a lending path nobody listed. Lent across a
    publication, the next turn (bound to the new epoch) would extend KV of the old weights: the backstop fails it and
    it inserts nothing."""
    monkeypatch.setattr(sessions.SessionSlots, "settle_at_bump", lambda *a, **k: 0)
    monkeypatch.setattr(sessions.SessionSlots, "take_stale", lambda *a, **k: None)
    fx, state = env
    session = Session(capacity_of_str_len=1 << 20, session_id="s0", streaming=True)
    P = seq(10, 48)
    t1, _ = admitted(fx, state, P, session)
    fx.prefill(t1)
    fx.decode(t1, 7)
    fx.finish(t1)
    slot = fx.cache.session.slots["s0"]
    assert slot.kv.holds_kv and slot.kv.kv_committed_len == 49  # the slot keeps turn 1's record
    state.bump(fx.cache, [], [], reason="test", label="v1")
    before = cached_tokens(fx)
    t2, hit = admitted(fx, state, P + [7] + seq(500, 8), session)
    assert state_of_req(t2).epoch == 1 and t2.kv is slot.kv and hit > 0  # lent, with KV of epoch 0
    fx.prefill(t2)
    assert_failed_by_backstop(t2, hit, hit, "epoch 1", "[0]")
    fx.finish(t2)
    assert isinstance(t2.finished_reason, FINISH_ABORT) and "s0" not in fx.cache.session.slots
    assert cached_tokens(fx) <= before  # the failed turn published nothing


def test_a_crossing_request_reads_its_own_older_kv_but_nothing_older_than_its_epoch(env):
    """A request that crossed a publication keeps extending its own KV (epoch 0 prompt, epoch 1 chunk): allowed.
    A page of its prefix outside [its epoch, the current one] (here a page the ledger says was freed) is not its own
    KV: the backstop fails it."""
    fx, state = env
    P = seq(10, 64)
    r, _ = admitted(fx, state, P + seq(200, 40))
    fx.prefill(r, upto=64)  # first chunk under epoch 0
    state.bump(fx.cache, [r], [], reason="test", label="v1")
    assert state_of_req(r).crossed
    fx.prefill(r, upto=80)  # second chunk under epoch 1, reading its own epoch-0 chunk
    assert r.discard_output_reason is None and state.guard.stats.violations_caught == 0
    row = fx.req_pool.req_to_token[r.kv.req_pool_idx]
    assert set(kernels.reference.row_epochs(state.ledger.page_epoch, fx.req_pool.req_to_token, r.kv.req_pool_idx,
                                            80, fx.page_size).tolist()) == {0, 1}
    state.ledger.page_epoch[int(row[3]) // fx.page_size] = kernels.FREE  # a freed page behind its row
    fx.prefill(r)
    assert_failed_by_backstop(r, fx.page_size, 80, "epochs 0..1", "[-1]")
    fx.finish(r)
    assert isinstance(r.finished_reason, FINISH_ABORT)


def test_one_gather_per_batch_and_detection_only_with_more_than_one_rank(env, monkeypatch):
    """A batch of several requests is checked with one kernel call, read once at the batch's result; only the
    violating request fails. With more than one TP/PP rank the violation is counted and logged but no request fails (every rank must
    run the same batch)."""
    fx, state = env
    P = seq(10, 64)
    w, _ = admitted(fx, state, P + [1])
    fx.prefill(w)
    fx.finish(w)
    reqs = [admitted(fx, state, P + [i + 2])[0] for i in range(2)] + [admitted(fx, state, seq(900, 20))[0]]
    assert [r.prefix_len for r in reqs] == [64, 64, 0]  # the third reads nothing cached
    r2t = fx.req_pool.req_to_token
    state.ledger.page_epoch[int(r2t[reqs[0].kv.req_pool_idx, 5]) // fx.page_size] = 9  # shared by the first two
    calls = []
    real = state.ledger.kernels.rows_outside_epochs  # the ledger's bound kernel, counted
    monkeypatch.setattr(state.ledger, "kernels",
                        state.ledger.kernels._replace(rows_outside_epochs=lambda *a: calls.append(a) or real(*a)))
    batch = ForwardWrite(out_cache_loc=torch.empty(0, dtype=torch.int64), forward_mode=ForwardMode.EXTEND,
                         reqs=reqs, prefix_lens=[r.prefix_len for r in reqs])
    state.guard.config = GuardConfig(verify="strict").for_ranks(tp_size=2)
    before_forward(fx.scheduler_view(), batch)
    assert len(calls) == 1 and state.guard.stats.prefixes_verified == 2
    assert state.guard.stats.verify_host_reads == 0 and state.guard.stats.violations_caught == 0  # not read yet
    at_result(fx.scheduler_view(), batch)
    assert state.guard.stats.verify_host_reads == 1 and len(state.guard.verdicts) == 0
    assert state.guard.stats.violations_caught == 2 and "detected only" in state.guard.stats.last_violation
    assert all(r.discard_output_reason is None for r in reqs)
    state.guard.config = GuardConfig(verify="strict")
    before_forward(fx.scheduler_view(), batch)
    at_result(fx.scheduler_view(), batch)
    assert len(calls) == 2 and state.guard.stats.violations_caught == 4
    assert [r.discard_output_reason is not None for r in reqs] == [True, True, False]
    decode = ForwardWrite(out_cache_loc=torch.empty(0, dtype=torch.int64), forward_mode=ForwardMode.DECODE,
                          reqs=reqs, prefix_lens=None)
    before_forward(fx.scheduler_view(), decode)  # a decode batch reads only KV its requests wrote
    assert len(calls) == 2
    for r in reqs:
        fx.prefill(r)
        fx.finish(r)
    assert [isinstance(r.finished_reason, FINISH_ABORT) for r in reqs] == [True, True, False]
    assert fx.idle_invariant_holds()
