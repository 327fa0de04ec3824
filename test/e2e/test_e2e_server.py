"""E2E on a real SGLang CPU server with tiny float32 models (peaky logits): stock SGLang (VRADIX_DISABLE=1) shows the
stale-prefix bug; vradix fixes it. The oracle is a fresh server started on the new weights.

Tests that need no fresh process lease theirs from the session's server pool (`server_pool`): the stock server on A
(the oracle's, too) and the vradix server on A are shared, reset before each lease, so a vradix test reads the counters
it starts from (`Counters`) and asserts differences. The configurations only this module uses start together, before
the first of those tests (`own_configurations`): the chunked-prefill server serves two tests (pooled, reset between),
each other one is stopped after its test."""
import itertools
import time
from typing import NamedTuple

import pytest
import requests

from vradix import __version__, settings
from vradix.testing.harness.scenario import (LONG_PROMPT, PREFIX, PROBE, StreamingRequest, pause_holding,
                                             shared_prefix_burst, stale_prefix_publication)
from vradix.testing.harness.server import CpuServer, fresh_stock_outputs

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

CHUNKED_PROMPT = [(i * 13) % 480 + 20 for i in range(3000)]
BURST = [[(i * 31 + j * 17) % 490 + 10 for j in range(40 + i)] for i in range(27)]


@pytest.fixture(scope="module")
def oracle(models, server_pool):
    """Greedy outputs of a fresh server on the new weights (B) and of one on the old weights (A)."""
    def compute(s):
        return {"probe": s.generate(PROBE, 4)["output_ids"],
                "chunked": s.generate(CHUNKED_PROMPT, 4, timeout=300)["output_ids"],
                "burst": [s.generate(p, 1)["output_ids"][0] for p in BURST]}
    return fresh_stock_outputs(dict(zip("AB", models)), compute, pool=server_pool)


def guard_env(verify: str) -> dict:
    """The fault that drops the epoch namespace, with the KV guard in `verify` mode."""
    return {"VRADIX_FAULT_NO_NAMESPACE": "1", "VRADIX_VERIFY": verify}


#: {name: CpuServer keyword arguments} of the configurations only this module uses (on A): "chunk32" serves the two
#: chunked-prefill tests (leased twice, reset between), the others one test each
#: "guard-strict" runs the kernels' device forms (`VRADIX_KERNELS=torch`: a verdict is never complete before its
#: batch's result, as on a busy GPU) with prefill chunks of 64, so the overlap loop checkpoints chunks before their
#: verdicts are read and holds them (`hooks.ledger.hold_stash_until_verdict`)
OWN = {"chunk32": dict(chunked_prefill_size=32),
       "guard-off": dict(env=guard_env("off")),
       "guard-strict": dict(env={**guard_env("strict"), "VRADIX_KERNELS": "torch"}, chunked_prefill_size=64)}


@pytest.fixture(scope="module")
def own_configurations(models, server_pool):
    """Start every `OWN` configuration now, three at a time, parked in the pool until its test leases it (`own`)."""
    server_pool.prestart(*[(models[0], kw) for kw in OWN.values()])


@pytest.fixture
def own(models, server_pool, own_configurations):
    """`own(name)`: a context leasing the fresh server of the `OWN` configuration `name`, stopped afterwards."""
    return lambda name: server_pool.lease(models[0], once=True, **OWN[name])


@pytest.fixture
def chunked(models, server_pool, own_configurations):
    """The "chunk32" server, leased from the pool (on A, label `default`, its cache flushed); it stays in the pool."""
    with server_pool.lease(models[0], **OWN["chunk32"]) as s:
        yield s


class Counters:
    """The cumulative vradix counters of a (pooled) server when a test starts: `since(info, *path)` is how much the
    counter at `path` (e.g. "kv_ledger", "audits") grew by the time `info` was read."""

    def __init__(self, server):
        self.start = server.vradix_info()

    def since(self, info: dict, *path: str) -> int:
        now, then = info, self.start
        for key in path:
            now, then = now[key], then[key]
        return now - then


def test_stock_sglang_serves_stale_prefix_after_in_place_publication(models, oracle, server_pool):
    with server_pool.lease(models[0], vradix=False) as s:
        o = stale_prefix_publication(s, models[1])
        assert o.vradix is None  # stock: no vradix block
        assert o.cached_after == 200 and o.label_after == "v2"
        assert o.output_after != oracle["B"]["probe"]  # hybrid policy: old-weight KV, new-weight label
        # and stock cannot flush while an in_place pause keeps a request's KV
        (inflight,) = pause_holding(s, lambda: [StreamingRequest(s.url, LONG_PROMPT, 300)])
        assert s.post("/flush_cache").status_code == 400
        s.post("/continue_generation")
        inflight.result()
        # stock computes an uncached prefix once per request admitted with it (the waste prefill dedup removes)
        burst = shared_prefix_burst(s)
        assert burst.computed >= burst.computed_once + 200, burst


def test_vradix_publication_never_reuses_stale_prefix(models, oracle, server_pool):
    with server_pool.lease(models[0]) as s:
        assert f"vradix {__version__} active" in s.logs() and "RustUnifiedTreeCore" in s.logs()
        start = Counters(s)
        e0 = start.start["epoch"]
        o = stale_prefix_publication(s, models[1])
        assert o.warm_cached == 0
        assert o.cached_after == 0, o  # no stale reuse right after publication
        assert o.output_after == oracle["B"]["probe"]  # identical to a fresh server on the new weights
        assert o.inflight_retractions == 0 and o.inflight_tokens == 300  # in-flight request kept its KV
        assert o.cached_again == 200  # prefix sharing resumes under the new epoch
        v = o.vradix
        assert start.since(v, "epoch") == 1 and v["label"] == "v2" and start.since(v, "publications") == 1
        assert v["crossing_requests"] == 0 and v["stale_tokens_pinned"] == 0  # all finished: stale KV all freed
        assert start.since(v, "stale_tokens_freed_at_release") > 0
        # the publication deferred the unlocked stale KV (the warm prefix); the engine reclaimed it all by now
        assert v["stale_tokens_pending"] == 0 and not v["stale_reclaim"]["active"], v["stale_reclaim"]
        assert start.since(v, "stale_reclaim", "completed") >= 1 and v["last_publication"]["tokens_deferred"] > 0
        assert f"epoch {e0}->{e0 + 1}" in o.update_message
        if settings.value("VRADIX_CENSUS"):  # the escape watch ran on the real scheduler, across the real publication
            assert start.since(v, "escape_watch", "bumps_checked") == 1
            assert start.since(v, "escape_watch", "forwards_checked") > 0
            assert v["escape_watch"]["weights_recorded_at"].startswith(f"the publication to epoch {e0 + 1}")
        led = v["kv_ledger"]  # the independent KV page ledger agrees: nothing stale was read, nothing leaked
        assert led["enabled"] and led["verify_mode"] == "strict" and led["kernels"] == "torch"
        assert start.since(v, "kv_ledger", "prefixes_verified") >= 2 and led["violations_caught"] == 0
        assert start.since(v, "kv_ledger", "audits") == 1 and led["leaked_pages_total"] == 0
        # a forged epoch namespace in a user extra_key is rejected with a clear error; the engine keeps serving
        forged = requests.post(s.url + "/generate", json={"input_ids": PROBE, "extra_key": "\x1evradix:e1\x1f",
                                                         "sampling_params": {"max_new_tokens": 2}}, timeout=60)
        assert forged.status_code == 400 and "reserved vradix epoch marker" in forged.text
        assert s.generate(PROBE, 4)["meta_info"]["cached_tokens"] == 200
        assert start.since(s.vradix_info(), "forged_keys_rejected") == 1
        # prefill dedup: prompts admitted together that share an uncached prefix compute it once (stock: ~5 times)
        burst = shared_prefix_burst(s, seed=1)
        assert burst.computed == burst.computed_once, burst
        assert sorted(burst.cached) == [0] + [200] * 7
        now = s.vradix_info()
        assert now["prefill_dedup"]["enabled"] and start.since(now, "prefill_dedup", "deferred") >= 7
        assert start.since(now, "prefill_dedup", "deferred_shared_tokens") >= 7 * 200
        # strict idle memory check: a flush when idle resets the pool to full
        assert s.post("/flush_cache").status_code == 200
        assert "Traceback" not in s.logs()



def test_lock_aware_flush_and_update_weight_version(models, oracle, server_pool):
    with server_pool.lease(models[0]) as s:
        start = Counters(s)
        base = s.generate(PROBE, 4)
        (inflight,) = pause_holding(s, lambda: [StreamingRequest(s.url, LONG_PROMPT, 300)])
        r = s.post("/flush_cache")
        assert r.status_code == 200, r.text  # performed, not refused
        v = s.vradix_info()
        assert start.since(v, "lock_aware_flushes") == 1 and start.since(v, "epoch") == 1
        assert v["crossing_requests"] == 1 and v["stale_tokens_pinned"] >= len(LONG_PROMPT) - 1
        assert s.post("/continue_generation").status_code == 200
        after = s.generate(PROBE, 4)
        assert after["meta_info"]["cached_tokens"] == 0 and after["output_ids"] == base["output_ids"]
        final = inflight.result()
        assert final["meta_info"]["num_retractions"] == 0
        assert s.vradix_info()["stale_tokens_pinned"] == 0
        # /update_weight_version alone is a publication
        assert s.generate(PROBE, 4)["meta_info"]["cached_tokens"] == 200
        assert s.post("/update_weight_version", {"new_version": "v9"}).status_code == 200
        r = s.generate(PROBE, 4)
        assert r["meta_info"]["cached_tokens"] == 0 and r["meta_info"]["weight_version"] == "v9"
        v = s.vradix_info()
        assert v["label"] == "v9" and start.since(v, "publications") == 1 and start.since(v, "epoch") == 2


def test_chunked_prefill_crossing_a_publication(models, oracle, chunked):
    s = chunked
    give_up = time.monotonic() + 300  # a prefill that ends before the pause voids the attempt
    for attempt in itertools.count():
        long = StreamingRequest(s.url, CHUNKED_PROMPT, 4)
        deadline = time.monotonic() + 60  # poll the scheduler's own state until the prefill is chunking
        while not s.vradix_info()["chunked_prefill_in_progress"] and not long.started.is_set():
            assert time.monotonic() < deadline, "chunked prefill never observed"
        s.post("/pause_generation", {"mode": "in_place"})
        upd = s.post("/update_weights_from_disk", {"model_path": models[1 - attempt % 2],
                                                   "flush_cache": False, "weight_version": f"c{attempt}"}).json()
        s.post("/continue_generation")
        final = long.result()
        assert final["meta_info"]["num_retractions"] == 0
        if "(1 mid-prefill)" in upd["message"]:
            break
        if time.monotonic() > give_up:
            pytest.fail(f"publication never landed mid-prefill in {attempt + 1} attempts: {upd['message']}")
    weights = "B" if attempt % 2 == 0 else "A"
    probe = s.generate(CHUNKED_PROMPT, 4, timeout=300)
    assert probe["meta_info"]["cached_tokens"] == 0  # the crossing chunks were not inserted anywhere
    assert probe["output_ids"] == oracle[weights]["chunked"]
    assert s.vradix_info()["stale_tokens_pinned"] == 0


class Burst(NamedTuple):
    checked: int
    wrong: list
    crossing: list


def burst_across_publication(s, new_model, version):
    """27 concurrent one-token requests, an in_place pause and a publication of `new_model` as `version` while they
    run, then continue. Returns the responses."""
    import concurrent.futures as cf

    with cf.ThreadPoolExecutor(len(BURST)) as pool:
        futs = [pool.submit(s.generate, p, 1) for p in BURST]
        s.post("/pause_generation", {"mode": "in_place"})
        assert s.post("/update_weights_from_disk", {"model_path": new_model, "flush_cache": False,
                                                    "weight_version": version}).json()["success"]
        s.post("/continue_generation")
        return [f.result(timeout=300) for f in futs]


def mislabelled(results, oracle, labels):
    """Split the burst's responses (those whose token differs between A and B) into `Burst(checked, wrong, crossing)`.
    `wrong`: [(i, label, token, token of A, token of B)] for responses whose token is not that of the weights their
    label names. `crossing`: responses whose prefill ran under both weights (a chunk before the publication, the rest
    after): no single version computed their token, so their provenance, not their label, must say so."""
    checked, wrong, crossing = 0, [], []
    for i, r in enumerate(results):
        a, b = oracle["A"]["burst"][i], oracle["B"]["burst"][i]
        if a == b:
            continue
        checked += 1
        meta = r["meta_info"]
        if "kv_weight_versions" in meta:
            crossing.append((i, meta["kv_weight_versions"]))
            continue
        label = meta["weight_version"]
        if r["output_ids"][0] != (a if labels[label] == "A" else b):
            wrong.append((i, label, r["output_ids"][0], a, b))
    return Burst(checked, wrong, crossing)


def test_overlap_batch_in_flight_at_pause_is_labelled_with_its_weights(models, oracle, chunked):
    """Each response's label must name the weights that computed its token. A request whose prefill was chunked across
    the publication (a crossing request, computed by neither weights alone) must say so in its provenance instead; the
    small chunk size makes such a request likely, so that branch runs too."""
    s = chunked
    burst = mislabelled(burst_across_publication(s, models[1], "v2"), oracle, {"default": "A", "v2": "B"})
    assert burst.wrong == [] and burst.checked >= 10, burst
    for i, spans in burst.crossing:
        assert [x["version"] for x in spans] == ["default", "v2"], (i, spans)
        assert spans[0]["start"] == 0 < spans[1]["start"] < len(BURST[i]), (i, spans)


def test_stock_overlap_mislabels_a_batch_in_flight_at_pause(models, oracle, server_pool):
    """The stock arm of the test above: with the overlap scheduler, stock 0.5.23 leaves the batch launched before an
    in_place pause in flight across the update, and labels its token with the new version. The race depends on
    timing, so publications (alternating A and B) run until one shows it, within a deadline; one response labelled
    with one version but carrying the other's token proves the bug (a request chunked across the publication carries
    neither and does not count)."""
    with server_pool.lease(models[0], vradix=False) as s:
        labels, give_up = {"default": "A"}, time.monotonic() + 300
        for n in itertools.count():
            w = "BA"[n % 2]
            labels[f"s{n}"] = w
            burst = mislabelled(burst_across_publication(s, models["AB".index(w)], f"s{n}"), oracle, labels)
            assert burst.checked >= 10
            if any(token in (a, b) for _, _, token, a, b in burst.wrong):
                return
            if time.monotonic() > give_up:
                pytest.fail(f"stock never mislabelled an in-flight batch in {n + 1} publications")


def test_fail_closed_when_a_hook_cannot_be_installed(models):
    with pytest.raises(Exception) as e:
        CpuServer(models[0], env={"VRADIX_FAULT_MISSING_HOOK": ".flush_cache"}, startup_timeout=600)
    assert "could not install hook(s) sglang.srt.managers.scheduler.Scheduler.flush_cache" in str(e.value)


@pytest.mark.long  # duplicate coverage: test_e2e_multimodal.py's radix-off test asserts the same log and flags on a VLM
def test_disable_radix_cache_versions_only_the_weight_derived_caches(models, own):
    """No tree to version: the startup log says what vradix still versions (test_e2e_multimodal.py runs it on a VLM,
    and publishes there)."""
    with CpuServer(models[0], extra_args=["--disable-radix-cache"]) as s:
        assert "active without a radix cache: no prefix tree to version" in s.logs()
        assert s.generate(PROBE, 4)["meta_info"]["cached_tokens"] == 0
        info = s.vradix_info()
        assert info["active"] is True and info["radix_cache"] is False and info["publications"] == 0


def held_prefix_publication(s, new_model):
    """Warm PREFIX, keep it locked by an in-flight request across an in_place publication, then probe PREFIX."""
    s.generate(PROBE, 4)
    # the in-flight request holds PREFIX's (old-weight) KV across the update
    (inflight,) = pause_holding(s, lambda: [StreamingRequest(s.url, PREFIX + [12], 300)])
    upd = s.post("/update_weights_from_disk", {"model_path": new_model, "flush_cache": False,
                                               "weight_version": "v2"}).json()
    assert upd["success"], upd
    assert s.post("/continue_generation", {}).status_code == 200
    probe = s.post("/generate", {"input_ids": PROBE, "sampling_params": {"temperature": 0, "max_new_tokens": 4,
                                                                         "ignore_eos": True}})
    assert inflight.result()["meta_info"]["completion_tokens"] == 300
    return probe, s.vradix_info()["kv_ledger"]


@pytest.mark.parametrize("verify", ["off", "strict"])
def test_ledger_guard_catches_stale_prefix_when_the_namespace_is_broken(models, oracle, own, verify):
    """Fault: VRADIX_FAULT_NO_NAMESPACE drops the epoch namespace, so the tree offers the in-flight request's stale
    PREFIX to the probe. With the guard off the stale KV is served (the fault is real); in strict mode the backstop
    launched before the forward sees pages of epoch 0 behind an epoch-1 request, and the probe fails at its result
    with an error naming vradix and the epochs (never silent). That server runs the device forms with chunked
    prefill: its chunk checkpoints were held until their verdicts were read, and the prefix still got cached (the
    in-flight request reused it). Once the in-flight request released the stale prefix, the same probe equals the
    fresh new-weights server."""
    with own(f"guard-{verify}") as s:
        probe, led = held_prefix_publication(s, models[1])
        if verify == "off":
            body = probe.json()
            assert probe.status_code == 200 and body["meta_info"]["cached_tokens"] == 200
            assert body["output_ids"] != oracle["B"]["probe"]
            assert led["violations_caught"] == 0
        else:
            assert probe.status_code == 500, probe.text
            assert "vradix KV backstop" in probe.text and "not written under epoch 1" in probe.text, probe.text
            assert led["violations_caught"] >= 1 and "failing the request" in led["last_violation"]
            assert "vradix verify guard" in s.logs()
            assert led["checkpoints_held"] >= 1 and led["verdicts_pending"] == 0, led
        again = s.generate(PROBE, 4)  # the engine keeps serving
        assert again["meta_info"]["weight_version"] == "v2"
        if verify == "strict":  # nothing of the failed probe was inserted
            assert again["output_ids"] == oracle["B"]["probe"]
        assert "Traceback" not in s.logs()
