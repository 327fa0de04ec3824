"""Control requests outside every `update_weights_*` call that write the weights, or would let a response be computed
from weights nobody published.

On the session's pooled servers (tiny float32 models; the stock server is the oracle that the hole exists):
- `/weights_checker` `reset_tensors` overwrites every parameter: a publication, so the prefix computed before it is
  never matched again, and the answer equals the same server's answer computed afresh on the reset weights;
- `/set_internal_state` relaxing speculative acceptance is refused with HTTP 400, as the same flags are at launch;
- `/continue_generation` inside an open bucketed update is refused with HTTP 400 naming `end_weight_update`.
Without a server (the publication hooks' `Engine`: a real UnifiedRadixCache with a running request, SGLang's real
updater class): resuming the weights' memory without a CPU backup brings back memory without its contents, a
publication (the CPU engine cannot release memory, so this runs at hook level); the scheduler's own refusal of a
continue inside a bucketed update, on SGLang's real `Scheduler.continue_generation`; the refusal of an RPC to a
state-changing method.
"""
import types

import pytest
from sglang.srt.disaggregation.utils import DisaggregationMode
from sglang.srt.managers.io_struct import (ContinueGenerationReqInput, ResumeMemoryOccupationReqInput,
                                           ResumeMemoryOccupationReqOutput, RpcReqInput)
from sglang.srt.managers.scheduler import Scheduler

from vradix.core.state import BucketedUpdate
from vradix.hooks import control, publication
from vradix.testing.harness.engine import Engine
from vradix.testing.harness.scenario import PROBE

pytestmark = [pytest.mark.timeout(600)]


def reset_then_probe(server):
    """PROBE cached under A, `/weights_checker` `reset_tensors`, then PROBE again; and the same PROBE computed afresh
    on the reset weights (after an idle flush): (the answer after the reset, the fresh answer, epochs before/after)."""
    server.generate(PROBE, 4)
    before = (server.vradix_info() or {}).get("epoch")
    reset = server.post("/weights_checker", {"action": "reset_tensors"})
    assert reset.status_code == 200, reset.text
    after = server.generate(PROBE, 8)
    epoch_after = (server.vradix_info() or {}).get("epoch")
    assert server.post("/flush_cache").status_code == 200
    fresh = server.generate(PROBE, 8)
    assert fresh["meta_info"]["cached_tokens"] == 0
    return after, fresh, (before, epoch_after)


@pytest.mark.e2e
def test_a_weights_checker_reset_is_a_publication(models, server_pool):
    with server_pool.lease(models[0], vradix=False) as stock:
        after, _fresh, _ = reset_then_probe(stock)
        assert after["meta_info"]["cached_tokens"] == 200  # stock serves A's prefix KV on the reset weights
    with server_pool.lease(models[0]) as s:
        after, fresh, (e0, e1) = reset_then_probe(s)
        assert e1 == e0 + 1, (e0, e1)  # one publication
        assert after["meta_info"]["cached_tokens"] == 0
        assert after["output_ids"] == fresh["output_ids"]  # computed on the reset weights only
        assert "Traceback" not in s.logs()


@pytest.mark.e2e
def test_relaxing_speculative_acceptance_at_runtime_is_refused(models, server_pool):
    with server_pool.lease(models[0]) as s:
        for key in ("speculative_accept_threshold_single", "speculative_accept_threshold_acc"):
            r = s.post("/set_internal_state", {"server_args": {key: 0.5}})
            assert r.status_code == 400 and key in r.text and "1.0" in r.text, r.text
        kept = s.post("/set_internal_state", {"server_args": {"speculative_accept_threshold_single": 1.0}})
        assert kept.status_code == 200, kept.text


@pytest.mark.e2e
def test_continue_generation_inside_a_bucketed_update_is_refused(models, server_pool):
    with server_pool.lease(models[0]) as s:
        assert s.post("/begin_weight_update", {}).status_code == 200
        refused = s.post("/continue_generation", {})
        assert refused.status_code == 400 and "end_weight_update" in refused.text, refused.text
        assert s.vradix_info()["pool"]["paused"]  # generation stays held
        end = s.post("/end_weight_update", {})
        assert end.status_code == 200 and "generation resumed" in end.json()["message"], end.text
        assert not s.vradix_info()["pool"]["paused"]
        assert s.post("/continue_generation", {}).status_code == 200  # outside a bucketed update it runs as stock's
        assert s.generate(PROBE, 2)["meta_info"]["completion_tokens"] == 2


def paused_scheduler(engine):
    """The engine's scheduler with what SGLang's `Scheduler.continue_generation` reads, paused."""
    s = engine.scheduler
    s.disaggregation_mode, s.disagg_decode_prealloc_queue = DisaggregationMode.NULL, None
    s._engine_paused, s._pause_started_at, s._pause_intervals = True, None, []
    return s


def test_the_scheduler_keeps_generation_paused_inside_a_bucketed_update():
    engine = Engine()
    scheduler = paused_scheduler(engine)
    engine.state.bucketed = BucketedUpdate()
    control.refuse_continue_inside_bucketed_update(Scheduler.continue_generation, scheduler,
                                                   ContinueGenerationReqInput())
    assert scheduler._engine_paused  # refused: the bucketed update's buckets are not published yet
    engine.state.bucketed = None
    control.refuse_continue_inside_bucketed_update(Scheduler.continue_generation, scheduler,
                                                   ContinueGenerationReqInput())
    assert not scheduler._engine_paused


def test_an_rpc_to_a_method_that_changes_state_is_refused():
    calls = []

    def original(scheduler, recv_req):
        calls.append(recv_req.method)
        return types.SimpleNamespace(success=True, message="")

    for method in ("flush_cache", "update_weights_from_disk", "record_weight_version_change"):
        out = control.refuse_state_changing_rpc(original, None, RpcReqInput(method=method, parameters=None))
        assert not out.success and method in out.message and "update_weights_" in out.message
    assert calls == []  # nothing was called
    out = control.refuse_state_changing_rpc(original, None, RpcReqInput(method="save_sharded_model", parameters={}))
    assert out.success and calls == ["save_sharded_model"]


def test_resuming_weights_without_a_cpu_backup_is_a_publication():
    from sglang.srt.runtime_context import get_exec

    engine = Engine()
    engine.updater.draft_worker = None
    resumed = []

    def original(updater, recv_req):  # SGLang's body: the memory saver remaps the tagged memory
        resumed.append(recv_req.tags)
        return ResumeMemoryOccupationReqOutput()

    def resume(tags):
        epoch = engine.state.epoch
        publication.publish_weights_resumed_without_backup(original, engine.updater,
                                                           ResumeMemoryOccupationReqInput(tags=tags))
        return engine.state.epoch - epoch

    original(engine.updater, ResumeMemoryOccupationReqInput(tags=["weights"]))
    assert engine.state.epoch == 0  # stock: the KV of the released weights stays matchable
    assert resume(["kv_cache"]) == 0  # no weights resumed
    assert resume(["weights"]) == 1 and resume(None) == 1  # contents lost: one publication each
    with get_exec().features.override(enable_weights_cpu_backup=True):
        assert resume(["weights"]) == 0  # the backup brings the same weights back
    assert len(resumed) == 5
