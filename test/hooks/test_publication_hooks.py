"""The weight-update hook bodies of `vradix.hooks.publication`, called as the HookRegistry calls them, on a real
SGLang UnifiedRadixCache (real pools, a real Req holding KV) and a real `SchedulerWeightUpdaterManager`: the
`vradix.testing.harness.engine` test engine, whose module doc names its stand-ins.
"""
import types

import pytest
import torch

from sglang.srt.managers.io_struct import (UpdateWeightFromDiskReqInput, UpdateWeightFromDiskReqOutput,
                                           UpdateWeightsFromDistributedReqInput,
                                           UpdateWeightsFromDistributedReqOutput, UpdateWeightsFromIPCReqInput,
                                           UpdateWeightsFromIPCReqOutput, UpdateWeightsFromTensorReqInput,
                                           UpdateWeightsFromTensorReqOutput)

from vradix.observability import server_info
from vradix.hooks import launcher, publication
from vradix.scheduler import publication as publication_glue
from vradix.engine import attach
from vradix.testing.harness.cache_fixture import build_cache
from vradix.testing.harness.trace import files_entered
from vradix.testing.harness.engine import (Engine, StubScheduler, checkpoint, disk_request, end_bucketed,
                                           fingerprint_engine, loading_update, open_bucketed, succeeding_update,
                                           tensor_bucket)


@pytest.fixture
def engine():
    return Engine()


def test_successful_update_bumps_once_although_the_flush_runs(engine):
    epoch, pubs, flushes = engine.counters()
    out = publication.publish_update_from_disk(succeeding_update(engine), engine.updater, disk_request("B1"))
    assert out.success, out.message
    assert engine.counters() == (epoch + 1, pubs + 1, flushes)  # the flush did not bump a second time
    assert engine.state.label == "B1" and engine.state.publication is None
    assert "epoch 0->1 (update_weights_from_disk" in out.message


def test_exception_after_weights_were_touched_propagates_without_a_bump(engine):
    before = engine.counters()

    def original(updater, recv_req):
        engine.touched += 1  # weights may have changed (e.g. the rollback reload raised)
        raise RuntimeError("rollback reload failed")

    with pytest.raises(RuntimeError, match="rollback reload failed"):
        publication.publish_update_from_disk(original, engine.updater, disk_request("B1"))
    assert engine.counters() == before and engine.state.publication is None


def test_exception_in_the_bump_itself_propagates(engine, monkeypatch):
    """vradix's own bump/audit failing is not reported as a failed update followed by a second, conservative bump on
    a half-evicted tree: it stops the engine like any scheduler error."""
    real_bump, calls = publication_glue.bump_scheduler, []

    def bump_failing_once(*a, **kw):
        calls.append(kw["reason"])
        if len(calls) == 1:
            raise AssertionError("audit found a leak")
        return real_bump(*a, **kw)

    monkeypatch.setattr(publication_glue, "bump_scheduler", bump_failing_once)
    with pytest.raises(AssertionError, match="audit found a leak"):
        publication.publish_update_from_disk(succeeding_update(engine), engine.updater, disk_request("B1"))
    assert calls == ["update_weights_from_disk"]


def test_returned_failure_after_touching_weights_bumps_once_conservatively(engine):
    epoch, pubs, flushes = engine.counters()

    def original(updater, recv_req):
        engine.touched += 1
        return UpdateWeightFromDiskReqOutput(success=False, message="Failed to update weights: x. Rolling back.")

    out = publication.publish_update_from_disk(original, engine.updater, disk_request("B1"))
    assert not out.success and "(conservative)" in out.message
    assert engine.counters() == (epoch + 1, pubs + 1, flushes)


@pytest.mark.parametrize("load_format", ["bogus", "dummy"])
def test_load_format_refused_before_loading_does_not_bump(engine, load_format):
    before = engine.counters()
    out = publication.publish_update_from_disk(succeeding_update(engine), engine.updater,
                                               disk_request("B1", load_format=load_format))
    assert not out.success and "refused" in out.message and load_format in out.message
    assert engine.touched == 0 and engine.counters() == before


def slow_drain(engine, monkeypatch, seconds=0.02):
    """The engine runs the overlap scheduler, and every drain finds one in-flight batch that takes `seconds` to
    finish."""
    import time

    def drain(scheduler):
        time.sleep(seconds)
        return 1
    monkeypatch.setattr(publication_glue.overlap, "drain_inflight_batch", drain)
    engine.scheduler.enable_overlap = True
    publication_glue.install_steps(engine.scheduler)


def test_a_publication_reports_its_pause_drain_plus_bump(engine, monkeypatch):
    slow_drain(engine, monkeypatch)
    publication.publish_update_from_disk(succeeding_update(engine), engine.updater, disk_request("B1"))
    last = engine.state.last_publication
    assert last.drain_ms >= 20 and last.bump_ms >= last.latency_ms + last.identity_ms > 0
    info = server_info.engine_block(engine.state, 0)
    assert info["last_publication_pause_ms"] == {"drain_ms": round(last.drain_ms, 3),
                                                 "bump_ms": round(last.bump_ms, 3),
                                                 "total_ms": round(last.drain_ms + last.bump_ms, 3)}
    assert info["last_publication"]["pause_ms"] == info["last_publication_pause_ms"]["total_ms"]
    assert engine.state.drain_ms_pending == 0  # taken by the bump: the next publication starts from nothing


def test_a_refused_update_leaves_no_drain_to_the_next_publication(engine, monkeypatch):
    slow_drain(engine, monkeypatch)
    publication.publish_update_from_disk(succeeding_update(engine), engine.updater,
                                         disk_request("B1", load_format="bogus"))
    assert engine.state.drain_ms_pending == 0 and engine.state.last_publication is None


def test_a_bucketed_update_pause_counts_every_drain_of_the_update(engine, monkeypatch):
    slow_drain(engine, monkeypatch)
    open_bucketed(engine)
    for i in range(2):
        original, req = tensor_bucket(engine, f"B{i}")
        publication.publish_update_from_tensor(original, engine.updater, req)
    end_bucketed(engine)
    assert engine.state.last_publication.drain_ms >= 3 * 20  # the begin's and each bucket's: one publication's pause


@pytest.mark.parametrize("buckets", [0, 1, 3])
def test_a_bucketed_update_is_one_publication_whatever_its_buckets(engine, buckets):
    epoch, pubs, flushes = engine.counters()
    open_bucketed(engine)
    for i in range(buckets):
        original, req = tensor_bucket(engine, f"B{i}")
        out = publication.publish_update_from_tensor(original, engine.updater, req)
        assert out.success and f"bucket {i + 1} of a bucketed update" in out.message
        assert engine.counters() == (epoch, pubs, flushes)  # neither the bucket nor its flush bumped
    assert engine.state.bucketed.buckets == buckets
    out = end_bucketed(engine)
    assert engine.counters() == (epoch + 1, pubs + 1, flushes)
    assert engine.state.bucketed is None
    if buckets:
        assert engine.state.label == f"B{buckets - 1}" and f"label='B{buckets - 1}'" in out.message
    else:
        assert "no bucket: P2P/RDMA" in out.message


def test_a_failed_bucket_does_not_bump_the_update_end_does(engine):
    epoch, pubs, _ = engine.counters()
    open_bucketed(engine)
    original, req = tensor_bucket(engine, "B0", success=False)
    assert not publication.publish_update_from_tensor(original, engine.updater, req).success
    assert engine.counters()[:2] == (epoch, pubs)
    assert "1 failed" in end_bucketed(engine).message and engine.counters()[:2] == (epoch + 1, pubs + 1)


def test_a_tensor_update_outside_a_bucketed_update_touches_nothing_and_does_not_bump(engine):
    before = engine.counters()

    def rejected(updater, recv_req):  # SGLang 0.5.23 rejects it before touching weights
        return UpdateWeightsFromTensorReqOutput(success=False, message="must run between begin and end")

    out = publication.publish_update_from_tensor(rejected, engine.updater, tensor_bucket(engine, "B0")[1])
    assert not out.success and engine.counters() == before


# ---- launcher-side request checks ----------------------------------------------------------------------------------
BAD_DISK_REQUESTS = [
    (dict(model_path=123), "model_path=123"), (dict(model_path=""), "model_path is empty"),
    (dict(model_path="x", load_format="bogus"), "is not a valid LoadFormat"),
    (dict(model_path="x", load_format=5), "load_format=5"),
    (dict(model_path="x", flush_cache="maybe"), "flush_cache='maybe'"),
    (dict(model_path="x", recapture_cuda_graph=1), "recapture_cuda_graph=1"),
    (dict(model_path="x", token_step=True), "token_step=True"),
    (dict(model_path="x", weight_version=""), "invalid weight_version label"),
]


@pytest.mark.parametrize("fields,why", BAD_DISK_REQUESTS)
def test_launcher_refuses_malformed_disk_updates(fields, why):
    with pytest.raises(ValueError, match=why.replace("(", r"\(")):
        launcher.check_disk_update_request(UpdateWeightFromDiskReqInput(**fields))


@pytest.mark.parametrize("load_format", [None, "auto", "SAFETENSORS", "pt"])
def test_launcher_accepts_every_load_format_sglang_knows(load_format):
    launcher.check_disk_update_request(UpdateWeightFromDiskReqInput(model_path="x", load_format=load_format,
                                                                    weight_version="v1", token_step=3))


def test_distributed_buckets_in_a_bucketed_update_are_one_publication(engine):
    epoch, pubs, flushes = engine.counters()
    open_bucketed(engine)
    for i in range(2):
        req = UpdateWeightsFromDistributedReqInput(names=["w"], dtypes=["float32"], shapes=[[1]], group_name="g",
                                                   weight_version=f"D{i}")
        out = publication.publish_update_from_distributed(
            succeeding_update(engine, UpdateWeightsFromDistributedReqOutput), engine.updater, req)
        assert out.success and engine.counters() == (epoch, pubs, flushes)
    assert "2 bucket(s), 0 failed" in end_bucketed(engine).message
    assert engine.counters() == (epoch + 1, pubs + 1, flushes) and engine.state.label == "D1"


def test_an_ipc_update_outside_a_bucketed_update_is_one_publication(engine):
    epoch, pubs, flushes = engine.counters()
    req = UpdateWeightsFromIPCReqInput(zmq_handles={}, weight_version="I1")
    out = publication.publish_update_from_ipc(succeeding_update(engine, UpdateWeightsFromIPCReqOutput),
                                              engine.updater, req)
    assert out.success and "epoch 0->1" in out.message
    assert engine.counters() == (epoch + 1, pubs + 1, flushes) and engine.state.label == "I1"


# when the target runner loaded but a later (draft) runner failed, SGLang still flushes: the lock-aware flush and the
# failed call's conservative bump are one bump for the one update call, not two
def test_a_failed_update_whose_flush_runs_bumps_once(engine):
    epoch, pubs, flushes = engine.counters()

    def target_loaded_draft_failed(updater, recv_req):
        engine.touched += 1
        ok, msg = updater.flush_cache_after_weight_update(recv_req, False, "draft runner failed")
        return UpdateWeightFromDiskReqOutput(success=ok, message=msg)

    out = publication.publish_update_from_disk(target_loaded_draft_failed, engine.updater, disk_request("B1"))
    assert not out.success and "conservative" in out.message
    assert engine.counters() == (epoch + 1, pubs + 1, flushes)


class LauncherStandIn:
    """The TokenizerManager attributes the bucketed-update hooks read: `is_pause` and the pause / continue
    coroutines."""

    def __init__(self):
        self.is_pause = False

    async def pause_generation(self, obj):
        self.is_pause = True

    async def continue_generation(self, obj):
        self.is_pause = False


# a begin_weight_update that raises releases the pause the bucketed update has just taken (it would otherwise stay
# forever)
def test_a_begin_that_raises_does_not_leave_generation_paused():
    import asyncio

    tm = LauncherStandIn()

    async def raising_begin(tm, obj):
        raise RuntimeError("communicator failed")

    with pytest.raises(RuntimeError, match="communicator failed"):
        asyncio.run(launcher.hold_generation_for_bucketed_update(raising_begin, tm, None))
    assert not tm.is_pause


def test_an_end_that_fails_says_generation_stays_paused():
    import asyncio

    tm = LauncherStandIn()

    async def begin(tm, obj):
        return True, "Success"

    async def failing_end(tm, obj):
        return False, "no weight-update session is open"

    assert asyncio.run(launcher.hold_generation_for_bucketed_update(begin, tm, None))[0] and tm.is_pause
    ok, message = asyncio.run(launcher.release_generation_after_bucketed_update(failing_end, tm, None))
    assert not ok and "generation stays paused" in message and tm.is_pause


# ---- weight identity (declared mode): the label is the identity; a reused declaration is refused before loading ----
def declared_engine():
    e = Engine()
    e.state.identity_mode = "declared"
    return e


def test_declared_mode_names_each_publication_by_its_label():
    e = declared_engine()
    out = publication.publish_update_from_disk(succeeding_update(e), e.updater, disk_request("run-1/step-2"))
    assert out.success and e.state.weight_id == "declared:run-1/step-2"
    assert "weight_id=declared:run-1/step-2" in out.message


def test_declared_mode_refuses_an_identity_an_earlier_publication_used_and_changes_nothing():
    e = declared_engine()
    publication.publish_update_from_disk(succeeding_update(e), e.updater, disk_request("step-2"))
    publication.publish_update_from_disk(succeeding_update(e), e.updater, disk_request("step-3"))
    before = (e.counters(), e.state.weight_id, e.state.label, e.touched)
    out = publication.publish_update_from_disk(succeeding_update(e), e.updater, disk_request("step-2"))
    assert not out.success and "already used by an earlier publication" in out.message
    assert (e.counters(), e.state.weight_id, e.state.label, e.touched) == before


@pytest.mark.parametrize("label", ["x" * 200, "   "])
def test_declared_mode_refuses_an_unusable_declaration_before_loading(label):
    e = declared_engine()
    before = (e.counters(), e.state.weight_id, e.touched)
    out = publication.publish_update_from_disk(succeeding_update(e), e.updater, disk_request(label))
    assert not out.success and "invalid declared weight identity" in out.message
    assert (e.counters(), e.state.weight_id, e.touched) == before


def test_declared_mode_gives_a_publication_that_keeps_its_label_a_nonce():
    e = declared_engine()
    publication.publish_update_from_disk(succeeding_update(e), e.updater, disk_request("step-2"))
    out = publication.publish_update_from_disk(succeeding_update(e), e.updater, disk_request(None))
    assert out.success and e.state.epoch == 2 and e.state.weight_id.startswith("nonce:")


def test_declared_mode_keeps_the_label_when_a_relabel_reuses_an_identity():
    """`/update_weight_version` has no failure reply: a reused declaration leaves label, epoch and identity as
    they were (the scheduler-side guard)."""
    e = declared_engine()
    publication.publish_update_from_disk(succeeding_update(e), e.updater, disk_request("step-2"))
    publication.publish_update_from_disk(succeeding_update(e), e.updater, disk_request("step-3"))
    before = (e.counters(), e.state.weight_id, publication_glue.current_label())
    e.scheduler.record_weight_version_change("step-2")
    assert (e.counters(), e.state.weight_id, publication_glue.current_label()) == before
    e.scheduler.record_weight_version_change("step-4")
    assert e.state.weight_id == "declared:step-4" and e.state.epoch == before[0][0] + 1


# ---- weight identity (fingerprint mode): proven from the tensors published into the model (vradix.core.published) --
def test_fingerprint_mode_proves_equal_weights_and_tells_different_ones_apart():
    e = fingerprint_engine()
    first = e.state.weight_id
    ident = e.state.identities[e.state.epoch].identity
    assert first.startswith("fp:") and ident.source == "fingerprint" and ident.basis == "published (complete)"
    assert fingerprint_engine().state.weight_id == first  # a second engine on the same checkpoint: the same id
    changed = checkpoint(0)
    changed["0.weight"][3, 5] = torch.nextafter(changed["0.weight"][3, 5], torch.tensor(1.0))  # one bit
    publication.publish_update_from_disk(loading_update(e, changed), e.updater, disk_request("b"))
    assert e.state.weight_id != first
    publication.publish_update_from_disk(loading_update(e, checkpoint(0)), e.updater, disk_request("c"))
    assert e.state.weight_id == first  # every name again, the same bytes: the identity of a fresh start, proven
    # ... but a namespace of its own inside this process (suffixed by the epoch)
    assert e.state.prefix_of_epoch(e.state.epoch) != e.state.prefix_of_epoch(e.state.epoch - 2)
    assert e.state.last_publication.identity_ms > 0  # the fingerprint's cost is reported with each publication


def test_a_partial_publication_chains_onto_the_identity_before_it():
    a, b = fingerprint_engine(), fingerprint_engine()
    part = {"1.bias": checkpoint(1)["1.bias"]}
    for e in (a, b):
        publication.publish_update_from_disk(loading_update(e, part), e.updater, disk_request("p"))
    assert a.state.weight_id == b.state.weight_id  # equal histories from a proven start: equal identities
    assert a.state.identities[a.state.epoch].identity.basis == "published (chained)"
    final = {**checkpoint(0), **part}
    fresh = fingerprint_engine(final)  # the same final weights, started fresh: proven without the history
    assert fresh.state.weight_id not in (a.state.weight_id, a.state.identities[0].identity.weight_id)
    other = fingerprint_engine()
    publication.publish_update_from_disk(loading_update(other, {"1.bias": checkpoint(2)["1.bias"]}), other.updater,
                                         disk_request("p"))
    assert other.state.weight_id != a.state.weight_id  # a different partial publication: a different identity


def test_a_bucketed_update_proves_the_same_identity_whatever_its_buckets_and_their_order():
    new = checkpoint(3)
    ids = []
    for order in (["0.weight", "0.bias", "1.weight", "1.bias"], ["1.bias", "0.weight"], ["1.weight", "0.bias"]):
        e = fingerprint_engine()
        open_bucketed(e)
        if len(order) == 2:  # two buckets of two tensors each
            buckets = [order, sorted(set(new) - set(order))]
        else:  # four buckets of one tensor
            buckets = [[n] for n in order]
        for names in buckets:
            original = loading_update(e, {n: new[n] for n in names}, UpdateWeightsFromTensorReqOutput)
            req = UpdateWeightsFromTensorReqInput(serialized_named_tensors=[], weight_version="s")
            assert publication.publish_update_from_tensor(original, e.updater, req).success
        end_bucketed(e)
        ids.append(e.state.weight_id)
    assert len(set(ids)) == 1 and ids[0] == fingerprint_engine(new).state.weight_id  # complete: a fresh start's id


def test_a_load_that_raises_gives_the_epoch_a_nonce():
    e = fingerprint_engine()

    def failing(updater, recv_req):
        def broken():
            yield "0.weight", checkpoint(5)["0.weight"]
            raise OSError("checkpoint shard unreadable")
        try:
            e.model.load_weights(broken())
        except OSError as err:  # SGLang's distributed path catches it and returns failure
            return UpdateWeightFromDiskReqOutput(success=False, message=str(err))
    out = publication.publish_update_from_disk(failing, e.updater, disk_request("x"))
    assert not out.success and e.state.weight_id.startswith("nonce:")  # partly written weights: nobody can name them
    publication.publish_update_from_disk(loading_update(e, checkpoint(0)), e.updater, disk_request("y"))
    assert e.state.weight_id == fingerprint_engine().state.weight_id  # a complete publication proves again


def test_weights_changed_where_no_tap_saw_them_get_the_fingerprint_of_the_loaded_shards():
    e = fingerprint_engine()
    first = e.state.weight_id

    def direct(updater, recv_req):  # a `direct` tensor load writes parameters without load_weights
        with torch.no_grad():
            e.model[0].weight.add_(1.0)
        updater.record_weight_version_after_update(recv_req.weight_version)
        return UpdateWeightFromDiskReqOutput(success=True, message="ok")
    publication.publish_update_from_disk(direct, e.updater, disk_request("d"))
    ident = e.state.identities[e.state.epoch].identity
    assert ident.basis == "loaded shards" and ident.weight_id != first


def test_a_label_alone_keeps_the_proven_identity():
    e = fingerprint_engine()
    first, epoch = e.state.weight_id, e.state.epoch
    e.scheduler.record_weight_version_change("relabelled")
    assert e.state.epoch == epoch + 1 and e.state.weight_id == first


def test_a_prefill_publication_crosses_requests_still_sending_kv_and_rebinds_those_awaiting_bootstrap():
    """P/D prefill role: a request whose prompt prefill computed and is still sending to decode sits only in
    `disagg_prefill_inflight_queue` (no batch holds it). It crosses the publication: when its transfer ends, SGLang's
    `release_kv_cache(checkpoint=True)` frees its old-weights KV instead of inserting it, and nothing stale stays in
    the tree. A request still waiting for decode's bootstrap holds nothing and is re-bound. Before prefill's queues
    were swept, the sent request was no holder: it inserted old-weights KV after the publication."""
    fx = build_cache("rust", 1, kv_tokens=1024)
    state = attach(fx.cache)
    sending = fx.running(state, list(range(10, 40)))
    awaiting = fx.make_req(list(range(50, 80)))
    state.admit_or_raise(awaiting)
    key_before = awaiting.extra_key
    scheduler = StubScheduler(fx, [])
    scheduler.disagg_prefill_inflight_queue = [sending]
    scheduler.disagg_prefill_bootstrap_queue = types.SimpleNamespace(queue=[awaiting])
    inv = publication_glue.bump_scheduler(scheduler, reason="update_weights_from_disk", label="B")
    assert inv.requeued_rebound == 1 and awaiting._vradix.epoch == state.epoch and awaiting.extra_key != key_before
    assert inv.crossing_requests == 1 and sending._vradix.crossed and sending.skip_radix_cache_insert
    fx.finish(sending)  # the transfer succeeded: SGLang releases the request's KV with checkpoint=True
    assert not state.crossing and fx.cache.evictable_size() + fx.cache.protected_size() == 0
    assert fx.idle_invariant_holds()


def decode_request(req, poll, promised=0):
    """SGLang's real `DecodeRequest` around `req`, with SGLang's real `FakeKVReceiver` brought to `poll` (the states a
    mooncake receiver passes through: Bootstrapping until prefill's bootstrap, WaitingForInput once the promise is
    sent and until prefill reports the KV sent, then Success) and the real `DecodePrefixMatch` of a `promised`-token
    prefix from decode's cache (the request's locked prefix, as `_match_prefix_and_lock` built it)."""
    from sglang.srt.disaggregation.base import KVPoll
    from sglang.srt.disaggregation.decode import DecodeRequest
    from sglang.srt.disaggregation.decode_hicache_mixin import DecodePrefixMatch
    from sglang.srt.disaggregation.fake.conn import FakeKVReceiver

    receiver = FakeKVReceiver(mgr=None, bootstrap_addr="127.0.0.1:8998", bootstrap_room=len(req.rid))
    if poll != KVPoll.Bootstrapping:
        receiver.init(0)
    if poll == KVPoll.Success:
        receiver.send_metadata([])
    assert receiver.poll() == poll
    match = None
    if promised:
        assert req.prefix_len == promised
        match = DecodePrefixMatch(prefix_indices=torch.zeros(promised, dtype=torch.int64), l2_host_hit_length=0,
                                  l3_storage_hit_length=0, last_device_node=req.last_node)
    return DecodeRequest(req=req, kv_receiver=receiver, prefix_match=match)


def pre_allocate(fx, req):
    """What decode's pre-allocation does before it promises prefill a prefix: match and lock the prefix, take a row,
    and allocate the slots prefill will write the rest of the prompt into (`alloc_for_decode_prealloc`)."""
    fx.admit(req)
    n = len(req.origin_input_ids)
    locs = fx._alloc(req.prefix_len, n - req.prefix_len)
    fx.req_pool.write((req.kv.req_pool_idx, slice(req.prefix_len, n)), locs.to(torch.int32))
    req.kv.kv_allocated_len = req.kv.kv_committed_len = n


def test_a_decode_publication_revokes_unfulfilled_promises_crosses_fulfilled_ones_and_rebinds_the_waiting():
    """P/D decode role, at a publication (`vradix.pd.revocation`):
    - a transfer-queue request that promised prefill a prefix of decode's cache under the old identity, and whose KV
      prefill has not reported sent (receiver WaitingForInput), is revoked: it fails with a 503 naming the
      publication and both identities, its receiver is aborted (prefill is told), and SGLang's failed-transfer path
      (its generic 500, then `release_kv_cache(checkpoint=False)`) keeps that 503 and inserts nothing;
    - a transfer-queue request whose KV prefill already sent (Success) crosses: keeps its KV, never inserts it;
    - a transfer-queue request that promised nothing from decode's cache crosses (the handshake alone decides it);
    - a prealloc-queue request (nothing matched or promised yet) is re-bound to the new namespace.
    Before revocation was built, the unfulfilled promise crossed like the others and kept its old-identity prefix."""
    from sglang.srt.disaggregation.base import KVPoll
    from sglang.srt.disaggregation.utils import prepare_abort
    from sglang.srt.managers.schedule_batch import FINISH_ABORT
    from sglang.srt.mem_cache import common

    fx = build_cache("rust", 1, kv_tokens=1024)
    state = attach(fx.cache)
    fx.finish(fx.running(state, list(range(10, 40))))  # decode's cache holds a 30-token prompt under identity A
    cached = fx.cache.evictable_size()
    old_id = state.weight_id
    unfulfilled, received = fx.make_req(list(range(10, 50))), fx.make_req(list(range(10, 45)))
    unpromised, waiting = fx.make_req(list(range(100, 130))), fx.make_req(list(range(50, 80)))
    for r in (unfulfilled, received, unpromised, waiting):
        state.admit_or_raise(r)
    for r in (unfulfilled, received, unpromised):
        pre_allocate(fx, r)
    key_before = waiting.extra_key
    scheduler = StubScheduler(fx, [])
    scheduler.disagg_decode_prealloc_queue = types.SimpleNamespace(
        queue=[decode_request(waiting, KVPoll.Bootstrapping)], pending_reqs=[], retracted_queue=[])
    transfer = [decode_request(unfulfilled, KVPoll.WaitingForInput, promised=30),
                decode_request(received, KVPoll.Success, promised=30),
                decode_request(unpromised, KVPoll.WaitingForInput)]
    scheduler.disagg_decode_transfer_queue = types.SimpleNamespace(queue=transfer, gloo_group=None)

    inv = publication_glue.bump_scheduler(scheduler, reason="update_weights_from_disk", label="B")

    assert inv.requeued_rebound == 1 and waiting._vradix.epoch == state.epoch and waiting.extra_key != key_before
    for r in (unfulfilled, received, unpromised):
        assert r._vradix.crossed and r.skip_radix_cache_insert and r._vradix.epoch == 0
    assert received.finished_reason is None and unpromised.finished_reason is None
    reason = unfulfilled.finished_reason
    assert isinstance(reason, FINISH_ABORT) and reason.status_code == 503, reason
    for part in ("promise revoked", f"epoch {state.epoch}", repr(old_id), repr(state.weight_id), "first 30 prompt"):
        assert part in reason.message, (part, reason.message)
    assert inv.promises_revoked == 1 and "1 unfulfilled P/D promise(s) revoked" in inv.summary()
    assert transfer[0].kv_receiver.poll() == KVPoll.Failed  # aborted: the mooncake receiver tells prefill here
    assert transfer[1].kv_receiver.poll() == KVPoll.Success and transfer[2].kv_receiver.poll() == KVPoll.WaitingForInput

    # SGLang's pop_transferred on the Failed receiver: its generic 500 (through the installed hook), then the release
    # without insert
    from sglang.srt.disaggregation import decode
    assert decode.prepare_abort is prepare_abort  # the reference pop_transferred calls is the hooked one
    prepare_abort(unfulfilled, "Decode transfer failed ... Aborted by AbortReq.", status_code=500)
    assert unfulfilled.finished_reason.status_code == 503 and unfulfilled.finished_reason.message == reason.message
    common.release_kv_cache(unfulfilled, fx.cache, checkpoint=False)
    assert fx.cache.evictable_size() + fx.cache.protected_size() <= cached  # nothing of it was inserted
    for r in (received, unpromised):
        fx.finish(r)  # committed and served later: crossing requests free their KV instead of inserting it
    assert not state.crossing and fx.idle_invariant_holds()

    # an abort of any other request stays SGLang's
    other = fx.make_req([1, 2, 3])
    state.admit_or_raise(other)
    prepare_abort(other, "Aborted by AbortReq.", status_code=500)
    assert other.finished_reason.status_code == 500 and other.finished_reason.message == "Aborted by AbortReq."

def test_a_restore_that_came_up_short_is_answered_503_naming_the_lost_pages():
    """SGLang's failed-transfer path, as `DecodeTransferQueue.pop_transferred` calls it when a decode HiCache restore
    came up short of its promise: its generic 500 becomes a retryable 503 that says pages were lost and keeps SGLang's
    own message; an abort without SGLang's lost-restore marker stays SGLang's."""
    from sglang.srt.disaggregation import decode
    from sglang.srt.disaggregation.utils import prepare_abort

    from vradix.pd import lost_restore

    fx = build_cache("rust", 1, kv_tokens=256)
    state = attach(fx.cache)
    short, other = fx.make_req(list(range(10, 40))), fx.make_req(list(range(50, 60)))
    for r in (short, other):
        state.admit_or_raise(r)
    sglang_message = (f"Decode transfer failed for request rank=0 decode_req.req.rid='{short.rid}' "
                      f"decode_req.req.bootstrap_room=7 {lost_restore.MARKER}")
    assert decode.prepare_abort is prepare_abort  # the reference pop_transferred calls is the hooked one
    prepare_abort(short, sglang_message, status_code=500)
    assert short.finished_reason.status_code == 503
    assert "came up short" in short.finished_reason.message and sglang_message in short.finished_reason.message
    prepare_abort(other, "Decode transfer failed ... KV transfer failed", status_code=500)
    assert other.finished_reason.status_code == 500
    assert other.finished_reason.message == "Decode transfer failed ... KV transfer failed"


# ---- one publication per entry point -------------------------------------------------------------------------------
def idle_engine():
    """The `Engine`, its request finished: an idle engine, whose flush is SGLang's own reset."""
    from vradix.testing.harness.vision import IdleStubScheduler

    e = Engine()
    e.fx.finish(e.scheduler.running[0])
    e.scheduler = e.updater.scheduler = IdleStubScheduler(e.fx)
    e.updater.flush_cache = e.scheduler.flush_cache
    return e


def treeless_engine():
    from vradix.testing.harness.vision import TreelessEngine

    return TreelessEngine()


def bucketed_of(*buckets):
    """A bucketed update with one bucket per `(update hook, output type)`."""
    def run(e):
        open_bucketed(e)
        for i, (hook, out_cls) in enumerate(buckets):
            req = (UpdateWeightsFromTensorReqInput(serialized_named_tensors=[], weight_version=f"S{i}")
                   if out_cls is UpdateWeightsFromTensorReqOutput else
                   UpdateWeightsFromDistributedReqInput(names=["w"], dtypes=["float32"], shapes=[[1]],
                                                        group_name="g", weight_version=f"S{i}"))
            assert hook(succeeding_update(e, out_cls), e.updater, req).success
        assert end_bucketed(e).success
    return run


def reset_tensors(e):
    publication.publish_weights_checker_reset(lambda updater, recv_req: None, e.updater,
                                              types.SimpleNamespace(action="reset_tensors"))


def unload_adapter(e):
    from vradix.hooks import lora

    lora.free_unloaded_adapter(types.SimpleNamespace(success=True), e.scheduler,
                               types.SimpleNamespace(lora_id="never-loaded", lora_name="a"))


#: (entry point, engine, how it is driven, epochs it advances: publications without a tree)
ENTRY_POINTS = [
    ("update_weights_from_disk", Engine, lambda e: publication.publish_update_from_disk(
        succeeding_update(e), e.updater, disk_request("B1")), 1),
    ("update_weights_from_ipc", Engine, lambda e: publication.publish_update_from_ipc(
        succeeding_update(e, UpdateWeightsFromIPCReqOutput), e.updater,
        UpdateWeightsFromIPCReqInput(zmq_handles={}, weight_version="I1")), 1),
    ("update_weights_from_tensor bucketed update", Engine, bucketed_of(
        (publication.publish_update_from_tensor, UpdateWeightsFromTensorReqOutput),
        (publication.publish_update_from_tensor, UpdateWeightsFromTensorReqOutput)), 1),
    ("update_weights_from_distributed bucketed update", Engine, bucketed_of(
        (publication.publish_update_from_distributed, UpdateWeightsFromDistributedReqOutput)), 1),
    ("P2P bucketed update", Engine, bucketed_of(), 1),
    ("update_weight_version", Engine, lambda e: e.scheduler.record_weight_version_change("B9"), 1),
    ("check_weights reset_tensors", Engine, reset_tensors, 1),
    ("without a tree: update_weights_from_disk", treeless_engine, lambda e: publication.publish_update_from_disk(
        succeeding_update(e), e.updater, disk_request("B1")), 1),
    ("without a tree: bucketed update", treeless_engine, bucketed_of(
        (publication.publish_update_from_tensor, UpdateWeightsFromTensorReqOutput)), 1),
    ("without a tree: update_weight_version", treeless_engine,
     lambda e: e.scheduler.record_weight_version_change("B9"), 1),
]


#: (operation, engine, how it is driven, epochs it advances, publications it counts): none is a publication
OTHER_OPERATIONS = [
    ("lock-aware flush", Engine, lambda e: e.scheduler.flush_cache(), 1, 0),
    ("idle flush", idle_engine, lambda e: e.scheduler.flush_cache(), 0, 0),
    ("LoRA unload", Engine, unload_adapter, 0, 0),
    ("without a tree: flush", treeless_engine, lambda e: e.scheduler.flush_cache(), 0, 0),
]


def advanced(e) -> int:
    return e.treeless.publications if hasattr(e, "treeless") else e.state.epoch


def publications(e) -> int:
    return e.treeless.publications if hasattr(e, "treeless") else e.state.publications


def counting_applies(monkeypatch) -> list:
    """The reasons `Publication.apply` is called with, from now on."""
    applied, real_apply = [], publication_glue.Publication.apply

    def counting_apply(self, reason, **kwargs):
        applied.append(reason)
        return real_apply(self, reason, **kwargs)

    monkeypatch.setattr(publication_glue.Publication, "apply", counting_apply)
    return applied


@pytest.mark.parametrize("name,make,drive,epochs", ENTRY_POINTS, ids=[p[0] for p in ENTRY_POINTS])
def test_every_entry_point_applies_its_publication_once(name, make, drive, epochs, monkeypatch):
    """Every entry point that changes the weights or their label is one `Publication`, applied exactly once (its
    epoch bump or, without a tree, its drop of the weight-derived caches), and nothing is left open on the engine
    afterwards."""
    e = make()
    applied = counting_applies(monkeypatch)
    before = advanced(e)
    drive(e)
    assert len(applied) == 1, applied
    assert advanced(e) == before + epochs
    assert publication_glue.opened(e.scheduler) is None


@pytest.mark.parametrize("name,make,drive,epochs,pubs", OTHER_OPERATIONS, ids=[p[0] for p in OTHER_OPERATIONS])
def test_a_flush_or_an_adapter_unload_is_no_publication(name, make, drive, epochs, pubs, monkeypatch):
    """A flush by itself (an idle reset, a lock-aware bump, without a tree a drop of the weight-derived caches) and an
    adapter unload are operations of their own: no `Publication` applies, no publication is counted, and nothing is
    left open on the engine afterwards."""
    e = make()
    applied = counting_applies(monkeypatch)
    before, pubs_before = (e.state.epoch if hasattr(e, "state") else 0), publications(e)
    drive(e)
    assert applied == []
    assert (e.state.epoch if hasattr(e, "state") else 0) == before + epochs
    assert publications(e) == pubs_before + pubs
    assert publication_glue.opened(e.scheduler) is None


def test_an_adapter_unload_inside_a_bucketed_update_frees_its_entries_and_leaves_the_update_open(engine):
    """Unloading an adapter while a bucketed update is open frees its entries at once and leaves the bucketed update
    open: its end still bumps, once."""
    epoch = engine.state.epoch
    open_bucketed(engine)
    unload_adapter(engine)
    assert engine.state.lora.events == 1 and engine.state.epoch == epoch
    assert publication_glue.opened(engine.scheduler).bucketed is engine.state.bucketed
    assert end_bucketed(engine).success and engine.state.epoch == epoch + 1


def test_one_update_call_stays_in_few_files(engine):
    """One successful update call (`test_successful_update_bumps_once_although_the_flush_runs`) on a plain engine
    enters at most eleven vradix files: the entry hooks (the flush's included) in `hooks/publication.py`, the sequence
    in `scheduler/publication.py`, the bump's steps (`core.epochs`, the request records of `vradix.request`, the engine
    of `vradix.engine` and the bump's record in `core.state`, the new identity and its namespace in `vradix.identity`, the deferred reclaim), the
    ledger's verdicts and audit in `ledger/guard.py` with the kernel implementation the ledger bound
    (`kernels/reference.py` on CPU: no dispatch and no setting read on the way). The steps the engine
    lacks (overlap drain, host tier, L3, streaming sessions, weight-derived caches, metrics) are never entered."""
    entered = files_entered(lambda: test_successful_update_bumps_once_although_the_flush_runs(engine))
    assert {"scheduler/publication.py", "hooks/publication.py", "ledger/guard.py", "kernels/reference.py"} <= entered
    assert not entered & {"kernels/__init__.py", "settings.py"}, sorted(entered)
    assert len(entered) <= 11, sorted(entered)
