"""Weight-derived state outside the KV cache (issue 20, holes 6 and 7), at cache level on SGLang's real objects:

- the interpolated position-embedding grids of SGLang's real MoonViT (`Learnable2DInterpPosEmb`) and PaddleOCR-VL
  (`SiglipVisionEmbeddings`) modules are dropped at a publication, so the next forward interpolates the new weights;
- with the radix cache off (SGLang's real UnifiedRadixCache built with `disable=True`, as `--disable-radix-cache`
  builds it) every publication path and `/flush_cache` still drop the multimodal embedding cache and the grids, once
  per publication (the E2E counterpart is `test_e2e_multimodal.py`);
- EPD flags (`--encoder-only`, `--language-only`, `--enable-mm-global-cache`) stop the launch in SGLang's own
  `check_server_args`, with the error naming the flag and the alternative;
- a `load_format="direct"` tensor update of a model that derives weights after loading (SGLang's real
  `DeepseekV2ForCausalLM` class: MLA `w_kc`/`w_vc`) is refused before any tensor is loaded;
- an IPC update whose SGLang post-hook fails (SGLang only logs a warning) is a failed update, not a publication.

Stand-ins: the scheduler and updater of `test_publication_hooks` (see there); a model runner holding the model; for
the IPC path, the external `checkpoint_engine.worker` (it delivers tensors over CUDA IPC, which CPU has not: here it
delivers no bucket and calls SGLang's real post-hook, as it does after its last bucket) and the device UUID.
"""
import dataclasses
import sys
import types

import pytest
import torch
from sglang.srt.managers import mm_schedule
from sglang.srt.managers.io_struct import (UpdateWeightsFromIPCReqInput, UpdateWeightsFromTensorReqInput,
                                           UpdateWeightsFromTensorReqOutput)
from sglang.srt.managers.scheduler_components.weight_updater import SchedulerWeightUpdaterManager
from sglang.srt.mem_cache.multimodal_cache import EmbeddingResult
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from test_publication_hooks import (Engine, StubScheduler, disk_request, end_session, open_session,
                                    succeeding_update, tensor_bucket)
from vradix import epd, weight_derived
from vradix.hooks import publication, reclaim
from vradix.state import attach_treeless
from vradix.testing.cache_fixture import build_cache

GRID = (3, 5)  # not the stored 4x4 grid: MoonViT interpolates (and memoises) only for other grids


def vision_tower():
    """SGLang's real MoonViT and PaddleOCR-VL position-embedding modules, in one module tree, in eval mode."""
    from sglang.srt.models.kimi_vl_moonvit import Learnable2DInterpPosEmb
    from sglang.srt.models.paddleocr_vl import SiglipVisionEmbeddings
    tower = torch.nn.Module()
    tower.moonvit = Learnable2DInterpPosEmb(4, 4, 8)
    tower.paddle = SiglipVisionEmbeddings(types.SimpleNamespace(hidden_size=8, image_size=8, patch_size=2,
                                                                num_channels=3))
    return tower.eval()


def grids(tower):
    """What the tower's position grids give for GRID now (filling their memos)."""
    x = torch.zeros(GRID[0] * GRID[1], 8)
    return tower.moonvit(x, torch.tensor([GRID])), tower.paddle.fetch_position_embedding_lfu_cache(*GRID)


def load_new_weights(tower, seed):
    """What an in-place update does to these modules: new values copied into the same parameters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (tower.moonvit.weight, tower.paddle.position_embedding.weight):
            p.copy_(torch.randn(p.shape, generator=g))


def fresh_grids(tower):
    """The oracle: what freshly built modules holding the tower's current weights give for GRID."""
    fresh = vision_tower()
    fresh.load_state_dict(tower.state_dict())
    return grids(fresh)


def serve(scheduler, model):
    scheduler.tp_worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(model=model))


@pytest.fixture
def mm_cache(monkeypatch):
    monkeypatch.setattr(mm_schedule, "embedding_cache", None)
    mm_schedule.init_mm_embedding_cache(1 << 20)
    cache = mm_schedule.embedding_cache
    assert cache.set(7, EmbeddingResult(embedding=torch.ones(4, 8)))
    return cache


def test_a_publication_recomputes_vision_position_grids():
    engine, tower = Engine(), vision_tower()
    serve(engine.scheduler, tower)
    old = grids(tower)
    load_new_weights(tower, seed=3)
    publication.publish_update_from_disk(succeeding_update(engine), engine.updater, disk_request("B1"))
    new = grids(tower)
    for got, want, before in zip(new, fresh_grids(tower), old):
        assert torch.equal(got, want), "a position grid interpolated from the old weights was reused"
        assert not torch.equal(got, before)
    assert engine.state.last_publication.position_grids_cleared == 2


def test_grid_memos_are_found_only_on_sglangs_own_classes():
    tower = vision_tower()
    grids(tower)
    assert len(weight_derived.position_grid_memos(tower)) == 2
    assert weight_derived.position_grid_memos(torch.nn.Linear(2, 2)) == []
    assert weight_derived.clear_position_grids(tower) == 2 and weight_derived.clear_position_grids(tower) == 0
    assert tower.paddle.cache_position_count == {}


# ---- no radix cache ------------------------------------------------------------------------------------------------


class IdleStubScheduler(StubScheduler):
    """The stand-in scheduler, idle, with what SGLang's own idle `Scheduler.flush_cache` resets besides the (real)
    cache and pools: the grammar manager, the metrics reporter, no draft worker."""

    def __init__(self, fx):
        super().__init__(fx, [])
        self.token_to_kv_pool_allocator, self.draft_worker = fx.allocator, None
        self.grammar_manager = types.SimpleNamespace(clear=lambda: None)
        self.metrics_reporter = types.SimpleNamespace(reset_metrics=lambda: None, is_stats_logging_rank=False)


class TreelessEngine(Engine):
    """An engine started with --disable-radix-cache: SGLang's real UnifiedRadixCache with `disable=True` (no prefix
    sharing), idle, serving the vision tower; vradix attached as `attach_to_scheduler` attaches it there."""

    def __init__(self):
        fx = build_cache("rust", 1, kv_tokens=1024)
        fx = dataclasses.replace(fx, cache=UnifiedRadixCache(dataclasses.replace(fx.cache.cache_init_params,
                                                                                 disable=True)))
        assert not fx.cache.supports_prefix_sharing()
        self.fx, self.treeless = fx, attach_treeless(fx.cache)
        self.scheduler = IdleStubScheduler(fx)
        u = SchedulerWeightUpdaterManager.__new__(SchedulerWeightUpdaterManager)
        u.scheduler, u._session, u.metrics_collector = self.scheduler, None, None
        u.flush_cache = self.scheduler.flush_cache
        u.tp_worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(model_config=None))
        self.updater, self.touched = u, 0
        self.tower = vision_tower()
        serve(self.scheduler, self.tower)


def filled(engine, mm_cache):
    assert mm_cache.set(8, EmbeddingResult(embedding=torch.ones(2, 8)))
    grids(engine.tower)
    return len(mm_cache)


def assert_dropped(engine, mm_cache, entries, reason):
    assert len(mm_cache) == 0 and weight_derived.position_grid_memos(engine.tower)[0][0] == {}
    assert engine.treeless.last == {"reason": reason, "label": engine.treeless.last["label"],
                                    "mm_embeddings_cleared": entries, "position_grids_cleared": 2}


def test_without_radix_cache_a_disk_update_drops_the_weight_derived_caches_once(mm_cache):
    engine = TreelessEngine()
    entries = filled(engine, mm_cache)
    out = publication.publish_update_from_disk(succeeding_update(engine), engine.updater, disk_request("B1"))
    assert out.success and "without a radix cache: 2 multimodal embedding(s)" in out.message
    assert engine.treeless.publications == 1  # the label change and the flush inside the call did not count again
    assert_dropped(engine, mm_cache, entries, "update_weights_from_disk")
    assert engine.treeless.last_publication["label"] == "B1"


def test_without_radix_cache_a_session_drops_them_once_at_its_end(mm_cache):
    engine = TreelessEngine()
    entries = filled(engine, mm_cache)
    open_session(engine)
    original, req = tensor_bucket(engine, "B0")
    assert publication.publish_update_from_tensor(original, engine.updater, req).success
    assert len(mm_cache) == entries and engine.treeless.publications == 0  # a bucket is not a publication
    end_session(engine)
    assert engine.treeless.publications == 1 and not engine.treeless.session_open
    assert_dropped(engine, mm_cache, entries, "weight-update session")


def test_without_radix_cache_a_new_label_and_a_flush_drop_them(mm_cache):
    engine = TreelessEngine()
    entries = filled(engine, mm_cache)
    engine.scheduler.record_weight_version_change("B1")
    assert engine.treeless.publications == 1
    assert_dropped(engine, mm_cache, entries, "update_weight_version")
    entries = filled(engine, mm_cache)
    assert engine.scheduler.flush_cache()
    assert engine.treeless.publications == 1  # a flush is not a publication
    assert_dropped(engine, mm_cache, entries, "flush")


def test_without_radix_cache_a_refused_update_drops_nothing(mm_cache):
    engine = TreelessEngine()
    entries = filled(engine, mm_cache)
    out = publication.publish_update_from_disk(succeeding_update(engine), engine.updater,
                                               disk_request("B1", load_format="bogus"))
    assert not out.success and engine.touched == 0
    assert len(mm_cache) == entries and engine.treeless.publications == 0


# ---- EPD -----------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vl_model(tmp_path_factory):
    from vradix.testing.tiny_vl_model import generate
    return generate(str(tmp_path_factory.mktemp("vl") / "A"), seed=1)


def launcher_args(model, *flags):
    """ServerArgs as the launcher builds them: SGLang's own parser, then its resolution."""
    from sglang.srt.server_args import prepare_server_args
    args = prepare_server_args(["--model-path", model, "--device", "cpu", "--skip-tokenizer-init", *flags])
    args.resolve_once()
    return args


def assert_names_flag_and_alternative(error, flag):
    assert f"vradix refuses {flag}" in str(error) and "without encoder disaggregation" in str(error)
    assert "VRADIX_DISABLE=1" in str(error)


@pytest.mark.parametrize("flag", ["--encoder-only", "--language-only", "--enable-mm-global-cache"])
def test_epd_flags_do_not_start(vl_model, flag, monkeypatch):
    """SGLang's own `check_server_args`, with the installed hooks, as `Engine._launch_subprocesses` runs it."""
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    args = launcher_args(vl_model, flag)
    with pytest.raises(epd.EncoderDisaggregationError) as e:
        args.check_server_args()
    assert_names_flag_and_alternative(e.value, flag)
    launcher_args(vl_model).check_server_args()  # the same launch without the flag passes


def test_an_encoder_only_server_does_not_build_its_encoder(vl_model, monkeypatch):
    """`--encoder-only` launches the encoder server, which skips `check_server_args`: SGLang's real MMEncoder
    refuses in its constructor, before it loads anything."""
    from sglang.srt.disaggregation.encoder.server import MMEncoder
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    with pytest.raises(epd.EncoderDisaggregationError) as e:
        MMEncoder(launcher_args(vl_model, "--encoder-only", "--enable-mm-global-cache"))
    assert_names_flag_and_alternative(e.value, "--encoder-only and --enable-mm-global-cache")


# ---- load_format="direct" on a model that derives weights after loading -------------------------------------------


def model_shell(class_path):
    """An instance of SGLang's real model class `class_path`, without its layers (what the refusal reads is the
    class: whether it derives weights in `post_load_weights`)."""
    import importlib
    module, name = class_path.rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)
    model = cls.__new__(cls)
    torch.nn.Module.__init__(model)
    return model


def serving_runners(engine, model):
    engine.updater.tp_worker.weight_update_runners = lambda: [("target", types.SimpleNamespace(model=model))]
    engine.updater.draft_worker = None


def direct_bucket(engine, load_format="direct"):
    original, req = tensor_bucket(engine, "B0")
    return original, UpdateWeightsFromTensorReqInput(serialized_named_tensors=[], weight_version="B0",
                                                     load_format=load_format)


def test_a_direct_tensor_update_of_an_mla_model_is_refused_before_loading():
    engine = Engine()
    serving_runners(engine, model_shell("sglang.srt.models.deepseek_v2.DeepseekV2ForCausalLM"))
    open_session(engine)
    original, req = direct_bucket(engine)
    out = publication.publish_update_from_tensor(original, engine.updater, req)
    assert not out.success and "load_format='direct'" in out.message and "load_format=None" in out.message
    assert "DeepseekV2ForCausalLM" in out.message and engine.touched == 0
    assert engine.state.session.buckets == 0 and engine.state.label != "B0"


def test_direct_updates_of_other_models_and_default_updates_of_mla_models_run():
    engine = Engine()
    serving_runners(engine, model_shell("sglang.srt.models.llama.LlamaForCausalLM"))
    open_session(engine)
    original, req = direct_bucket(engine)
    assert publication.publish_update_from_tensor(original, engine.updater, req).success
    serving_runners(engine, model_shell("sglang.srt.models.deepseek_v2.DeepseekV2ForCausalLM"))
    original, req = direct_bucket(engine, load_format=None)
    assert publication.publish_update_from_tensor(original, engine.updater, req).success
    assert engine.touched == 2


# ---- IPC: a post-hook failure is a failed update ------------------------------------------------------------------


@pytest.fixture
def checkpoint_engine(monkeypatch):
    """The external checkpoint-engine package, as far as SGLang's IPC worker uses it: its `update_weights_from_ipc`
    loads the buckets it receives (none here: no CUDA IPC on CPU), then calls SGLang's post-hook."""
    def update_weights_from_ipc(zmq_ctx, handle, *, device_id, run, post_hook):
        post_hook()
    package, worker = types.ModuleType("checkpoint_engine"), types.ModuleType("checkpoint_engine.worker")
    worker.update_weights_from_ipc = update_weights_from_ipc
    package.worker = worker
    monkeypatch.setitem(sys.modules, "checkpoint_engine", package)
    monkeypatch.setitem(sys.modules, "checkpoint_engine.worker", worker)
    from sglang.srt.checkpoint_engine import checkpoint_engine_worker as w
    monkeypatch.setattr(w.SGLangCheckpointEngineWorkerExtensionImpl, "get_device_uuid", lambda self: "GPU-0")
    monkeypatch.setattr(w.SGLangCheckpointEngineWorkerExtensionImpl, "get_device_id", lambda self: 0)
    return w


def runner_updater(model):
    """SGLang's real model-runner WeightUpdater (installed hooks included) over `model`."""
    from sglang.srt.model_executor.model_runner_components.weight_updater import WeightUpdater
    runner = types.SimpleNamespace(model=model)
    updater = WeightUpdater(tp_rank=0, device="cpu", gpu_id=0, model_config=None, custom_weight_loaders={},
                            get_model=lambda: model, update_model_fields=lambda **kw: None,
                            recapture_cuda_graph=lambda: None, get_model_runner=lambda: runner)
    runner.weight_updater = updater
    return runner


def ipc_engine(model):
    engine = Engine()
    engine.updater.tp_worker.weight_update_runners = lambda: [("target", runner_updater(model))]
    engine.updater.draft_worker = None
    engine.updater.tp_cpu_group = None
    return engine


def test_an_ipc_update_whose_post_hook_failed_is_not_published(checkpoint_engine, monkeypatch):
    """The MLA shell's `post_load_weights` raises (it has no layers): SGLang's post-hook logs that and returns."""
    monkeypatch.setattr(torch.distributed, "barrier", lambda group=None: None)  # one rank: nothing to wait for
    engine = ipc_engine(model_shell("sglang.srt.models.deepseek_v2.DeepseekV2ForCausalLM"))
    epoch, pubs, _ = engine.counters()
    out = engine.updater.update_weights_from_ipc(UpdateWeightsFromIPCReqInput(zmq_handles={"GPU-0": "ipc://x"},
                                                                              weight_version="B1"))
    assert not out.success, "an IPC update whose post-load step failed was reported (and published) as a success"
    assert "post-load step failed (Post-hook processing failed" in out.message
    assert engine.state.label != "B1"  # the label was not applied: not a publication of B1
    # weights were loaded, so the failure bumps once, conservatively, as every failed update that touched weights
    assert engine.counters()[:2] == (epoch + 1, pubs + 1) and "(conservative)" in out.message


def test_an_ipc_update_whose_post_hook_ran_is_published(checkpoint_engine, monkeypatch):
    monkeypatch.setattr(torch.distributed, "barrier", lambda group=None: None)
    engine = ipc_engine(model_shell("sglang.srt.models.llama.LlamaForCausalLM"))  # no post_load_weights
    out = engine.updater.update_weights_from_ipc(UpdateWeightsFromIPCReqInput(zmq_handles={"GPU-0": "ipc://x"},
                                                                              weight_version="B1"))
    assert out.success, out.message
    assert engine.state.label == "B1" and engine.state.last_publication.reason == "update_weights_from_ipc"
