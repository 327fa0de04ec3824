"""The escape watch, a test mode (`vradix_census.watch`, `VRADIX_CENSUS=1`, on in the whole suite through
test/conftest.py: `vradix.plugin` installed its hooks in this process), and the event loops a publication can treat
(`vradix.closed_world.loops`).

Real SGLang objects throughout: a real UnifiedRadixCache with its pools, real `Req`s holding KV (admitted, prefilled
and checkpointed as the scheduler does), real `ScheduleBatch`es, SGLang's real `Scheduler.collect_inflight_reqs`
under a real pipeline-parallel context (`get_parallel().override`), SGLang's real weight-update manager through the
publication hook. The scheduler is the fixture's `SchedulerView` (`vradix.testing.harness.engine.StubScheduler`): a real
`Scheduler` needs a model runner that cannot be built on CPU in-process; the CPU servers of test/e2e run the watch
on the real one (`test_e2e_server.py::test_vradix_publication_never_reuses_stale_prefix` checks it ran).
"""
import types

import pytest
import torch
from sglang.srt.managers.io_struct import CheckWeightsReqInput, CheckWeightsReqOutput
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.runtime_context import get_parallel
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from vradix import request
from vradix.closed_world import loops
from vradix.engine import attach
from vradix import plugin
from vradix.hooks import publication
from vradix.hooks.startup import attach_to_scheduler
from vradix.scheduler import publication as publication_glue
from vradix.scheduler.publication import live_requests
from vradix.testing.harness.cache_fixture import build_cache
from vradix.testing.harness.engine import (Engine, StubScheduler, TinyModel, checkpoint, disk_request,
                                           fingerprint_engine, loading_update)
from vradix_census import watch


def test_the_suite_runs_with_the_escape_watch_installed():
    """The plugin installed every hook of the watch in this process (the suite sets `VRADIX_CENSUS`), after vradix's
    own on the same targets."""
    assert plugin.installed()
    missing = [target for target, _, hook in watch.HOOKS if not plugin.is_installed(target, hook)]
    assert not missing, missing
    assert publication_glue.bump_scheduler is not publication_glue.bump_scheduler.__wrapped__


class Held:
    """A scheduler over a real cache with one running request holding KV (`held`) and one queued request holding
    nothing (`queued`), both admitted by vradix."""

    def __init__(self):
        self.fx = build_cache("rust", 1, kv_tokens=1024)
        self.state = attach(self.fx.cache)
        self.held = self.fx.running(self.state, range(10, 40))
        self.queued = self.fx.make_req(range(50, 60))
        self.state.admit_or_raise(self.queued)
        self.scheduler = StubScheduler(self.fx, [self.held])
        self.scheduler.waiting_queue = [self.queued]
        self.scheduler.running_batch = self.batch([self.held])  # where SGLang keeps a running request
        assert watch.attach(self.scheduler) is watch.of(self.scheduler)

    def holder(self, tokens) -> "object":
        """Another request holding KV (a row, a lock, computed and checkpointed KV)."""
        return self.fx.running(self.state, tokens)

    def batch(self, reqs) -> ScheduleBatch:
        """SGLang's `ScheduleBatch` over `reqs`, as `ScheduleBatch.init_new` builds it for the scheduler."""
        model_config = types.SimpleNamespace(vocab_size=1000, is_encoder_decoder=False, hf_text_config=None)
        return ScheduleBatch.init_new(list(reqs), self.fx.req_pool, self.fx.allocator, self.fx.cache, model_config,
                                      False, SpeculativeAlgorithm.NONE)

    def publish(self):
        return publication_glue.bump_scheduler(self.scheduler, reason="test publication", label="v2")


# ---- 1. the request check ---------------------------------------------------------------------------------------------
def test_the_request_check_passes_when_every_held_request_crosses_the_bump():
    h = Held()
    h.publish()
    assert watch.of(h.scheduler).bumps_checked == 1
    assert request.of(h.held).crossed and h.held.skip_radix_cache_insert
    assert request.of(h.queued).epoch == h.state.epoch  # re-bound: it holds nothing, so it is not a holder
    found, _, complete = watch.find_requests(h.scheduler)
    assert complete and {req.rid: path for path, req in found.values()} == {
        h.held.rid: "scheduler.running[0]", h.queued.rid: "scheduler.waiting_queue[0]"}  # shortest paths


def test_a_finished_request_that_still_holds_kv_passes():
    """A request finished (a revoked promise, an abort) whose release has not run yet is treated: it never inserts."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    h = Held()
    done = h.holder(range(70, 90))
    done.finished_reason = FINISH_ABORT("aborted")
    h.scheduler.aborted = [done]
    h.publish()
    assert not request.of(done).crossed and watch.of(h.scheduler).bumps_checked == 1


def test_the_request_check_fails_on_a_held_request_live_requests_misses():
    """A request holding KV kept where `live_requests` does not read (here pdmux's split prefill batch, the
    attribute `event_loop_pdmux` keeps it in) is not marked crossing by the bump: it would insert old-weights KV. The
    watch names where it found it."""
    h = Held()
    hidden = h.holder(range(100, 130))
    h.scheduler.split_prefill_batch = h.batch([hidden])
    assert hidden not in live_requests(h.scheduler)
    with pytest.raises(watch.EscapeViolation) as e:
        h.publish()
    message = str(e.value)
    assert message.startswith(watch.MARKER)
    assert f"rid {hidden.rid!r} at scheduler.split_prefill_batch.reqs[0]" in message
    assert "missed by live_requests" in message and h.held.rid not in message
    assert not request.of(hidden).crossed and h.state.epoch == 1  # the bump ran; the watch caught what it missed


def test_the_walk_reads_attributes_only_and_reaches_nested_containers():
    """Dicts (values and keys), sets, deques and dataclasses are walked; properties and methods are never called;
    a request is found once, by its shortest path; an unadmitted holder is named so."""
    import collections
    import dataclasses

    h = Held()
    deep = h.fx.make_req(range(200, 210))
    h.state.admit_or_raise(deep)
    h.fx.admit(deep)
    del deep._vradix  # holds a row and a lock, as a request vradix never admitted would

    @dataclasses.dataclass
    class Box:
        inner: dict

    class Trap:
        @property
        def boom(self):
            raise AssertionError("the walk called a property")

    h.scheduler.manager = types.SimpleNamespace(box=Box({"k": collections.deque([{deep}])}))
    h.scheduler.vradix_trap = Trap()
    h.scheduler.alias = [h.held]
    found, _, _ = watch.find_requests(h.scheduler)
    paths = {req.rid: path for path, req in found.values()}
    assert paths[h.held.rid] in ("scheduler.alias[0]", "scheduler.running[0]")
    # SimpleNamespace is not SGLang's or vradix's: the walk does not enter third-party objects
    assert deep.rid not in paths
    h.scheduler.manager = Box({"k": collections.deque([{deep}])})
    found, _, _ = watch.find_requests(h.scheduler)
    assert {req.rid: path for path, req in found.values()}[deep.rid] == "scheduler.manager.inner['k'][0][member]"
    with pytest.raises(watch.EscapeViolation, match="never admitted by vradix"):
        h.publish()


# ---- 2. the weight check ----------------------------------------------------------------------------------------------
def served(engine, model):
    engine.scheduler.tp_worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(model=model))
    watch.attach(engine.scheduler)
    return engine.scheduler


def test_the_weight_check_passes_across_a_publication_and_fails_on_a_write_without_one():
    """Through SGLang's real update manager and the publication hook: an update that loads new tensors into the
    model bumps, and the watch records what it published; a write into a parameter without a publication fails
    the next forward, naming the parameter and the control requests answered since the publication."""
    e = fingerprint_engine()
    scheduler = served(e, e.model)
    watch.check_weights_before_forward(scheduler, None)
    out = publication.publish_update_from_disk(loading_update(e, checkpoint(1)), e.updater, disk_request("B1"))
    assert out.success
    watch.check_weights_before_forward(scheduler, None)  # the published weights: no failure
    assert watch.of(scheduler).recorded_at.startswith("the publication to epoch")
    check = CheckWeightsReqInput(action="reset_tensors")
    watch.note_control_request(scheduler, CheckWeightsReqOutput(success=True, message=""), check)
    with torch.no_grad():
        e.model[1].bias.add_(1.0)  # what a writer that bypasses every publication does
    with pytest.raises(watch.EscapeViolation) as err:
        watch.check_weights_before_forward(scheduler, None)
    message = str(err.value)
    assert message.startswith(watch.MARKER) and "parameter 1.bias was written in place" in message
    assert "CheckWeightsReqInput(action='reset_tensors')" in message and "the publication to epoch" in message
    assert watch.of(scheduler).forwards_checked == 3


def test_a_parameter_moved_to_another_storage_without_a_publication_fails():
    e = Engine()
    model = TinyModel(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    scheduler = served(e, model)
    watch.of(scheduler).check_weights(scheduler)
    model[0].weight.data = model[0].weight.data.clone()  # equal values, new storage
    with pytest.raises(watch.EscapeViolation, match="parameter 0.weight moved to another storage"):
        watch.of(scheduler).check_weights(scheduler)


def test_a_lock_aware_flush_is_no_publication_for_the_weight_check():
    """A bump that is not a publication (a lock-aware flush keeps the weights) does not record them: a write before
    it still fails the next forward."""
    e = Engine()
    model = TinyModel(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    scheduler = served(e, model)
    with torch.no_grad():
        model[0].weight.mul_(2.0)
    publication_glue.bump_scheduler(scheduler, reason="lock-aware flush", is_publication=False)
    with pytest.raises(watch.EscapeViolation, match="0.weight was written in place"):
        watch.of(scheduler).check_weights(scheduler)


# ---- 3. event loops --------------------------------------------------------------------------------------------------
def pipeline_view(h: Held, microbatches):
    """The scheduler state `event_loop_pp` keeps (one `ScheduleBatch` per micro-batch in `mbs`, `last_mbs` the same
    batches once processed, `running_mbs` each micro-batch's running batch), read by SGLang's real
    `Scheduler.collect_inflight_reqs`."""
    s = h.scheduler
    s.mbs = [h.batch(reqs) for reqs in microbatches]
    s.last_mbs = list(s.mbs)
    s.running_mbs = [h.batch([]) for _ in microbatches]
    s.running_mbs[0] = h.batch([h.held])
    s.last_batch, s.enable_continuous_input_polling, s.result_queue = None, False, None
    s.collect_inflight_reqs = types.MethodType(Scheduler.collect_inflight_reqs, s)
    s._collect_inflight_batches = types.MethodType(Scheduler._collect_inflight_batches, s)
    s.running = []  # only SGLang's own collect_inflight_reqs names the in-flight requests now
    return s


def test_pipeline_parallel_micro_batches_are_live_and_cross_a_publication():
    """The pipeline-parallel loops keep each micro-batch's requests in `mbs`/`running_mbs`, which SGLang's
    `collect_inflight_reqs` reads when `pp_size` > 1: every holder the watch's walk finds there crosses the bump. With
    `pp_size` 1 the same state is read as the normal loop's, and the watch names every micro-batch holder missed."""
    h = Held()
    a, b = h.holder(range(300, 320)), h.holder(range(400, 420))
    pipeline_view(h, [[a], [b]])
    with get_parallel().override(pp_size=1):
        with pytest.raises(watch.EscapeViolation) as e:
            publication_glue.bump_scheduler(h.scheduler, reason="publication", label="v2")
    assert "scheduler.mbs[0].reqs[0]" in str(e.value) and "scheduler.mbs[1].reqs[0]" in str(e.value)

    h = Held()
    a, b = h.holder(range(300, 320)), h.holder(range(400, 420))
    s = pipeline_view(h, [[a], [b]])
    with get_parallel().override(pp_size=2):
        assert {h.held, a, b} <= live_requests(s)
        publication_glue.bump_scheduler(s, reason="publication", label="v2")
    assert all(request.of(r).crossed for r in (h.held, a, b))
    assert watch.of(s).bumps_checked == 1


@pytest.mark.parametrize("flag,attribute,alternative", [
    ("--enable-pdmux", "enable_pdmux", "the default scheduler loop (without --enable-pdmux)"),
    ("SGLANG_USE_MLX=1 with the overlap schedule", "enable_overlap_mlx", "--disable-overlap-schedule"),
])
def test_a_loop_a_publication_cannot_treat_is_refused_at_engine_start(flag, attribute, alternative):
    """`Scheduler._dispatch_event_loop_once` selects the loop from these scheduler attributes; the scheduler start
    (`hooks.startup.attach_to_scheduler`) refuses it, naming the flag and the alternative, before the tree is
    versioned."""
    cache = build_cache().cache
    with pytest.raises(loops.UnservedLoopError) as e:
        attach_to_scheduler(None, types.SimpleNamespace(tree_cache=cache, **{attribute: True}))
    assert flag in str(e.value) and alternative in str(e.value)
    assert getattr(cache, "_vradix", None) is None
