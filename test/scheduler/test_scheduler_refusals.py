"""Safety is decided in the scheduler process: every refusal the launcher makes early is made again where the
scheduler receives the call, so a caller that bypasses the launcher's copy (a TokenizerManager without vradix, a
frontend of its own, a launch that skips `ServerArgs.check_server_args`) is refused there, and nothing changes.

Each test here runs with the launcher-side copy absent: it drives the scheduler-side path directly, on SGLang's real
`Scheduler` methods (bound to the test kit's scheduler stand-in where a real one cannot be built on CPU) and its real
request and output structs. The table of every check is in docs/fail-closed.md."""
import types
from array import array

import pytest
from sglang.srt.disaggregation.utils import DisaggregationMode
from sglang.srt.managers.io_struct import (AbortReq, ContinueGenerationReqInput, TokenizedGenerateReqInput,
                                           UpdateWeightFromDiskReqInput, UpdateWeightFromDiskReqOutput)
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.runtime_context import get_parallel
from sglang.srt.sampling.sampling_params import SamplingParams

from vradix import identity
from vradix.closed_world import unversioned
from vradix.core import staleness
from vradix.hooks import publication, serving
from vradix.pd import bootstrap, handshake, restore_policy
from vradix.testing.harness.engine import Engine, succeeding_update

# ---- launch rules: the engine does not start --------------------------------------------------------------------


def resolved_args(model, *flags, **fields):
    """SGLang's real `ServerArgs` for a CPU launch, resolved as the launcher resolves it, but never checked: the
    launcher's refusals (`ServerArgs.check_server_args` and vradix's hooks on it) did not run."""
    from sglang.srt.server_args import ServerArgs, prepare_server_args
    if fields:
        args = ServerArgs(model_path=model, device="cpu", attention_backend="torch_native", skip_tokenizer_init=True,
                          **fields)
    else:
        args = prepare_server_args(["--model-path", model, "--device", "cpu", "--attention-backend", "torch_native",
                                    "--skip-tokenizer-init", *flags])
    args.resolve_once()
    return args


def start_scheduler(server_args):
    """SGLang's real `Scheduler.__init__` (with vradix's hooks) on `server_args`; no port args: a scheduler that got
    past vradix's launch rules fails on them instead."""
    Scheduler.__new__(Scheduler).__init__(server_args, None)


def test_pipeline_parallelism_is_refused_at_launch_and_at_engine_start(models, monkeypatch):
    """PP > 1: the overlap drain does nothing there, so micro-batches launched before a publication would be
    labelled with the new weights. The launcher refuses it in SGLang's argument check, and the scheduler refuses it
    before it builds anything; both name the alternative."""
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    args = resolved_args(models[0], "--pp-size", "2")
    with pytest.raises(unversioned.UnversionedPathError, match="--pp-size above 1") as launcher:
        args.check_server_args()
    with pytest.raises(unversioned.UnversionedPathError, match="--pp-size above 1") as scheduler:
        start_scheduler(resolved_args(models[0], "--pp-size", "2"))
    for refusal in (launcher, scheduler):
        assert "--pp-size 1" in str(refusal.value) and "VRADIX_DISABLE=1" in str(refusal.value)
    resolved_args(models[0], "--pp-size", "1").check_server_args()  # one pipeline stage starts


def test_a_window_refused_at_launch_is_refused_at_engine_start(models, monkeypatch):
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    monkeypatch.setenv(staleness.ENV, "1")
    args = resolved_args(models[0], "--enable-hierarchical-cache", "--hicache-io-backend", "direct",
                         "--hicache-mem-layout", "layer_first")
    with pytest.raises(staleness.StalenessError, match="--enable-hierarchical-cache"):
        start_scheduler(args)


def decode_args(model, policy, **extra):
    return resolved_args(model, disaggregation_mode="decode", disaggregation_transfer_backend="mooncake_tcp",
                         disaggregation_decode_enable_radix_cache=True, enable_hierarchical_cache=True,
                         hicache_io_backend="direct", hicache_mem_layout="layer_first",
                         hicache_storage_prefetch_policy=policy, **extra)


def test_the_pd_launch_rules_are_refused_at_engine_start(models, monkeypatch):
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    monkeypatch.setenv(identity.ENV, "fingerprint")
    with pytest.raises(restore_policy.RestorePolicyError, match="wait_complete"):
        start_scheduler(decode_args(models[0], "best_effort", hicache_storage_backend="file"))
    monkeypatch.setenv(identity.ENV, "nonce")
    with pytest.raises(handshake.RoleIdentityError, match="decode-role engine needs a weight identity"):
        start_scheduler(decode_args(models[0], "wait_complete"))


# ---- requests: refused where the scheduler receives them, answered with HTTP 400 -------------------------------


def generate_request(rid="r1", **fields):
    """SGLang's real tokenized generate request, as a TokenizerManager sends it to a scheduler."""
    return TokenizedGenerateReqInput(rid=rid, input_text=None, input_ids=array("q", [11, 12, 13]), input_embeds=None,
                                     mm_inputs=None, token_type_ids=None, sampling_params=SamplingParams(),
                                     return_logprob=False, logprob_start_len=-1, top_logprobs_num=0,
                                     token_ids_logprob=None, stream=False, **fields)


class Receiving:
    """The engine stand-in's scheduler with SGLang's real request entry and answer methods bound to it: what it
    sends to the TokenizerManager is recorded in `sent`, what reaches SGLang's own handler in `handled`."""

    def __init__(self, engine: Engine, paused: bool = False):
        s = self.scheduler = engine.scheduler
        self.sent, self.handled = [], []
        s.rust_server = None
        s.ipc_channels = types.SimpleNamespace(send_to_tokenizer=types.SimpleNamespace(
            send_output=lambda out, recv: self.sent.append(out)))
        s.send_abort_output = types.MethodType(Scheduler.send_abort_output, s)
        s._engine_paused = paused
        s._handle_generate_request = lambda recv_req, *args, **kwargs: self.handled.append(recv_req.rid)

    def generate(self, recv_req) -> None:
        """A request arriving at the scheduler: SGLang's real `Scheduler.handle_generate_request` (with vradix's
        hooks); what it hands on to its request builder (which needs a model) is recorded in `handled`."""
        Scheduler.handle_generate_request(self.scheduler, recv_req)

    def refusals(self) -> list:
        return [out for out in self.sent if isinstance(out, AbortReq)]


def begin(engine):
    """`/begin_weight_update` reaching the scheduler: SGLang's begin body (here: the bucketed update opens) through
    vradix's hook."""
    def original(updater, recv_req):
        updater._session = "open"
        return types.SimpleNamespace(success=True, message="Success")
    return publication.open_bucketed_update(original, engine.updater, None)


def end(engine):
    def original(updater, recv_req):
        updater._session = None
        return types.SimpleNamespace(success=True, message="Success")
    return publication.publish_on_bucketed_update_end(original, engine.updater, None)


def test_a_bucketed_update_the_launcher_did_not_hold_pauses_the_scheduler_and_refuses_new_requests():
    """Without the launcher's hold (its TokenizerManager runs unpaused, under its model-update lock), the scheduler
    pauses itself in place at begin: nothing runs a forward on half-written weights. A request that arrives during
    the bucketed update is answered at once with HTTP 400 naming end_weight_update, never held (held, it would keep the
    TokenizerManager's next bucket waiting for it forever); at end the scheduler resumes itself."""
    engine = Engine()
    r = Receiving(engine)
    epoch = engine.state.epoch
    assert begin(engine).success
    assert r.scheduler._engine_paused
    r.generate(generate_request("during"))
    (refused,) = r.refusals()
    assert refused.rid == "during" and refused.finished_reason["status_code"] == 400
    assert "end_weight_update" in refused.finished_reason["message"]
    assert r.handled == [] and r.scheduler.waiting_queue == []  # nothing queued, nothing changed
    assert engine.state.epoch == epoch
    end(engine)
    assert not r.scheduler._engine_paused and engine.state.epoch == epoch + 1
    r.generate(generate_request("after"))
    assert r.handled == ["after"] and len(r.refusals()) == 1


def test_a_bucketed_update_the_launcher_held_stays_the_launchers_and_queues_as_stock():
    """With the launcher's hold (generation paused in place before begin), requests that still reach the scheduler
    wait in the queue as in stock SGLang, and the scheduler leaves the resume to whoever paused."""
    engine = Engine()
    r = Receiving(engine, paused=True)
    assert begin(engine).success
    r.generate(generate_request("during"))
    assert r.handled == ["during"] and r.refusals() == []
    end(engine)
    assert r.scheduler._engine_paused  # the holder resumes it


def test_a_continue_inside_a_held_bucketed_update_is_deferred_to_its_end_and_new_requests_are_refused():
    """A continue_generation that bypassed the launcher's refusal un-pauses its TokenizerManager, so its requests
    would reach a paused scheduler: the scheduler keeps generation paused, takes the hold over (new requests are
    refused) and resumes at the bucketed update's end, as the continue asked."""
    engine = Engine()
    r = Receiving(engine, paused=True)
    assert begin(engine).success
    r.scheduler.continue_generation(ContinueGenerationReqInput(torch_empty_cache=False))
    assert r.scheduler._engine_paused
    r.generate(generate_request("during"))
    assert [a.rid for a in r.refusals()] == ["during"] and r.handled == []
    end(engine)
    assert not r.scheduler._engine_paused


def test_a_decode_request_without_bootstrap_fields_is_refused_by_the_decode_scheduler():
    """The decode scheduler answers the request with HTTP 400 naming the fields, before SGLang's handler (which
    would stop the engine building the peer's address from a missing host)."""
    engine = Engine()
    r = Receiving(engine)
    r.scheduler.disaggregation_mode = DisaggregationMode.DECODE
    r.generate(generate_request("no-host", bootstrap_room=7))
    (refused,) = r.refusals()
    assert refused.finished_reason["status_code"] == 400 and "bootstrap_host is missing" in \
        refused.finished_reason["message"]
    assert r.handled == []
    r.generate(generate_request("routed", bootstrap_host="127.0.0.1", bootstrap_port=8998, bootstrap_room=7))
    r.generate(generate_request("probe", bootstrap_host=bootstrap.FAKE_BOOTSTRAP_HOST, bootstrap_room=0))
    assert r.handled == ["routed", "probe"] and len(r.refusals()) == 1
    r.scheduler.disaggregation_mode = DisaggregationMode.NULL
    r.generate(generate_request("plain"))
    assert r.handled[-1] == "plain"


def test_a_bound_above_the_window_is_refused_at_admission(monkeypatch):
    """The scheduler's admission stamp aborts the request with HTTP 400 (SGLang answers it without running it
    past one token) and binds it to nothing older."""
    engine = Engine()
    req = engine.fx.make_req(list(range(50, 60)))
    req.sampling_params.custom_params = {staleness.PARAM: 3}
    with get_parallel().override(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1):  # what SGLang's abort reads
        serving.admit(engine.scheduler, req)
    assert req.to_finish is not None and req.to_finish.status_code == 400
    assert "exceeds this server's window" in req.to_finish.message


# ---- control calls: SGLang's failure reply, nothing changed ------------------------------------------------------


@pytest.mark.parametrize("fields, named", [
    ({"model_path": ""}, "model_path is empty"),
    ({"model_path": "/weights/B", "abort_all_requests": "yes"}, "abort_all_requests='yes'"),
    ({"model_path": "/weights/B", "load_format": "no-such-format"}, "load_format 'no-such-format'"),
    ({"model_path": "/weights/B", "weight_version": ""}, "empty string"),
    ({"model_path": "/weights/B", "weight_version": "a\nb"}, "control characters"),
])
def test_a_malformed_disk_update_is_refused_by_the_scheduler_and_loads_nothing(fields, named):
    engine = Engine()
    before = engine.counters()
    out = publication.publish_update_from_disk(succeeding_update(engine), engine.updater,
                                               UpdateWeightFromDiskReqInput(**fields))
    assert isinstance(out, UpdateWeightFromDiskReqOutput) and not out.success and named in out.message, out.message
    assert engine.touched == 0 and engine.counters() == before


@pytest.mark.parametrize("label", ["", "x" * 1000, "a\nb"])
def test_a_bad_version_label_is_refused_by_the_scheduler_and_the_label_stays(label):
    from vradix.core.epochs import current_label
    engine = Engine()
    before, label_before = engine.counters(), current_label()
    engine.scheduler.record_weight_version_change(label)  # SGLang's handler of /update_weight_version
    assert current_label() == label_before and engine.counters() == before


def test_a_reused_declared_label_is_refused_by_the_scheduler_and_the_label_stays(monkeypatch):
    from vradix.core.epochs import current_label
    engine = Engine()
    engine.state.identity_mode = "declared"
    engine.scheduler.record_weight_version_change("run1-step1")
    engine.scheduler.record_weight_version_change("run1-step2")
    before = engine.counters()
    engine.scheduler.record_weight_version_change("run1-step1")
    assert current_label() == "run1-step2" and engine.counters() == before
