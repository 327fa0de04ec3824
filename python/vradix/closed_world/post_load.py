"""Weights SGLang derives after loading, and the update paths that skip or hide that step.

- `load_format="direct"` tensor updates (`update_weights_from_tensor`) copy each named tensor into its parameter
  (`_model_load_weights_direct`) and never call the model's `post_load_weights`, which derives weights from loaded
  ones: MLA models (DeepSeek V2/V3, Kimi, GLM-5 and the others built on `deepseek_weight_loader`) split `kv_b_proj`
  into `w_kc`/`w_vc` there. After such an update the served model would mix new weights with weights derived from the
  old ones. vradix refuses such an update before anything is loaded when the model defines `post_load_weights`
  (`direct_update_refusal`); `load_format=None` (the model's own `load_weights`) runs the derivation. The same holds
  for a buffer a module's weight loader derives at every load of a weight (`LOADER_DERIVED`: Inkling's linearized
  shared sink), which a direct load, copying into the parameter, never refreshes.
- `update_weights_from_ipc` (checkpoint-engine) runs SGLang's post-hook (`process_weights_after_loading`, then
  `post_load_weights`) inside a `try` that only logs "Post-hook processing failed" as a warning, and the update then
  reports success. `PostHookFailures` catches that warning during the call, so vradix turns the call into a failed
  update: its label is not applied and it is not a publication (its weights were touched, so the epoch still bumps
  once, conservatively, as for every failed update that may have touched weights).
- GPU model families whose post-load steps (or first forwards) build weight-derived copies that an update leaves
  stale (`GPU_DERIVED_COPIES`): built once and never rebuilt (`ALWAYS`), rebuilt as new tensors while CUDA graphs
  captured before keep reading the old ones (`UNDER_GRAPHS`), or rebuilt only by a full `load_weights`, which a
  P2P/RDMA write in a bucketed update bypasses (`AFTER_BUCKETED_UPDATE`). vradix cannot version them in 0.5.23, so
  an update that would leave one stale is refused before anything is loaded (`gpu_derived_refusal`), on every update
  path and at `begin_weight_update`; serving without updates stays allowed. At begin, what SGLang's own check refuses
  at every update call is refused too (`bypassed_sglang_refusal`): a P2P/RDMA write makes no update call.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Callable, Optional

#: the logger of SGLang's checkpoint-engine worker (`checkpoint_engine/checkpoint_engine_worker.py`)
IPC_WORKER_LOGGER = "sglang.srt.checkpoint_engine.checkpoint_engine_worker"
#: the start of the warning it logs when the post-hook raised
POST_HOOK_FAILED = "Post-hook processing failed"


def derives_weights_after_load(model) -> bool:
    """Whether `model` derives weights in `post_load_weights` (what SGLang's `loader.post_load_weights` calls)."""
    return model is not None and callable(getattr(model, "post_load_weights", None))


#: ("module:Class", buffer, what it is): buffers a module's weight loader derives from a loaded weight each time that
#: weight is loaded; a direct load copies into the parameter and never runs the weight loader
LOADER_DERIVED = (
    ("sglang.srt.models.inkling_common.dense_mlp:InklingDenseMLP", "_w2_lin",
     "Inkling's linearized shared-sink down-projection, restacked from w2 by `weight_loader_fused`"),
)


def loader_derived_buffers(model) -> list:
    """(module, buffer, what) for every `LOADER_DERIVED` buffer `model` holds built (not None)."""
    if model is None or not hasattr(model, "modules"):
        return []
    return [(module, attr, what) for module in model.modules()
            for holder, attr, what in LOADER_DERIVED
            if holder in {f"{c.__module__}:{c.__qualname__}" for c in type(module).__mro__}
            and getattr(module, attr, None) is not None]


def direct_update_refusal(load_format, models) -> Optional[str]:
    """The reason a `load_format="direct"` update must not run on `models` (target, then draft), or None."""
    if load_format != "direct":
        return None
    for model in models:
        if derives_weights_after_load(model):
            return (f"vradix refused update_weights_from_tensor(load_format='direct'): {type(model).__name__} "
                    "derives weights after loading (post_load_weights, e.g. MLA w_kc/w_vc from kv_b_proj), which the "
                    "direct loader skips, so the served weights would mix new tensors with ones derived from the old. "
                    "Nothing was loaded. Send the bucket with load_format=None (the model's load_weights runs the "
                    "derivation)")
        built = loader_derived_buffers(model)
        if built:
            module, attr, what = built[0]
            return (f"vradix refused update_weights_from_tensor(load_format='direct'): {type(model).__name__} holds "
                    f"{type(module).__name__}.{attr} ({what}), which the direct loader never refreshes, so the served "
                    "weights would mix new tensors with one derived from the old. Nothing was loaded. Send the bucket "
                    "with load_format=None (the weight loader rebuilds it)")
    return None


class PostHookFailures(logging.Handler):
    """While open, records every "Post-hook processing failed" warning SGLang's IPC worker logs (the handler is on
    that logger only, and its level is lowered to WARNING for the call if it was higher)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.failures: list = []
        self._logger = logging.getLogger(IPC_WORKER_LOGGER)
        self._level = None

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith(POST_HOOK_FAILED):
            self.failures.append(message)

    def __enter__(self) -> "PostHookFailures":
        self._level = self._logger.level
        if self._logger.getEffectiveLevel() > logging.WARNING:
            self._logger.setLevel(logging.WARNING)
        self._logger.addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._level)


# ---- GPU-derived copies --------------------------------------------------------------------------------------------

#: built once (at load, at startup or at a first forward) and never rebuilt, or rebuilt wrongly: stale after any update
ALWAYS = "always"
#: rebuilt as a new tensor by every post-load step: stale only for the CUDA graphs captured before, which keep the old
UNDER_GRAPHS = "under CUDA graphs"
#: rebuilt only by a full `load_weights`: stale after a P2P/RDMA write into an open bucketed update
AFTER_BUCKETED_UPDATE = "after a bucketed update"
#: the update source of `begin_weight_update` (a bucketed update's writes may follow with no update call)
BEGIN = "begin_weight_update"

ALTERNATIVES = {
    ALWAYS: "Restart the engine on the new checkpoint, or set VRADIX_DISABLE=1 to update without vradix's guarantees",
    UNDER_GRAPHS: ("Restart the engine on the new checkpoint, serve without CUDA graphs (--cuda-graph-backend-decode "
                   "disabled --cuda-graph-backend-prefill disabled), or set VRADIX_DISABLE=1 to update without "
                   "vradix's guarantees"),
    AFTER_BUCKETED_UPDATE: ("Update with update_weights_from_disk (a full load rebuilds it), restart the engine on "
                            "the new checkpoint, or set VRADIX_DISABLE=1 to update without vradix's guarantees"),
}


def built(module, value) -> bool:
    """A copy is built once its attribute holds something: not None, not False, not an empty memo."""
    return value is not None and value is not False and not (isinstance(value, dict) and not value)


def rebound_w_scale(module, value) -> bool:
    """MLA `w_scale` is a derived copy once post-load bound a tensor of its own (the requantized per-tensor scale),
    not `kv_b_proj.weight_scale` itself (which Kimi-K3 aliases, and the loader updates in place) nor the 1.0 default."""
    import torch
    kv_b_proj = getattr(module, "kv_b_proj", None)
    return isinstance(value, torch.Tensor) and value is not getattr(kv_b_proj, "weight_scale", None)


def cached_kv_scale(module, value) -> bool:
    """AITER's cached float is weight-derived when the layer has a checkpoint KV scale (else it is the constant 1.0)."""
    return value is not None and getattr(module, "k_scale", None) is not None


@dataclass(frozen=True)
class DerivedCopy:
    """One weight-derived copy SGLang keeps on a module: `holder` ("module:Class", subclasses included) holds it in
    `attr`; `assigned_in` ("module:qualname") is the SGLang code that builds it; `stale` says after which updates
    it is stale; `present(module, value)` says whether this instance holds it."""

    family: str
    what: str
    holder: str
    attr: str
    assigned_in: str
    stale: str
    why: str
    present: Callable = built


_K3 = "sglang.srt.models.kimi_k3"
_V4 = "sglang.srt.models.deepseek_v4"
_MUSE = "sglang.srt.layers.muse_spark"
_DS_LOADER = "sglang.srt.models.deepseek_common.deepseek_weight_loader"
_REBUILT = "post_load_weights builds it anew after every load, and CUDA graphs captured before keep the old tensor"

#: every copy of the `gpu-derived` row of docs/coverage.md (test_weight_derived reads each against SGLang's source)
GPU_DERIVED_COPIES = (
    DerivedCopy("Kimi-K3", "merged [f_a | b] in-proj weight (dequantized BF16 for block-FP8)",
                f"{_K3}:KimiK3DeltaAttention", "_bfa_w", f"{_K3}:KimiK3DeltaAttention._merge_bfa_weights",
                UNDER_GRAPHS, f"{_REBUILT} (f_a_proj/b_proj are re-pointed at views of the new buffer)"),
    DerivedCopy("Kimi-K3", "fused KDA decode arguments (fp32 conv weights, output-norm weight)",
                "sglang.srt.layers.radix_linear_attention:RadixLinearAttention", "_k3_fused_decode_args",
                f"{_K3}:KimiK3DeltaAttention._prepare_fused_decode", UNDER_GRAPHS, _REBUILT),
    DerivedCopy("Kimi-K3", "ROCm fused KDA decode arguments (f_b and output-norm weights)",
                "sglang.srt.layers.radix_linear_attention:RadixLinearAttention", "_k3_hip_fused_decode_args",
                f"{_K3}:KimiK3DeltaAttention._prepare_fused_decode", UNDER_GRAPHS, _REBUILT),
    DerivedCopy("Kimi-K3", "merged MoE front weight (shared gate_up, router gate, latent down_proj)",
                f"{_K3}:KimiK3MoE", "_front_w", f"{_K3}:KimiK3MoE._merge_front_weights", UNDER_GRAPHS, _REBUILT),
    DerivedCopy("Kimi-K3", "attention-residual score weight (norm weight times projection, per dtype)",
                "sglang.srt.layers.linear:ReplicatedLinear", "_attn_res_cw_cache",
                "sglang.srt.layers.attn_residual:get_cw", ALWAYS,
                "get_cw memoises it at its first call and never recomputes it, the post-load warm-up included"),
    DerivedCopy("DeepSeek-V4", "bf16 layernorm weight copies", f"{_V4}:DeepseekV4DecoderLayerBase",
                "_input_layernorm_weight_bf16", f"{_V4}:DeepseekV4DecoderLayerBase.refresh_mhc_norm_weight_cache",
                UNDER_GRAPHS, _REBUILT),
    DerivedCopy("DeepSeek-V4", "FlashMLA-mega interleaved, quantized wo_a", f"{_V4}:MQALayer", "mega_wo_a",
                f"{_V4}:MQALayer.setup_mega_attention", UNDER_GRAPHS, _REBUILT),
    DerivedCopy("DeepSeek-V4", "FlashMLA-mega wq_b rows permuted in place", f"{_V4}:MQALayer", "mega_wq_b_permuted",
                f"{_V4}:MQALayer.setup_mega_attention", ALWAYS,
                "every post_load_weights permutes wq_b again, also after a bucket that did not reload it, and the "
                "block-FP8 branch rewrites the scale layout and weight_block_size the loader reads"),
    DerivedCopy("DeepSeek-V4 (and every MegaMoE model)", "MegaMoE interleaved expert weights and transformed scales",
                "sglang.srt.layers.moe.fused_moe_triton.layer:FusedMoE", "_mega_moe_weights_built",
                "sglang.srt.layers.moe.mega_moe:build_mega_moe_experts_weights", ALWAYS,
                "the repack replaces the checkpoint layout in place and runs once: a reload writes checkpoint-layout "
                "tensors into the repacked ones and the repack is skipped"),
    DerivedCopy("DeepSeek-V4", "MegaMoE fused shared-expert weights", "sglang.srt.models.deepseek_v2:DeepseekV2MoE",
                "mega_shared_l1_weights", f"{_V4}:DeepseekV4ForCausalLM.precompile_kernels_after_loading", ALWAYS,
                "built once after the startup load (precompile_kernels_after_loading), which no update runs"),
    DerivedCopy("Muse Spark", "frozen effective norm weight (weight + gain centre)",
                f"{_MUSE}.muse_spark_layers:MuseSpark1xRMSNorm", "_frozen_weight",
                f"{_MUSE}.muse_spark_layers:MuseSpark1xRMSNorm.precompute_effective_weight", UNDER_GRAPHS, _REBUILT),
    DerivedCopy("Muse Spark", "precomputed residual gate coefficients",
                f"{_MUSE}.muse_spark_layers:MuseSpark1xNormPreservingResidualConnection", "_alpha",
                f"{_MUSE}.muse_spark_layers:MuseSpark1xNormPreservingResidualConnection.precompute_coefficients",
                UNDER_GRAPHS, _REBUILT),
    DerivedCopy("Muse Spark", "BF16 post-expert norm weight bound into the TRT-LLM finalize op",
                f"{_MUSE}.muse_spark_bf16_moe:MuseSpark1xBf16Experts", "_post_expert_norm_weight",
                f"{_MUSE}.muse_spark_bf16_moe:MuseSpark1xBf16Experts._build_finalize_op", ALWAYS,
                "prepare_trtllm_weights binds it once and returns early at every later post_load_weights"),
    DerivedCopy("Muse Spark", "BF16 post-expert norm weight of the FP4 experts",
                f"{_MUSE}.muse_spark_fp4_moe:MuseSpark1xFp4Experts", "_post_expert_norm_weight",
                f"{_MUSE}.muse_spark_fp4_moe:MuseSpark1xFp4Experts.set_post_expert_norm", ALWAYS,
                "cached at the first forward and refreshed only when the norm module changes, never its weight"),
    DerivedCopy("Qwen4-Exp", "permuted, padded hyper-connection mix-up weight",
                "sglang.srt.layers.hyperconnection:GatedResidual", "_mix_up_weight_padded",
                "sglang.srt.layers.hyperconnection:GatedResidual.mix", ALWAYS,
                "built at the first small-batch mix (sm100) and never rebuilt"),
    DerivedCopy("Dots3 omni", "vision MoE FP8 expert pack",
                "sglang.srt.models.dots3_common.dots_omni_vision:MoESwiGLUFFNFP8", "_fused_w13_fp8",
                "sglang.srt.models.dots3_common.dots_omni_vision:MoESwiGLUFFNFP8._pack_fused_fp8_weights",
                AFTER_BUCKETED_UPDATE, "only its load_state_dict post-hook repacks it, which a full load_weights runs "
                "and a P2P/RDMA write followed by end_weight_update does not"),
    DerivedCopy("HunYuan-V3", "fp32 q/k norm weight copies of the HPC-Ops FP8 attention",
                "sglang.srt.models.hunyuan_v3:HYV3Attention", "_hpc_q_norm_w_fp32",
                "sglang.srt.models.hunyuan_v3:HYV3Attention._resolve_hpc_ops_fp8_attn", ALWAYS,
                "cached at the first forward and never rebuilt"),
    DerivedCopy("DeepSeek MLA", "per-tensor w_scale requantized from a per-channel (or non-128 block) FP8 kv_b_proj",
                "sglang.srt.models.deepseek_v2:DeepseekV2AttentionMLA", "w_scale",
                f"{_DS_LOADER}:DeepseekV2WeightLoaderMixin.post_load_weights",
                UNDER_GRAPHS, f"{_REBUILT} (w_kc/w_vc are copied in place and stay valid)", rebound_w_scale),
    DerivedCopy("DeepSeek MLA", "full-head w_kc and q_b_proj gathered for --dcp-replicate-q-proj",
                "sglang.srt.models.deepseek_v2:DeepseekV2AttentionMLA", "w_kc_qrep",
                "sglang.srt.model_executor.model_runner:ModelRunner._prepare_replicated_q_proj", ALWAYS,
                "gathered once when the model runner starts"),
    DerivedCopy("AITER", "FP8 KV scale cached as a Python float", "sglang.srt.layers.radix_attention:RadixAttention",
                "_aiter_kv_scale_float",
                "sglang.srt.layers.attention.aiter_backend:AiterAttnBackend._resolve_fp8_kv_scale_float", ALWAYS,
                "read from the layer's k_scale at its first MLA decode and never re-read", cached_kv_scale),
)


@functools.lru_cache(maxsize=None)
def copies_held_by(cls: type) -> tuple:
    """The entries of `GPU_DERIVED_COPIES` whose holder is `cls` or one of its bases, matched by module and name
    (a same-named class elsewhere is not SGLang's)."""
    names = {f"{c.__module__}:{c.__qualname__}" for c in cls.__mro__}
    return tuple(copy for copy in GPU_DERIVED_COPIES if copy.holder in names)


def derived_copies(model) -> list:
    """(module, DerivedCopy) for every copy `model` holds now."""
    if model is None or not hasattr(model, "modules"):
        return []
    return [(module, copy) for module in model.modules() for copy in copies_held_by(module.__class__)
            if copy.present(module, getattr(module, copy.attr, None))]


def stale_after(copy: DerivedCopy, source: str, graphs: bool) -> bool:
    """Whether `copy` would be stale after `source` (an update call, or `BEGIN`) on an engine that does (`graphs`)
    or does not replay CUDA graphs captured before the update."""
    if copy.stale == ALWAYS:
        return True
    if copy.stale == UNDER_GRAPHS:
        return graphs
    return source == BEGIN


_NO_ATTRIBUTE = object()


def captures_graphs(runner) -> bool:
    """Whether `runner` (a ModelRunner) replays graphs captured before an update: it holds a decode or prefill graph
    runner other than SGLang's eager one (graphs off leave None or the EagerRunner there,
    `cuda_graph_setup.capture_cuda_graphs`). A runner holding neither attribute counts as capturing (fail closed)."""
    from sglang.srt.model_executor.runner.eager_runner import EagerRunner
    held = [getattr(runner, name, _NO_ATTRIBUTE) for name in ("decode_cuda_graph_runner", "prefill_cuda_graph_runner")]
    return any(g is _NO_ATTRIBUTE or (g is not None and not isinstance(g, EagerRunner)) for g in held)


def gpu_derived_refusal(source: str, models, graphs: bool) -> Optional[str]:
    """The reason `source` must not run on `models` (target, then draft), or None: the first copy they hold that the
    update would leave stale. Invariant: None only if no copy of `GPU_DERIVED_COPIES` would be stale after it."""
    for model in models:
        for module, copy in derived_copies(model):
            if stale_after(copy, source, graphs):
                return refusal_message(source, model, module, copy)
    return None


def refusal_message(source: str, model, module, copy: DerivedCopy) -> str:
    outcome = "No bucketed update was opened" if source == BEGIN else "Nothing was loaded"
    return (f"vradix refused {source}: {type(model).__name__} holds a weight-derived copy vradix cannot version: "
            f"{copy.family} {copy.what} ({type(module).__name__}.{copy.attr}); {copy.why}, so the served model "
            f"would mix the new weights with values derived from the old ones ({copy.stale}). {outcome}. "
            f"{ALTERNATIVES[copy.stale]}")


def bypassed_sglang_refusal(models) -> Optional[str]:
    """What SGLang's own check refuses at every update call (`_unsupported_derived_weight_cache_error`: mHC splits,
    FP8->BF16 caches, paged experts, kernel plugins, ...) but not at begin_weight_update, after which a P2P/RDMA write
    makes no update call: the reason to refuse the begin, or None."""
    from sglang.srt.model_executor.model_runner_components.weight_updater import (
        _unsupported_derived_weight_cache_error)
    for model in models:
        reason = _unsupported_derived_weight_cache_error(model)
        if reason is not None:
            return (f"vradix refused {BEGIN}: SGLang refuses every update call of {type(model).__name__} ({reason}), "
                    "and a P2P/RDMA write into a bucketed update makes none. No bucketed update was opened")
    return None
