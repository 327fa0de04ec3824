"""E2E on a TP=2 CPU engine (`CpuServer(tp_size=2)`: `--tp-size 2`, one core per rank, the TP CPU aid): vradix with
two tensor-parallel ranks, each keeping its own epoch, identity, ledger and pools, read through the server-info
block's `tp_ranks` (SGLang answers server info from rank 0 only).

Three engines start together (start-up dominates on CPU), each stopped while a test does not use it: a TP=2 engine on
A (`tp2`, SGLang's busy-time memory checks on), a TP=2 engine on A with the namespace fault
(`VRADIX_FAULT_NO_NAMESPACE`, `faulty`: only the KV page ledger's guard sees stale KV, and with two ranks it only
detects), and a TP=1 engine on A (`tp1`); `tp2` keeps the default identity mode (`nonce`), the other two run the
`fingerprint` identity. The oracle is the pool's stock TP=1 server on A and on B.
- an in_place publication A->B with a request holding the prefix in flight: one bump on each rank, one `weight_id`
  on both, the request crosses with its KV and says so, every later output equals the fresh server on B, and the
  strict idle check holds on both ranks;
- equal weights give equal fingerprints on the TP=2 and the TP=1 engines; the default-mode ranks agree on one nonce;
- a bucketed tensor update (B->A, each bucket one payload per rank) is one bump on each rank, outputs equal A's;
- detection only: a stale prefix read is reported on both ranks, the request runs, and the ranks stay in step;
- `vradix publish` verifies every rank of the default-mode engine: one new nonce on both, outputs equal B's.
"""
import pytest

from vradix import __version__
from vradix.client import publish
from vradix.ledger.guard import DETECTED_ONLY
from vradix.testing.harness.pool import stopped_while_unused
from vradix.testing.harness.reliability import STRICT_CHECK_ENV, strict_idle_check
from vradix.testing.harness.scenario import (PREFIX, PROBE, StreamingRequest, begin_bucketed_update_holding,
                                             crossed_update, pause_holding, tensor_buckets)
from vradix.testing.harness.server import CpuServer, fresh_stock_outputs, servers

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

TP = 2
FINGERPRINT_FLAGS = ["--vradix-weight-identity", "fingerprint"]
#: prompts every later output is checked on: the probe (its prefix was cached under the old weights) and one without
PROMPTS = [PROBE, [(i * 11) % 470 + 13 for i in range(90)]]
HELD = PREFIX + [12]  # the in-flight request: it locks PREFIX's KV across the publication
#: the TP=2 engine keeps the default identity mode (`nonce` off P/D: derived from the launch, so both ranks must
#: agree on it); the other two prove equal weights give equal fingerprints on TP=2 and TP=1
ENGINES = {"tp2": dict(tp_size=TP, env=STRICT_CHECK_ENV),
           "faulty": dict(tp_size=TP, env={"VRADIX_FAULT_NO_NAMESPACE": "1"}, extra_args=FINGERPRINT_FLAGS),
           "tp1": dict(extra_args=FINGERPRINT_FLAGS)}


@pytest.fixture(scope="module")
def oracle(models, server_pool):
    """Greedy outputs (4 tokens) of `PROMPTS` on a fresh stock server on A and on B."""
    out = fresh_stock_outputs(dict(zip("AB", models)), lambda s: [s.generate(p, 4)["output_ids"] for p in PROMPTS],
                              pool=server_pool)
    assert out["A"] != out["B"]
    return out


@pytest.fixture(scope="module")
def engines(models, request):
    """{name: (server, its server-info vradix block at startup)} of `ENGINES`, started together; a server runs only
    during the tests that request its fixture (`tp2`, `faulty`, `tp1`)."""
    factories = [lambda kw=kw: CpuServer(models[0], **kw) for kw in ENGINES.values()]
    with servers(*factories) as started:
        named = dict(zip(ENGINES, started))
        startup = {name: s.vradix_info() for name, s in named.items()}
        with stopped_while_unused(request, named["tp2"], fixture="tp2"), \
                stopped_while_unused(request, named["faulty"], fixture="faulty"), \
                stopped_while_unused(request, named["tp1"], fixture="tp1"):
            yield {name: (s, startup[name]) for name, s in named.items()}
        for s in started:
            assert "Traceback" not in s.logs(), s.tail(80)


@pytest.fixture(scope="module")
def tp2(engines):
    return engines["tp2"][0]


@pytest.fixture(scope="module")
def faulty(engines):
    return engines["faulty"][0]


@pytest.fixture(scope="module")
def tp1(engines):
    return engines["tp1"][0]


def ranks(server) -> list:
    """Each TP rank's vradix block, rank order."""
    blocks = server.vradix_info()["tp_ranks"]
    assert len(blocks) == TP
    return blocks


def assert_ranks_agree(blocks: list, *keys: str) -> None:
    """Every rank's block has the same value at each of `keys`."""
    for key in keys:
        assert len({repr(b[key]) for b in blocks}) == 1, (key, [b[key] for b in blocks])


def outputs(server) -> list:
    return [server.generate(p, 4, timeout=300)["output_ids"] for p in PROMPTS]


def assert_ranks_in_step_at_idle(server) -> None:
    """The strict idle check on every rank, and the ranks hold the same cache: equal pool figures."""
    strict_idle_check(server)
    blocks = ranks(server)
    assert len({repr({k: b["pool"][k] for k in ("available", "evictable", "protected")}) for b in blocks}) == 1, \
        [b["pool"] for b in blocks]


def held_prefix_publication(server, new_model: str, version: str):
    """PROBE cached, then an in_place publication of `new_model` while `HELD` is in flight (locking PREFIX's KV):
    returns (the update's response, PROBE's response sent while the request still runs, the request)."""
    assert server.generate(PROBE, 4)["meta_info"]["cached_tokens"] in (0, len(PREFIX))
    (inflight,) = pause_holding(server, lambda: [StreamingRequest(server.url, HELD, 300)], what="the held request")
    update = server.update_weights(new_model, version)
    server.resume()
    probe = server.post("/generate", {"input_ids": PROBE, "sampling_params": {"temperature": 0, "max_new_tokens": 4,
                                                                              "ignore_eos": True}})
    assert not inflight.done, "the held request finished before the probe: the probe proves nothing"
    return update, probe, inflight


def test_both_ranks_log_vradix_and_detection_only(tp2):
    logs = tp2.logs()
    for rank in range(TP):
        assert f"TP{rank}] vradix {__version__} active" in logs
        assert f"TP{rank}] vradix verify guard: {TP} TP x 1 PP ranks" in logs
    assert all(b["kv_ledger"]["verify_mode"] == "strict" for b in ranks(tp2))


def test_equal_weights_give_equal_identities_on_tp2_and_tp1(engines):
    """The startup fingerprint on A of the TP=2 engine (`faulty`: the fault does not touch the identity), on each
    rank, equals the TP=1 engine's; the default-mode TP=2 engine's ranks agree on one nonce of their own."""
    tp1_id = engines["tp1"][1]["weight_id"]
    assert tp1_id.startswith("fp:") and engines["tp1"][1]["weight_identity"]["mode"] == "fingerprint"
    assert [b["weight_id"] for b in engines["faulty"][1]["tp_ranks"]] == [tp1_id] * TP
    nonces = {b["weight_id"] for b in engines["tp2"][1]["tp_ranks"]}
    assert len(nonces) == 1 and nonces.pop().startswith("nonce:"), engines["tp2"][1]["tp_ranks"]


def test_in_place_publication_with_a_request_in_flight_bumps_each_rank_once(tp2, models, oracle):
    before = ranks(tp2)
    assert_ranks_agree(before, "epoch", "publications", "weight_id")
    update, probe, inflight = held_prefix_publication(tp2, models[1], "B")
    e0 = before[0]["epoch"]
    assert f"epoch {e0}->{e0 + 1}" in update["message"] and "1 crossing request(s)" in update["message"], update
    after = ranks(tp2)
    assert [(b["epoch"], b["publications"], b["label"]) for b in after] == \
        [(e0 + 1, before[0]["publications"] + 1, "B")] * TP
    assert_ranks_agree(after, "weight_id")
    assert after[0]["weight_id"] != before[0]["weight_id"] and after[0]["weight_id"].startswith("nonce:")
    # the probe, sent while the held request still locks PREFIX's old KV, reused none of it
    body = probe.json()
    assert probe.status_code == 200 and body["meta_info"]["cached_tokens"] == 0, probe.text
    assert body["output_ids"] == oracle["B"][0]
    assert body["meta_info"]["prefix_cache"]["weight_id"] == after[0]["weight_id"]
    meta = inflight.result(300)["meta_info"]
    assert meta["num_retractions"] == 0 and meta["completion_tokens"] == 300  # crossed with its own KV
    assert crossed_update(meta)
    spans = meta["kv_weight_versions"]
    assert [(s["version"], s["weight_id"]) for s in spans] == [("default", before[0]["weight_id"]),
                                                                ("B", after[0]["weight_id"])], spans
    assert spans[0]["start"] == 0 and len(HELD) <= spans[1]["start"] < len(HELD) + 300, spans
    assert outputs(tp2) == oracle["B"]
    assert all(b["kv_ledger"]["violations_caught"] == before[i]["kv_ledger"]["violations_caught"]
               for i, b in enumerate(ranks(tp2)))
    assert_ranks_in_step_at_idle(tp2)


def test_a_bucketed_tensor_update_is_one_bump_on_each_rank(tp2, models, oracle):
    """B->A in three buckets (one payload per rank each) with a request in flight: no bump per bucket, one bump on
    each rank at the end, one `weight_id` on both ranks, and every later output equals the fresh server on A."""
    tp2.update_weights(models[1], "B")  # from B whatever ran before: the bucketed update's weights must differ
    _, begin, inflight = begin_bucketed_update_holding(tp2)
    assert begin.status_code == 200, begin.text
    before = ranks(tp2)
    buckets = list(tensor_buckets(models[0], 3))
    for i, (payload,) in enumerate(buckets):
        r = tp2.post("/update_weights_from_tensor", {"serialized_named_tensors": [payload] * TP,
                                                      "weight_version": f"A-{i}", "flush_cache": True})
        assert r.status_code == 200 and r.json()["success"], r.text
        assert [b["epoch"] for b in ranks(tp2)] == [before[0]["epoch"]] * TP  # no bump per bucket
    end = tp2.post("/end_weight_update", {})
    assert end.status_code == 200 and "generation resumed" in end.json()["message"], end.text
    after = ranks(tp2)
    assert [(b["epoch"], b["publications"], b["label"]) for b in after] == \
        [(before[0]["epoch"] + 1, before[0]["publications"] + 1, "A-2")] * TP
    assert_ranks_agree(after, "weight_id")
    meta = inflight.result(300)["meta_info"]
    assert meta["num_retractions"] == 0 and crossed_update(meta)
    assert outputs(tp2) == oracle["A"]
    assert_ranks_in_step_at_idle(tp2)


def test_detection_only_reports_a_stale_read_on_both_ranks_and_they_stay_in_step(faulty, models, oracle):
    """The fault drops the epoch namespace, so the tree offers the held request's stale PREFIX to the probe. Each
    rank's guard sees pages of the old epoch behind a new-epoch request and reports it; with two ranks it only
    detects (failing the request on one rank would desynchronise them), so the probe runs on the stale KV. The ranks
    then stay in step: same epoch, identity and cache on both, and after a flush every output equals B's."""
    before = ranks(faulty)
    update, probe, inflight = held_prefix_publication(faulty, models[1], "B")
    assert update["success"], update
    assert probe.status_code == 200, probe.text  # detected, not failed
    body = probe.json()
    assert body["meta_info"]["cached_tokens"] == len(PREFIX) and body["output_ids"] != oracle["B"][0]  # a stale read
    after = ranks(faulty)
    for rank, (b, a) in enumerate(zip(before, after)):
        led = a["kv_ledger"]
        assert led["violations_caught"] > b["kv_ledger"]["violations_caught"], (rank, led)
        assert "vradix KV backstop" in led["last_violation"] and led["last_violation"].endswith(DETECTED_ONLY), led
    assert "TP1] vradix verify guard: vradix KV backstop" in faulty.logs()
    assert_ranks_agree(after, "epoch", "label", "weight_id")
    assert inflight.result(300)["meta_info"]["completion_tokens"] == 300
    strict_idle_check(faulty)
    assert faulty.post("/flush_cache").status_code == 200  # the KV the stale read computed goes with it
    assert outputs(faulty) == oracle["B"]
    assert_ranks_in_step_at_idle(faulty)


def test_publish_verifies_every_rank_of_a_default_mode_engine(tp2, models, oracle):
    """`vradix publish` (the client) on the default-mode TP=2 engine: it checks every rank's epoch and that the ranks
    serve one new nonce (it fails a publication whose ranks disagree), and nothing cached before is reused after."""
    tp2.update_weights(models[0], "A")  # from A whatever ran before: the publication must change the weights
    for p in PROMPTS:  # caches the prompts under A
        tp2.generate(p, 4)
    before = ranks(tp2)
    result = publish([tp2.url], models[1], "multi-rank-b")
    assert [e.verified for e in result] == [True], [e.evidence() for e in result]
    after = ranks(tp2)
    assert_ranks_agree(after, "weight_id", "epoch")
    assert after[0]["weight_id"].startswith("nonce:") and after[0]["weight_id"] != before[0]["weight_id"]
    assert after[0]["epoch"] == before[0]["epoch"] + 1
    assert outputs(tp2) == oracle["B"]
    assert_ranks_in_step_at_idle(tp2)
