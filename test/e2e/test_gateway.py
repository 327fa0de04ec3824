"""The fail-closed publish client and CLI through an SGLang model gateway (`smg --enable-rl`): a fleet behind the
gateway is published through its RL control plane and every worker is verified from its own server info.

Real parts: the `smg` gateway (its Rust router, from the `smg` wheel) in front of two vradix CPU servers on the tiny
model, leased once for the module from the session's server pool (`server_pool`). Not run here: a P/D pair behind the gateway (the mooncake transfer; the client
treats prefill and decode workers like any other, each with its own plan).
"""
import json
import subprocess
import sys

import pytest
import requests

from vradix.client import publish
from vradix.testing.harness.scenario import PROBE

pytest.importorskip("smg")
from vradix.testing.harness.gateway import Gateway  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def fleet(models, server_pool):
    with server_pool.lease_many(2, models[0]) as (w1, w2), Gateway([w1.url, w2.url]) as gw:
        yield gw, (w1, w2)
        assert "Traceback" not in w1.logs() + w2.logs()


def labels_and_epochs(workers):
    return [(w.vradix_info()["label"], w.vradix_info()["epoch"]) for w in workers]


def test_publish_through_the_gateway_verifies_every_worker(fleet, models):
    gw, workers = fleet
    before = labels_and_epochs(workers)
    for w in workers:
        w.generate(PROBE, 1)
    results = publish([], models[1], "gw-step1", gateways=[gw.url], timeout=240)
    assert sorted(r.worker_url for r in results) == sorted(w.url for w in workers)
    assert all(r.verified and r.plan.pause_mode == "in_place" and r.state == "running" for r in results)
    # each worker's own server info, read directly, not through the gateway
    assert labels_and_epochs(workers) == [("gw-step1", e + 1) for _, e in before]
    assert all(w.generate(PROBE, 1)["meta_info"]["cached_tokens"] == 0 for w in workers)  # no stale prefix
    cli = subprocess.run([sys.executable, "-m", "vradix.publish", "--gateway", gw.url, "--model-path", models[0],
                          "--version", "gw-step2", "--timeout", "240"], capture_output=True, text=True, timeout=600)
    assert cli.returncode == 0, cli.stderr[-3000:]
    *lines, fleet = [json.loads(x) for x in cli.stdout.splitlines()]
    assert len(lines) == 2 and all(x["verified"] and x["label_after"] == "gw-step2" for x in lines)
    # the fleet line: nonce workers (`auto` off P/D) cannot share an identity, so each is listed with its own
    assert fleet["fleet"]["weight_id"] is None
    assert sorted((e["worker_url"], e["mode"], e["in_fleet"]) for e in fleet["fleet"]["engines"]) == sorted(
        (w.url, "nonce", False) for w in workers)
    assert labels_and_epochs(workers) == [("gw-step2", e + 2) for _, e in before]


def test_a_failed_publication_through_the_gateway_leaves_every_worker_paused(fleet, models):
    gw, workers = fleet
    cli = subprocess.run([sys.executable, "-m", "vradix.publish", "--gateway", gw.url, "--model-path",
                          "/no/such/checkpoint", "--version", "gw-bad", "--timeout", "240"],
                         capture_output=True, text=True, timeout=600)
    assert cli.returncode == 2, cli.stdout + cli.stderr[-3000:]
    assert "NOT verified on all 2 engine(s)" in cli.stderr and cli.stderr.count("left paused(in_place)") == 2
    assert all(f"worker {w.url}" in cli.stderr for w in workers)  # each worker named, beside its gateway route
    for w in workers:  # paused: a generation does not complete until the worker is resumed through the gateway
        with pytest.raises(requests.Timeout):
            requests.post(w.url + "/generate", json={"input_ids": PROBE, "sampling_params": {"max_new_tokens": 1}},
                          timeout=3)
    for wk in gw.workers():
        r = requests.post(f"{gw.url}/v1/rl/workers/{wk['id']}/engine/continue_generation", json={}, timeout=30)
        assert r.status_code == 200 and r.json()["status"] == 200
    assert all(w.generate(PROBE, 1)["meta_info"]["completion_tokens"] == 1 for w in workers)


def test_a_gateway_without_workers_is_refused_before_anything_is_touched():
    with Gateway([]) as empty:
        with pytest.raises(RuntimeError, match="lists no workers"):
            publish([], "/unused", "v", gateways=[empty.url], timeout=30)
        cli = subprocess.run([sys.executable, "-m", "vradix.publish", "--gateway", empty.url, "--model-path", "/x"],
                             capture_output=True, text=True, timeout=300)
        assert cli.returncode == 2 and "lists no workers" in cli.stderr

