"""E2E on real SGLang CPU servers: per-response provenance, verifiable state (server info, metrics, invalidation
reports) and the fail-closed publish client, against vradix and against stock SGLang (VRADIX_DISABLE=1).

One vradix server (with its tokenizer, for the OpenAI endpoint, and --enable-metrics) serves the whole module; the
tests run in file order on it and each reads the epoch it starts from. The client tests lease stock servers from the
session's server pool (`server_pool`; the stock-fleet test two)."""
import json
import signal
import subprocess
import sys
import time

import psutil
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

import vradix
from vradix.client import EngineHandle, PublishError, publish
from vradix.predicate import UnsafeDeployment
from vradix.testing.harness.pool import stopped_while_unused
from vradix.testing.harness.scenario import (LONG_PROMPT, PROBE, StreamingRequest, across_publications, crossed_update,
                                             pause_holding, pause_took_effect)
from vradix.testing.harness.server import CpuServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def server(models, request):
    """The module's vradix server; stopped (SIGSTOP) while a test that does not use it runs."""
    # launched with upstream SGLang's --enable-prefill-weight-versions, which SGLang 0.5.23 does not have: accepted
    with CpuServer(models[0], skip_tokenizer_init=False,
                   extra_args=["--enable-metrics", "--enable-prefill-weight-versions"]) as s, \
            stopped_while_unused(request, s):
        yield s
        assert "Traceback" not in s.logs()


@pytest.fixture
def stock_fleet(models, server_pool):
    """Two stock SGLang servers (VRADIX_DISABLE=1) from the pool, leased per test (parked between, taking no CPU)."""
    with server_pool.lease_many(2, models[0], vradix=False) as fleet:
        yield fleet


@pytest.fixture
def stock(models, server_pool):
    with server_pool.lease(models[0], vradix=False) as s:
        yield s


class StreamFinishedFirst(RuntimeError):
    """The publish client paused the engine after the request meant to be in flight had finished."""


def publish_holding(url, start, *args, held=crossed_update, deadline_s: float = 300.0, **kwargs):
    """`publish(url, *args, **kwargs)` with the streaming request `start()` running when the client's pause took
    effect: its engine handle checks that right after the pause. An attempt where the request finished first (or came
    `near_end`) fails before any update (the client raises, the engine stays paused): the engine is continued, the
    request's result collected, and a new attempt starts, until `deadline_s`. The request's own final record then proves
    it was held (`held(meta_info)`: by default SGLang's `weight_versions` show the change); an attempt it does not prove
    is void too, and the publication is made again. Returns (the request, the client's results)."""
    deadline = time.monotonic() + deadline_s
    while True:
        stream = start()
        stream.wait_decoding()

        class Holding(EngineHandle):
            def post_ok(self, path, payload=None):
                r = super().post_ok(path, payload)
                if path == "/pause_generation":
                    pause_took_effect(self)
                    if stream.near_end:
                        raise StreamFinishedFirst("the streaming request (nearly) finished before the pause")
                return r

        try:
            results = publish(url, *args, engine_factory=Holding, **kwargs)
            if held(stream.result()["meta_info"]):
                return stream, results
        except PublishError as e:
            if not isinstance(e.__cause__, StreamFinishedFirst):
                raise
            assert requests.post(url + "/continue_generation", timeout=60).status_code == 200
            stream.result()
        assert time.monotonic() < deadline, "the streaming request finished before every pause of the publish client"


def update_and_continue(s, model, version):
    """The rest of an in-place publication on a paused server: update without a flush, continue."""
    upd = s.post("/update_weights_from_disk", {"model_path": model, "flush_cache": False,
                                               "weight_version": version}).json()
    assert upd["success"], upd
    assert s.post("/continue_generation").status_code == 200
    return upd["message"]


def test_provenance_in_meta_info_across_two_publications(server, models):
    s = server
    e0, w0 = s.vradix_info()["epoch"], s.vradix_info()["weight_id"]
    first = s.generate(PROBE, 4)["meta_info"]
    assert first["prefix_cache"] == {"cached_tokens": 0, "epoch": e0, "weight_version": "default", "weight_id": w0}
    assert "kv_weight_versions" not in first  # never crossed a publication
    # upstream SGLang's and miles' fields, on every response
    assert first["prefill_weight_versions"] == [{"version": "default", "start": 0, "end": len(PROBE)}]
    assert {first[f"{k}_weight_version"] for k in ("first_prefill", "min_forward", "max_forward", "last_forward")} \
        == {"default"}
    assert s.generate(PROBE, 4)["meta_info"]["prefix_cache"]["cached_tokens"] == 200

    def prepare():
        s.update_weights(models[0], "v1")  # an idle publication: each attempt starts on A labelled v1
        info = s.vradix_info()
        return info["epoch"], info["weight_id"]

    # a request in flight at both publications, with some KV computed under v2 before the second (its own record,
    # SGLang's weight_versions, proves it ran across both; an attempt where it finished first is redone)
    crossing = across_publications(s, lambda: StreamingRequest(s.url, LONG_PROMPT, 300),
                                   [lambda: update_and_continue(s, models[1], "v2"),
                                    lambda: update_and_continue(s, models[0], "v3")], prepare=prepare)
    (e0, w0), msg, final = crossing.before, crossing.messages[0], crossing.final["meta_info"]
    assert f"epoch {e0}->{e0 + 1}" in msg and "freed" in msg and "stale tokens pinned by 1 crossing" in msg
    assert final["num_retractions"] == 0 and final["completion_tokens"] == 300

    spans = final["kv_weight_versions"]  # on the final streaming chunk
    total = len(LONG_PROMPT) + 300
    assert [x["version"] for x in spans] == ["v1", "v2", "v3"], spans
    assert [x["epoch"] for x in spans] == [e0, e0 + 1, e0 + 2]
    assert spans[0]["start"] == 0 and spans[-1]["end"] == total
    assert all(a["end"] == b["start"] for a, b in zip(spans, spans[1:]))
    assert len(LONG_PROMPT) <= spans[1]["start"] < spans[2]["start"] < total
    # cross-check with SGLang's own per-output-token version spans: the token sampled last under the old weights is
    # the first position whose KV is computed under the new ones
    sglang_starts = [x["start"] for x in final["weight_versions"]]
    assert [x["version"] for x in final["weight_versions"]] == ["v1", "v2", "v3"]
    assert [len(LONG_PROMPT) + k - 1 for k in sglang_starts[1:]] == [spans[1]["start"], spans[2]["start"]]
    assert final["prefix_cache"]["epoch"] == e0  # the prompt matched (nothing) in the namespace of epoch e0
    # upstream's `prefill_weight_versions` is the prompt's part of these spans; miles' per-forward versions are the
    # weights of the first, oldest, newest and last forward
    assert final["prefill_weight_versions"] == [{"version": "v1", "start": 0, "end": len(LONG_PROMPT)}]
    assert (final["first_prefill_weight_version"], final["min_forward_weight_version"],
            final["max_forward_weight_version"], final["last_forward_weight_version"]) == ("v1", "v1", "v3", "v3")
    upstream_prefill_spans_hold(final["prefill_weight_versions"], final["prompt_tokens"])
    # miles' response segments are SGLang's own sampling spans, as miles' per-call parser reads them
    assert final["response_weight_version_segments"] == [[x["start"], x["end"], x["version"]]
                                                         for x in final["weight_versions"]]
    assert final["response_weight_version"] == "v3" == final["weight_version"]
    miles_call(final)
    # the KV page ledger's `spans` kernel, read off the row at release, agrees (page size 1 here: exact starts)
    ledger = final["kv_ledger_spans"]
    assert [x["epoch"] for x in ledger] == [e0, e0 + 1, e0 + 2], ledger
    assert [x["start"] for x in ledger] == [0, spans[1]["start"], spans[2]["start"]], (ledger, spans)

    w2 = s.vradix_info()["weight_id"]
    assert spans[0]["weight_id"] == w0 and spans[2]["weight_id"] == w2 and len({x["weight_id"] for x in spans}) == 3
    after = s.generate(PROBE, 4)["meta_info"]
    assert after["prefix_cache"] == {"cached_tokens": 0, "epoch": e0 + 2, "weight_version": "v3", "weight_id": w2}
    r = s.post("/v1/completions", {"model": "m", "prompt": PROBE, "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["metadata"]["prefix_cache"] == {"cached_tokens": 200, "epoch": e0 + 2, "weight_version": "v3",
                                                    "weight_id": w2}
    metadata = r.json()["metadata"]  # where SGLang 0.5.23 puts its own weight_versions, so do vradix's fields
    assert metadata["prefill_weight_versions"] == [{"version": "v3", "start": 0, "end": len(PROBE)}]
    assert metadata["weight_versions"][0]["version"] == "v3" and metadata["response_weight_version"] == "v3"
    assert metadata["response_weight_version_segments"] == [[0, 2, "v3"]] and metadata["last_forward_weight_version"] \
        == "v3"
    chat = {"model": "m", "messages": [{"role": "user", "content": " ".join(f"t{i}" for i in PROBE)}],
            "max_tokens": 2, "temperature": 0}
    r = s.post("/v1/chat/completions", chat)
    assert r.status_code == 200, r.text
    chat_prefix = r.json()["metadata"]["prefix_cache"]
    assert (chat_prefix["epoch"], chat_prefix["weight_version"]) == (e0 + 2, "v3") and chat_prefix["cached_tokens"] > 0


def test_trainer_api_and_recipes_on_a_request_crossing_two_step_publications(server, models, tmp_path):
    """`vradix.trainer` on a live response: a greedy stream with log-probs crosses two publications labelled with
    step numbers (as RL frameworks publish); per output token the sampler, the KV read, the staleness and the kind
    follow SGLang's `weight_versions` and vradix's spans; the corrections align with the engine's log-probs; the
    docs' recipes (slime / miles, verl, AReaL) run as written on it, and `vradix inspect --response` prints the same
    facts from the saved response; an OpenAI completion after it is all fresh."""
    from vradix.testing.harness import recipes
    from vradix.trainer import CROSSING, FRESH, TokenVersions, importance_weights, mask

    s, n = server, 160
    # step labels from here on: each attempt starts with an idle publication labelled 1; the request's own record
    # proves it ran across both publications (an attempt where it finished first is redone)
    final = across_publications(s, lambda: StreamingRequest(s.url, LONG_PROMPT, n, return_logprob=True),
                                [lambda: update_and_continue(s, models[1], "2"),
                                 lambda: update_and_continue(s, models[0], "3")],
                                prepare=lambda: s.update_weights(models[0], "1")).final
    meta = final["meta_info"]
    assert meta["num_retractions"] == 0 and len(meta["output_token_logprobs"]) == n == len(final["output_ids"])
    k2, k3 = [x["start"] for x in meta["weight_versions"][1:]]
    assert [x["version"] for x in meta["weight_versions"]] == ["1", "2", "3"] and 0 < k2 < k3 < n

    tv = TokenVersions.from_response(final)
    assert tv.sampler == (1,) * k2 + (2,) * (k3 - k2) + (3,) * (n - k3)
    assert tv.kv_oldest == (1,) * n and tv.kv_newest == tv.sampler
    assert tv.staleness == (0,) * k2 + (1,) * (k3 - k2) + (2,) * (n - k3)
    assert tv.kind == (FRESH,) * k2 + (CROSSING,) * (n - k2) and tv.clock_unit == "epoch"
    assert list(tv.logprobs) == [x[0] for x in meta["output_token_logprobs"]]
    assert mask(tv, trainer_version=3, max_staleness=1) == [0] * n  # every token read step 1's prompt KV
    assert mask(tv, max_staleness=1) == [1] * k3 + [0] * (n - k3)
    shifted = [x + 0.1 for x in tv.logprobs]
    assert importance_weights(tv, shifted, kinds=("crossing",)) == pytest.approx([1.0] * k2 + [1.1051709] * (n - k2))
    recipes.check_all(final, LONG_PROMPT, trainer_version=3)
    saved = tmp_path / "response.json"  # `vradix inspect --response` on the saved response: one row per run
    saved.write_text(json.dumps(final))
    inspected = subprocess.run([sys.executable, "-m", "vradix.cli", "inspect", "--response", str(saved)],
                               capture_output=True, text=True, timeout=60)
    assert inspected.returncode == 0, inspected.stderr
    rows = [line.split() for line in inspected.stdout.splitlines()[2:]]
    assert rows == [[f"0-{k2 - 1}", "1", "1", "0", FRESH], [f"{k2}-{k3 - 1}", "2", "1", "..", "2", "1", CROSSING],
                    [f"{k3}-{n - 1}", "3", "1", "..", "3", "2", CROSSING]], inspected.stdout

    r = s.post("/v1/completions", {"model": "m", "prompt": PROBE, "max_tokens": 3, "temperature": 0, "logprobs": 1})
    assert r.status_code == 200, r.text
    done = TokenVersions.from_response(r.json())
    assert done.sampler == (3,) * 3 and done.kind == (FRESH,) * 3 and len(done.logprobs) == 3 and done.described


def upstream_prefill_spans_hold(spans, prompt_tokens):
    """Upstream SGLang's E2E assertions on `prefill_weight_versions` (`_assert_prefill_spans_contiguous`): at least one
    span, from 0, contiguous, adjacent versions different, ending at the prompt; versions are strings, bounds ints."""
    assert spans and spans[0]["start"] == 0 and spans[-1]["end"] == prompt_tokens, spans
    assert all(a["end"] == b["start"] and a["version"] != b["version"] for a, b in zip(spans, spans[1:])), spans
    assert all(isinstance(x["version"], str) and type(x["start"]) is int and type(x["end"]) is int for x in spans)


def miles_call(meta):
    """miles' per-call parser rules for the response fields: no zero-length segment, none past the reported output,
    exact coverage of the output; the last segment's label is `response_weight_version` (a string)."""
    out, segments = meta["completion_tokens"], meta["response_weight_version_segments"]
    assert segments[0][0] == 0 and segments[-1][1] == out, (segments, out)
    assert all(s < e for s, e, _ in segments) and all(a[1] == b[0] for a, b in zip(segments, segments[1:]))
    assert isinstance(meta["response_weight_version"], str)


def test_a_request_aborted_after_its_prefill_keeps_its_prompt_spans(server):
    """Upstream: a request aborted after its prefill keeps the prompt spans; miles' segments cover exactly the output
    it reported. (One aborted while queued gets SGLang's own abort answer, which carries no plugin fields on 0.5.23;
    the rule for a request aborted before its prefill is shown at cache level:
    `test_provenance_cache_level.py::test_a_request_aborted_before_its_prefill_reports_no_prompt_spans`.)"""
    s = server
    label = s.vradix_info()["label"]
    stream = StreamingRequest(s.url, LONG_PROMPT + [5], 2000, rid="upstream-abort-decoding")
    stream.wait_decoding()
    assert s.post("/abort_request", {"rid": "upstream-abort-decoding"}).status_code == 200
    meta = stream.result()["meta_info"]
    assert meta["finish_reason"]["type"] == "abort" and 0 < meta["completion_tokens"] < 2000
    assert meta["prefill_weight_versions"] == [{"version": label, "start": 0, "end": len(LONG_PROMPT) + 1}]
    miles_call(meta)


#: every `sglang:vradix_*` series and its Prometheus type
VRADIX_SERIES = {"sglang:vradix_epoch": "gauge", "sglang:vradix_crossing_requests": "gauge",
                 "sglang:vradix_stale_tokens_pinned": "gauge", "sglang:vradix_stale_tokens_freed_last": "gauge",
                 "sglang:vradix_publications": "counter", "sglang:vradix_lock_aware_flushes": "counter",
                 "sglang:vradix_stale_tokens_freed": "counter", "sglang:vradix_guard_violations": "counter",
                 "sglang:vradix_bounded_requests": "counter", "sglang:vradix_epoch_bump_seconds": "histogram",
                 "sglang:vradix_publication_pause_seconds": "histogram"}


def scrape(s) -> dict:
    """`/metrics`, parsed by prometheus_client: {family name: family}."""
    text = requests.get(s.url + "/metrics", timeout=30).text
    return {f.name: f for f in text_string_to_metric_families(text) if f.name.startswith("sglang:vradix_")}


def sample(families: dict, name: str, suffix: str = "") -> float:
    """The value of `name`'s one sample named `name + suffix` (this server has one scheduler: one label set)."""
    (value,) = [x.value for x in families[name].samples if x.name == name + suffix]
    return value


def test_server_info_metrics_and_flush_report(server):
    s = server
    v = s.vradix_info()
    for key in ("active", "version", "tree_core", "epoch", "label", "publications", "stale_tokens_pinned",
                "stale_tokens_freed_total", "stale_tokens_freed_last", "last_publication_latency_ms",
                "last_publication_pause_ms", "last_publication"):
        assert key in v, key
    assert v["active"] and v["version"] == vradix.__version__ and v["tree_core"] == "RustUnifiedTreeCore"
    assert v["publications"] >= 2 and v["stale_tokens_freed_total"] > 0 and v["last_publication_latency_ms"] > 0
    assert v["last_publication"]["epoch_after"] == v["epoch"] and v["last_publication"]["label"] == v["label"]
    pause = v["last_publication_pause_ms"]  # what the last publication paused the scheduler for: drain + bump
    assert pause["drain_ms"] >= 0 and pause["bump_ms"] >= v["last_publication_latency_ms"]
    assert pause["total_ms"] == v["last_publication"]["pause_ms"]
    assert pause["total_ms"] == pytest.approx(pause["drain_ms"] + pause["bump_ms"], abs=2e-3)
    families = scrape(s)
    assert {name: families[name].type for name in VRADIX_SERIES} == VRADIX_SERIES
    assert sample(families, "sglang:vradix_epoch") == v["epoch"]
    assert sample(families, "sglang:vradix_publications", "_total") == v["publications"]
    assert sample(families, "sglang:vradix_stale_tokens_freed", "_total") == v["stale_tokens_freed_total"]
    assert sample(families, "sglang:vradix_guard_violations", "_total") == v["kv_ledger"]["violations_caught"]
    bumps = sample(families, "sglang:vradix_epoch_bump_seconds", "_count")
    assert bumps >= v["publications"] and sample(families, "sglang:vradix_epoch_bump_seconds", "_sum") > 0
    assert sample(families, "sglang:vradix_publication_pause_seconds", "_count") == v["publications"]

    (stream,) = pause_holding(s, lambda: [StreamingRequest(s.url, LONG_PROMPT, 100)])
    r = s.post("/flush_cache")
    assert r.status_code == 200
    assert f"vradix: epoch {v['epoch']}->{v['epoch'] + 1} (lock-aware flush" in r.text
    assert "stale tokens pinned by 1 crossing request(s)" in r.text and " 0 stale tokens pinned" not in r.text
    during = scrape(s)  # current at scrape: no server-info read since the flush
    assert sample(during, "sglang:vradix_crossing_requests") == 1 and sample(during, "sglang:vradix_epoch") == \
        v["epoch"] + 1 and sample(during, "sglang:vradix_lock_aware_flushes", "_total") == v["lock_aware_flushes"] + 1
    assert s.post("/continue_generation").status_code == 200
    assert stream.result()["meta_info"]["num_retractions"] == 0
    after = scrape(s)  # the crossing request's release wrote the new levels; still no server-info read
    assert sample(after, "sglang:vradix_crossing_requests") == 0
    assert sample(after, "sglang:vradix_stale_tokens_pinned") == 0
    assert sample(after, "sglang:vradix_stale_tokens_freed", "_total") == s.vradix_info()["stale_tokens_freed_total"]
    r = s.post("/flush_cache")  # idle: the stock full reset, still reported
    assert r.status_code == 200 and "flush (idle reset)" in r.text


def inspect_cli(url):
    return subprocess.run([sys.executable, "-m", "vradix.inspector", "--url", url, "--limit", "3"],
                          capture_output=True, text=True, timeout=120)


def test_cache_inspector_after_a_publication_and_refused_without_vradix(server, stock, models):
    s = server
    for _ in range(3):  # cached once, then two hits on the probe prefix
        s.generate(PROBE, 2)
    top = requests.get(s.url + "/vradix/cache?limit=1&head=4", timeout=60).json()["top_prefixes"]["items"][0]
    assert top["hits"] >= 2 and top["head_tokens"] == PROBE[:4] and top["lock_count"] == 0
    e0 = s.vradix_info()["epoch"]
    (stream,) = pause_holding(s, lambda: [StreamingRequest(s.url, LONG_PROMPT, 200)])
    upd = s.post("/update_weights_from_disk", {"model_path": models[1], "flush_cache": False,
                                               "weight_version": "v-inspect"}).json()
    assert upd["success"], upd
    # while paused, the crossing request still pins its stale KV
    view = requests.get(s.url + "/vradix/cache?limit=5", timeout=60).json()
    current, older = view["epochs"][0], view["epochs"][1]
    assert (current["epoch"], current["label"], current["current"]) == (e0 + 1, "v-inspect", True)
    assert older["epoch"] == e0 and older["pinned_tokens"] >= len(LONG_PROMPT) and len(older["pinned_by"]) == 1
    assert view["stale"]["crossing_requests"] == 1 and view["stale"]["pinned_tokens"] == older["pinned_tokens"]
    assert view["top_prefixes"]["items"][0]["stale"]  # the probe prefix is of the older epoch now
    out = inspect_cli(s.url)
    assert out.returncode == 0, out.stderr
    assert "label='v-inspect'" in out.stdout and "pinned by 1 crossing request(s)" in out.stdout, out.stdout
    assert s.post("/continue_generation").status_code == 200
    assert stream.result()["meta_info"]["completion_tokens"] == 200
    bad = requests.get(s.url + "/vradix/cache?limit=100000", timeout=60)
    assert bad.status_code == 400 and "limit" in bad.json()["error"]

    r = requests.get(stock.url + "/vradix/cache", timeout=30)
    assert r.status_code == 404
    out = inspect_cli(stock.url)
    assert out.returncode == 2 and f"vradix is not active on {stock.url}" in out.stderr, (out.returncode, out.stderr)


def test_publish_client_on_vradix_engine_in_place_and_fail_closed(server, models):
    s = server
    before = s.vradix_info()["epoch"]
    stream, (res,) = publish_holding(s.url, lambda: StreamingRequest(s.url, LONG_PROMPT, 200), models[1], "c1")
    assert res.verified and res.vradix and res.state == "running"
    assert res.plan.pause_mode == "in_place" and not res.plan.flush
    assert res.epochs_before == [before] and res.epochs_after == [before + 1] and res.label_after == "c1"
    assert res.identity_mode == "nonce" and res.weight_ids_after[0].startswith("nonce:")
    assert res.weight_ids_after != res.weight_ids_before
    assert stream.result()["meta_info"]["num_retractions"] == 0  # in_place: the in-flight request kept its KV
    prefix = s.generate(PROBE, 2)["meta_info"]["prefix_cache"]
    assert prefix["weight_version"] == "c1" and prefix["weight_id"] == res.weight_ids_after[0]

    cli = [sys.executable, "-m", "vradix.publish", "--url", s.url]
    ok = subprocess.run(cli + ["--model-path", models[0], "--version", "c2"], capture_output=True, text=True,
                        timeout=300)
    assert ok.returncode == 0, ok.stderr
    line, fleet = [json.loads(x) for x in ok.stdout.strip().splitlines()]
    assert line["verified"] and line["label_after"] == "c2" and line["epochs_after"] == [before + 2]
    assert line["weight_ids_after"] == [s.vradix_info()["weight_id"]] != res.weight_ids_after
    # the fleet line: a nonce engine cannot agree with any other, so it is listed alone and the fleet has no one id
    assert (fleet["fleet"]["weight_id"], fleet["fleet"]["mode"]) == (None, None)
    assert [(e["url"], e["mode"], e["weight_id"], e["in_fleet"]) for e in fleet["fleet"]["engines"]] == [
        (s.url, "nonce", line["weight_ids_after"][0], False)]

    bad = subprocess.run(cli + ["--model-path", "/nonexistent/weights", "--version", "c3"], capture_output=True,
                         text=True, timeout=300)
    assert bad.returncode == 2
    assert "NOT verified" in bad.stderr and "left paused(in_place)" in bad.stderr
    assert "update_weights_from_disk failed" in bad.stderr
    # it really is paused: a generation does not complete until the operator continues the engine
    with pytest.raises(requests.Timeout):
        requests.post(s.url + "/generate", json={"input_ids": PROBE, "sampling_params": {"max_new_tokens": 1}},
                      timeout=5)
    assert s.post("/continue_generation").status_code == 200
    assert s.generate(PROBE, 2)["meta_info"]["weight_version"] == "c2"  # still serving the last verified label


def test_publish_client_on_stock_engine_retracts_flushes_and_verifies_with_a_probe(server, stock, models):
    s = stock
    assert s.vradix_info() is None
    with pytest.raises(UnsafeDeployment, match="in_place pause on an engine without vradix"):
        publish(s.url, models[1], "s0", pause_mode="in_place")  # rejected before touching the engine
    stream, (res,) = publish_holding(s.url, lambda: StreamingRequest(s.url, LONG_PROMPT, 200), models[1], "s1",
                                     held=lambda meta: meta["num_retractions"] >= 1, seed=7)
    assert res.verified and not res.vradix and res.state == "running"
    assert (res.plan.pause_mode, res.plan.radix_enabled, res.plan.flush) == ("retract", True, True)
    assert res.probe_cached_before > 0  # the probe was really cached before the publication...
    assert res.probe_cached_after == 0  # ...and really gone after it
    assert res.label_after == "s1"
    final = stream.result()["meta_info"]
    assert final["num_retractions"] >= 1 and final["completion_tokens"] == 200
    # fail closed on stock too: a failed update leaves the engine paused and says so
    with pytest.raises(PublishError) as e:
        publish(s.url, "/nonexistent/weights", "s2")
    assert "left paused(retract)" in str(e.value) and e.value.results[0].state == "paused(retract)"
    assert s.post("/continue_generation").status_code == 200
    assert s.generate(PROBE, 2)["meta_info"]["weight_version"] == "s1"

    # a mixed fleet (vradix + stock): each engine gets its own plan, and the result is all-or-nothing
    fleet = [server.url, s.url]
    ok = publish(fleet, models[0], "m1", seed=3)
    assert [r.verified for r in ok] == [True, True]
    assert [r.plan.pause_mode for r in ok] == ["in_place", "retract"] and ok[1].probe_cached_after == 0
    # neither engine must agree with the other (nonce, stock): each is reported alone, not as a failure
    assert ok.fleet.weight_id is None
    assert [(e["mode"], e["weight_id"], e["in_fleet"]) for e in ok.fleet.engines] == [
        ("nonce", server.vradix_info()["weight_id"], False), (None, None, False)]

    def transfer(engine, version):  # a framework's own transfer, failing on the second engine
        if engine.url == s.url:
            raise RuntimeError("simulated transfer failure on the stock engine")
        engine.post_ok("/update_weights_from_disk", {"model_path": models[1], "weight_version": version,
                                                     "flush_cache": False})

    with pytest.raises(PublishError) as e:
        publish(fleet, transfer, "m2")
    assert [r.state for r in e.value.results] == ["paused(in_place)", "paused(retract)"]
    assert not any(r.verified for r in e.value.results)  # the updated vradix engine is not reported published
    assert "simulated transfer failure" in str(e.value) and "engines left paused" in str(e.value)
    for url in fleet:
        assert requests.post(url + "/continue_generation", json={}, timeout=60).status_code == 200


class RewarmedProbe(EngineHandle):
    """Fault injection with real servers and real HTTP: the probe prompt is sent once more right before each read, so
    the read after the flush reports a hit, exactly what an engine whose flush did not take would report."""

    def probe_cached_tokens(self, input_ids):
        self.generate_ids(input_ids)
        return super().probe_cached_tokens(input_ids)


def test_publish_client_stock_fleet_is_all_or_nothing_across_probes(stock_fleet, models):
    s1, s2 = stock_fleet
    fleet = [s1.url, s2.url]

    def second_probe_fails(url, timeout):
        return (RewarmedProbe if url == s2.url else EngineHandle)(url, timeout)

    with pytest.raises(PublishError) as e:
        publish(fleet, models[1], "f1", seed=11, engine_factory=second_probe_fails)
    r1, r2 = e.value.results
    assert r2.probe_cached_after > 0 and "probe prefix still cached" in r2.error
    # the first engine's probe passed, but it is neither reported verified nor left serving
    assert [r.state for r in (r1, r2)] == ["paused(retract)", "paused(retract)"], str(e.value)
    assert not r1.verified and not r2.verified and "engines left paused" in str(e.value)
    assert r1.checks_passed and "NOT verified (its own checks passed), left paused(retract)" in str(e.value)
    for url in fleet:  # really paused: a generation does not complete until the engine is continued
        with pytest.raises(requests.Timeout):
            requests.post(url + "/generate", json={"input_ids": PROBE, "sampling_params": {"max_new_tokens": 1}},
                          timeout=5)
    for url in fleet:
        assert requests.post(url + "/continue_generation", json={}, timeout=60).status_code == 200
    for url in fleet:  # both serve again (the updated but unverified weights: the operator chose to continue)
        r = requests.post(url + "/generate", json={"input_ids": PROBE, "sampling_params": {"max_new_tokens": 2}},
                          timeout=120)
        assert r.status_code == 200 and r.json()["meta_info"]["weight_version"] == "f1", r.text

    # on_failure="continue" keeps its meaning: the same failure, every engine resumed, none reported verified
    with pytest.raises(PublishError) as e:
        publish(fleet, models[0], "f2", seed=12, engine_factory=second_probe_fails, on_failure="continue")
    assert [r.state for r in e.value.results] == ["running", "running"]
    assert not any(r.verified for r in e.value.results)
    # and without the fault the same fleet publishes: both probes go from a hit to 0, both verified and running
    ok = publish(fleet, models[0], "f3", seed=13)
    assert [(r.verified, r.state) for r in ok] == [(True, "running"), (True, "running")]
    assert all(r.probe_cached_before > 0 and r.probe_cached_after == 0 for r in ok)


def detokenizer_of(server) -> psutil.Process:
    """The server's detokenizer process (SGLang names it `sglang::detokenizer`)."""
    (detokenizer,) = [p for p in psutil.Process(server.proc.pid).children(recursive=True)
                      if "detokenizer" in p.name()]
    return detokenizer


def test_a_client_lagging_its_scheduler_voids_the_attempt(server, models):
    """This server's outputs reach their client through its detokenizer. The first attempt stalls that process
    (SIGSTOP) right after the request's first chunk and keeps it stalled until the scheduler is idle: the request has
    finished there while its client has seen a few tokens of 1000, so by its client's view it is still running at the
    pause. `pause_holding` asks the scheduler too (`scheduler_holds`), voids the attempt and holds the next request,
    which runs across both publications, as its own record shows."""
    s, starts = server, []
    detokenizer = detokenizer_of(s)

    def start():
        lagging = not starts  # long enough to be still decoding when its first chunk arrives
        stream = StreamingRequest(s.url, LONG_PROMPT, 1000 if lagging else 120)
        starts.append(stream)
        if lagging:
            stream.wait_decoding()
            detokenizer.send_signal(signal.SIGSTOP)
            deadline = time.monotonic() + 120
            while not s.vradix_info()["pool"]["idle"]:  # the scheduler's own view: the request finished there
                assert time.monotonic() < deadline, "the request never finished in its scheduler"
            assert not stream.near_end, "the client saw the request's end before its detokenizer stalled"
        return stream

    def resume():  # the void attempt's: its request's last chunks can reach its client again
        detokenizer.send_signal(signal.SIGCONT)
        s.resume()

    try:
        crossing = across_publications(s, start, [lambda: update_and_continue(s, models[1], "lag-2"),
                                                  lambda: update_and_continue(s, models[0], "lag-3")], resume=resume)
    finally:
        detokenizer.send_signal(signal.SIGCONT)
    first = starts[0].result()["meta_info"]
    assert len(first["weight_versions"]) == 1 and first["completion_tokens"] == 1000  # over before any publication
    assert len(starts) == 2 and crossing.attempts == 1 and crossing.final["meta_info"]["completion_tokens"] == 120
    assert [x["version"] for x in crossing.final["meta_info"]["weight_versions"]][1:] == ["lag-2", "lag-3"]
