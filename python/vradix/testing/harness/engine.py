"""A publication-hook test engine: vradix's weight-update hook bodies (`vradix.hooks.publication`) called as the
HookRegistry calls them, on a real SGLang UnifiedRadixCache (real pools, a real Req holding KV) and a real
`SchedulerWeightUpdaterManager`.

Stand-ins (where a real object cannot be built on CPU without a launched engine):
- `StubScheduler` (the fixture's `SchedulerView` plus four bound methods) exposes only the attributes the hooks and
  SGLang's own `Scheduler.flush_cache` / `record_weight_version_change` / `pause_generation` / `continue_generation`
  read; those four are SGLang's real (hooked) methods, bound to it;
- the updater is SGLang's real class, built without `__post_init__` (which needs an initialized TP process group),
  its `flush_cache` bound to the real hooked `Scheduler.flush_cache`, its TP worker serving no model runner (a test
  that needs one serves it, e.g. `test_weight_derived.serving_runners`);
- each `original` plays SGLang's update body: it calls the updater's real `record_weight_version_after_update` and
  `flush_cache_after_weight_update`, or raises after "touching weights".

In fingerprint mode (`fingerprint_engine`) the model is `TinyModel`, a two-layer torch model with SGLang's
`load_weights` interface, started through SGLang's real `load_weights_only` as the startup hook taps it.
"""
from __future__ import annotations

import os
import types
from unittest import mock

import torch

from sglang.srt.managers.io_struct import (UpdateWeightFromDiskReqInput, UpdateWeightFromDiskReqOutput,
                                           UpdateWeightsFromTensorReqInput, UpdateWeightsFromTensorReqOutput)
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.managers.scheduler_components.weight_updater import SchedulerWeightUpdaterManager

from vradix.engine import attach
from vradix.hooks import publication
from vradix.scheduler import identity_proof
from vradix.scheduler.publication import install_steps
from vradix.testing.harness.cache_fixture import SchedulerView, build_cache


class StubScheduler(SchedulerView):
    """The fixture's scheduler view, plus what the publication hooks and SGLang's flush / relabel bodies read (see
    module doc)."""

    def __init__(self, fx, live, multimodal: bool = False):
        super().__init__(fx, running=live)
        self.hisparse_coordinator, self.enable_overlap = None, False
        self.model_config = types.SimpleNamespace(is_multimodal=multimodal)
        self.flush_cache = types.MethodType(Scheduler.flush_cache, self)
        self.record_weight_version_change = types.MethodType(Scheduler.record_weight_version_change, self)
        # SGLang's in-place pause and its continue (a bucketed update the launcher did not hold pauses the scheduler
        # itself)
        self.disagg_decode_prealloc_queue, self._pause_started_at = None, None
        self._pause_intervals: list[tuple[float, float]] = []
        self.pause_generation = types.MethodType(Scheduler.pause_generation, self)
        self.continue_generation = types.MethodType(Scheduler.continue_generation, self)


class Engine:
    """A Rust-core cache (1024 tokens, page size 1) with vradix attached and one running request holding KV, its
    `StubScheduler` and a real updater (see module doc); `touched` counts the update bodies that touched weights. It
    plays a plain engine: a text-only model (`multimodal` for one that fills the multimodal embedding cache), no
    overlap scheduler, no streaming sessions, no metrics."""

    def __init__(self, multimodal: bool = False):
        self.fx = build_cache("rust", 1, kv_tokens=1024)
        self.state = attach(self.fx.cache, streaming_sessions=False)  # started without --enable-streaming-session
        req = self.fx.make_req(list(range(10, 40)))
        self.state.admit_or_raise(req)
        self.fx.admit(req)
        self.fx.prefill(req)  # a running request holding KV: a flush now would be a lock-aware bump
        self.scheduler = StubScheduler(self.fx, [req], multimodal)
        install_steps(self.scheduler)  # as vradix's startup does, once the scheduler is built
        self.updater = updater_for(self.scheduler)
        self.touched = 0

    def counters(self):
        return self.state.epoch, self.state.publications, self.state.flushes


def updater_for(scheduler) -> SchedulerWeightUpdaterManager:
    """SGLang's real weight updater, built without `__init__` (it needs a model runner) around `scheduler`: no bucketed
    update open, no metrics, no draft worker, no runner to load into."""
    u = SchedulerWeightUpdaterManager.__new__(SchedulerWeightUpdaterManager)
    u.scheduler, u._session, u.metrics_collector = scheduler, None, None
    u.flush_cache = scheduler.flush_cache
    u.tp_worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(model_config=None),
                                        weight_update_runners=lambda: [])
    u.draft_worker = None
    return u


def disk_request(label, **kw):
    """An `/update_weights_from_disk` request for model B labelled `label`."""
    return UpdateWeightFromDiskReqInput(model_path="/weights/B", weight_version=label, **kw)


def succeeding_update(engine, out_cls=UpdateWeightFromDiskReqOutput):
    """SGLang's success path of an update call: weights loaded, version recorded, then the flush it asks for."""
    def original(updater, recv_req):
        engine.touched += 1
        updater.record_weight_version_after_update(recv_req.weight_version)
        ok, msg = updater.flush_cache_after_weight_update(recv_req, True, "Succeeded to update model weights.")
        return out_cls(success=ok, message=msg)
    return original


def tensor_bucket(engine, label, success=True):
    """One `/update_weights_from_tensor` bucket labelled `label`: (SGLang's update body, its request)."""
    def original(updater, recv_req):
        engine.touched += 1
        if success:
            updater.record_weight_version_after_update(recv_req.weight_version)
            ok, msg = updater.flush_cache_after_weight_update(recv_req, True, "Success")
            return UpdateWeightsFromTensorReqOutput(success=ok, message=msg)
        return UpdateWeightsFromTensorReqOutput(success=False, message="bad bucket")
    return original, UpdateWeightsFromTensorReqInput(serialized_named_tensors=[], weight_version=label)


def open_bucketed(engine):
    """`/begin_weight_update` through vradix's hook."""
    def begin(updater, recv_req):
        updater._session = "open"
        return types.SimpleNamespace(success=True, message="Success")
    publication.open_bucketed_update(begin, engine.updater, None)


def end_bucketed(engine):
    """`/end_weight_update` through vradix's hook: the bucketed update's one publication."""
    def end(updater, recv_req):
        updater._session = None
        return types.SimpleNamespace(success=True, message="Success")
    return publication.publish_on_bucketed_update_end(end, engine.updater, None)


class TinyModel(torch.nn.Sequential):
    """A model with SGLang's loading interface: `load_weights` copies named tensors into its parameters."""

    def load_weights(self, weights):
        params = dict(self.named_parameters())
        for name, tensor in weights:
            params[name].data.copy_(tensor)


def checkpoint(seed):
    """`TinyModel`'s named tensors, drawn from `seed`."""
    g = torch.Generator().manual_seed(seed)
    return {"0.weight": torch.randn(8, 8, generator=g), "0.bias": torch.randn(8, generator=g),
            "1.weight": torch.randn(4, 8, generator=g), "1.bias": torch.randn(4, generator=g)}


def fingerprint_engine(weights=None):
    """An engine in fingerprint mode whose model was started through SGLang's real `load_weights_only`, tapped by
    the startup hook."""
    from sglang.srt.model_loader.loader import DefaultModelLoader

    from vradix.hooks import startup

    e = Engine()
    e.state.identity_mode = "fingerprint"
    e.model = TinyModel(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    with mock.patch.dict(os.environ, {"VRADIX_WEIGHT_IDENTITY": "fingerprint"}):
        startup.tap_startup_load(DefaultModelLoader.load_weights_only, e.model,
                                 iter((weights or checkpoint(0)).items()), torch.device("cpu"))
    e.scheduler.tp_worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(model=e.model))
    start = identity_proof.published_identity(e.scheduler, e.state.nonces.for_epoch(0))
    e.state.identities.clear()
    e.state.bind_identity(e.state.epoch, start)
    return e


def loading_update(engine, named, label_out=UpdateWeightFromDiskReqOutput):
    """SGLang's success path of an update call that loads `named` through the model's `load_weights`."""
    def original(updater, recv_req):
        engine.model.load_weights(iter(named.items()))
        updater.record_weight_version_after_update(recv_req.weight_version)
        ok, msg = updater.flush_cache_after_weight_update(recv_req, True, "Succeeded to update model weights.")
        return label_out(success=ok, message=msg)
    return original
