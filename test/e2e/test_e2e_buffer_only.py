"""E2E: `--hicache-host-memory-mode buffer_only` across a publication with an L3 prefetch in flight.

In buffer-only host memory the host pool only stages storage pages for a request (no host tier to keep): the landing
guard does not apply and the KV page ledger is off, so the publication's revocation of queued prefetches is the only
protection. A vradix server on weights A serves PROMPT, waits until its pages are in the L3 store, and flushes
(PROMPT is then in L3 only). With the store's existence queries held (`cpu_aids.held_store`), PROMPT is sent again:
its storage prefetch is in flight. Generation is paused in place, B is published, generation continues and the hold
is released. The answer must equal a fresh server's on B (`fresh_stock_outputs`, from the pool) and read nothing
from storage. Before a bump on a cache with an L3 backend stopped using the tree's reset, the reset stopped the
scheduler here (its storage threads could not be joined while the lookup was held).
"""
import concurrent.futures as cf

import pytest

from vradix.testing.cpu_aids import held_store
from vradix.testing.harness.hicache_store import hicache_server, tiers, wait_stored
from vradix.testing.harness.server import fresh_stock_outputs

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

PROMPT = [(i * 13 + 5) % 480 + 17 for i in range(600)]
NEW = 6
BUFFER_ONLY = ["--hicache-host-memory-mode", "buffer_only", *held_store.backend_args()]


def test_a_publication_with_a_buffer_only_prefetch_in_flight_equals_a_fresh_server_on_the_new_weights(
        models, tmp_path, server_pool):
    store = str(tmp_path / "l3")
    (tmp_path / "l3").mkdir()
    with cf.ThreadPoolExecutor(2) as pool:
        oracle = pool.submit(fresh_stock_outputs, {"B": models[1]},
                             lambda s: s.generate(PROMPT, NEW, timeout=300)["output_ids"], pool=server_pool)
        with hicache_server(models[0], store, extra_args=BUFFER_ONLY) as s:
            s.generate(PROMPT, NEW, timeout=300)
            wait_stored(s, store, PROMPT)
            assert s.post("/flush_cache").status_code == 200  # PROMPT is in L3 only
            held_store.hold(store)
            try:
                queued = pool.submit(s.generate, PROMPT, NEW, timeout=300)
                held_store.wait_held(store)  # its storage prefetch is in flight
                assert s.post("/pause_generation", {"mode": "in_place"}).status_code == 200
                upd = s.post("/update_weights_from_disk", {"model_path": models[1], "flush_cache": False},
                             timeout=300).json()
                assert upd["success"], upd
                assert s.post("/continue_generation").status_code == 200
            finally:
                held_store.release(store)
            after = queued.result(timeout=300)
            assert "KV page ledger disabled" in s.logs()  # buffer-only: the revocation is the only protection
        assert after["output_ids"] == oracle.result(timeout=600)["B"]
        assert tiers(after)["storage"] == 0, after["meta_info"]
