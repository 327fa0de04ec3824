"""Provenance spans and LoRA-scoped invalidation on the real UnifiedRadixCache (Rust and Python cores, page sizes 1
and 16), driven like test_cache_level.py (`vradix.testing.harness.cache_steps`). LoRA does not run on SGLang's CPU
engine (its LoRA layers pin memory, which needs CUDA), so adapter (re)loads are exercised here with real LoRA-keyed
requests and the real unload hook body."""
import pytest

from vradix.core import provenance
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
                    "prefill_weight_versions": [{"version": "unknown", "start": 0, "end": 65}],
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
    freed = state.lora.free_entries(fx.cache, "X-load1")
    assert freed >= 49 - fx.page_size and fx.cache.evictable_size() == cached_before - freed
    assert state.lora.free_entries(fx.cache, "X-load1") == 0  # nothing of X's is left to free
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
    state.lora.free_entries(fx.cache, "X")
    assert fx.cache.protected_size() >= 32  # the holder's KV is untouched
    check(fx, [holder])
    fx.finish(holder)
    fx.cache.evict(__import__("sglang.srt.mem_cache.base_prefix_cache", fromlist=["EvictParams"]).EvictParams(
        num_tokens=fx.cache.evictable_size()))  # LRU pressure evicts everything X had
    assert state.lora.free_entries(fx.cache, "X") == 0  # dead node ids are skipped, not an error
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
    assert provenance.forward_weight_versions(spans, 40, 80) == {
        "first_prefill_weight_version": 41, "min_forward_weight_version": 41, "max_forward_weight_version": 43,
        "last_forward_weight_version": 43}
    # a request whose prefix was cached and whose last span holds only the never-computed last token
    assert provenance.forward_weight_versions(spans, 55, 70) == {
        "first_prefill_weight_version": 42, "min_forward_weight_version": 42, "max_forward_weight_version": 42,
        "last_forward_weight_version": 42}
    assert provenance.upstream_version("step-7") == "step-7" and provenance.upstream_version(None) is None


# ---- upstream fidelity: SGLang's `prefill_weight_versions` and miles' fields, as they are read ---------------------
def upstream_prefill_spans_hold(spans, prompt_tokens):
    """Upstream SGLang's E2E assertions on `prefill_weight_versions` (`_assert_prefill_spans_contiguous`): at least one
    span, from 0, contiguous, adjacent versions different, ending at the prompt; versions are strings, bounds ints."""
    assert spans and spans[0]["start"] == 0 and spans[-1]["end"] == prompt_tokens, spans
    assert all(a["end"] == b["start"] and a["version"] != b["version"] for a, b in zip(spans, spans[1:])), spans
    assert all(isinstance(x["version"], str) and type(x["start"]) is int and type(x["end"]) is int for x in spans)
    assert all(set(x) == {"version", "start", "end"} for x in spans), spans


def test_prefill_spans_have_upstreams_types_and_shape():
    """Labels are strings even when they are step numbers (upstream's `WeightVersionSpan.version: str`); spans of one
    label merge across epochs, so adjacent spans always differ; the spans end at the prompt."""
    spans = [{"version": "7", "epoch": 1, "start": 0, "end": 20}, {"version": "7", "epoch": 2, "start": 20, "end": 30},
             {"version": "8", "epoch": 3, "start": 30, "end": 90}]
    out = provenance.prefill_weight_versions(spans, 64)
    assert out == [{"version": "7", "start": 0, "end": 30}, {"version": "8", "start": 30, "end": 64}]
    upstream_prefill_spans_hold(out, 64)


def test_positions_no_label_names_are_one_unknown_span():
    """Upstream's KV-slot table reports never-written slots as version "unknown" (one of its two designs; the other
    raises): a position whose weights no label names (a ledger page no forward stamped, an unlabelled epoch) is
    reported the same way, never as null, and merges with its unknown neighbours."""
    spans = [{"version": "v0", "start": 0, "end": 4}, {"version": None, "start": 4, "end": 6},
             {"version": None, "start": 6, "end": 8}, {"version": "v0", "start": 8, "end": 12}]
    out = provenance.prefill_weight_versions(spans, 12)
    assert out == [{"version": "v0", "start": 0, "end": 4}, {"version": "unknown", "start": 4, "end": 8},
                   {"version": "v0", "start": 8, "end": 12}]
    upstream_prefill_spans_hold(out, 12)


def test_a_request_aborted_before_its_prefill_reports_no_prompt_spans(env):
    """Upstream: a request aborted before its prefill ran has no prompt KV, so its response has no
    `prefill_weight_versions` key; nor does it get miles' per-forward versions (no forward ran)."""
    fx, state = env
    r = new_req(fx, state, seq(300, 40))  # stamped at admission, aborted while waiting
    info = provenance.response_provenance(r)
    assert info is not None and "prefix_cache" in info
    assert not {"prefill_weight_versions", "first_prefill_weight_version", "min_forward_weight_version",
                "max_forward_weight_version", "last_forward_weight_version"} & set(info), info


def test_a_request_aborted_mid_prefill_reports_only_the_prompt_kv_it_wrote(env):
    """Upstream clamps the lookup to the committed KV length: a prompt aborted mid-prefill reports only the tokens
    whose KV was written; miles' forwards are those that ran."""
    fx, state = env
    r = new_req(fx, state, seq(400, 40))
    fx.admit(r)
    fx.prefill(r, upto=16)
    info = provenance.response_provenance(r)
    assert info["prefill_weight_versions"] == [{"version": "unknown", "start": 0, "end": 16}], info
    assert info["first_prefill_weight_version"] == info["last_forward_weight_version"] is None  # no label yet
    fx.prefill(r)
    fx.finish(r)
    check(fx)


def miles_call(meta_info):
    """miles' per-call parser rules for what it reads (`WeightVersionsPerCall.from_meta_info`, `Sample.validate`,
    `Sample.update_policy_version_from_meta_info`), as assertions: per-output spans and response segments have no
    zero-length entry and none past the reported output; the per-forward versions are read as they are (integers for
    step numbers). Returns the typed record miles would keep."""
    out = int(meta_info["completion_tokens"])
    segments = meta_info.get("response_weight_version_segments", [])
    previous = 0
    for start, end, version in segments:
        assert previous <= start < end <= out and version not in ("", None), segments
        previous = end
    if segments:
        assert segments[0][0] == 0 and segments[-1][1] == out  # exact coverage of the response
        assert all(a[1] == b[0] for a, b in zip(segments, segments[1:])), segments
        assert isinstance(meta_info["response_weight_version"], str)
    return {k: meta_info.get(k) for k in ("first_prefill_weight_version", "min_forward_weight_version",
                                          "max_forward_weight_version", "last_forward_weight_version",
                                          "response_weight_version", "response_weight_version_segments")}


def test_response_segments_are_sglangs_sampling_spans_as_miles_reads_them():
    """`response_weight_version_segments` come from SGLang's own per-output-token `weight_versions` (who sampled each
    token) as `[start, end, version]` with integer step versions; `response_weight_version` is the string label of
    the last token's weights. SGLang's zero-length span of an empty output (an abort) and any span past the output
    are not carried over: no output, no response fields."""
    weight_versions = [{"version": "10", "start": 0, "end": 2}, {"version": "11", "start": 2, "end": 4}]
    fields = provenance.response_weight_version_segments(weight_versions, 4)
    assert fields == {"response_weight_version": "11", "response_weight_version_segments": [[0, 2, 10], [2, 4, 11]]}
    meta = {"completion_tokens": 4, "first_prefill_weight_version": 10, "min_forward_weight_version": 10,
            "max_forward_weight_version": 11, "last_forward_weight_version": 11, **fields}
    assert miles_call(meta) == {"first_prefill_weight_version": 10, "min_forward_weight_version": 10,
                                "max_forward_weight_version": 11, "last_forward_weight_version": 11,
                                "response_weight_version": "11",
                                "response_weight_version_segments": [[0, 2, 10], [2, 4, 11]]}
    assert provenance.response_weight_version_segments([{"version": "v1", "start": 0, "end": 0}], 0) == {}
    clipped = provenance.response_weight_version_segments(
        [{"version": "v1", "start": 0, "end": 3}, {"version": "v1", "start": 3, "end": 9}, {"version": "v2",
                                                                                          "start": 9, "end": 12}], 5)
    assert clipped == {"response_weight_version": "v1", "response_weight_version_segments": [[0, 5, "v1"]]}
    miles_call({"completion_tokens": 5, **clipped})


def test_miles_forward_versions_are_integers_for_step_labels(env):
    """miles reads `first_prefill_weight_version` and `min_/max_/last_forward_weight_version` as integers: a request
    crossing publications labelled with step numbers reports them as ints, its prefill spans as strings."""
    fx, state = env
    state.bump(fx.cache, [], [], reason="test", label="41")
    r = new_req(fx, state, seq(500, 40))
    fx.admit(r)
    fx.prefill(r, upto=16)
    state.bump(fx.cache, [r], [], reason="test", label="42")
    fx.prefill(r)
    fx.decode(r, 5)
    info = provenance.response_provenance(r)
    assert info["prefill_weight_versions"] == [{"version": "41", "start": 0, "end": 16},
                                               {"version": "42", "start": 16, "end": 40}]
    upstream_prefill_spans_hold(info["prefill_weight_versions"], 40)
    fields = {k: info[k] for k in ("first_prefill_weight_version", "min_forward_weight_version",
                                   "max_forward_weight_version", "last_forward_weight_version")}
    assert fields == {"first_prefill_weight_version": 41, "min_forward_weight_version": 41,
                      "max_forward_weight_version": 42, "last_forward_weight_version": 42}
    assert all(type(v) is int for v in fields.values())
    fx.finish(r)
    check(fx)


@pytest.mark.parametrize("label", ["--5", "²", "1²", "-"])
def test_a_label_that_only_looks_like_a_step_number_stays_a_label_in_the_fields_and_the_trainer_api(label):
    """One rule for labels (`vradix.labels.step_number`), shared by the response fields and the consumer API: a label
    that is not a decimal step number is reported as given; it used to raise in `int()` ("--5", "²"), which would
    have failed the response (and the scheduler's accumulator) of every request that ran under such a label."""
    from vradix.trainer import version
    assert provenance.upstream_version(label) == label and version(label) == label
    spans = [{"version": label, "start": 0, "end": 10}]
    assert provenance.forward_weight_versions(spans, 0, 9)["first_prefill_weight_version"] == label
    assert provenance.response_weight_version_segments(spans, 10) == {
        "response_weight_version": label, "response_weight_version_segments": [[0, 10, label]]}
