"""SGLang paths vradix cannot version in 0.5.23, refused before any scheduler starts (the closed world,
docs/coverage.md).

Each `Refusal` names the server flag that turns a path on, why the path can hand a request KV (or weight-derived
state) that vradix does not see, and the alternative that is versioned. `check(server_args)` raises
`UnversionedPathError` for the first flag set, so the engine does not start and the error names the flag; nothing
else has been built yet, so nothing is lost. The rules read `ServerArgs` fields and environment settings; a boolean
setting is read through SGLang's own `envs` field, so it is parsed exactly as the launcher parses it.

Invariant: a row of docs/coverage.md whose verdict is "refused at launch" has its `Refusal` here, and
test/closed_world/test_coverage.py starts SGLang's own argument pipeline with that flag and expects this error.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable


class UnversionedPathError(ValueError):
    """A server flag turns on a path that could serve KV or state of other weights, unversioned."""


@dataclass(frozen=True)
class Refusal:
    flag: str
    is_set: Callable[[object], bool]
    why: str
    alternative: str

    def message(self) -> str:
        return (f"vradix refuses to start with {self.flag}: {self.why}. Serving it would be unversioned. "
                f"Instead: {self.alternative}; or set VRADIX_DISABLE=1 for stock behaviour (docs/coverage.md).")


def _field(name: str, default=None):
    return lambda args: getattr(args, name, default)


def _env_above_zero(name: str) -> Callable[[object], bool]:
    """An environment setting SGLang reads as a float, set above 0 (unset or unparsable: not set)."""
    def is_set(_args) -> bool:
        try:
            return float(os.environ.get(name, "-1")) > 0
        except ValueError:
            return False
    return is_set


def _sglang_env_on(name: str) -> Callable[[object], bool]:
    """A boolean environment setting, read through SGLang's own field (`sglang.srt.environ.envs`), so vradix and
    the launcher that branches on it agree on every spelling SGLang accepts."""
    def is_set(_args) -> bool:
        from sglang.srt.environ import envs
        return bool(getattr(envs, name).get())
    return is_set


def _any_env_above_zero(*names: str) -> Callable[[object], bool]:
    """Any of several environment settings SGLang reads as floats, set above 0."""
    checks = [_env_above_zero(name) for name in names]
    return lambda args: any(check(args) for check in checks)


def _env_nonempty(name: str) -> Callable[[object], bool]:
    """A string environment setting, set to anything but blanks."""
    return lambda _args: bool(os.environ.get(name, "").strip())


#: the KV canary's fault injections: each corrupts what a request reads (its slot table, its KV, its next token)
KV_CANARY_PERTURBATIONS = ("SGLANG_KV_CANARY_PERTURB_REQ_TO_TOKEN_PROB", "SGLANG_KV_CANARY_PERTURB_REAL_KV_USED_PROB",
                           "SGLANG_KV_CANARY_PERTURB_REAL_KV_UNUSED_CACHE_PROB",
                           "SGLANG_KV_CANARY_PERTURB_REAL_KV_POST_FORWARD_PROB",
                           "SGLANG_KV_CANARY_PERTURB_NEXT_TOKEN_SWAP_PROB")


def _kv_outside_forwards(args) -> bool:
    """KV that reaches the device without a forward on this engine: HiCache load-backs, a P/D decode role's
    transfers, the external cache linker."""
    return bool(getattr(args, "enable_hierarchical_cache", False)
                or getattr(args, "disaggregation_mode", "null") == "decode"
                or getattr(args, "enable_unified_cache_external_linker", False))


REFUSALS = (
    Refusal("--enable-flexkv", _field("enable_flexkv"),
            "FlexKV's cache is a RadixCache without the tree core vradix namespaces, and FlexKV stores KV outside "
            "SGLang under keys that carry no weight identity",
            "HiCache with an L3 storage backend (--enable-hierarchical-cache --hicache-storage-backend ...), which "
            "vradix versions"),
    Refusal("--enable-lmcache", _field("enable_lmcache"),
            "LMCache salts its storage keys inside the external package, so vradix cannot show they carry the "
            "weight identity, and its retrieve path loads device KV outside the page ledger",
            "HiCache with an L3 storage backend (--enable-hierarchical-cache --hicache-storage-backend ...)"),
    Refusal("--radix-cache-backend", _field("radix_cache_backend"),
            "a registered third-party prefix cache is not SGLang's UnifiedRadixCache, whose namespaces and tree "
            "core vradix versions",
            "the default radix cache (leave --radix-cache-backend unset)"),
    Refusal("--pp-size above 1", lambda args: int(getattr(args, "pp_size", 1) or 1) > 1,
            "the pipeline-parallel loops keep several micro-batches in flight and process each one's sampled tokens "
            "iterations after its launch; the overlap drain a publication runs does not reach them, so tokens of "
            "micro-batches launched before a publication would be processed after it and labelled with the new "
            "weights",
            "--pp-size 1 (tensor or data parallelism, --tp-size / --dp-size, which vradix versions)"),
    Refusal("--enable-pd-role-switch", _field("enable_pd_role_switch"),
            "a role switch resets the tree under the launch role's scope, so the role-local L3 namespaces and the "
            "decode-only restore rules would follow the wrong role",
            "separate prefill and decode engines, each started in its role"),
    Refusal("--enable-streaming-session on a P/D decode role",
            lambda args: (bool(getattr(args, "enable_streaming_session", False))
                          and getattr(args, "disaggregation_mode", "null") == "decode"),
            "decode hands a transferred request's KV record to its session slot (DecodeTransferQueue), a path "
            "vradix's session step (docs/streaming-sessions.md) has not been checked against",
            "streaming sessions on a non-P/D engine, or plain sessions over P/D"),
    Refusal("--disaggregation-mode decode without --disaggregation-decode-enable-radix-cache",
            lambda args: (getattr(args, "disaggregation_mode", "null") == "decode"
                          and (not getattr(args, "disaggregation_decode_enable_radix_cache", False)
                               or bool(getattr(args, "disable_radix_cache", False)))),
            "without its radix cache (SGLang's default for decode) vradix runs treeless there: no epoch binds a "
            "request, so the weight-identity handshake has nothing to compare and decode would commit KV prefill "
            "computed under any weights, before or after a publication",
            "a decode role with its radix cache (--disaggregation-decode-enable-radix-cache), which vradix versions "
            "and whose handshake refuses KV of other weights"),
    Refusal("--enable-streaming-session with --disable-radix-cache",
            lambda args: (bool(getattr(args, "enable_streaming_session", False))
                          and bool(getattr(args, "disable_radix_cache", False))),
            "without a radix cache vradix keeps no epochs (it runs treeless), yet SGLang's session slot still keeps "
            "the last turn's KV and lends it to the session's next turn, across a publication too, so that turn "
            "would be computed on the previous weights' KV",
            "streaming sessions with the radix cache on (vradix versions their slots), or plain sessions without "
            "the radix cache"),
    Refusal("--enable-streaming-session with --hicache-storage-backend",
            lambda args: (bool(getattr(args, "enable_streaming_session", False))
                          and bool(getattr(args, "enable_hierarchical_cache", False))
                          and bool(getattr(args, "hicache_storage_backend", None))),
            "SGLang 0.5.23's L3 prefetch (`Scheduler._prefetch_kvcache`) takes a session turn's slot stand-in "
            "(`_VirtualNode`) for a tree node and stops the scheduler at the session's second turn (stock SGLang "
            "too), so the engine cannot serve the pair",
            "streaming sessions with HiCache's host tier only (no --hicache-storage-backend), or the L3 storage "
            "backend without streaming sessions"),
    Refusal("--enable-torch-compile on the CPU engine",
            lambda args: bool(getattr(args, "enable_torch_compile", False)) and getattr(args, "device", None) == "cpu",
            "the CPU graph runner compiles with Inductor freezing, which folds the weights into the compiled graph "
            "as constants, and a weight update does not recompile it",
            "the CPU engine without --enable-torch-compile"),
    Refusal("--offload-mode sharded_gpu/meta",
            lambda args: (int(getattr(args, "offload_group_size", -1) or -1) > 0
                          and getattr(args, "offload_mode", "cpu") in ("sharded_gpu", "meta")),
            "these offload modes keep the real weights outside the module's parameters, which a weight update "
            "writes into a meta tensor without effect",
            "--offload-mode cpu or shm_cpu, which a weight update writes in place"),
    Refusal("--elastic-ep-backend",
            lambda args: getattr(args, "elastic_ep_backend", None) not in (None, "none"),
            "elastic EP recovery reloads lost experts from the startup checkpoint or a startup host backup, never "
            "from the last publication, so a recovered engine mixes old experts into new weights",
            "a fixed EP layout"),
    Refusal("--kt-weight-path", lambda args: getattr(args, "kt_weight_path", None) is not None,
            "KTransformers serves the CPU experts from this path and reloads them from it at every post-load step "
            "(`KTEPWrapperMethod.process_weights_after_loading`, which an update runs too), so a publication's CPU "
            "experts never reach them and the engine serves the startup experts with the published rest",
            "every expert on the device (leave --kt-weight-path unset), or a restart on the new checkpoint"),
    Refusal("--enable-return-routed-experts/--enable-return-indexer-topk with KV that arrives outside a forward",
            lambda args: (bool(getattr(args, "enable_return_routed_experts", False)
                               or getattr(args, "enable_return_indexer_topk", False)) and _kv_outside_forwards(args)),
            "the routed-experts capture buffer is written per KV slot by forwards only, so a prefix loaded from "
            "HiCache, received over P/D or linked from an external store returns what those slots last held",
            "routed-experts capture on an engine without HiCache, P/D decode or the external linker"),
    Refusal("SGLANG_SIMULATE_ACC_LEN above 0", _env_above_zero("SGLANG_SIMULATE_ACC_LEN"),
            "draft tokens are accepted without verification, so the draft model's state decides outputs",
            "leave SGLANG_SIMULATE_ACC_LEN unset (a benchmark setting)"),
    Refusal("--speculative-accept-threshold-single/--speculative-accept-threshold-acc below 1",
            lambda args: (getattr(args, "speculative_algorithm", None) is not None
                          and min(float(getattr(args, "speculative_accept_threshold_single", 1.0)),
                                  float(getattr(args, "speculative_accept_threshold_acc", 1.0))) < 1.0),
            "relaxed acceptance lets the draft model's proposals, which a publication does not version, change "
            "the outputs",
            "speculative decoding with the default thresholds (1.0), where verification is lossless"),
    Refusal("SGLANG_RUST_SERVER", _sglang_env_on("SGLANG_RUST_SERVER"),
            "the embedded Rust frontend replaces the HTTP server and the TokenizerManager, so none of vradix's "
            "launcher-side steps runs: responses carry no provenance, a staleness bound above the window is not "
            "refused, a bucketed update does not hold generation, and the flush report and the cache "
            "inspector are gone",
            "the Python HTTP server (leave SGLANG_RUST_SERVER unset)"),
    Refusal("--smg-grpc-mode", lambda args: bool(getattr(args, "smg_grpc_mode", False)
                                                 or getattr(args, "grpc_mode", False)),
            "the SMG gRPC server replaces SGLang's HTTP server and TokenizerManager with the servicer's own request "
            "manager, so no launcher-side vradix check runs there (the bucketed update's hold, the refusal of a "
            "continue inside a bucketed update and of relaxed acceptance, the staleness bound's 400, provenance)",
            "the HTTP server, with SGLang's native gRPC server beside it if needed (--grpc-port), which goes "
            "through the TokenizerManager"),
    Refusal("--dllm-algorithm", lambda args: getattr(args, "dllm_algorithm", None) is not None,
            "diffusion-LLM serving stages requests between denoising blocks in its own queues (the dLLM "
            "manager's waiting and staging queues), outside the waiting queue and batches a publication re-binds "
            "or marks crossing, so a staged request could continue on KV of the previous weights",
            "autoregressive serving of the model (leave --dllm-algorithm unset)"),
    Refusal("SGLANG_ROCM_OPT_DSPARK_FP8_LM_HEAD", _sglang_env_on("SGLANG_ROCM_OPT_DSPARK_FP8_LM_HEAD"),
            "the target's verify logits run through an FP8 copy of lm_head quantized at its first use and kept on "
            "the module (`_fp8_weight_cache`, rebuilt only when the shape changes), so after a weight update the "
            "logits would still come from the old lm_head",
            "leave SGLANG_ROCM_OPT_DSPARK_FP8_LM_HEAD unset (the lm_head GEMM reads the live weight)"),
    Refusal("SGLANG_OPT_FUSE_SWIGLU_INTERLEAVED", _sglang_env_on("SGLANG_OPT_FUSE_SWIGLU_INTERLEAVED"),
            "the MoE w13 gate/up rows are permuted in place after loading and nothing restores the checkpoint "
            "layout before an update, so a tensor, distributed or IPC update writes checkpoint-layout rows the "
            "kernels read as interleaved: the served experts would not be the published ones",
            "leave SGLANG_OPT_FUSE_SWIGLU_INTERLEAVED unset (the separate SwiGLU reads the checkpoint layout)"),
    Refusal("SGLANG_DSV4_DENSE_MXSCALE", _sglang_env_on("SGLANG_DSV4_DENSE_MXSCALE"),
            "the dense block-FP8 GEMMs read an e8m0 copy of each weight's scale, built after loading "
            "(`weight._mxscale_w_scale`), which an update that does not rerun the post-load step (tensor, "
            "distributed, IPC) leaves computed from the old scales",
            "leave SGLANG_DSV4_DENSE_MXSCALE unset (the fp32-scale GEMM reads the live scales)"),
    Refusal("SGLANG_DEBUG_HISPARSE_SKIP_IO", _sglang_env_on("SGLANG_DEBUG_HISPARSE_SKIP_IO"),
            "the HiSparse swap-in skips the host-to-device KV copy, so a request attends over whatever its device "
            "slots held before, KV of other requests and possibly of other weights (a benchmark probe SGLang "
            "documents as garbage output)",
            "leave SGLANG_DEBUG_HISPARSE_SKIP_IO unset"),
    Refusal("SGLANG_KV_CANARY_PERTURB_REQ_TO_TOKEN_PROB (or another SGLANG_KV_CANARY_PERTURB_*_PROB) above 0",
            _any_env_above_zero(*KV_CANARY_PERTURBATIONS),
            f"the KV canary's fault injections ({', '.join(KV_CANARY_PERTURBATIONS)}) corrupt what a request reads "
            "on purpose: a perturbed slot table points it at KV of other requests, possibly of other weights",
            "leave the SGLANG_KV_CANARY_PERTURB_*_PROB settings unset (the canary itself only detects)"),
    Refusal("SGLANG_DEBUG_REVERT_PR", _env_above_zero("SGLANG_DEBUG_REVERT_PR"),
            "it patches SGLang at startup to undo a registered bug fix (`debug_utils/pr_fix_toggle.py`: attention "
            "metadata under CUDA graphs, the request-to-token table's size, speculative draft steps), bringing back "
            "a bug a regression test reproduces, so which KV a request reads is no longer what SGLang's released "
            "code says",
            "leave SGLANG_DEBUG_REVERT_PR unset (a regression-test setting)"),
    Refusal("SGLANG_EXTERNAL_MODEL_PACKAGE", _env_nonempty("SGLANG_EXTERNAL_MODEL_PACKAGE"),
            "the model classes come from an external package, whose weight-derived state (memos, fused or "
            "requantized copies built after loading) vradix has not read, so a publication could leave it stale",
            "a model class SGLang ships (leave SGLANG_EXTERNAL_MODEL_PACKAGE unset)"),
)


def check(server_args) -> None:
    """Raise UnversionedPathError naming the first refused flag `server_args` sets; return if none is set."""
    for refusal in REFUSALS:
        if refusal.is_set(server_args):
            raise UnversionedPathError(refusal.message())
