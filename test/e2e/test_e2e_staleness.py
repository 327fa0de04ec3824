"""E2E on a real SGLang CPU server started with `--vradix-max-staleness 1`: bounded staleness across two publications
(docs/bounded-staleness.md), with tiny float32 models of peaky logits on three weight versions A -> B -> C.

Two multi-turn conversations run on the one bounded server (window 1; a request that names no bound gets it):
- `P` reuses its history once: its second turn, after the first publication, reads the first turn's KV (computed
  under A) and computes the rest under B; its third turn, after the second publication, finds that history aged out
  (epoch A is older than the window) and recomputes all of it under C.
- `Q` is also asked, at every epoch, as an *exact* request (bound 0) on the prompt its bounded turn just computed on
  stale KV: the exact request never matches that KV; and its third turn reuses, at staleness 1, what the exact
  request computed under B.

Oracles, compared on greedy output ids:
- a fresh stock server on A, B and C (`fresh_stock_outputs`): every exact response, and every bounded response whose
  provenance spans name one version only;
- a bounded response whose spans name two versions is the cache state the spans describe, rebuilt on a fresh stock
  server (VRADIX_DISABLE=1): the requests that computed the reused prefix, run under the older weights, then an
  `in_place` update to the newer weights without a flush (stock SGLang reuses the old KV silently), then the same
  prompt. Equal outputs and an equal cached length show that the reused span was computed by exactly the weights
  the spans name.

The bound travels in `sampling_params.custom_params` on `/generate`, in the top-level `custom_params` on the
OpenAI endpoints, and through the `smg` router: a bound above the window is a 400 on each, a bound of 0 makes an
exact request (the server's bounded-request counter does not move) and no bound the window's.
"""
from __future__ import annotations

import pytest
import requests

from vradix.testing.harness.server import fresh_stock_outputs

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

WINDOW = 1
NEW = 6  # output tokens per turn
BOUND = "vradix_max_staleness"
H1 = [(i * 11) % 400 + 40 for i in range(48)]       # P's first prompt
G1 = [(i * 17) % 400 + 60 for i in range(40)]       # Q's first prompt (no shared prefix with P)
U2, U3 = [301, 302, 303, 304, 305, 306, 307, 308], [401, 402, 403, 404, 405, 406]
V2, V3 = [311, 312, 313, 314, 315, 316], [411, 412, 413, 414, 415, 416, 417]


@pytest.fixture(scope="module")
def weights(models, tmp_path_factory):
    """Three float32 checkpoints published in turn: A (served first), B, C."""
    from vradix.testing.models.llama import generate
    c = generate(str(tmp_path_factory.mktemp("staleness") / "C"), seed=3, dtype="float32", init_range=0.2)
    return {"A": models[0], "B": models[1], "C": c}


@pytest.fixture(scope="module")
def server(weights, server_pool):
    """The module's bounded server (window 1, with its tokenizer for the OpenAI endpoints), used by this module only."""
    with server_pool.lease(weights["A"], once=True, skip_tokenizer_init=False,
                           extra_args=["--vradix-max-staleness", str(WINDOW), "--enable-metrics"]) as s:
        yield s
        assert "Traceback" not in s.logs()


def ask(s, ids, bound=None):
    """Greedy generation of NEW tokens; `bound`: the request's staleness bound (None: the server window)."""
    sp = {"temperature": 0, "max_new_tokens": NEW, "ignore_eos": True}
    if bound is not None:
        sp["custom_params"] = {BOUND: bound}
    r = requests.post(s.url + "/generate", json={"input_ids": list(ids), "sampling_params": sp}, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def spans_of(meta):
    """The response's provenance as (version, epoch, length) per span."""
    return [(x["version"], x["epoch"], x["end"] - x["start"]) for x in meta["kv_weight_versions"]]


def publish(s, path, version):
    s.update_weights(path, version)  # an in_place publication on an idle engine: update, no flush


def staleness_block(s):
    return s.vradix_info()["bounded_staleness"]


@pytest.fixture(scope="module")
def run(server, weights):
    """The two conversations across A -> B -> C, every response kept by name (prompts are built from the outputs)."""
    s = server
    e0 = s.vradix_info()["epoch"]
    out = {"e0": e0, "weight_ids": {}}
    out["weight_ids"][e0] = s.vradix_info()["weight_id"]
    out["P1"], out["Q1"] = ask(s, H1), ask(s, G1)
    publish(s, weights["B"], "vB")
    out["weight_ids"][e0 + 1] = s.vradix_info()["weight_id"]
    h2 = H1 + out["P1"]["output_ids"] + U2
    g2 = G1 + out["Q1"]["output_ids"] + V2
    out["P2"], out["Q2"] = ask(s, h2), ask(s, g2)
    out["XQ2"] = ask(s, g2, bound=0)  # exact, on the prompt Q2 just computed on stale KV
    publish(s, weights["C"], "vC")
    out["weight_ids"][e0 + 2] = s.vradix_info()["weight_id"]
    out["H3"] = h2 + out["P2"]["output_ids"] + U3
    out["G3"] = g2 + out["Q2"]["output_ids"] + V3
    out["P3"], out["Q3"] = ask(s, out["H3"]), ask(s, out["G3"])
    out["XP3"] = ask(s, out["H3"], bound=0)
    out["h2"], out["g2"] = h2, g2
    return out


@pytest.fixture(scope="module")
def fresh(run, weights, server_pool):
    """Greedy outputs of a fresh stock server on each version for every prompt the exact oracle covers."""
    prompts = {"A": {"P1": H1, "Q1": G1}, "B": {"XQ2": run["g2"]}, "C": {"P3": run["H3"], "XP3": run["H3"]}}
    order = iter(weights)  # fresh_stock_outputs computes on the versions in this order
    return fresh_stock_outputs(weights, lambda s: {k: s.generate(p, NEW)["output_ids"]
                                                   for k, p in prompts[next(order)].items()}, pool=server_pool)


def stale_replay(server_pool, weights, old, new, computed, prompt):
    """What stock SGLang answers for `prompt` when its cache holds exactly the KV of `computed` (prompts run
    greedily under `old`) and it then updates to `new` in place, without a flush: (output ids, cached tokens)."""
    with server_pool.lease(weights["A"], vradix=False) as s:
        if old != "A":
            s.reset(weights[old], old)
        for p in computed:
            s.generate(p, NEW)
        s.update_weights(weights[new], new)
        meta = s.generate(prompt, NEW)
        return meta["output_ids"], meta["meta_info"]["cached_tokens"]


def test_first_turns_run_exactly_on_the_only_epoch(run, fresh):
    e0 = run["e0"]
    for name, prompt in (("P1", H1), ("Q1", G1)):
        meta = run[name]["meta_info"]
        assert run[name]["output_ids"] == fresh["A"][name]
        assert meta["vradix_staleness"] == {"max_staleness": WINDOW, "admitted_epoch": e0, "namespace_epoch": e0,
                                            "staleness": 0, "stale_tokens": 0}
        assert spans_of(meta) == [("default", e0, len(prompt) + NEW)]
        assert meta["kv_weight_versions"][0]["weight_id"] == run["weight_ids"][e0]


def test_second_turn_reuses_the_history_once_and_reports_it(run, server_pool, weights):
    e0 = run["e0"]
    for name, first, prompt in (("P2", H1, run["h2"]), ("Q2", G1, run["g2"])):
        meta = run[name]["meta_info"]
        reused = len(first) + NEW - 1  # the first turn's prompt and output (its last token was never a KV row)
        assert meta["cached_tokens"] == reused
        assert meta["vradix_staleness"] == {"max_staleness": WINDOW, "admitted_epoch": e0 + 1,
                                            "namespace_epoch": e0, "staleness": 1, "stale_tokens": reused}
        assert spans_of(meta) == [("default", e0, reused), ("vB", e0 + 1, len(prompt) + NEW - reused)]
        assert [x["weight_id"] for x in meta["kv_weight_versions"]] == [run["weight_ids"][e0],
                                                                         run["weight_ids"][e0 + 1]]
        # upstream's prefill spans name the stale prefix's weights; miles' forwards all ran on B
        assert meta["prefill_weight_versions"] == [{"version": "default", "start": 0, "end": reused},
                                                   {"version": "vB", "start": reused, "end": len(prompt)}]
        # upstream's assertion for a reused stale prefix: the stale span ends exactly at `cached_tokens`
        assert meta["prefill_weight_versions"][0]["end"] == meta["cached_tokens"] and \
            meta["prefill_weight_versions"][-1]["end"] == meta["prompt_tokens"]
        assert {meta[f"{k}_weight_version"] for k in ("first_prefill", "min_forward", "max_forward",
                                                      "last_forward")} == {"vB"}
        # the spans' oracle: stock SGLang holding exactly the first turn's KV under A, updated to B without a flush
        out, cached = stale_replay(server_pool, weights, "A", "B", [first], prompt)
        assert (run[name]["output_ids"], meta["cached_tokens"]) == (out, cached)


def test_an_exact_request_never_matches_kv_computed_on_stale_kv(run, fresh):
    meta = run["XQ2"]["meta_info"]
    assert meta["cached_tokens"] == 0  # Q2's KV (on top of A's) sits in A's namespace, out of an exact request's reach
    assert run["XQ2"]["output_ids"] == fresh["B"]["XQ2"]
    assert "vradix_staleness" not in meta and "kv_weight_versions" not in meta  # exact responses keep today's fields


def test_third_turn_recomputes_a_history_that_aged_out(run, fresh):
    e0, meta = run["e0"], run["P3"]["meta_info"]
    assert meta["cached_tokens"] == 0  # everything P reused or computed hangs off A, which the window left
    assert meta["vradix_staleness"] == {"max_staleness": WINDOW, "admitted_epoch": e0 + 2, "namespace_epoch": e0 + 2,
                                        "staleness": 0, "stale_tokens": 0}
    assert spans_of(meta) == [("vC", e0 + 2, len(run["H3"]) + NEW)]
    assert run["P3"]["output_ids"] == fresh["C"]["P3"]
    # an exact request then shares what the bounded one computed: it was all computed under the current weights
    assert run["XP3"]["meta_info"]["cached_tokens"] > 0
    assert run["XP3"]["output_ids"] == fresh["C"]["XP3"]


def test_third_turn_reuses_in_window_kv_an_exact_request_computed(run, server_pool, weights):
    e0, meta = run["e0"], run["Q3"]["meta_info"]
    reused = meta["cached_tokens"]
    assert reused >= len(run["g2"])  # at least XQ2's prompt, computed under B
    assert meta["vradix_staleness"] == {"max_staleness": WINDOW, "admitted_epoch": e0 + 2,
                                        "namespace_epoch": e0 + 1, "staleness": 1, "stale_tokens": reused}
    assert spans_of(meta) == [("vB", e0 + 1, reused), ("vC", e0 + 2, len(run["G3"]) + NEW - reused)]
    out, cached = stale_replay(server_pool, weights, "B", "C", [run["g2"]], run["G3"])
    assert (run["Q3"]["output_ids"], reused) == (out, cached)


def test_the_trainer_api_reads_stale_and_fresh_tokens_of_each_turn(run):
    """`vradix.trainer` on the bounded server's responses: a turn that reused one-publication-old KV has every token
    stale by one publication (oldest KV read: the older label; sampled by the current one), an exact or recomputed
    turn every token fresh; the mask drops the stale tokens at bound 0 and keeps them at bound 1."""
    from vradix.trainer import FRESH, STALE, TokenVersions, mask

    for name, older, current in (("P2", "default", "vB"), ("Q2", "default", "vB"), ("Q3", "vB", "vC")):
        tv = TokenVersions.from_response(run[name])
        assert (tv.kind, tv.staleness) == ((STALE,) * NEW, (1,) * NEW), name
        assert (tv.kv_oldest, tv.kv_newest, tv.sampler) == ((older,) * NEW, (current,) * NEW, (current,) * NEW)
        assert mask(tv) == [0] * NEW and mask(tv, trainer_version=current, max_staleness=1) == [1] * NEW
        assert tv.distance(older, current) == 1
    for name, current in (("P1", "default"), ("XQ2", "vB"), ("P3", "vC"), ("XP3", "vC")):
        tv = TokenVersions.from_response(run[name])
        assert tv.kind == (FRESH,) * NEW and tv.sampler == (current,) * NEW and mask(tv) == [1] * NEW, name


def test_the_server_counts_stale_tokens_by_staleness(run, server):
    block = staleness_block(server)
    reused = [run[n]["meta_info"]["vradix_staleness"]["stale_tokens"] for n in ("P2", "Q2", "Q3")]
    assert block["window"] == WINDOW and block["bounded_requests"] >= 6
    assert block["stale_tokens_reused_by_staleness"] == {"1": sum(reused)}
    assert block["stale_tokens_reused_total"] == sum(reused)
    metrics = requests.get(server.url + "/metrics", timeout=30).text  # counters: `_total`, current at every release
    line = next(l for l in metrics.splitlines() if l.startswith("sglang:vradix_stale_tokens_reused_total{"))
    assert 'staleness="1"' in line and float(line.rsplit(" ", 1)[1]) == sum(reused)
    line = next(l for l in metrics.splitlines() if l.startswith("sglang:vradix_bounded_requests_total{"))
    assert float(line.rsplit(" ", 1)[1]) == block["bounded_requests"]


def bounded_requests(s) -> int:
    return staleness_block(s)["bounded_requests"]


def served_model(url) -> str:
    """The model name `url` lists (smg routes a request by the body's `model`, named as it registered the worker)."""
    return requests.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]


def check_bound_travels(s, url, send):
    """`send(url, model, bound)` (None: no bound) reaches the scheduler: above the window a 400, 0 exact, none
    bounded."""
    model = served_model(url)
    r = send(url, model, WINDOW + 1)
    assert r.status_code == 400 and "exceeds this server's window" in r.text, (r.status_code, r.text[:500])
    before = bounded_requests(s)
    assert send(url, model, 0).status_code == 200
    assert bounded_requests(s) == before  # bound 0: the exact path
    assert send(url, model, None).status_code == 200
    assert bounded_requests(s) == before + 1  # no bound: the server window


def via_generate(url, model, bound):
    sp = {"temperature": 0, "max_new_tokens": 2}
    if bound is not None:
        sp["custom_params"] = {BOUND: bound}
    body = {"model": model, "input_ids": [5, 6, 7, 8], "sampling_params": sp}
    return requests.post(url + "/generate", json=body, timeout=120)


def via_completions(url, model, bound):
    body = {"model": model, "prompt": "abc", "max_tokens": 2, "temperature": 0}
    if bound is not None:
        body["custom_params"] = {BOUND: bound}
    return requests.post(url + "/v1/completions", json=body, timeout=120)


def via_chat(url, model, bound):
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}
    if bound is not None:
        body["custom_params"] = {BOUND: bound}
    return requests.post(url + "/v1/chat/completions", json=body, timeout=120)


@pytest.mark.parametrize("send", [via_generate, via_completions, via_chat])
def test_the_bound_travels_through_generate_and_the_openai_endpoints(run, server, send):
    check_bound_travels(server, server.url, send)


def test_the_bound_travels_through_the_smg_router(run, server):
    """smg (`--enable-rl`) routes by the body's `model` and forwards `custom_params` on `/generate` and the OpenAI
    endpoints untouched; the scheduler's 400 comes back through it."""
    pytest.importorskip("smg")
    from vradix.testing.harness.gateway import Gateway
    with Gateway([server.url]) as gw:
        for send in (via_generate, via_completions, via_chat):
            check_bound_travels(server, gw.url, send)


def test_an_update_that_asks_for_a_flush_ages_the_window_out(run, server, weights):
    """`flush_cache=True` on an update: bounded requests reuse nothing cached before it (a flush is a flush), and
    the exact output is a fresh server's. Last in the module: it leaves the server on a new epoch."""
    server.update_weights(weights["C"], "vC-flushed", flush=True)
    again = ask(server, run["H3"])  # P3 and XP3 cached this prompt one epoch ago: inside the window
    assert again["meta_info"]["cached_tokens"] == 0
    assert again["meta_info"]["vradix_staleness"]["staleness"] == 0
    assert again["output_ids"] == run["XP3"]["output_ids"]
