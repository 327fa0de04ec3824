"""P/D decode KV offload to L3 (`--disaggregation-decode-enable-offload-kvcache`) across a publication, at cache
level: SGLang's real `DecodeKVCacheOffloadManager` (its host pool, `HiCacheController`, storage threads
and `HiCacheFile` backend on a temporary directory, with the CPU copy path) over a real UnifiedRadixCache, driven as
the decode loop drives it: `offload_kv_cache` after a decode step and at the finish, `check_offload_progress` each
iteration (whose write acks trigger the pages' L3 backup), `finalize_release_on_finish` when nothing is left to
offload. Waits block on the controller's own queues with a deadline, never on a timer.

Contract: each page decode offloads is attributed, in the store's manifest, to the weight identity it was computed
under (so `vradix.l3 gc` sees it); a request that crossed a publication offloads none of its mixed KV."""
from __future__ import annotations

import os
from contextlib import contextmanager

import pytest
import torch.distributed as dist
from sglang.srt.environ import envs
from sglang.srt.managers.schedule_batch import FINISH_LENGTH
from sglang.srt.runtime_context import get_parallel
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

from vradix import request
from vradix.scheduler.publication import bump_scheduler
from vradix.l3 import gc, manifest
from vradix.pd import layout
from vradix.engine import attach
from vradix.testing import cpu_aids
from vradix.testing.harness.cache_fixture import build_cache, seq
from vradix.testing.harness.decode_queue import DECODE_SERVER_ARGS, decode_scheduler

PAGE = 4
WAIT_S = 60


@contextmanager
def single_rank_group(tmp_path):
    """A one-process gloo group: the offload manager reads its TP group's size (1: no cross-rank reduction)."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


@pytest.fixture(params=["rust", "python"])
def offload(request, tmp_path):
    from sglang.srt.disaggregation.decode_kvcache_offload_manager import DecodeKVCacheOffloadManager
    from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope

    store = tmp_path / "store"
    store.mkdir()
    cpu_aids.apply()
    with single_rank_group(tmp_path) as group, get_parallel().override(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1), \
            envs.SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR.override(str(store)):
        fx = build_cache(request.param, PAGE, kv_tokens=256, hicache_ratio=2, hicache_io_backend="direct",
                         hicache_mem_layout="layer_first", hicache_storage_backend="file",
                         hicache_storage_prefetch_policy="wait_complete",
                         disaggregation_decode_enable_offload_kvcache=True, **DECODE_SERVER_ARGS)
        state = attach(fx.cache, with_ledger=False,
                       scope=layout.scope_of(layout.KvLayout("decode", 1, 1, PAGE, "bfloat16")))
        with host_memory_budget_scope(cpu_aids.TEST_HOST_BUDGET_BYTES):
            manager = DecodeKVCacheOffloadManager(fx.req_pool, fx.allocator, group, fx.cache)
        try:
            yield fx, state, manager, str(store)
        finally:
            manager.cache_controller._stop_storage_threads()
            manager.release_host_resources()
            set_global_server_args_for_scheduler(ServerArgs(model_path="dummy"))


def decoding(fx, state, prompt, outputs):
    """A decode request holding its row: prompt received from prefill, then `outputs` decoded."""
    req = fx.make_req(prompt)
    state.admit_or_raise(req)
    fx.admit(req)
    fx.prefill(req, checkpoint=False)
    for t in outputs:
        fx.decode(req, t)
    return req


def poll(manager) -> None:
    """The decode loop's `check_offload_progress` until every offload in flight reached L3: the first poll takes the
    device-to-host acks (each queues its pages' L3 write), the second the L3 write acks (host pages freed)."""
    cc = manager.cache_controller
    manager.check_offload_progress()
    assert not manager.ongoing_offload, "a device-to-host offload copy did not finish"
    with cc.ack_backup_queue.not_empty:
        assert cc.ack_backup_queue.not_empty.wait_for(
            lambda: len(cc.ack_backup_queue.queue) >= len(manager.ongoing_backup), WAIT_S), "no L3 write ack"
    manager.check_offload_progress()
    assert not manager.ongoing_backup


def stored_hashes(store) -> set:
    """The page hashes of the store's page files (`<hash>_<model>_<tp rank>_<tp size>.bin`)."""
    return {name.split("_", 1)[0] for name in os.listdir(store) if name.endswith(".bin")}


def finish(manager, req) -> None:
    """The decode finish with offload on (`_handle_finish_state_updated_req`)."""
    req.finished_reason = FINISH_LENGTH(length=0)
    if not manager.offload_kv_cache(req):
        manager.finalize_release_on_finish(req)


def test_every_page_decode_offloads_is_in_the_manifest_under_its_identity(offload):
    fx, state, manager, store = offload
    r = decoding(fx, state, seq(100, 10), outputs=seq(500, 12))
    assert manager.offload_kv_cache(r)
    poll(manager)
    pages = stored_hashes(store)
    assert len(pages) == 3  # positions [8, 20): past prefill's page-aligned prompt, up to the last computed token
    owners = manifest.read(store)
    assert {h: owners.get(h) for h in pages} == {h: {state.weight_id} for h in pages}  # all attributed, to A
    assert state.storage.pages_backed_up == {state.weight_id: 3}
    finish(manager, r)
    poll(manager)
    assert fx.allocator.available_size() == fx.total
    # once A is retired, `vradix.l3 gc` frees them (it never deletes a page no manifest names)
    report = gc.collect(store, keep=["fp:another-identity"])
    assert report.dead[state.weight_id].files == 3 and not stored_hashes(store)


def test_a_request_that_crossed_a_publication_offloads_none_of_its_mixed_kv(offload):
    fx, state, manager, store = offload
    old_id = state.weight_id
    r = decoding(fx, state, seq(100, 10), outputs=seq(500, 6))
    assert manager.offload_kv_cache(r)  # positions [8, 12): old weights only
    poll(manager)
    before = stored_hashes(store)
    bump_scheduler(decode_scheduler(fx, running=[r]), reason="test publication", label="B")
    assert request.of(r).crossed and state.weight_id != old_id
    for t in seq(600, 12):
        fx.decode(r, t)  # computed under the new weights
    offloaded = manager.offload_kv_cache(r)
    poll(manager)
    finish(manager, r)
    poll(manager)
    assert stored_hashes(store) == before  # nothing of the mixed KV reached L3 under the old identity
    assert not offloaded
    assert set(manifest.read(store)) == before  # what is stored is attributed, and nothing more
    assert fx.allocator.available_size() == fx.total  # SGLang released the row itself at the finish
