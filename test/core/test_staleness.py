"""Bounded staleness at cache level (`vradix.core.staleness`): SGLang's real UnifiedRadixCache on both tree cores,
page sizes 1 and 16, with the vradix hooks installed."""
import pytest

from vradix.core import deferred_reclaim, staleness
from vradix.testing.harness.cache_fixture import seq
from vradix.testing.harness.cache_steps import check


def run(fx, state, tokens, bound=None):
    req = fx.make_req(tokens)
    if bound is not None:
        req.sampling_params.custom_params = {"vradix_max_staleness": bound}
    state.admit_or_raise(req)
    hit = fx.admit(req)
    fx.prefill(req)
    fx.finish(req)
    return hit, req


def bump(fx, state):
    inv = state.bump(fx.cache, [], [], reason="test", label=f"v{state.epoch + 1}")
    state.deferred.finish(state, fx.cache)
    return inv


def test_bounded_request_reuses_the_window_and_exact_requests_never_see_its_kv(env):
    fx, state = env
    state.staleness.window = 1
    P = seq(10, 64)
    assert run(fx, state, P + [1], bound=0)[0] == 0
    bump(fx, state)  # epoch 1: epoch 0's KV stays for bounded requests
    hit, bounded = run(fx, state, P + [3], bound=1)
    assert hit == 64 and bounded._vradix.epoch == 0 and bounded._vradix.admitted_epoch == 1
    assert bounded._vradix.bounded_report["vradix_staleness"]["staleness"] == 1
    assert run(fx, state, P + [3], bound=0)[0] == 0, "an exact request matched KV a bounded request computed on stale KV"
    assert run(fx, state, P + [3], bound=0)[0] == 64  # exact requests cache in their own namespace
    hit, bounded = run(fx, state, P + [3], bound=1)
    assert hit == 64 and bounded._vradix.epoch == 1  # a tie: the current epoch wins
    check(fx)
    bump(fx, state)  # epoch 2: epoch 0 ages out and is reclaimed; epoch 1 is in the window
    hit, bounded = run(fx, state, P + [4], bound=1)
    assert hit == 64 and bounded._vradix.epoch == 1
    assert run(fx, state, P + [9])[0] >= 64  # no bound named: the server window is the bound
    bump(fx, state)
    bump(fx, state)  # epoch 4: nothing in the window holds P (epoch 3 computed nothing)
    assert run(fx, state, P + [5], bound=1)[0] == 0
    check(fx)
    assert state.staleness.bounded_requests == 5
    assert state.staleness.stale_tokens_by_staleness == {1: 192}


def test_sglangs_health_probe_runs_exact_and_is_not_counted(env):
    """`/health` and `/health_generate` send SGLang's probe (rid `HEALTH_CHECK_...`, no bound) every few seconds from a
    gateway: it is no rollout, so it neither reads older epochs' KV nor counts as a bounded request."""
    from sglang.srt.constants import HEALTH_CHECK_RID_PREFIX
    fx, state = env
    state.staleness.window = 1
    P = seq(10, 64)
    run(fx, state, P + [1], bound=0)
    bump(fx, state)
    probe = fx.make_req(P + [2])
    probe.rid = f"{HEALTH_CHECK_RID_PREFIX}_0"
    state.admit_or_raise(probe)
    assert fx.admit(probe) == 0 and probe._vradix.max_staleness == 0
    fx.prefill(probe)
    fx.finish(probe)
    assert state.staleness.bounded_requests == 0
    assert run(fx, state, P + [3])[0] == 64  # a request that names no bound still gets the server window
    assert state.staleness.bounded_requests == 1
    check(fx)


def test_a_request_never_reuses_kv_older_than_its_own_bound(env):
    """Window 2, bound 1: epoch 0's longer match is inside the window but outside the request's bound."""
    fx, state = env
    state.staleness.window = 2
    P, Q = seq(10, 64), seq(200, 32)
    run(fx, state, P + Q + [1], bound=0)   # epoch 0 holds P + Q
    bump(fx, state)
    run(fx, state, P + [2], bound=0)       # epoch 1 holds P only
    bump(fx, state)                        # epoch 2: epochs 0 and 1 are both in the window
    hit, req = run(fx, state, P + Q + [4], bound=2)
    assert req._vradix.epoch == 0 and hit == 96  # the window's longest match, when the bound allows it
    hit, req = run(fx, state, P + Q + [3], bound=1)
    assert req._vradix.epoch == 1 and hit == 64, "a bound-1 request read KV two publications old"
    check(fx)


def test_a_flush_ages_the_whole_window_out(env):
    """A lock-aware flush (the engine is not idle) with a window: bounded requests no longer reuse what was cached
    before it, and the deferred reclaim frees it (what the crossing request pins goes when it finishes)."""
    from vradix.hooks.publication import lock_aware_flush

    def stock_flush(*_):
        raise AssertionError("the stock reset runs only on an idle engine")

    fx, state = env
    state.staleness.window = 1
    P = seq(10, 64)
    run(fx, state, P + [1], bound=0)
    held = fx.running(state, seq(500, 32) + [2])
    assert lock_aware_flush(stock_flush, fx.scheduler_view(running=[held]))
    assert state.window_floor == state.epoch
    hit, req = run(fx, state, P + [3], bound=1)
    assert hit == 0 and req._vradix.epoch == state.epoch, "a bounded request reused KV cached before a flush"
    fx.finish(held)
    state.deferred.finish(state, fx.cache)
    check(fx)


def test_a_bound_above_the_window_is_refused_with_a_400_error(monkeypatch):
    """The launcher's check (a ValueError: HTTP 400) before the request reaches a scheduler."""
    from sglang.srt.managers.io_struct import GenerateReqInput
    from vradix.hooks.launcher import launcher_window, check_generate_request

    def req(k):
        return GenerateReqInput(input_ids=[1, 2], sampling_params={"custom_params": {staleness.PARAM: k}})

    monkeypatch.setenv(staleness.ENV, "2")
    launcher_window.cache_clear()  # read once per launcher process; this test plays two launches
    check_generate_request(None, req(2))
    check_generate_request(None, req(0))
    check_generate_request(None, GenerateReqInput(input_ids=[1], sampling_params={"custom_params": {"x": 1}}))
    for bad in (3, -1, "1", True, 1.0):
        with pytest.raises(staleness.StalenessError, match="vradix_max_staleness"):
            check_generate_request(None, req(bad))
    monkeypatch.setenv(staleness.ENV, "0")
    launcher_window.cache_clear()
    with pytest.raises(staleness.StalenessError, match="exceeds this server's window"):
        check_generate_request(None, req(1))
    launcher_window.cache_clear()


def test_a_window_is_refused_at_startup_with_the_paths_it_does_not_support():
    from types import SimpleNamespace

    staleness.check_server(SimpleNamespace(disaggregation_mode="prefill"), 0)  # no window: nothing refused
    for attr, flag, _ in staleness.REFUSED_WITH:
        args = SimpleNamespace(**{a: None for a, _, _ in staleness.REFUSED_WITH})
        setattr(args, attr, "decode" if attr == "disaggregation_mode" else True)
        with pytest.raises(staleness.StalenessError, match=flag):
            staleness.check_server(args, 1)
    staleness.check_server(SimpleNamespace(disaggregation_mode="null", enable_hierarchical_cache=False,
                                           enable_lora=None), 1)


def test_the_current_epoch_wins_ties_and_the_newer_epoch_wins_older_ties():
    assert staleness.pick({3: 10, 2: 10, 1: 10}, 3) == 3
    assert staleness.pick({3: 0, 2: 10, 1: 10}, 3) == 2
    assert staleness.pick({3: 5, 2: 4, 1: 9}, 3) == 1


def test_the_server_flag_exports_the_window_for_scheduler_processes(models, monkeypatch):
    """`--vradix-max-staleness` is accepted by SGLang's own parser and exported to the environment the scheduler
    processes inherit; a value that is not an integer is argparse's usage error."""
    import os

    from sglang.srt.server_args import prepare_server_args

    monkeypatch.delenv(staleness.ENV, raising=False)
    prepare_server_args(["--model-path", models[0], "--vradix-max-staleness", "2"])
    assert os.environ[staleness.ENV] == "2" and staleness.server_window() == 2
    with pytest.raises(SystemExit):
        prepare_server_args(["--model-path", models[0], "--vradix-max-staleness", "two"])


def start(fx, state, tokens, bound):
    """A bounded request admitted and prefilled, still running: it locks the prefix it matched."""
    req = fx.make_req(tokens)
    req.sampling_params.custom_params = {"vradix_max_staleness": bound}
    state.admit_or_raise(req)
    fx.admit(req)
    fx.prefill(req)
    return req


def tree_slots(fx):
    return set(fx.cache.tree_core.all_values_flatten().tolist())


def test_memory_pressure_evicts_older_in_window_kv_before_current_epoch_kv(env):
    """The second eviction tier: under pressure, KV of in-window older namespaces goes before current-epoch KV,
    although LRU ranks it hotter (bounded requests touched it last); a locked older node is never touched."""
    from sglang.srt.mem_cache import common

    fx, state = env
    state.staleness.window = 1
    olds = [seq(1000 + 100 * g, 64) for g in range(4)]
    for P in olds:
        run(fx, state, P + [1], bound=0)
    bump(fx, state)  # epoch 1: epoch 0's KV stays in the window
    older = tree_slots(fx)
    for g in range(2):
        run(fx, state, seq(5000 + 100 * g, 64) + [2], bound=0)
    current = tree_slots(fx) - older
    for P in olds[1:]:  # the most recently used KV is now the older namespace's
        run(fx, state, P + [3], bound=1)
    holder = start(fx, state, olds[0] + [4], bound=1)
    assert holder._vradix.epoch == 0
    held = set(fx.req_pool.req_to_token[holder.kv.req_pool_idx, : holder.kv.kv_committed_len].tolist()) & tree_slots(fx)
    older = tree_slots(fx) - current
    check(fx, [holder])
    need = fx.allocator.available_size() + 64
    common.evict_from_tree_cache(fx.cache, need)
    assert fx.allocator.available_size() >= need
    assert current <= tree_slots(fx), "current-epoch KV was evicted while older in-window KV was left"
    assert held <= tree_slots(fx), "a locked older node was evicted"
    assert state.staleness.tokens_evicted_in_window >= 64
    check(fx, [holder])
    common.evict_from_tree_cache(fx.cache, fx.allocator.available_size() + len(older))  # more than the older KV
    assert not (tree_slots(fx) & older) - held, "older unlocked KV left while current-epoch KV was evicted"
    assert state.staleness.tokens_evicted_in_window == len(older - held)  # each once, nothing locked
    check(fx, [holder])
    fx.finish(holder)
    common.evict_from_tree_cache(fx.cache, fx.total)
    assert fx.idle_invariant_holds() and fx.allocator.available_size() == fx.total, fx.accounting()


def test_a_window_is_refused_where_the_kv_page_ledger_is_off(env):
    """A bounded response's spans and staleness are read from the KV page ledger. On an engine where the ledger is off
    (speculative decoding, the external cache linker) a bounded request that reused one-publication-old KV would
    report no spans and staleness 0: wrong provenance. So a window is refused there, at launch (naming the flag) and
    at attach (the invariant: a window has a ledger)."""
    from types import SimpleNamespace

    from vradix.engine import attach

    fx, _ = env
    blind = attach(fx.cache, with_ledger=False)  # what an engine without the refusal would run
    blind.staleness.window = 1
    P = seq(10, 64)
    run(fx, blind, P + [1], bound=0)
    bump(fx, blind)
    hit, req = run(fx, blind, P + [3], bound=1)
    report = req._vradix.bounded_report
    assert hit == 64 and req._vradix.epoch == 0  # it read 64 tokens of epoch-0 KV at epoch 1 ...
    assert report["kv_weight_versions"] == [] and report["vradix_staleness"]["staleness"] == 0  # ... and says none

    with pytest.raises(staleness.StalenessError, match="needs the KV page ledger"):
        attach(fx.cache, with_ledger=False, staleness_window=1)
    for attr, flag, value in (("speculative_algorithm", "--speculative-algorithm", "EAGLE"),
                              ("enable_unified_cache_external_linker", "--enable-unified-cache-external-linker", True)):
        with pytest.raises(staleness.StalenessError, match=f"{flag}.*Start without --vradix-max-staleness"):
            staleness.check_server(SimpleNamespace(**{attr: value}), 1)
        staleness.check_server(SimpleNamespace(**{attr: value}), 0)
    with pytest.raises(staleness.StalenessError, match="speculative decoding"):
        staleness.check_ledger(2, ["speculative decoding"])


def test_a_window_without_a_radix_cache_reuses_nothing(monkeypatch):
    """`--disable-radix-cache` with a window: vradix runs treeless (no epochs, no namespaces), SGLang's disabled tree
    matches nothing, so a bounded request computes its whole prompt on the current weights, like an exact one."""
    import dataclasses
    import types

    from sglang.srt.mem_cache import common
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    from vradix.engine import state_of

    from vradix.core.state import treeless_of
    from vradix.hooks.startup import attach_to_scheduler
    from vradix.testing.harness.cache_fixture import build_cache

    monkeypatch.setenv(staleness.ENV, "1")
    fx = build_cache("rust", 1, kv_tokens=256)
    cache = UnifiedRadixCache(dataclasses.replace(fx.cache.cache_init_params, disable=True))
    attach_to_scheduler(None, types.SimpleNamespace(tree_cache=cache, server_args=types.SimpleNamespace()))
    assert treeless_of(cache) is not None and state_of(cache) is None
    for _ in range(2):
        req = fx.make_req(seq(10, 64) + [1])
        req.sampling_params.custom_params = {staleness.PARAM: 1}
        common.match_kv_cache(req, cache, req.origin_input_ids, max_prefix_len=64)
        assert req.prefix_len == 0


def test_a_window_is_refused_at_engine_start_on_a_tree_it_cannot_age_out():
    """The deferred reclaim that ages an epoch out frees full-attention KV only: a window on a tree with hybrid
    components (or a HiCache tier) does not start, and the error names the tree's components."""
    from vradix.engine import attach
    from vradix.testing.harness.cache_fixture import build_cache

    fx = build_cache("rust", 1, kv_tokens=256)
    assert deferred_reclaim.supported(fx.cache)
    staleness.check_cache(fx.cache, 1, deferred_reclaim.supported(fx.cache))
    with pytest.raises(staleness.StalenessError, match="needs a full-attention radix cache.*full"):
        staleness.check_cache(fx.cache, 1, False)
    staleness.check_cache(fx.cache, 0, False)  # no window: nothing to age out
    attach(fx.cache, staleness_window=1)
