"""Weight-derived state outside the KV cache, at cache level on SGLang's real objects:

- the interpolated position-embedding grids of SGLang's real MoonViT (`Learnable2DInterpPosEmb`) and PaddleOCR-VL
  (`SiglipVisionEmbeddings`) modules are dropped at a publication, so the next forward interpolates the new weights;
- with the radix cache off (SGLang's real UnifiedRadixCache built with `disable=True`, as `--disable-radix-cache`
  builds it) every publication path and `/flush_cache` still drop the multimodal embedding cache and the grids, once
  per publication (the E2E counterpart is `test_e2e_multimodal.py`);
- EPD flags (`--encoder-only`, `--language-only`, `--enable-mm-global-cache`) stop the launch in SGLang's own
  `check_server_args`, with the error naming the flag and the alternative;
- a `load_format="direct"` tensor update of a model that derives weights after loading (SGLang's real
  `DeepseekV2ForCausalLM` class: MLA `w_kc`/`w_vc`) is refused before any tensor is loaded;
- an IPC update whose SGLang post-hook fails (SGLang only logs a warning) is a failed update, not a publication;
- an update (every path, and `begin_weight_update`) of a model holding a GPU-derived copy it would leave stale
  (`vradix.closed_world.post_load.GPU_DERIVED_COPIES`, each entry checked against SGLang's source and read off SGLang's real class)
  is refused before anything is loaded, with graphs captured or not as the copy's staleness says.

Stand-ins: the scheduler and updater of `vradix.testing.harness.engine` (see there); a model runner holding the model; for
the IPC path, the external `checkpoint_engine.worker` (it delivers tensors over CUDA IPC, which CPU has not: here it
delivers no bucket and calls SGLang's real post-hook, as it does after its last bucket) and the device UUID; for the
GPU-derived copies, instances of SGLang's classes built without `__init__` (it needs a GPU) holding the attribute as
SGLang's builder sets it, and a captured decode graph runner (none can be captured on CPU).
"""
import importlib
import inspect
import re
import sys
import types

import pytest
import torch
from sglang.srt.managers import mm_schedule
from sglang.srt.managers.io_struct import (UpdateWeightsFromDistributedReqInput,
                                           UpdateWeightsFromDistributedReqOutput, UpdateWeightsFromIPCReqInput,
                                           UpdateWeightsFromIPCReqOutput, UpdateWeightsFromTensorReqInput)
from sglang.srt.mem_cache.multimodal_cache import EmbeddingResult

from vradix.closed_world import epd, post_load
from vradix.core import weight_derived
from vradix.engine import of_scheduler
from vradix.hooks import publication
from vradix.testing.harness.engine import (Engine, disk_request, end_bucketed, open_bucketed,
                                           succeeding_update, tensor_bucket)
from vradix.testing.harness.vision import TreelessEngine, serve, vision_tower

GRID = (3, 5)  # not the stored 4x4 grid: MoonViT interpolates (and memoises) only for other grids


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


@pytest.fixture
def mm_cache(monkeypatch):
    monkeypatch.setattr(mm_schedule, "embedding_cache", None)
    mm_schedule.init_mm_embedding_cache(1 << 20)
    cache = mm_schedule.embedding_cache
    assert cache.set(7, EmbeddingResult(embedding=torch.ones(4, 8)))
    return cache


def test_a_publication_recomputes_vision_position_grids():
    engine, tower = Engine(multimodal=True), vision_tower()
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



def test_the_derived_caches_step_is_read_from_the_served_model():
    """A publication drops the weight-derived caches on an engine whose model can fill one: a multimodal model, one
    with a position-grid memo, or one whose config vradix cannot read; a text-only model fills none."""
    def scheduler(config, model=None):
        s = types.SimpleNamespace(model_config=config)
        serve(s, model)
        return s

    text = types.SimpleNamespace(is_multimodal=False)
    assert not weight_derived.present(scheduler(text, torch.nn.Linear(2, 2)))
    assert weight_derived.present(scheduler(types.SimpleNamespace(is_multimodal=True)))
    assert weight_derived.present(scheduler(None))
    assert weight_derived.present(scheduler(text, vision_tower()))
    assert of_scheduler(Engine(multimodal=True).scheduler).steps.derived_caches
    assert not of_scheduler(Engine().scheduler).steps.derived_caches

# ---- no radix cache ------------------------------------------------------------------------------------------------


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


def test_without_radix_cache_a_bucketed_update_drops_them_once_at_its_end(mm_cache):
    engine = TreelessEngine()
    entries = filled(engine, mm_cache)
    open_bucketed(engine)
    original, req = tensor_bucket(engine, "B0")
    assert publication.publish_update_from_tensor(original, engine.updater, req).success
    assert len(mm_cache) == entries and engine.treeless.publications == 0  # a bucket is not a publication
    end_bucketed(engine)
    assert engine.treeless.publications == 1 and not engine.treeless.bucketed_open
    assert_dropped(engine, mm_cache, entries, "bucketed update (1 bucket(s), 0 failed)")


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
    from vradix.testing.models.vl import generate
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
    engine = Engine(multimodal=True)
    serving_runners(engine, model_shell("sglang.srt.models.deepseek_v2.DeepseekV2ForCausalLM"))
    open_bucketed(engine)
    original, req = direct_bucket(engine)
    out = publication.publish_update_from_tensor(original, engine.updater, req)
    assert not out.success and "load_format='direct'" in out.message and "load_format=None" in out.message
    assert "DeepseekV2ForCausalLM" in out.message and engine.touched == 0
    assert engine.state.bucketed.buckets == 0 and engine.state.label != "B0"


def test_direct_updates_of_other_models_and_default_updates_of_mla_models_run():
    engine = Engine(multimodal=True)
    serving_runners(engine, model_shell("sglang.srt.models.llama.LlamaForCausalLM"))
    open_bucketed(engine)
    original, req = direct_bucket(engine)
    assert publication.publish_update_from_tensor(original, engine.updater, req).success
    serving_runners(engine, model_shell("sglang.srt.models.deepseek_v2.DeepseekV2ForCausalLM"))
    original, req = direct_bucket(engine, load_format=None)
    assert publication.publish_update_from_tensor(original, engine.updater, req).success
    assert engine.touched == 2


def test_a_direct_update_while_a_weight_loader_buffer_is_built_is_refused():
    """Inkling's linearized shared sink (SGLANG_OPT_LINEARIZED_SHARED_SINK, on by default): its weight loader restacks
    the shared experts' w2 into `_w2_lin` at every w2 load, which a direct load (a copy into the parameter) skips.
    Refused while the buffer is built; the same model without it, and a default-format update, run."""
    sink = bare("sglang.srt.models.inkling_common.dense_mlp:InklingDenseMLP")
    sink.register_buffer("_w2_lin", None, persistent=False)
    engine = Engine(multimodal=True)
    serving_runners(engine, serving(sink))
    open_bucketed(engine)

    def update(load_format="direct"):
        original, req = direct_bucket(engine, load_format)
        return publication.publish_update_from_tensor(original, engine.updater, req)

    assert update().success
    sink._w2_lin = torch.zeros(4, 2)
    out = update()
    assert not out.success and "InklingDenseMLP._w2_lin" in out.message and "load_format=None" in out.message
    assert update(load_format=None).success
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
    engine = Engine(multimodal=True)
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


# ---- GPU-derived copies: refused at every update path, before anything is loaded ----------------------------------


def sglang_object(path):
    """SGLang's object at `module:qualname` (a class, a function, a method)."""
    module, qualname = path.split(":")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def bare(class_path):
    """An instance of SGLang's real class `module:Class` built without its `__init__` (which needs a GPU, its kernels,
    a quantization config or process groups): the refusal reads the class and one attribute."""
    cls = sglang_object(class_path)
    obj = object.__new__(cls)
    torch.nn.Module.__init__(obj)
    return obj


def serving(*modules):
    """SGLang's real LlamaForCausalLM shell (no derived copy of its own) with `modules` in its module tree."""
    model = model_shell("sglang.srt.models.llama.LlamaForCausalLM")
    for i, module in enumerate(modules):
        model.add_module(f"layer{i}", module)
    return model


def hunyuan_fp32_norms():
    """HunYuan-V3's attention after its first forward on the HPC-Ops FP8 backend: `_resolve_hpc_ops_fp8_attn` has
    cached fp32 copies of the q/k norm weights, which nothing rebuilds (stale after any update)."""
    attn = bare("sglang.srt.models.hunyuan_v3:HYV3Attention")
    attn._hpc_q_norm_w_fp32, attn._hpc_k_norm_w_fp32 = torch.ones(4), torch.ones(4)
    return attn


def dots_vision_fp8_pack():
    """Dots3 omni's vision MoE after `load_state_dict`: its post-hook packed the experts into FP8 buffers."""
    moe = bare("sglang.srt.models.dots3_common.dots_omni_vision:MoESwiGLUFFNFP8")
    moe._fused_w13_fp8 = torch.ones(2, 2)
    return moe


def graphs(runner, captured: bool):
    """What `cuda_graph_setup.capture_cuda_graphs` leaves on a model runner: a captured decode graph runner (a
    stand-in: none can be built on CPU), or, with graphs off, no decode runner and SGLang's real eager runner."""
    from sglang.srt.model_executor.runner.eager_runner import EagerRunner
    runner.decode_cuda_graph_runner = types.SimpleNamespace(captured=True) if captured else None
    runner.prefill_cuda_graph_runner = object.__new__(EagerRunner)
    return runner


def real_updater_engine(model, monkeypatch, captured=True):
    """An engine whose updater runs SGLang's real update and begin bodies (hooked) on SGLang's real model-runner
    WeightUpdater over `model`; one rank, so its barriers wait for nothing."""
    monkeypatch.setattr(torch.distributed, "barrier", lambda group=None: None)
    engine = Engine(multimodal=True)
    runner = graphs(runner_updater(model), captured)
    engine.updater.tp_worker.weight_update_runners = lambda: [("target", runner)]
    engine.updater.tp_worker.deserialize_own_rank = lambda tensors: tensors
    engine.updater.draft_worker, engine.updater.tp_cpu_group = None, None
    return engine, runner


UPDATE_PATHS = {
    "update_weights_from_disk": lambda e: (publication.publish_update_from_disk, succeeding_update(e),
                                           disk_request("B1")),
    "update_weights_from_tensor": lambda e: (publication.publish_update_from_tensor, *tensor_bucket(e, "B1")),
    "update_weights_from_distributed": lambda e: (
        publication.publish_update_from_distributed, succeeding_update(e, UpdateWeightsFromDistributedReqOutput),
        UpdateWeightsFromDistributedReqInput(names=["w"], dtypes=["float32"], shapes=[[1]], group_name="g",
                                             weight_version="B1")),
    "update_weights_from_ipc": lambda e: (publication.publish_update_from_ipc,
                                          succeeding_update(e, UpdateWeightsFromIPCReqOutput),
                                          UpdateWeightsFromIPCReqInput(zmq_handles={}, weight_version="B1")),
}


@pytest.mark.parametrize("source", UPDATE_PATHS)
def test_a_copy_no_update_rebuilds_refuses_every_update_path_before_loading(source):
    """HunYuan-V3's fp32 norm copies, in SGLang's real HYV3Attention, without CUDA graphs: each update path is
    refused before SGLang's body runs, its label is not applied and the epoch does not move."""
    engine = Engine(multimodal=True)
    runner = graphs(types.SimpleNamespace(model=serving(hunyuan_fp32_norms())), captured=False)
    engine.updater.tp_worker.weight_update_runners = lambda: [("target", runner)]
    engine.updater._session = "open"  # tensor and distributed buckets run inside a bucketed update
    handler, original, req = UPDATE_PATHS[source](engine)
    before = engine.counters()
    out = handler(original, engine.updater, req)
    assert not out.success and out.message.startswith(f"vradix refused {source}")
    assert "LlamaForCausalLM" in out.message and "HYV3Attention._hpc_q_norm_w_fp32" in out.message
    assert "Restart the engine on the new checkpoint" in out.message and "VRADIX_DISABLE=1" in out.message
    assert engine.touched == 0 and engine.counters() == before and engine.state.label != "B1"


def test_a_bucket_after_a_post_load_copy_that_graphs_keep_is_refused_and_loads_nothing(monkeypatch):
    """Muse Spark's norm: SGLang's own `precompute_effective_weight` (its post-load step) rebinds `_frozen_weight` to
    a new tensor, which CUDA graphs captured before keep reading. Through SGLang's real tensor-update path, a bucket
    is refused while graphs are captured (the weight is untouched, no bucket is counted) and loads without them."""
    from sglang.srt.layers.muse_spark.muse_spark_layers import MuseSpark1xRMSNorm
    from sglang.srt.managers.io_struct import BeginWeightUpdateReqInput
    from sglang.srt.runtime_context import get_parallel
    norm = MuseSpark1xRMSNorm(4, zero_centered_gamma=True)
    with torch.no_grad():
        norm.weight.fill_(0.5)
    engine, runner = real_updater_engine(serving(norm), monkeypatch)
    assert engine.updater.begin_weight_update(BeginWeightUpdateReqInput()).success
    norm.precompute_effective_weight()
    new = [("layer0.weight", torch.full((4,), 2.0))]
    req = UpdateWeightsFromTensorReqInput(serialized_named_tensors=new, weight_version="B1", load_format="direct")
    before = engine.counters()
    with get_parallel().override(tp_rank=0):
        out = engine.updater.update_weights_from_tensor(req)
        assert not out.success and "MuseSpark1xRMSNorm._frozen_weight" in out.message, out.message
        assert "CUDA graphs" in out.message and "--cuda-graph-backend-decode disabled" in out.message
        assert torch.equal(norm.weight, torch.full((4,), 0.5)) and engine.state.bucketed.buckets == 0
        assert engine.counters() == before and engine.state.label != "B1"
        graphs(runner, captured=False)
        out = engine.updater.update_weights_from_tensor(req)
    assert out.success, out.message
    assert torch.equal(norm.weight, torch.full((4,), 2.0)) and engine.state.bucketed.buckets == 1


@pytest.mark.parametrize("held", ["dots-vision-pack", "sglang-guarded"])
def test_a_bucketed_update_a_p2p_write_would_leave_stale_is_refused_at_begin(held, monkeypatch):
    """`begin_weight_update` opens a bucketed update a P2P/RDMA write may fill without any update call: refused
    (SGLang's own BeginWeightUpdateReqOutput) when the model holds a copy such a write leaves stale, Dots3's vision FP8
    pack (only `load_state_dict` repacks it), or one SGLang's own check refuses at every update call but not at
    begin."""
    from sglang.srt.managers.io_struct import BeginWeightUpdateReqInput, BeginWeightUpdateReqOutput
    if held == "dots-vision-pack":
        module, named = dots_vision_fp8_pack(), "MoESwiGLUFFNFP8._fused_w13_fp8"
    else:
        module, named = torch.nn.Linear(2, 2), "kept by a test"
        module._derived_weight_cache_error = "Online weight updates are not supported: kept by a test"
    engine, _ = real_updater_engine(serving(module), monkeypatch, captured=False)
    before = engine.counters()
    out = engine.updater.begin_weight_update(BeginWeightUpdateReqInput())
    assert isinstance(out, BeginWeightUpdateReqOutput) and not out.success
    assert out.message.startswith("vradix refused begin_weight_update") and named in out.message
    assert engine.updater._session is None and engine.state.bucketed is None and engine.counters() == before


def test_a_copy_only_a_bucketed_update_leaves_stale_does_not_refuse_a_disk_update():
    """A disk update runs `load_state_dict`, whose post-hook repacks Dots3's vision experts: not refused."""
    engine = Engine(multimodal=True)
    serving_runners(engine, serving(dots_vision_fp8_pack()))
    epoch, pubs, _ = engine.counters()
    out = publication.publish_update_from_disk(succeeding_update(engine), engine.updater, disk_request("B1"))
    assert out.success, out.message
    assert engine.counters()[:2] == (epoch + 1, pubs + 1) and engine.state.label == "B1"


def assigns(source: str, attr: str) -> bool:
    """Whether `source` assigns `attr`: `x.attr = ...`, `x.attr, y.b = ...`, or `setattr(x, "attr", ...)`."""
    return bool(re.search(rf"\.{attr}\b(?:\s*,\s*[\w.]+)*\s*=(?!=)", source)
                or re.search(rf"setattr(?:__)?\(\s*\w+\s*,\s*[\"']{attr}[\"']", source))


def test_every_gpu_derived_copy_is_built_where_the_table_says_in_sglangs_source():
    """Each entry names a real SGLang module class, and the SGLang code it names assigns the attribute: the table
    tracks SGLang (a renamed attribute or moved builder fails here)."""
    problems = []
    for copy in post_load.GPU_DERIVED_COPIES:
        holder = sglang_object(copy.holder)
        if not (isinstance(holder, type) and issubclass(holder, torch.nn.Module)):
            problems.append(f"{copy.holder} is not a torch module class")
        if not assigns(inspect.getsource(sglang_object(copy.assigned_in)), copy.attr):
            problems.append(f"{copy.assigned_in} does not assign {copy.attr}")
        if copy.stale not in post_load.ALTERNATIVES:
            problems.append(f"{copy.attr}: unknown staleness {copy.stale!r}")
    assert not problems, "\n".join(problems)
    assert len({(c.holder, c.attr) for c in post_load.GPU_DERIVED_COPIES}) == len(post_load.GPU_DERIVED_COPIES)


#: the value SGLang leaves before building a copy, and one as its builder leaves it (default: None, a tensor)
UNBUILT = {"_attn_res_cw_cache": {}, "_mega_moe_weights_built": False, "mega_wq_b_permuted": False, "w_scale": 1.0}
BUILT = {"_attn_res_cw_cache": lambda: {torch.bfloat16: torch.ones(1)}, "_mega_moe_weights_built": lambda: True,
         "mega_wq_b_permuted": lambda: True}


def surroundings(module):
    """What a copy's presence rule reads besides its attribute, as SGLang builds it: MLA's FP8 kv_b_proj with its own
    scale, a KV-cache scale loaded into an attention layer."""
    module.kv_b_proj = torch.nn.Module()
    module.kv_b_proj.weight_scale = torch.nn.Parameter(torch.ones(4), requires_grad=False)
    module.k_scale = torch.nn.Parameter(torch.tensor(0.5), requires_grad=False)
    return module


@pytest.mark.parametrize("copy", post_load.GPU_DERIVED_COPIES, ids=lambda c: f"{c.holder.split(':')[1]}.{c.attr}")
def test_the_refusal_fires_on_sglangs_class_exactly_while_the_copy_is_built(copy):
    module = surroundings(bare(copy.holder))
    model = serving(module)
    assert post_load.derived_copies(model) == []
    setattr(module, copy.attr, UNBUILT.get(copy.attr))
    assert post_load.derived_copies(model) == []
    assert post_load.gpu_derived_refusal(post_load.BEGIN, [model], graphs=True) is None
    setattr(module, copy.attr, BUILT.get(copy.attr, lambda: torch.ones(2))())
    assert post_load.derived_copies(model) == [(module, copy)]
    refused = {(source, graphs): post_load.gpu_derived_refusal(source, [model], graphs)
               for source in ("update_weights_from_disk", post_load.BEGIN) for graphs in (False, True)}
    expected = {post_load.ALWAYS: {k: True for k in refused},
                post_load.UNDER_GRAPHS: {(s, g): g for s, g in refused},
                post_load.AFTER_BUCKETED_UPDATE: {(s, g): s == post_load.BEGIN for s, g in refused}}[copy.stale]
    assert {k: v is not None for k, v in refused.items()} == expected
    message = next(v for v in refused.values() if v is not None)
    assert f"{type(module).__name__}.{copy.attr}" in message and "LlamaForCausalLM" in message
    assert copy.why in message and post_load.ALTERNATIVES[copy.stale] in message


def test_presence_rules_that_read_more_than_the_attribute():
    """MLA's `w_scale` is a copy only when post-load bound a tensor of its own, not kv_b_proj's scale itself (Kimi-K3
    aliases it, and the loader updates it in place); AITER's cached float only when the layer has a KV scale."""
    mla = surroundings(bare("sglang.srt.models.deepseek_v2:DeepseekV2AttentionMLA"))
    mla.w_scale = mla.kv_b_proj.weight_scale
    assert post_load.derived_copies(serving(mla)) == []
    attn = bare("sglang.srt.layers.radix_attention:RadixAttention")
    attn.k_scale, attn._aiter_kv_scale_float = None, 1.0
    assert post_load.derived_copies(serving(attn)) == []


def test_copies_are_found_on_sglangs_classes_and_their_subclasses_only():
    layer = bare("sglang.srt.models.deepseek_v4:DeepseekV4CudaDecoderLayer")  # a DeepseekV4DecoderLayerBase
    layer._input_layernorm_weight_bf16 = torch.ones(2)
    assert [c.attr for _, c in post_load.derived_copies(serving(layer))] == ["_input_layernorm_weight_bf16"]
    lookalike = type("KimiK3DeltaAttention", (torch.nn.Module,), {})()
    lookalike._bfa_w = torch.ones(2)
    assert post_load.derived_copies(serving(lookalike)) == []


def test_captured_graphs_are_read_off_the_model_runner():
    runner = types.SimpleNamespace()
    assert post_load.captures_graphs(runner)  # a runner SGLang did not set up: fail closed
    assert not post_load.captures_graphs(graphs(runner, captured=False))
    assert post_load.captures_graphs(graphs(runner, captured=True))
