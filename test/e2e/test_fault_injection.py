"""Fault injection on a real SGLang CPU server with vradix (tiny float32 models with peaky logits).

One vradix server runs every scenario in turn (server start is the expensive part on CPU); a second one with HiCache
L2 and L3 (`hicache_engine`) runs the publication scenarios again at the end of the module. It runs with SGLang's own
busy-time memory accounting and KV page checks switched on (`STRICT_CHECK_ENV`), so a leak or a use-after-free inside
any step stops the scheduler and fails the test. After each scenario:
- no stale hit: probes must equal the greedy output of a fresh server on the weights the engine now serves (oracle);
- no leak: the strict idle memory check (`available + evictable + protected == total`, nothing locked, every request
  slot free, no stale KV pinned);
- no hang: every wait has a deadline;
- the engine keeps serving (the probes themselves).
"""
import concurrent.futures as cf
import itertools
import time

import pytest
import requests

from vradix.testing.harness.hicache_store import hicache_server
from vradix.testing.harness.reliability import STRICT_CHECK_ENV, oracles, publish, strict_idle_check, wait_until
from vradix.testing.harness.scenario import PREFIX, PROBE, StreamingRequest, pause_holding, pause_took_effect
from vradix.testing.harness.server import CpuServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

CHUNK = 64
MAX_RUNNING = 4
CHUNKED_PROMPT = [(i * 13) % 480 + 20 for i in range(1500)]
WAITERS = [PREFIX[:120] + [(i * 37) % 400 + 50, (i * 11) % 300 + 60] for i in range(16)]
LONG = [9, 8, 7] * 20
PROMPTS = {"probe": [PROBE], "chunked": [CHUNKED_PROMPT], "waiters": WAITERS}


@pytest.fixture(scope="module")
def models(models):
    """The session's tiny models A and B, by name."""
    return dict(zip("AB", models))


@pytest.fixture(scope="module")
def oracle(models, server_pool):
    """Greedy outputs of a fresh stock server on A and on B (the pool's, reset)."""
    return oracles(models, PROMPTS, pool=server_pool)


class Engine:
    """The server under test and the weights it serves now."""

    def __init__(self, server, models):
        self.s, self.models, self.weights, self.n = server, models, "A", 0

    def other(self):
        return "B" if self.weights == "A" else "A"

    def update(self):
        """Publish the other weights; returns the update response."""
        weights, self.n = self.other(), self.n + 1
        body = publish(self.s, self.models[weights], f"{weights}{self.n}")
        self.weights = weights
        return body

    def stream(self, prompt=LONG, tokens=60, **extra):
        r = StreamingRequest(self.s.url, prompt, tokens, **extra)
        assert r.started.wait(120), "request never started"
        return r

    def pause(self):
        assert self.s.post("/pause_generation", {"mode": "in_place"}).status_code == 200

    def pause_holding(self, *streams):
        """Start the streaming requests `streams` ((prompt, tokens, extra) each) and pause in place once every one
        is decoding; returns them, each still running when the pause took effect (`scenario.pause_holding`)."""
        return pause_holding(self.s, lambda: [StreamingRequest(self.s.url, p, n, **extra) for p, n, extra in streams],
                             resume=self.resume)

    def resume(self):
        assert self.s.post("/continue_generation").status_code == 200

    def check(self, oracle, group="probe", expect_cached=None):
        """No leak (strict idle check), then no stale hit: the probes equal the oracle of the current weights."""
        v = strict_idle_check(self.s)
        outs = [self.s.generate(p, 4, timeout=300) for p in PROMPTS[group]]
        assert [o["output_ids"] for o in outs] == oracle[self.weights][group], (group, self.weights)
        if expect_cached is not None:
            assert outs[0]["meta_info"]["cached_tokens"] == expect_cached
        strict_idle_check(self.s)
        return v


@pytest.fixture(scope="module")
def engine(models, oracle):
    with CpuServer(models["A"], chunked_prefill_size=CHUNK, env=STRICT_CHECK_ENV,
                   extra_args=["--max-running-requests", str(MAX_RUNNING)]) as s:
        e = Engine(s, models)
        e.check(oracle)
        yield e
        assert "Traceback" not in s.logs(), s.tail(80)


def test_publication_during_chunked_prefill(engine, oracle):
    give_up = time.monotonic() + 300  # a prefill that ends before the pause voids the attempt
    for attempt in itertools.count():
        long = StreamingRequest(engine.s.url, CHUNKED_PROMPT, 4)
        wait_until(lambda: engine.s.vradix_info()["chunked_prefill_in_progress"] or long.started.is_set(), 120,
                   "the chunked prefill")
        engine.pause()
        body = engine.update()
        engine.resume()
        final = long.result(300)
        assert final["meta_info"]["num_retractions"] == 0
        if "(1 mid-prefill)" in body["message"]:
            break
        if time.monotonic() > give_up:
            pytest.fail(f"publication never landed mid-prefill in {attempt + 1} attempts: {body['message']}")
    # the crossing request's chunks were inserted nowhere: a fresh prefill of the same prompt equals the oracle
    engine.check(oracle, "chunked", expect_cached=0)


def test_abort_of_requests_paused_in_place(engine, oracle):
    engine.s.generate(PROBE, 4)  # PROBE cached under the current weights
    streams = engine.pause_holding(*[(LONG + [i], 2000, {"rid": f"paused-{i}"}) for i in range(3)])
    engine.s.post("/abort_request", {"rid": "paused-0"})  # aborted before the publication
    engine.update()
    engine.s.post("/abort_request", {"rid": "paused-1"})  # aborted while crossing
    engine.resume()
    engine.s.post("/abort_request", {"abort_all": True})
    for r in streams:
        final = r.result(120)
        assert final["meta_info"]["finish_reason"]["type"] == "abort", final["meta_info"]
        assert final["meta_info"]["completion_tokens"] < 2000
    engine.check(oracle, expect_cached=0)


def test_storm_of_publications_while_paused(engine, oracle):
    engine.s.generate(PROBE, 4)
    epoch = engine.s.vradix_info()["epoch"]
    streams = engine.pause_holding(*[(LONG + [i], 60, {}) for i in range(2)])
    for i in range(11):
        engine.update()
        if i % 4 == 1:  # relabel only: also a publication
            assert engine.s.post("/update_weight_version", {"new_version": f"relabel{i}",
                                                            "abort_all_requests": False}).status_code == 200
    v = engine.s.vradix_info()
    assert v["epoch"] == epoch + 11 + 3 and v["crossing_requests"] == 2
    engine.resume()
    for r in streams:
        meta = r.result(300)["meta_info"]
        assert meta["num_retractions"] == 0 and meta["completion_tokens"] == 60
    engine.check(oracle, expect_cached=0)


def test_failed_update_from_bad_path_while_requests_in_flight(engine, oracle):
    engine.s.generate(PROBE, 4)
    before = engine.s.vradix_info()
    streams = engine.pause_holding(*[(LONG + [i], 60, {}) for i in range(2)])
    r = engine.s.post("/update_weights_from_disk", {"model_path": "/nonexistent/weights", "flush_cache": False,
                                                     "weight_version": "never"})
    assert r.status_code == 400 and not r.json()["success"]
    assert "failed update_weights_from_disk (conservative)" in r.json()["message"]
    # a malformed update (unknown load_format raises inside the scheduler in stock SGLang) is refused by the
    # launcher before anything is sent: a clear error and no bump
    r = engine.s.post("/update_weights_from_disk", {"model_path": engine.models[engine.other()],
                                                     "load_format": "bogus", "flush_cache": False})
    assert r.status_code == 400 and "is not a valid LoadFormat" in r.json()["message"], r.text
    v = engine.s.vradix_info()
    assert v["label"] == before["label"] and v["epoch"] == before["epoch"] + 1  # one conservative bump, same label
    engine.resume()
    for s in streams:
        meta = s.result(300)["meta_info"]
        assert meta["num_retractions"] == 0 and meta["completion_tokens"] == 60
    engine.check(oracle, expect_cached=0)  # weights unchanged, cache invalidated conservatively
    engine.update()  # and the next good publication works
    engine.check(oracle, expect_cached=0)


def abort_blockers(engine) -> None:
    for i in range(MAX_RUNNING):
        engine.s.post("/abort_request", {"rid": f"blocker-{i}"})


def pause_with_the_waiting_queue_full(engine, pool, deadline_s: float = 300.0):
    """MAX_RUNNING long requests fill the running batch, so every waiter stays in the scheduler's waiting queue (their
    max_new_tokens is small enough that all of them fit the KV budget the scheduler reserves); pause in place then.
    Returns (blockers, waiter futures) once the pause took effect with every blocker running and every waiter queued.
    An attempt where a blocker finished first (a waiter took its slot) is void: continued, aborted, their results
    collected, and started afresh, until `deadline_s`."""
    deadline = time.monotonic() + deadline_s
    while True:
        blockers = [engine.stream(LONG + [i], 1000, rid=f"blocker-{i}") for i in range(MAX_RUNNING)]
        futs = [pool.submit(engine.s.generate, p, 4, 300) for p in WAITERS]
        wait_until(lambda: engine.s.vradix_info()["pool"]["waiting_requests"] == len(WAITERS)
                   or any(b.done for b in blockers), 120, "the waiting queue to fill")
        engine.pause()
        pause_took_effect(engine.s)
        if not any(b.done for b in blockers) and engine.s.vradix_info()["pool"]["waiting_requests"] == len(WAITERS):
            return blockers, futs
        engine.resume()
        abort_blockers(engine)
        for f in futs:
            f.result(300)
        for b in blockers:
            b.result(300)
        assert time.monotonic() < deadline, "a blocker finished before every pause with the waiting queue full"


def test_publication_while_the_waiting_queue_holds_many_requests(engine, oracle):
    try:
        with cf.ThreadPoolExecutor(len(WAITERS)) as pool:
            blockers, futs = pause_with_the_waiting_queue_full(engine, pool)
            body = engine.update()
            assert f"{len(WAITERS)} queued request(s) re-bound" in body["message"], body["message"]
            assert f"{MAX_RUNNING} crossing request(s)" in body["message"], body["message"]
            engine.resume()
            abort_blockers(engine)  # free the running slots; the crossing blockers end without retraction
            outs = [f.result(300) for f in futs]
    finally:
        engine.s.post("/continue_generation")
        engine.s.post("/abort_request", {"abort_all": True})
    # every queued request was prefilled under the new weights: it equals the oracle, whatever it shares
    assert [o["output_ids"] for o in outs] == oracle[engine.weights]["waiters"]
    for b in blockers:
        meta = b.result(300)["meta_info"]
        assert meta["num_retractions"] == 0 and meta["finish_reason"]["type"] == "abort"
    engine.check(oracle, "waiters")


def test_pause_continue_without_publication_keeps_the_cache(engine, oracle):
    engine.s.generate(PROBE, 4)
    epoch = engine.s.vradix_info()["epoch"]
    (stream,) = engine.pause_holding((LONG, 60, {}))
    engine.resume()
    assert stream.result(300)["meta_info"]["num_retractions"] == 0
    engine.check(oracle, expect_cached=len(PREFIX))  # nothing invalidated: the prefix is still shared
    assert engine.s.vradix_info()["epoch"] == epoch


def test_in_place_pauses_under_decode_load_lose_no_request(engine, oracle):
    """A request one token short of max_new_tokens when an in_place pause drains the overlap queue stays in the next
    decode batch and finishes and is released (dropping it would hang it and leak its KV). Many short requests and
    back-to-back pauses, half of them with a publication, make that state certain to occur."""
    lengths = [2 + i % 7 for i in range(24)]
    with cf.ThreadPoolExecutor(8) as pool:
        futs = [pool.submit(engine.s.generate, PREFIX[:40 + i] + [i + 1], n, 120) for i, n in enumerate(lengths)]
        for k in range(16):
            engine.pause()
            if k % 2:
                engine.update()
            engine.resume()
        outs = [f.result(180) for f in futs]  # a lost request raises here (timeout) instead of hanging the suite
    assert [o["meta_info"]["completion_tokens"] for o in outs] == lengths
    engine.check(oracle)  # (requests served after the last publication legitimately share PROBE's prefix)


# ---- bad input ------------------------------------------------------------------------------------------------------
def _generate_raw(engine, **extra):
    return requests.post(engine.s.url + "/generate", json={"input_ids": PROBE, "sampling_params": {
        "temperature": 0, "max_new_tokens": 4, "ignore_eos": True}, **extra}, timeout=120)


def test_user_keys_colliding_with_the_epoch_namespace_are_rejected(engine, oracle):
    v = engine.s.vradix_info()
    epoch, rejected = v["epoch"], v["forged_keys_rejected"]
    stream = engine.stream(LONG, 30)  # a request in flight must not be affected
    forged = [f"\x1evradix:e{epoch}\x1f", f"\x1evradix:e{epoch + 1}\x1f", "tenant\x1evradix:e0\x1f", "\x1e"]
    for field in ("extra_key", "cache_salt"):
        for key in forged:
            r = _generate_raw(engine, **{field: key})
            assert r.status_code == 400 and "reserved vradix epoch marker" in r.text, (field, key, r.text)
        for ok in ["vradix:e0", "e0\x1f", "\x1f"]:  # look-alikes without the control character are ordinary keys
            assert _generate_raw(engine, **{field: ok}).status_code == 200
    assert stream.result(300)["meta_info"]["completion_tokens"] == 30
    assert engine.s.vradix_info()["forged_keys_rejected"] == rejected + 2 * len(forged)
    engine.check(oracle)


# SGLang queues a request for a missing session (and one a session aborts) without passing the point where vradix
# stamps requests: the fail-closed "unstamped request" check must refuse that request, not raise in the scheduler and
# stop the engine
def test_a_request_for_a_missing_session_is_refused_and_the_engine_keeps_serving(engine, oracle):
    stream = engine.stream(LONG, 30)
    r = _generate_raw(engine, session_params={"id": "no-such-session"})
    assert "session id no-such-session does not exist" in r.text, r.text[:300]
    assert stream.result(300)["meta_info"]["completion_tokens"] == 30
    engine.update()  # a publication with that request gone through the queue still works
    engine.check(oracle)


BAD_LABELS = [("", "empty string"), ("v" * 100_000, "at most 256"), ("v1\nINJECTED", "control characters"),
              (123, None), (None, None), (["v1"], None)]


def test_bad_version_labels_are_refused_and_change_nothing(engine, oracle):
    before = engine.s.vradix_info()
    stream = engine.stream(LONG, 30)
    for label, why in BAD_LABELS:
        r = engine.s.post("/update_weight_version", {"new_version": label, "abort_all_requests": False})
        assert r.status_code == 400, r.text[:300]
        if why:
            assert "invalid weight_version label" in r.text and why in r.text, r.text[:300]
        if label is not None:  # weight_version is optional on a weight update
            r = engine.s.post("/update_weights_from_disk", {"model_path": engine.models[engine.other()],
                                                             "weight_version": label, "flush_cache": False})
            assert r.status_code == 400, r.text[:300]
            if why:
                assert "invalid weight_version label" in r.text and why in r.text, r.text[:300]
    after = engine.s.vradix_info()
    assert (after["epoch"], after["label"]) == (before["epoch"], before["label"])  # no publication happened
    assert stream.result(300)["meta_info"]["completion_tokens"] == 30  # nothing lost
    engine.check(oracle)  # still the old weights, still serving


#: (body, bumps): refused by the HTTP schema or the launcher (no bump), or a load from a path that does not exist
#: (the scheduler's loader fails; SGLang cannot say whether weights were touched: one conservative bump)
MALFORMED = [({}, 0), ({"model_path": 123}, 0), ({"model_path": "x", "flush_cache": "maybe"}, 0),
             ({"model_path": "x", "unknown": 1}, 1), ({"model_path": "x", "load_format": "bogus"}, 0)]


def test_malformed_update_requests_get_clear_errors(engine, oracle):
    stream = engine.stream(LONG, 30)
    for body, bumps in MALFORMED:
        before = engine.s.vradix_info()["epoch"]
        r = engine.s.post("/update_weights_from_disk", body)
        assert r.status_code in (400, 422), (body, r.text[:300])
        assert engine.s.vradix_info()["epoch"] == before + bumps, body
    assert stream.result(300)["meta_info"]["completion_tokens"] == 30
    engine.check(oracle)


# ---- the publication scenarios again, on HiCache (L2 host pool, L3 file store) --------------------------------------
@pytest.fixture(scope="module")
def hicache_engine(models, oracle, tmp_path_factory):
    """A vradix server with HiCache L2 and L3 and the same strict checks and device pool as `engine` (the scenarios
    size their requests for it: three 2000-token requests must run at once)."""
    with hicache_server(models["A"], str(tmp_path_factory.mktemp("l3")), chunked_prefill_size=CHUNK,
                        max_total_tokens=8192, env=STRICT_CHECK_ENV,
                        extra_args=["--max-running-requests", str(MAX_RUNNING)]) as s:
        e = Engine(s, models)
        e.check(oracle)
        yield e
        assert "Traceback" not in s.logs(), s.tail(80)


HICACHE_SCENARIOS = [test_publication_during_chunked_prefill, test_abort_of_requests_paused_in_place,
                     test_storm_of_publications_while_paused, test_failed_update_from_bad_path_while_requests_in_flight,
                     test_publication_while_the_waiting_queue_holds_many_requests,
                     test_pause_continue_without_publication_keeps_the_cache,
                     test_in_place_pauses_under_decode_load_lose_no_request]


@pytest.mark.long  # the scenarios above, repeated with HiCache on; test_e2e_hicache covers its publications
@pytest.mark.parametrize("scenario", HICACHE_SCENARIOS, ids=lambda f: f.__name__[len("test_"):])
def test_on_hicache(hicache_engine, oracle, scenario):
    scenario(hicache_engine, oracle)
