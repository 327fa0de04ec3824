"""SGLang's multi-tokenizer HTTP server (`--tokenizer-worker-num N > 1`, a stock launch SGLang documents) on a real CPU
server with vradix: uvicorn starts N worker processes that import SGLang's app and never call `load_plugins()`; each
builds its own `TokenizerWorker`, which serves every HTTP request and control call, while the launcher keeps only the
router. vradix must be installed in each worker, or the worker must not serve (docs/processes.md).

One vradix server on model A (two workers, with its tokenizer for the OpenAI endpoint) runs every test; the oracle is
a fresh stock server on model B.
- every tokenizer worker process says it installed vradix (its pid in the log line);
- provenance reaches the client through the workers, on `/generate` and on the OpenAI endpoint, and the workers
  serve `/vradix/cache`;
- a bucketed update sent through the workers holds generation: a request sent between two buckets
  equals the fresh server on B (not a hybrid of A and B).
"""
import concurrent.futures as cf
import re
import time

import psutil
import pytest

from vradix.testing.harness.reliability import oracle_outputs
from vradix.testing.harness.scenario import PROBE, tensor_buckets
from vradix.testing.harness.server import CpuServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

WORKERS = 2
PROMPTS = {"probe": [PROBE]}


@pytest.fixture(scope="module")
def oracle_b(models, server_pool):
    return oracle_outputs(models[1], PROMPTS, pool=server_pool)["probe"]


@pytest.fixture(scope="module")
def server(models):
    with CpuServer(models[0], skip_tokenizer_init=False,
                   extra_args=["--tokenizer-worker-num", str(WORKERS)]) as s:
        yield s
        assert "Traceback" not in s.logs(), s.tail(80)


def tokenizer_worker_pids(server, timeout: float = 120.0) -> set:
    """The pids of the server's tokenizer worker processes (SGLang titles them `sglang::tokenizer_worker:<pid>` once
    each built its TokenizerWorker): the server answers as soon as one worker serves, so wait until all do."""
    deadline = time.monotonic() + timeout
    while True:
        procs = psutil.Process(server.proc.pid).children(recursive=True)
        pids = {p.pid for p in procs if "tokenizer_worker" in " ".join(p.cmdline())}
        if len(pids) >= WORKERS or time.monotonic() > deadline:
            return pids
        time.sleep(0.2)


def test_every_tokenizer_worker_installs_vradix(server):
    pids = tokenizer_worker_pids(server)
    assert len(pids) == WORKERS, f"expected {WORKERS} tokenizer workers, found {pids}"
    installed = {int(pid) for pid in re.findall(r"vradix \S+: \d+ hooks installed in tokenizer worker (\d+)",
                                                server.logs())}
    assert pids <= installed, f"tokenizer workers without vradix: {sorted(pids - installed)}"


def test_provenance_reaches_the_client_through_every_worker(server):
    """Each request on a new connection, so the kernel spreads them over the workers."""
    for _ in range(3 * WORKERS):
        meta = server.generate(PROBE, 2)["meta_info"]
        assert "prefix_cache" in meta and "prefill_weight_versions" in meta, meta
        r = server.post("/v1/completions", {"model": "m", "prompt": "hello", "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200, r.text
        assert "prefix_cache" in r.json()["metadata"], r.json()
        inspected = server.get("/vradix/cache?limit=1")
        assert inspected.status_code == 200 and inspected.json()["active"], inspected.text


def test_a_bucketed_update_through_the_workers_holds_generation_between_buckets(server, models, oracle_b):
    """Each call of a bucketed update goes on a connection of its own, so its begin and end may reach different
    workers; the request sent inside it goes on another. SGLang broadcasts the begin's pause to every worker, and the
    end resumes generation whichever worker it reaches."""
    server.generate(PROBE, 4)  # PROBE's prefix cached under A
    begin = server.post("/begin_weight_update", {})
    assert begin.status_code == 200, begin.text
    buckets = list(tensor_buckets(models[1], 3))
    ok = server.post("/update_weights_from_tensor", {"serialized_named_tensors": buckets[0], "weight_version": "B"})
    assert ok.status_code == 200, ok.text
    with cf.ThreadPoolExecutor(1) as pool:
        mid = pool.submit(server.generate, PROBE, 4, 300)  # sent with a third of B's tensors loaded
        for payload in buckets[1:]:
            ok = server.post("/update_weights_from_tensor", {"serialized_named_tensors": payload,
                                                             "weight_version": "B"})
            assert ok.status_code == 200, ok.text
        end = server.post("/end_weight_update", {})
        assert end.status_code == 200 and end.json()["success"], end.text
        out = mid.result(300)
    assert out["output_ids"] == oracle_b[0], "a request sent inside the bucketed update ran on a hybrid of A and B"
    assert "paused in place" in begin.json()["message"] and "generation resumed" in end.json()["message"]
    assert server.generate(PROBE, 4)["output_ids"] == oracle_b[0]
