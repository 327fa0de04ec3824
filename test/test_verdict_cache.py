"""The strict guard's cost model on SGLang's real UnifiedRadixCache (both tree cores, page sizes 1/16) and SGLang's
real `SchedulePolicy`: a request's verdict is reused while its key (epoch, matched length, last node, ledger
generation) holds, one scheduling pass's matches are checked with one kernel call and one host read, and what can make
an old verdict wrong — a longer match, pages freed and reused, a publication — forces a fresh check that catches it.

Costs are counted (kernel calls, host reads), never timed."""
import pytest
import torch
from sglang.srt.managers.schedule_policy import SchedulePolicy
from sglang.srt.mem_cache import common

from vradix import epochs, kernels
from vradix.admission import stamp
from vradix.state import attach
from vradix.testing.cache_fixture import build_cache, seq

CONFIGS = [("rust", 1), ("rust", 16), ("python", 1), ("python", 16)]


@pytest.fixture(params=CONFIGS, ids=[f"{c}-ps{p}" for c, p in CONFIGS])
def env(request):
    core, ps = request.param
    fx = build_cache(core, ps, kv_tokens=4096)
    state = attach(fx.cache)
    assert state.ledger is not None and state.guard.verify == "strict"
    return fx, state


@pytest.fixture
def kernel_calls(monkeypatch):
    """Names of the ledger check kernels called (each one is one host read), in order."""
    calls = []
    for name in ("verify", "prefix_violation_counts"):
        fn = getattr(kernels, name, None)
        if fn is not None:
            def counted(*a, _fn=fn, _name=name, **k):
                calls.append(_name)
                return _fn(*a, **k)
            monkeypatch.setattr(kernels, name, counted)
    return calls



def stamped(fx, state, tokens):
    req = fx.make_req(tokens)
    stamp(state, req)
    return req


def cached(fx, state, tokens):
    """Run one request to completion, so its prompt is cached."""
    req = stamped(fx, state, tokens)
    fx.admit(req)
    fx.prefill(req)
    fx.finish(req)


def match(fx, req):
    """The scheduler's re-match of a waiting request (what every prefill pass does)."""
    common.match_kv_cache(req, fx.cache)
    return req.prefix_len


def test_a_waiting_request_is_verified_once_per_match_key(env, kernel_calls):
    fx, state = env
    P = seq(10, 64)
    cached(fx, state, P + [1])
    kernel_calls.clear()
    q = stamped(fx, state, P + seq(500, 40))
    assert [match(fx, q) for _ in range(3)] == [64] * 3  # three passes while it waits
    assert kernel_calls == ["prefix_violation_counts"], kernel_calls
    st = state.guard_stats
    assert st.prefixes_verified == 1 and st.verdicts_reused == 2 and st.verify_host_reads == 1
    # a longer match covers positions never checked: a fresh check
    cached(fx, state, P + seq(500, 32) + [2])
    kernel_calls.clear()
    checked = st.prefixes_verified
    assert match(fx, q) == 96 and len(kernel_calls) == 1 and st.prefixes_verified == checked + 1
    # the admitting match reuses that verdict; nothing is checked again
    assert fx.admit(q) == 96 and len(kernel_calls) == 1 and st.violations_caught == 0
    fx.prefill(q)
    fx.finish(q)
    assert fx.idle_invariant_holds()


@pytest.mark.parametrize("reused_under", [None, 7], ids=["freed", "freed-and-rewritten"])
def test_pages_freed_after_a_cached_verdict_are_caught_at_the_next_match(env, reused_under):
    """A use-after-free between two matches of one waiting request: the allocator takes back a page the tree still
    references (and a forward under other weights may rewrite it). The key's ledger generation moved, so the next
    match is checked again and recomputed as a miss, although its epoch, length and last node are unchanged."""
    fx, state = env
    P = seq(10, 64)
    cached(fx, state, P + [1])
    q = stamped(fx, state, P + [2])
    assert match(fx, q) == 64 and state.guard_stats.violations_caught == 0  # verdict cached: clean
    page = int(fx.cache.prefix_device_indices(q)[40]) // fx.page_size
    slots = torch.arange(page * fx.page_size, (page + 1) * fx.page_size, dtype=torch.int64)
    state.ledger.mark_freed_slots(slots)  # what the allocator's free hook records
    if reused_under is not None:
        state.ledger.stamp_written(slots, reused_under)
    assert match(fx, q) == 0, "a prefix on a freed page was adopted on a cached verdict"
    assert state.guard_stats.violations_caught == 1 and q.skip_radix_cache_insert
    assert state.guard_stats.prefixes_verified == 2


def test_a_publication_after_a_cached_verdict_forces_a_fresh_check(env, monkeypatch):
    """With the epoch namespace lost (test fault), a waiting request re-bound by a publication would match the stale
    prefix a crossing request still holds; its old verdict (epoch 0) does not carry over to epoch 1."""
    monkeypatch.setenv("VRADIX_FAULT_NO_NAMESPACE", "1")
    fx, state = env
    P = seq(10, 64)
    w = stamped(fx, state, P + [1])
    fx.admit(w)
    fx.prefill(w)  # w holds its prefix locked, so the bump keeps it (crossing)
    q = stamped(fx, state, P + [2])
    assert match(fx, q) == 64 and state.guard_stats.violations_caught == 0
    epochs.bump(state, fx.cache, [w], [], reason="test", label="v1")
    assert match(fx, q) == 0, "a stale prefix was adopted on a verdict from before the publication"
    assert state.guard_stats.violations_caught == 1 and "epoch 1" in state.guard_stats.last_violation
    fx.finish(w)


def corrupt_cached_prefix(fx, state, tokens, position):
    node = fx.cache.match_prefix(_params(fx, state, tokens)).last_device_node
    slots = fx.cache.tree_core.collect_full_device_indices(node, fx.cache.root_node_handle(state.prefix_of_epoch(0)))
    state.ledger.page_epoch[int(slots[position]) // fx.page_size] = 7


def _params(fx, state, tokens):
    from array import array

    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey
    return MatchPrefixParams(key=RadixKey(array("q", tokens), extra_key=state.prefix_of_epoch(0)))


def test_a_scheduling_pass_checks_its_matches_with_one_host_read(env, kernel_calls):
    """`lpm` re-matches the whole waiting queue on every pass (`fcfs` does only on tree cores with a fast match,
    which neither UnifiedRadixCache core reports in SGLang 0.5.23)."""
    fx, state = env
    prompts = [seq(100 * i + 10, 48) for i in range(4)]
    for p in prompts:
        cached(fx, state, p + [1])
    kernel_calls.clear()
    waiting = [stamped(fx, state, p + [2, 3]) for p in prompts]
    policy = SchedulePolicy("lpm", fx.cache, False, False, False)
    policy.calc_priority(waiting)
    assert kernel_calls == ["prefix_violation_counts"], kernel_calls  # one check, one host read, four prefixes
    st = state.guard_stats
    assert st.prefixes_verified == 4 and st.verify_host_reads == 1
    policy.calc_priority(waiting)  # the next pass: nothing was freed, every verdict holds
    assert len(kernel_calls) == 1 and st.verdicts_reused == 4
    assert [fx.admit(r) for r in waiting] == [48] * 4  # the admitting matches reuse them too
    assert len(kernel_calls) == 1 and st.verdicts_reused == 8 and st.violations_caught == 0
    for r in waiting:
        fx.prefill(r)
        fx.finish(r)
    assert fx.idle_invariant_holds()


def test_a_scheduling_pass_recomputes_a_corrupted_prefix_and_admission_keeps_it_a_miss(env):
    fx, state = env
    prompts = [seq(100 * i + 10, 48) for i in range(3)]
    for p in prompts:
        cached(fx, state, p + [1])
    corrupt_cached_prefix(fx, state, prompts[1], 33)
    waiting = [stamped(fx, state, p + [2, 3]) for p in prompts]
    SchedulePolicy("lpm", fx.cache, False, False, False).calc_priority(waiting)
    st = state.guard_stats
    assert st.violations_caught == 1 and "recomputing" in st.last_violation and st.verify_host_reads == 1
    assert [r.prefix_len for r in waiting] == [48, 0, 48] and waiting[1].skip_radix_cache_insert
    assert [fx.admit(r) for r in waiting] == [48, 0, 48]  # the cached bad verdict: still a miss, not re-counted
    assert st.violations_caught == 1
    for r in waiting:
        fx.prefill(r)
        fx.finish(r)
