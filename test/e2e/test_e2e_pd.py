"""E2E on a real prefill/decode pair (CPU engine, real KV transfer over `mooncake_tcp`, the real P/D router in front;
`vradix.testing.harness.pd`). Tiny float32 models A and B; the oracle is a fresh non-P/D server on each.

- stock SGLang (VRADIX_DISABLE=1 on both roles) shows the P/D weight-skew bug: decode on B answers a request labelled
  B with KV prefill computed on A, caches it, and keeps reusing it after prefill is on B too;
- stock SGLang's decode scheduler crashes on a request without `bootstrap_host`; vradix refuses it with HTTP 400
  naming the missing fields, and the pair keeps serving;
- a decode role with L3 storage and a prefetch policy other than `wait_complete`, or with the `nonce` identity
  (which prefill can never share), does not start; started with no identity flag, both roles prove their identity
  from their weights (`auto`);
- vradix on both roles (the weight-identity handshake, `vradix.pd.handshake`): with the roles on different weights,
  decode updated first or prefill updated first, a request fails with HTTP 503 naming both identities and nothing of
  it enters decode's tree; once both roles are updated the pair answers what a fresh server on the new weights does.
- a publication on decode revokes a promise prefill has not fulfilled (prefill paused, the request waiting in decode's
  transfer queue): 503 naming the revoked promise and both identities, the request released, the retry served on B.
- mixed layouts, no identity flag: the vradix pair runs prefill at TP=1 and decode at TP=2, and a second pair the
  reverse (TP CPU aid); both refuse skew in both orders and converge, and the publish client gives the reverse pair
  one fleet `weight_id` across the layouts and fails a publication that leaves the roles on different weights.
The pair needs packages beyond the venv (`pd.missing_requirements()`); without them these tests skip and say which.
"""
import concurrent.futures as cf
import dataclasses
import time

import pytest
import requests

from vradix.client import PublishError, publish
from vradix.pd import layout
from vradix.testing.harness import pd
from vradix.testing.harness.pool import run_held_servers_for, stopped_while_unused
from vradix.testing.harness.reliability import wait_until
from vradix.testing.harness.scenario import StreamingRequest, crossed_update, pause_holding
from vradix.testing.harness.server import CpuServer, ServerDied

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

MISSING = pd.missing_requirements()
needs_pd = pytest.mark.skipif(bool(MISSING), reason="P/D kit needs: " + ", ".join(MISSING))

PROMPT = pd.PROMPT
SAMPLING = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}


@pytest.fixture(scope="module")
def oracle(pd_oracle):
    """Greedy outputs of a fresh non-P/D server on A and on B."""
    return pd_oracle


def decode_direct(pair, **fields):
    """POST /generate straight to the decode server (no router), with only the given bootstrap fields."""
    return pair.decode.post("/generate", {"input_ids": PROMPT[:64], "sampling_params": SAMPLING, **fields},
                            timeout=60)


@pytest.fixture(scope="module")
def stock_pair(models, request):
    """Stock SGLang on both roles (VRADIX_DISABLE=1), decode radix cache on, on weights A; stopped (SIGSTOP) while
    other tests run."""
    with pd.PdPair(models[0], vradix=False) as p, stopped_while_unused(request, p):
        yield p


@pytest.fixture(scope="module")
def vradix_pair(models, request):
    """vradix on both roles, started with no identity flag, prefill at TP=1 and decode at TP=2 (mixed layouts),
    decode radix cache on, on weights A; stopped (SIGSTOP) while other tests run."""
    with pd.PdPair(models[0], vradix=True, decode_tp=2) as p, stopped_while_unused(request, p):
        yield p


@pytest.fixture(scope="module")
def wide_prefill_pair(models, request):
    """The reverse layout: prefill at TP=2, decode at TP=1, otherwise as `vradix_pair`; stopped while other tests
    run."""
    # a module-scoped fixture starts before the per-test switch: the last test's pair would poll both cores meanwhile
    run_held_servers_for(())
    with pd.PdPair(models[0], vradix=True, prefill_tp=2) as p, stopped_while_unused(request, p):
        yield p


@needs_pd
def test_stock_decode_serves_and_caches_prefill_kv_of_other_weights(stock_pair, models, oracle):
    pair = stock_pair
    assert pair.generate(PROMPT, 6)["output_ids"] == oracle["A"]  # the KV really moves: P/D == non-P/D
    # decode first; prefill still on A. Stock flushes only an idle engine, and decode may still be releasing the request
    # the router has answered, so `reset` retries until the flush succeeds.
    pair.decode.reset(models[1], "B")
    skewed = pair.generate(PROMPT, 6)
    assert skewed["meta_info"]["weight_version"] == "B"
    assert skewed["output_ids"] != oracle["B"]  # labelled B, computed from A's KV
    pair.prefill.reset(models[1], "B")  # both on B now
    after = pair.generate(PROMPT, 6)
    assert after["meta_info"]["cached_tokens"] > 0  # decode's own tree: the KV it received from prefill-A
    assert after["output_ids"] != oracle["B"], (after, oracle)


@needs_pd
def test_stock_decode_scheduler_crashes_on_a_request_without_bootstrap_host(stock_pair):
    """The last test of the stock pair: it kills the stock decode server, and then stops the pair, so only one pair
    runs at a time."""
    pair = stock_pair
    try:
        r = decode_direct(pair, bootstrap_room=7)
        assert r.status_code != 200
    except requests.RequestException:
        pass  # the connection dies with the server
    deadline = time.monotonic() + 60
    while pair.decode.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    crashed, logs = pair.decode.proc.poll() is not None, pair.decode.logs()
    pair.stop()
    assert crashed, "stock decode server survived a request without bootstrap_host"
    assert "'NoneType' object has no attribute" in logs


@needs_pd
def test_decode_refuses_a_request_without_bootstrap_fields_and_keeps_serving(vradix_pair, oracle):
    pair = vradix_pair
    r = decode_direct(pair, bootstrap_room=7)  # the request that crashes stock decode
    assert r.status_code == 400, r.text
    assert "bootstrap_host is missing" in r.text and "bootstrap_port is missing" in r.text
    r = decode_direct(pair)
    assert r.status_code == 400 and "bootstrap_room is missing" in r.text, r.text
    r = decode_direct(pair, bootstrap_host="127.0.0.1", bootstrap_port=0, bootstrap_room=7)
    assert r.status_code == 400 and "bootstrap_port=0 is not a port" in r.text, r.text
    # nothing reached the scheduler (stock's own late check would have logged this), and the pair still serves
    assert "without bootstrap room id" not in pair.decode.logs()
    assert pair.decode.proc.poll() is None
    assert pair.generate(PROMPT, 6)["output_ids"] == oracle["A"]


@needs_pd
def test_each_role_stamps_its_namespaces_with_its_role_local_scope(vradix_pair):
    """Role-local L3: every namespace a role stamps starts with its role and KV layout (`vradix.pd.layout`), so its
    storage keys are its own; the weight_id, which the handshake compares, is the same on both roles."""
    pair = vradix_pair
    prefill, decode = pair.prefill.vradix_info(), pair.decode.vradix_info()
    p_layout, d_layout = layout.parse_scope(prefill["l3_scope"]), layout.parse_scope(decode["l3_scope"])
    assert (p_layout.role, p_layout.tp_size, p_layout.dcp_size, p_layout.page_size) == ("prefill", 1, 1, 1)
    assert d_layout == dataclasses.replace(p_layout, role="decode", tp_size=2)  # decode's own KV layout and role
    # started with no identity flag on two layouts: both prove one identity from the same checkpoint
    assert prefill["weight_id"] == decode["weight_id"] and prefill["weight_id"].startswith("fp:")
    assert f"role-local scope {decode['l3_scope']}" in pair.decode.logs()


def weight_id(server) -> str:
    return server.vradix_info()["weight_id"]


def current_epoch_tokens(server) -> int:
    """Tokens the server's radix cache holds in its current epoch's namespace (the cache inspector)."""
    snap = server.get("/vradix/cache").json()
    return next(e["cached_tokens"] for e in snap["epochs"] if e["current"])


def generate_raw(pair) -> requests.Response:
    return pair.post("/generate", {"input_ids": PROMPT, "sampling_params": SAMPLING}, timeout=120)


def assert_refused_naming(r: requests.Response, prefill_id: str, decode_id: str) -> None:
    """The handshake's refusal: retryable (503), naming both identities (prefill's shown by its first 32 bytes)."""
    assert r.status_code == 503, (r.status_code, r.text)
    assert "weight-identity mismatch" in r.text and prefill_id[:32] in r.text and decode_id in r.text, r.text


def skew_then_converge(pair, models, oracle, first, second):
    """Pair on A (its answer is A's), `first` updated to B: a request fails with the handshake's error, and decode's
    current tree gains nothing from it; `second` updated to B too: the pair answers B's output, its provenance names B's identity for
    prefill's and decode's spans, and decode's new-epoch tree holds only KV computed under B (a repeat is a decode
    hit with B's output)."""
    assert pair.generate(PROMPT, 6)["output_ids"] == oracle["A"]
    first.update_weights(models[1], "B")
    assert weight_id(pair.prefill) != weight_id(pair.decode)
    held = current_epoch_tokens(pair.decode)  # 0 after a decode publication; A's 606 tokens while decode is on A
    r = generate_raw(pair)
    assert_refused_naming(r, weight_id(pair.prefill), weight_id(pair.decode))
    assert current_epoch_tokens(pair.decode) == held  # nothing of the refused request entered decode's tree
    second.update_weights(models[1], "B")
    assert weight_id(pair.prefill) == weight_id(pair.decode)
    served = pair.generate(PROMPT, 6)
    assert served["output_ids"] == oracle["B"]
    assert roles_and_ids(served) == [("prefill", weight_id(pair.prefill)), ("decode", weight_id(pair.decode))]
    assert current_epoch_tokens(pair.decode) > 0
    again = pair.generate(PROMPT, 6)
    assert again["output_ids"] == oracle["B"], again
    # a decode hit now: the prefix decode promised (here the whole prompt, so prefill sent no KV span) is its own
    # B-epoch KV
    spans = again["meta_info"]["pd_spans"]
    assert spans[0]["role"] == "decode_cache" and spans[0]["end"] > 0 and spans[-1]["role"] == "decode", spans
    assert {w for _, w in roles_and_ids(again)} == {weight_id(pair.decode)}


def roles_and_ids(response) -> list:
    """The response's P/D provenance: (role, weight_id) of each span of its KV."""
    return roles_and_ids_of(response["meta_info"])


def roles_and_ids_of(meta) -> list:
    return [(s["role"], s["weight_id"]) for s in meta["pd_spans"]]


@needs_pd
@pytest.mark.timeout(600)
def test_skew_with_decode_updated_first_fails_the_request_and_caches_nothing(vradix_pair, models, oracle):
    skew_then_converge(vradix_pair, models, oracle, vradix_pair.decode, vradix_pair.prefill)


@needs_pd
@pytest.mark.timeout(600)
def test_skew_with_prefill_updated_first_fails_the_request_and_caches_nothing(vradix_pair, models, oracle):
    pair = vradix_pair
    for server in (pair.prefill, pair.decode):  # back to A on both (the previous test left them on B)
        server.update_weights(models[0], "A")
    skew_then_converge(pair, models, oracle, pair.prefill, pair.decode)


@needs_pd
@pytest.mark.long  # the reverse layout's skew: `vradix_pair` (also mixed layouts) refuses skew in both orders in CI
@pytest.mark.timeout(900)
def test_a_wide_prefill_pair_refuses_skew_in_both_orders_and_then_serves_the_new_weights(wide_prefill_pair, models,
                                                                                        oracle):
    """The reverse layout (prefill TP=2, decode TP=1), no identity flag: equal weights give both roles one identity
    across the layouts; with decode updated first, then with prefill updated first, a request fails with the
    handshake's 503 naming both identities; once both roles are on B, every output is a fresh server's on B."""
    pair = wide_prefill_pair
    tp = [layout.parse_scope(s.vradix_info()["l3_scope"]).tp_size for s in (pair.prefill, pair.decode)]
    assert tp == [2, 1] and weight_id(pair.prefill) == weight_id(pair.decode)
    skew_then_converge(pair, models, oracle, pair.decode, pair.prefill)
    for server in (pair.prefill, pair.decode):
        server.update_weights(models[0], "A")
    skew_then_converge(pair, models, oracle, pair.prefill, pair.decode)


@needs_pd
@pytest.mark.timeout(600)
def test_the_publish_client_gives_a_mixed_layout_pair_one_weight_id_and_fails_a_skewed_one(vradix_pair, models,
                                                                                          oracle):
    """The publish client on both roles of the mixed-layout pair (prefill TP=1, decode TP=2; planned `in_place`,
    radix kept: vradix on each role). A transfer that loads A on prefill and B on decode is one publication whose
    roles disagree: PublishError naming both identities, both roles left paused; resumed, the skewed pair refuses the
    request (503). Publishing A to both: one fleet weight_id across TP=1 and TP=2, and the pair answers a fresh
    server's output on A."""
    pair = vradix_pair
    urls = [pair.prefill.url, pair.decode.url]

    def prefill_to_a(engine, version):  # one publication, other weights on decode
        model = models[0] if engine.url == pair.prefill.url else models[1]
        engine.post_ok("/update_weights_from_disk", {"model_path": model, "weight_version": version,
                                                     "flush_cache": False})

    with pytest.raises(PublishError) as e:
        publish(urls, prefill_to_a, "pd-split")
    a_id, b_id = weight_id(pair.prefill), weight_id(pair.decode)
    message = str(e.value)
    assert a_id != b_id and repr(a_id) in message and repr(b_id) in message, message
    assert "engines that must serve one weight identity (fingerprint mode" in message, message
    assert [(r.plan.pause_mode, r.plan.radix_enabled, r.state) for r in e.value.results] == [
        ("in_place", True, "paused(in_place)")] * 2, message
    pair.resume()
    assert_refused_naming(generate_raw(pair), a_id, b_id)
    ok = publish(urls, models[0], "pd-a")
    assert [len(r.weight_ids_after) for r in ok] == [1, 2]  # every TP rank of decode checked (`tp_ranks`)
    assert ok.fleet.weight_id == a_id == weight_id(pair.decode) and ok.fleet.mode == "fingerprint"
    assert [(e["url"], e["in_fleet"]) for e in ok.fleet.engines] == [(u, True) for u in urls]
    assert pair.generate(PROMPT, 6)["output_ids"] == oracle["A"]


#: prompts of the requests decoding when a publication pauses the pair (300 tokens each, none a prefix of PROMPT)
DECODING = [[(i * 13 + k * 53) % 480 + 20 for i in range(300)] for k in range(3)]
DECODE_TOKENS = 400


def check_served_whole_or_refused(r: requests.Response, oracle, ids: dict) -> None:
    """A request sent around a publication: refused by the handshake or by the revocation of its promise (503), or
    served with its prompt's KV under one identity; when nothing of it crossed, its output is that identity's
    fresh-server output."""
    if r.status_code == 503:
        assert "weight-identity mismatch" in r.text or "promise revoked" in r.text, r.text
        return
    assert r.status_code == 200, (r.status_code, r.text)
    body = r.json()
    meta = body["meta_info"]
    prompt_ids = {s["weight_id"] for s in meta["pd_spans"] if s["role"] != "decode"}
    assert len(prompt_ids) == 1 and prompt_ids <= set(ids), meta["pd_spans"]
    if "kv_weight_versions" not in meta:
        assert body["output_ids"] == oracle[ids[prompt_ids.pop()]], body


def publication_with_requests_decoding(pair, models):
    """One attempt: both roles on A, DECODING decoding on decode, requests sent around an in-place publication of B.
    Returns (a_id, b_id, the around responses, the decoding requests' final meta_info), or None when a decoding
    request finished before the publication (SGLang's `weight_versions` of it show one version): the attempt is void,
    since what the test proves needs every one of them crossing it."""
    for server in (pair.prefill, pair.decode):
        server.update_weights(models[0], "A")
    a_id = weight_id(pair.decode)
    with cf.ThreadPoolExecutor(4) as pool:
        around = []

        def send_around_and_pause():
            around.extend(pool.submit(generate_raw, pair) for _ in range(4))
            pair.pause("in_place")

        # the first request decodes while the others still prefill, and can finish first: checked at the pause
        decoding = pause_holding(pair.decode, lambda: [StreamingRequest(pair.url, p, DECODE_TOKENS) for p in DECODING],
                                 pause=send_around_and_pause, resume=pair.resume, what="the decoding requests")
        pair.update_and_resume(models[1], "B")
        b_id = weight_id(pair.decode)
        responses = [f.result() for f in around]
    metas = [s.result()["meta_info"] for s in decoding]
    if not all(crossed_update(meta) for meta in metas):
        return None
    return a_id, b_id, responses, metas


@needs_pd
@pytest.mark.timeout(600)
def test_in_place_publication_on_both_roles_with_requests_in_flight(vradix_pair, models, oracle):
    """Requests decoding at the pause cross it on decode: 0 retractions, every token generated, and `pd_spans` splits
    decode's positions at the publication (A's identity, then B's). Requests sent around it are served whole under
    one identity or refused by the handshake, never a silent mix. Requests after it answer what a fresh server on B
    does, a repeat from decode's cache too, and nothing stale stays pinned on either role."""
    pair = vradix_pair
    deadline = time.monotonic() + 300
    while (attempt := publication_with_requests_decoding(pair, models)) is None:
        assert time.monotonic() < deadline, "a decoding request finished before every publication"
    a_id, b_id, around, metas = attempt
    assert b_id != a_id and weight_id(pair.prefill) == b_id
    for r in around:
        check_served_whole_or_refused(r, oracle, {a_id: "A", b_id: "B"})
    for meta in metas:
        assert meta["completion_tokens"] == DECODE_TOKENS and meta["num_retractions"] == 0, meta
        assert [w for role, w in roles_and_ids_of(meta) if role == "decode"] == [a_id, b_id], meta["pd_spans"]
        assert [v["weight_id"] for v in meta["kv_weight_versions"]] == [a_id, b_id], meta["kv_weight_versions"]
    served = pair.generate(PROMPT, 6)
    assert served["output_ids"] == oracle["B"] and {w for _, w in roles_and_ids(served)} == {b_id}
    again = pair.generate(PROMPT, 6)
    assert again["output_ids"] == oracle["B"] and again["meta_info"]["cached_tokens"] > 0, again
    for server in (pair.prefill, pair.decode):  # a response may reach the client just before its KV is released
        wait_until(lambda: server.vradix_info()["crossing_requests"] == 0, 30, "crossing requests released")
        assert server.vradix_info()["stale_tokens_pinned"] == 0


def transfer_queue_len(server) -> int:
    """Requests in the decode role's transfer queue (SGLang's `/v1/loads`, disaggregation section)."""
    loads = server.get("/v1/loads?include=disagg").json()["loads"]
    return sum(load["disaggregation"]["decode_transfer_queue_reqs"] for load in loads)


def revocation_attempt(pair, models, prompt):
    """Both roles on A, `prompt` cached on decode, then the two halves of one request with prefill paused, and a
    publication of B on decode while the request waits in its transfer queue. Returns (A's id, B's id, decode's
    response) when decode answered 503 naming a revoked promise; None (the attempt is void) when the handshake
    refused the KV instead. Anything else fails."""
    for server in (pair.prefill, pair.decode):
        server.update_weights(models[0], "A")
    a_id = weight_id(pair.decode)
    pair.generate(prompt, 2)  # decode's cache now holds the prompt under A
    body = {"input_ids": prompt, "sampling_params": SAMPLING, **pair.bootstrap()}
    pool = cf.ThreadPoolExecutor(2)
    pair.prefill.pause("in_place")
    try:  # the two halves of one P/D request, as the router sends them
        to_prefill = pool.submit(pair.prefill.post, "/generate", body, 120)
        to_decode = pool.submit(pair.decode.post, "/generate", body, 120)
        wait_until(lambda: transfer_queue_len(pair.decode) == 1, 60, "the promise sent, the request waiting for KV")
        pair.decode.pause("in_place")
        pair.decode.update_weights(models[1], "B")
        pair.decode.resume()
    finally:
        pair.prefill.resume()
    b_id = weight_id(pair.decode)
    r = to_decode.result()
    to_prefill.result()  # prefill answers its half too (it was told of the abort): no timeout
    pool.shutdown()
    assert r.status_code == 503, (r.status_code, r.text)
    if "promise revoked" not in r.text:
        assert "weight-identity mismatch" in r.text, r.text
        return None
    return a_id, b_id, r


@needs_pd
@pytest.mark.timeout(300)
def test_a_decode_publication_revokes_a_promise_prefill_has_not_fulfilled(vradix_pair, models):
    """Prefill is paused, so a request whose prompt decode's cache holds waits in decode's transfer queue with its
    promise sent and unfulfilled. A publication on decode revokes it: decode answers 503 naming the revoked promise
    and both identities, and releases it (no crossing request, no stale token pinned). Prefill, told by the abort,
    resumes without sending. Before the revocation, the request crossed and was served (200) from A's KV on decode
    after its publication to B."""
    pair = vradix_pair
    prompt = PROMPT[100:228]
    deadline = time.monotonic() + 200
    # an attempt whose promise was no longer pending at the publication (decode matched nothing of it, or prefill's
    # KV was already on its way) ends in the handshake's refusal instead, which proves nothing here: it is retried
    while (attempt := revocation_attempt(pair, models, prompt)) is None:
        assert time.monotonic() < deadline, "no attempt had a pending promise at the publication"
    a_id, b_id, r = attempt
    assert "promise revoked" in r.text and repr(a_id) in r.text and repr(b_id) in r.text, r.text
    pair.prefill.update_weights(models[1], "B")
    wait_until(lambda: pair.decode.vradix_info()["crossing_requests"] == 0, 60, "the revoked request released")
    assert pair.decode.vradix_info()["stale_tokens_pinned"] == 0 and transfer_queue_len(pair.decode) == 0
    served = pair.generate(prompt, 2)  # the retry: matched, promised and served under B
    assert {w for _, w in roles_and_ids(served)} == {b_id}, served["meta_info"]["pd_spans"]


@pytest.mark.timeout(120)
def test_both_roles_run_the_backstop_with_the_ledger_on_and_catch_nothing(vradix_pair):
    """The backstop runs on every role. After this module's traffic (repeats that hit each role's cache,
    publications, skews, a revoked promise), both roles keep the KV page ledger on with the strict guard, each has
    checked batches (prefill: extend batches reading its cache; decode: the prebuilt batches transferred requests
    enter through), and neither caught a violation: no false positive on a real pair. Before: the ledger was off on
    both roles."""
    pair = vradix_pair
    for _ in range(2):  # the second at the latest hits prefill's cache
        r = generate_raw(pair)
        assert r.status_code == 200, r.text
    for role, server in (("prefill", pair.prefill), ("decode", pair.decode)):
        ledger = server.vradix_info()["kv_ledger"]
        seen = {k: ledger[k] for k in ("enabled", "verify_mode", "batches_verified", "violations_caught")}
        assert ledger["enabled"] and ledger["verify_mode"] == "strict", (role, seen)
        assert ledger["batches_verified"] >= 1 and ledger["violations_caught"] == 0, (role, seen)


L3_DECODE = ["--enable-hierarchical-cache", "--hicache-storage-backend", "file"]


#: decode roles that cannot keep their contract, and what the launcher says: an L3 restore policy that can end short
#: of the promise, and the nonce identity mode, which the prefill role can never share
REFUSED_DECODE_ROLES = {
    "l3-best-effort": ([*L3_DECODE,
                        "--hicache-storage-prefetch-policy", "best_effort"],
                       "requires --hicache-storage-prefetch-policy wait_complete, got 'best_effort'"),
    "nonce-identity": (["--vradix-weight-identity", "nonce"],
                       "decode-role engine needs a weight identity both P/D roles compute equally"),
}


@pytest.mark.skipif(bool(MISSING), reason="P/D kit needs: " + ", ".join(MISSING))
def test_a_decode_role_that_cannot_keep_its_contract_does_not_start(models, tmp_path):
    """The launcher refuses each before any scheduler starts (seconds, no model load); the starts run together."""
    def start(flags):
        return CpuServer(models[0], startup_timeout=600, env={"SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": str(tmp_path)},
                         extra_args=["--disaggregation-mode", "decode", *pd.TRANSFER_FLAGS,
                                     "--disaggregation-decode-enable-radix-cache", *flags])

    with cf.ThreadPoolExecutor(len(REFUSED_DECODE_ROLES)) as pool:
        starts = {case: pool.submit(start, flags) for case, (flags, _) in REFUSED_DECODE_ROLES.items()}
    for case, (_, refused) in REFUSED_DECODE_ROLES.items():
        error = starts[case].exception()
        if error is None:
            starts[case].result().stop()  # it started: stop it, then fail
        assert isinstance(error, ServerDied) and refused in str(error), (case, error)
