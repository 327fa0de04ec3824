"""The KV page ledger against SGLang's real UnifiedRadixCache and allocators (both tree cores, page sizes 1/16):
it stays in step with writes and frees, the sample guard detects a corrupted prefix in a sampled batch (the strict guard's
backstop: test_backstop.py), and the post-publication audit finds a leaked page (and repairs it on request)."""
import pytest
import torch

from vradix.ledger import guard
from vradix.ledger.guard import GuardConfig
from vradix.settings import SettingsError
from vradix.kernels import FREE
from vradix.testing.harness.cache_fixture import seq
from vradix.testing.harness.trace import functions_entered



def admitted(fx, state, tokens):
    req = fx.make_req(tokens)
    state.admit_or_raise(req)
    hit = fx.admit(req)
    return req, hit


def row_pages(fx, req, n):
    slots = fx.req_pool.req_to_token[req.kv.req_pool_idx, :n].to(torch.int64)
    return torch.unique(slots // fx.page_size)


def bump(fx, state, live=()):
    return state.bump(fx.cache, list(live), [], reason="test", label=f"v{state.epoch + 1}")


def audit(fx, state, live=()):
    return guard.audit(state.guard.config, state.guard.stats, state.ledger, fx.cache, list(live), state.epoch)


def test_ledger_follows_writes_frees_and_epochs(env):
    fx, state = env
    pe = state.ledger.page_epoch
    assert bool((pe == FREE).all())
    a, _ = admitted(fx, state, seq(10, 64) + [1])
    fx.prefill(a)
    pages_a = row_pages(fx, a, 65)
    assert set(pe[pages_a].tolist()) == {0}
    fx.finish(a)
    bump(fx, state)  # frees every unlocked stale node
    assert set(pe[pages_a].tolist()) == {FREE}
    assert bool((pe == FREE).all())
    b, hit = admitted(fx, state, seq(10, 64) + [2])
    assert hit == 0
    fx.prefill(b)
    assert set(pe[row_pages(fx, b, 65)].tolist()) == {1}
    fx.finish(b)


def test_a_ledger_resolves_its_kernels_once(env, monkeypatch):
    """The ledger binds its kernels when it is attached (`kernels.bind`; `VRADIX_KERNELS=auto` on CPU: the torch
    reference's host forms) and keeps them: after `VRADIX_KERNELS` changes, its stamps, frees, backstop check and
    audit still run the host forms, straight in the implementation's module, with no setting read and no dispatch
    (`kernels/__init__.py`, `VRADIX_KERNELS`) on the way. A ledger built after the change gets the new choice, and one
    forced onto an implementation this device lacks fails when it is built, not at its first stamp."""
    fx, state = env
    ledger = state.ledger
    bound = ledger.kernels
    assert (bound.name, bound.host) == ("torch", True)
    monkeypatch.setenv("VRADIX_KERNELS", "torch")  # the device forms, for any ledger built from now on

    def serve_and_audit():
        r, _ = admitted(fx, state, seq(10, 48) + [1])
        fx.prefill(r)
        again, hit = admitted(fx, state, seq(10, 48) + [2])
        assert hit == 48
        fx.prefill(again)  # the backstop checks the cached prefix (read at the batch's result)
        for req in (r, again):
            fx.finish(req)
        bump(fx, state)  # frees the stale nodes' pages
        assert audit(fx, state) == 0

    entered = functions_entered(serve_and_audit)
    assert ledger.kernels is bound and state.guard.stats.batches_verified >= 1
    kernel_calls = {name for path, name in entered if path == "kernels/reference.py"}
    assert kernel_calls == {"host_stamp", "host_rows_outside_epochs", "_rows_outside_epochs_host", "invalidate"}, \
        kernel_calls
    assert "kernels/__init__.py" not in {path for path, _ in entered}, sorted(entered)
    assert ("settings.py", "VRADIX_KERNELS") not in entered

    from vradix.ledger.device import PageLedger
    later = PageLedger(fx.allocator)
    assert (later.kernels.name, later.kernels.host) == ("torch", False)
    monkeypatch.setenv("VRADIX_KERNELS", "cuda")
    with pytest.raises(RuntimeError, match="'cuda' is not available for cpu tensors"):
        PageLedger(fx.allocator)
    assert ledger.kernels is bound


def test_sample_guard_detects_a_corrupted_row_in_a_batch(env):
    """VRADIX_VERIFY=sample: every Nth extend batch gets the backstop's check, read at its result; a violation is
    recorded, never failed."""
    fx, state = env
    state.guard.config = GuardConfig(verify="sample", sample_every=2)
    P = seq(10, 48)
    w, _ = admitted(fx, state, P + [9])
    fx.prefill(w)  # batch 1 (checked: it reads nothing cached)
    fx.finish(w)
    r2t = fx.req_pool.req_to_token
    reqs = []
    for i in range(3):
        r, hit = admitted(fx, state, P + [i])
        assert hit == 48
        if i == 0:
            state.ledger.page_epoch[int(r2t[r.kv.req_pool_idx, 33]) // fx.page_size] = 3
        fx.prefill(r, checkpoint=False)  # batches 2, 3, 4: the 3rd one is checked
        reqs.append(r)
    assert state.guard.stats.batches_verified == 1 and state.guard.stats.violations_caught == 1
    assert f"request {reqs[1].rid} would read {fx.page_size} of 48" in state.guard.stats.last_violation
    assert "detected only (sample mode)" in state.guard.stats.last_violation
    assert all(r.discard_output_reason is None for r in reqs)
    for r in reqs:
        fx.finish(r)


def test_audit_is_clean_with_a_crossing_request_and_after_its_release(env):
    fx, state = env
    crossing, _ = admitted(fx, state, seq(10, 80) + [1])
    fx.prefill(crossing)
    bump(fx, state, live=[crossing])
    assert audit(fx, state, live=[crossing]) == 0  # its stale pages are pinned by its row, not leaked
    fx.decode(crossing, 5)
    fx.finish(crossing)
    bump(fx, state)
    assert audit(fx, state) == 0 and state.guard.stats.leaked_pages_total == 0
    assert fx.idle_invariant_holds()


@pytest.mark.parametrize("mode", ["report", "repair"])
def test_audit_finds_a_leaked_page_and_repairs_it(env, mode):
    fx, state = env
    state.guard.config = GuardConfig(verify="strict", audit=mode)
    leaked = fx.allocator.alloc(fx.page_size * 2)  # written by a forward, then forgotten by everyone
    state.ledger.stamp_written(leaked, state.epoch)
    r, _ = admitted(fx, state, seq(10, 30) + [1])
    fx.prefill(r)
    fx.finish(r)
    bump(fx, state)
    assert not fx.idle_invariant_holds()  # the leak is real: the allocator is short of two pages
    assert audit(fx, state) == 2 and state.guard.stats.leaked_pages_last == 2
    if mode == "repair":
        assert state.guard.stats.leaked_pages_repaired == 2
        assert fx.idle_invariant_holds()
        assert audit(fx, state) == 0
    else:
        assert audit(fx, state) == 2  # still there: report mode only counts


def test_guard_config_rejects_bad_values(monkeypatch):
    monkeypatch.setenv("VRADIX_VERIFY", "paranoid")
    with pytest.raises(SettingsError, match="VRADIX_VERIFY='paranoid'"):
        GuardConfig.from_env()
    monkeypatch.setenv("VRADIX_VERIFY", "sample")
    monkeypatch.setenv("VRADIX_VERIFY_SAMPLE_EVERY", "0")
    with pytest.raises(SettingsError, match="positive integer"):
        GuardConfig.from_env()
    monkeypatch.setenv("VRADIX_VERIFY_SAMPLE_EVERY", "4")
    monkeypatch.setenv("VRADIX_AUDIT", "REPAIR")
    assert GuardConfig.from_env() == GuardConfig(verify="sample", sample_every=4, audit="repair")


def test_repair_never_frees_a_page_the_tree_holds(env):
    """A stale node kept by a lock that is not a live request's (a session, a pin) is still the tree's: the audit
    must not call its pages leaked, and repair must not free them under the tree."""
    fx, state = env
    state.guard.config = GuardConfig(verify="strict", audit="repair")
    r, _ = admitted(fx, state, seq(10, 40) + [1])
    fx.prefill(r)
    fx.finish(r)
    q, hit = admitted(fx, state, seq(10, 40) + [2])
    pin = fx.cache.lock(q.last_node)  # held outside any request
    fx.cache.unlock(q.lock)
    q.lock = None
    fx.req_pool.free(q)
    bump(fx, state)  # q is gone from the live set; the pinned stale node stays in the tree
    tree = set(fx.cache.tree_core.all_values_flatten().tolist())
    assert len(tree) >= hit > 0
    available = fx.allocator.available_size()
    assert audit(fx, state) == 0 and state.guard.stats.leaked_pages_repaired == 0
    assert fx.allocator.available_size() == available and not tree & set(free_slots(fx))
    fx.cache.unlock(pin)


def free_slots(fx):
    pages = fx.allocator.free_pages.tolist()
    return pages if fx.page_size == 1 else [p * fx.page_size + i for p in pages for i in range(fx.page_size)]


def test_guard_only_detects_with_more_than_one_rank(env):
    """TP/PP > 1 (faked at the config level): each rank would decide from its own ledger, so a strict violation is
    counted but the request runs (every rank runs the same batch), and repair does not free."""
    fx, state = env
    state.guard.config = GuardConfig(verify="strict", audit="repair").for_ranks(tp_size=2)
    assert state.guard.config.detect_only and GuardConfig().for_ranks(tp_size=1).detect_only is False
    P = seq(10, 64)
    w, _ = admitted(fx, state, P + [1])
    fx.prefill(w)
    fx.finish(w)
    cached = fx.cache.tree_core.collect_full_device_indices(w.last_node, fx.cache.root_node_handle(w.extra_key))
    state.ledger.page_epoch[int(cached[40]) // fx.page_size] = 7
    seen, hit = admitted(fx, state, P + [3])
    fx.prefill(seen)
    assert hit == 64 and not seen.skip_radix_cache_insert and seen.discard_output_reason is None  # runs unchanged
    assert state.guard.stats.violations_caught == 1 and "detected only" in state.guard.stats.last_violation
    fx.finish(seen)
    leaked = fx.allocator.alloc(fx.page_size)
    state.ledger.stamp_written(leaked, state.epoch)
    bump(fx, state)
    assert audit(fx, state) == 1 and state.guard.stats.leaked_pages_repaired == 0  # reported, not freed
