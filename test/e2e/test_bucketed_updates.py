"""Bucketed updates and malformed updates on a real SGLang CPU server with vradix (tiny float32 models).

One vradix server on model A runs every scenario; the oracle is a fresh stock server on model B.
- A bucketed publication (`/begin_weight_update`, several `/update_weights_from_tensor` buckets each carrying part of
  B's tensors, `/end_weight_update`) with a request in flight is one publication: exactly one epoch bump at the end,
  generation held (in place) for the whole bucketed update, the crossing request keeps its KV, and every request
  admitted after the bucketed update equals the fresh server on B.
- Malformed `/update_weights_from_disk` requests get HTTP 400 before anything changes (epoch, label, paused state).
"""

import pytest

from vradix.testing.harness.reliability import STRICT_CHECK_ENV, oracle_outputs, strict_idle_check
from vradix.testing.harness.scenario import (LONG_PROMPT, PREFIX, PROBE, StreamingRequest,
                                             begin_bucketed_update_holding, tensor_buckets)
from vradix.testing.harness.server import CpuServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

PROMPTS = {"probe": [PROBE, PREFIX[:150] + [3, 4]]}
BUCKETS = 3


@pytest.fixture(scope="module")
def oracle_b(models, server_pool):
    return oracle_outputs(models[1], PROMPTS, pool=server_pool)["probe"]


@pytest.fixture(scope="module")
def server(models):
    with CpuServer(models[0], env=STRICT_CHECK_ENV) as s:
        yield s
        assert "Traceback" not in s.logs(), s.tail(80)


def test_a_bucketed_update_is_one_publication_with_requests_in_flight(server, models, oracle_b):
    before, begin, inflight = begin_bucketed_update_holding(server)
    assert begin.status_code == 200 and "paused in place" in begin.json()["message"], begin.text
    v = server.vradix_info()
    assert v["pool"]["paused"] and v["weight_session"] == {"buckets": 0, "failed_buckets": 0}

    for i, payload in enumerate(tensor_buckets(models[1], BUCKETS)):
        r = server.post("/update_weights_from_tensor", {"serialized_named_tensors": payload,
                                                         "weight_version": f"B-{i}", "flush_cache": True})
        assert r.status_code == 200, r.text
        assert f"bucket {i + 1} of a bucketed update" in r.json()["message"], r.text
        v = server.vradix_info()
        assert (v["epoch"], v["publications"]) == (before["epoch"], before["publications"])  # no bump per bucket
        assert v["pool"]["paused"], "generation resumed in the middle of the bucketed update"

    end = server.post("/end_weight_update", {})
    assert end.status_code == 200, end.text
    msg = end.json()["message"]
    assert f"epoch {before['epoch']}->{before['epoch'] + 1} (bucketed update ({BUCKETS} bucket(s), 0 failed)" \
        in msg and "1 crossing request(s)" in msg and "generation resumed" in msg, msg

    v = server.vradix_info()
    assert (v["epoch"], v["publications"], v["label"]) == (before["epoch"] + 1, before["publications"] + 1,
                                                           f"B-{BUCKETS - 1}")
    assert v["weight_session"] is None and v["lock_aware_flushes"] == before["lock_aware_flushes"]
    outs = [server.generate(p, 4, timeout=300) for p in PROMPTS["probe"]]
    assert [o["output_ids"] for o in outs] == oracle_b  # admitted after the bucketed update == a fresh server on B
    assert outs[0]["meta_info"]["weight_version"] == f"B-{BUCKETS - 1}"
    final = inflight.result(300)["meta_info"]
    assert final["num_retractions"] == 0 and final["completion_tokens"] == 200  # crossed with its KV
    strict_idle_check(server)


def test_a_bucketed_update_without_buckets_bumps_once_and_an_explicit_pause_stays(server):
    """0 buckets is a P2P/RDMA write: still one bump. A pause the caller took is not lifted by the bucketed update."""
    before = server.vradix_info()
    assert server.post("/pause_generation", {"mode": "in_place"}).status_code == 200
    begin = server.post("/begin_weight_update", {}).json()
    assert begin["success"] and "paused in place" not in begin["message"], begin
    end = server.post("/end_weight_update", {}).json()
    assert end["success"] and "no bucket: P2P/RDMA" in end["message"] and "resumed" not in end["message"], end
    v = server.vradix_info()
    assert v["epoch"] == before["epoch"] + 1 and v["pool"]["paused"]
    assert server.post("/continue_generation", {}).status_code == 200
    strict_idle_check(server)


MALFORMED = [({"model_path": ""}, "model_path is empty"),
             ({"model_path": "{A}", "load_format": "bogus"}, "is not a valid LoadFormat"),
             ({"model_path": "{A}", "weight_version": ""}, "invalid weight_version label"),
             ({"model_path": "{A}", "load_format": "dummy"}, "cannot update weights in place"),  # refused in scheduler
             ({"model_path": 123}, None), ({"model_path": "{A}", "flush_cache": "maybe"}, None)]  # HTTP schema


def test_malformed_disk_updates_are_refused_and_change_nothing(server, models):
    before = server.vradix_info()
    inflight = StreamingRequest(server.url, LONG_PROMPT, 30)
    for body, why in MALFORMED:
        body = {k: (v.format(A=models[0]) if isinstance(v, str) else v) for k, v in body.items()}
        r = server.post("/update_weights_from_disk", body)
        assert r.status_code == 400 and (why or "validation error") in r.json()["message"], (body, r.text[:300])
        v = server.vradix_info()
        assert (v["epoch"], v["label"], v["pool"]["paused"]) == (before["epoch"], before["label"], False), body
    assert inflight.result(300)["meta_info"]["completion_tokens"] == 30  # the engine kept serving
    strict_idle_check(server)
