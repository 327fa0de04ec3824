"""Provenance spans and LoRA-scoped invalidation on the real UnifiedRadixCache (Rust and Python cores, page sizes 1
and 16), driven like test_cache_level.py (`vradix.testing.harness.cache_steps`). LoRA does not run on SGLang's CPU
engine (its LoRA layers pin memory, which needs CUDA), so adapter (re)loads are exercised here with real LoRA-keyed
requests and the real unload hook body."""
from vradix.core import lora, provenance
from vradix.testing.harness.cache_fixture import seq
from vradix.testing.harness.cache_steps import bump, check, new_req, run_to_end


def spans(req):
    return [(s["version"], s["epoch"], s["start"], s["end"]) for s in provenance.kv_weight_versions(req)]


def test_request_that_never_crossed_reports_its_prefix_and_no_spans(env):
    fx, state = env
    P = seq(10, 64)
    run_to_end(fx, state, P + [1])
    r = new_req(fx, state, P + [2])
    fx.admit(r)
    r.cached_tokens = r.prefix_len  # the scheduler's accounting at prefill
    fx.prefill(r)
    fx.finish(r)
    info = provenance.response_provenance(r)
    assert info == {"prefix_cache": {"cached_tokens": 64, "epoch": 0, "weight_version": None,
                                     "weight_id": state.weight_id},
                    "prefill_weight_versions": [{"version": None, "start": 0, "end": 65}],
                    "first_prefill_weight_version": None, "min_forward_weight_version": None,
                    "max_forward_weight_version": None, "last_forward_weight_version": None}


def test_spans_follow_every_crossing_at_the_committed_position(env):
    fx, state = env
    prompt = seq(100, 40)
    r = new_req(fx, state, prompt)
    fx.admit(r)
    fx.prefill(r, upto=16)  # chunk 1 under epoch 0 / v0 (label None before any publication)
    bump(fx, state, live=[r])  # -> epoch 1, label v1
    fx.prefill(r)  # rest of the prompt under v1
    fx.decode(r, 5)
    fx.decode(r, 6)
    bump(fx, state, live=[r])  # -> epoch 2, label v2, after 42 positions
    fx.decode(r, 7)
    fx.finish(r)
    assert spans(r) == [(None, 0, 0, 16), ("v1", 1, 16, 42), ("v2", 2, 42, 43)]
    assert provenance.response_provenance(r)["prefix_cache"]["epoch"] == 0
    check(fx)


def test_bumps_without_compute_in_between_collapse_into_one_span(env):
    fx, state = env
    r = new_req(fx, state, seq(300, 24))
    fx.admit(r)
    fx.prefill(r)
    bump(fx, state, live=[r])
    bump(fx, state, live=[r])  # nothing computed under v1: it owns no positions
    fx.decode(r, 3)
    fx.finish(r)
    assert spans(r) == [(None, 0, 0, 24), ("v2", 2, 24, 25)]


def test_retracted_crossing_request_starts_a_fresh_history(env):
    fx, state = env
    r = new_req(fx, state, seq(500, 32))
    fx.admit(r)
    fx.prefill(r)
    bump(fx, state, live=[r])
    fx.retract(r)
    fx.admit(r)  # re-bound at its match: everything is recomputed under epoch 1
    fx.prefill(r)
    fx.finish(r)
    assert not provenance.spans_several_epochs(r) and spans(r) == [("v1", 1, 0, 32)]


def test_reloading_adapter_frees_only_its_own_entries(env):
    fx, state = env
    P = seq(700, 48)
    full = 48 // fx.page_size * fx.page_size
    assert run_to_end(fx, state, P + [1], lora_id="X-load1") == 0
    assert run_to_end(fx, state, P + [2], lora_id="X-load1") == full
    assert run_to_end(fx, state, P + [3], lora_id="Y") == 0
    assert run_to_end(fx, state, P + [4]) == 0
    assert run_to_end(fx, state, P + [5], lora_id="Y") == full
    cached_before = fx.cache.evictable_size()
    # unload X (SGLang waits until no request uses it), then load X again: SGLang mints a new lora_id
    freed = lora.free_adapter_entries(state, fx.cache, "X-load1")
    assert freed >= 49 - fx.page_size and fx.cache.evictable_size() == cached_before - freed
    assert lora.free_adapter_entries(state, fx.cache, "X-load1") == 0  # nothing of X's is left to free
    check(fx)
    assert run_to_end(fx, state, P + [6], lora_id="X-load2") == 0  # new X: no stale KV of the old X
    assert run_to_end(fx, state, P + [7], lora_id="Y") == full  # other adapter untouched
    assert run_to_end(fx, state, P + [8]) == full  # base model untouched
    # a base-weight publication invalidates every namespace, adapters included
    bump(fx, state)
    assert fx.cache.evictable_size() == 0 and fx.allocator.available_size() == fx.total
    for lora_id in ("X-load2", "Y", None):
        assert run_to_end(fx, state, P + [9], lora_id=lora_id) == 0
    check(fx)


def test_adapter_free_skips_entries_lru_already_evicted_and_spares_locked_ones(env):
    fx, state = env
    P = seq(900, 32)
    run_to_end(fx, state, P + [1], lora_id="X")
    holder = new_req(fx, state, P + [2], lora_id="X")
    fx.admit(holder)
    fx.prefill(holder)  # X request still running: its path is locked
    lora.free_adapter_entries(state, fx.cache, "X")
    assert fx.cache.protected_size() >= 32  # the holder's KV is untouched
    check(fx, [holder])
    fx.finish(holder)
    fx.cache.evict(__import__("sglang.srt.mem_cache.base_prefix_cache", fromlist=["EvictParams"]).EvictParams(
        num_tokens=fx.cache.evictable_size()))  # LRU pressure evicts everything X had
    assert lora.free_adapter_entries(state, fx.cache, "X") == 0  # dead node ids are skipped, not an error
    assert fx.allocator.available_size() == fx.total
    check(fx)


def test_upstream_fields_read_the_same_spans():
    """SGLang's `prefill_weight_versions` is the prompt's part of the spans, adjacent spans of one label merged;
    miles' per-forward versions come from the positions the request computed, `[cached, total - 1)`, as integers
    when the labels are step numbers; the oldest and newest by publication order."""
    spans = [{"version": "41", "epoch": 3, "start": 0, "end": 30}, {"version": "41", "epoch": 4, "start": 30, "end": 50},
             {"version": "42", "epoch": 5, "start": 50, "end": 70}, {"version": "43", "epoch": 6, "start": 70, "end": 81}]
    assert provenance.prefill_weight_versions(spans, 60) == [{"version": "41", "start": 0, "end": 50},
                                                            {"version": "42", "start": 50, "end": 60}]
    assert provenance.forward_weight_versions(spans, 40, 81) == {
        "first_prefill_weight_version": 41, "min_forward_weight_version": 41, "max_forward_weight_version": 43,
        "last_forward_weight_version": 43}
    # a request whose prefix was cached and whose last span holds only the never-computed last token
    assert provenance.forward_weight_versions(spans, 55, 71) == {
        "first_prefill_weight_version": 42, "min_forward_weight_version": 42, "max_forward_weight_version": 42,
        "last_forward_weight_version": 42}
    assert provenance.upstream_version("step-7") == "step-7" and provenance.upstream_version(None) is None
