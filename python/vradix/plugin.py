"""The vradix SGLang plugin: every hook vradix installs, in one table, and the fail-closed install.

Entry point: `sglang.srt.plugins: vradix = vradix.plugin:register`. SGLang's `load_plugins()` calls `register()` in
the launcher and, first thing, in every scheduler process (`run_scheduler_process`).

Fail closed: `load_plugins()` only logs plugin exceptions and `HookRegistry.apply_hooks()` only logs a target it
cannot patch. So `register()` applies the hooks itself and then checks that every target really carries its hook;
if one is missing it raises `VradixInstallError`, a `SystemExit` subclass that `load_plugins()` does not swallow, so
the launcher (and any scheduler process) exits with an error naming the hook instead of serving an unversioned cache.
`VRADIX_DISABLE=1` opts out (stock SGLang) for A/B runs.
"""
from __future__ import annotations

import logging
import os
import pkgutil
from importlib.metadata import version as dist_version

from vradix import __version__, engine, ledger, overlap, report
from vradix.guard import GuardConfig, GuardConfigError

logger = logging.getLogger("vradix")

SUPPORTED_SGLANG = "0.5.23"
_SCHED = "sglang.srt.managers.scheduler.Scheduler"
_UPDATER = "sglang.srt.managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager"
_COMMON = "sglang.srt.mem_cache.common"
_TOKEN_ALLOC = "sglang.srt.mem_cache.allocator.token.TokenToKVPoolAllocator"
_PAGED_ALLOC = "sglang.srt.mem_cache.allocator.paged.PagedTokenToKVPoolAllocator"
_OUT = "sglang.srt.managers.scheduler_components.output_streamer"
_TM = "sglang.srt.managers.tokenizer_manager.TokenizerManager"

#: (target, hook type, hook) — the complete list of places vradix attaches, in data-path order.
HOOKS = [
    # engine start
    (f"{_SCHED}.__init__", "AFTER", engine.attach_to_scheduler),
    # 1. admission: stamp, and re-bind queued requests before they match
    (f"{_SCHED}._maybe_namespace_elastic_radix_cache", "AFTER", engine.stamp_request),
    (f"{_COMMON}.match_kv_cache", "BEFORE", engine.rebind_before_match),
    (f"{_COMMON}.match_kv_cache", "AROUND", engine.verify_match),
    ("sglang.srt.mem_cache.allocation.alloc_for_extend", "AFTER", engine.sample_verify_prefill_batch),
    # forward: the KV page ledger records which epoch wrote each page, and which pages are free
    (f"{_SCHED}.run_batch", "BEFORE", engine.stamp_forward_batch),
    (f"{_TOKEN_ALLOC}.free", "BEFORE", ledger.on_free_slots),
    (f"{_PAGED_ALLOC}.free", "BEFORE", ledger.on_free_slots),
    (f"{_PAGED_ALLOC}.free_page_ids", "BEFORE", ledger.on_free_pages),
    (f"{_TOKEN_ALLOC}.clear", "AFTER", ledger.on_clear),
    (f"{_PAGED_ALLOC}.clear", "AFTER", ledger.on_clear),
    # 2. publication: every way the weights (or their label) change bumps the epoch once
    (f"{_UPDATER}.update_weights_from_disk", "AROUND", engine.publish_update_from_disk),
    (f"{_UPDATER}.update_weights_from_distributed", "AROUND", engine.publish_update_from_distributed),
    (f"{_UPDATER}.update_weights_from_tensor", "AROUND", engine.publish_update_from_tensor),
    (f"{_UPDATER}.update_weights_from_ipc", "AROUND", engine.publish_update_from_ipc),
    (f"{_UPDATER}.record_weight_version_after_update", "AROUND", engine.publish_after_version_record),
    (f"{_UPDATER}.begin_weight_update", "BEFORE", engine.drain_before_weight_session),
    (f"{_UPDATER}.end_weight_update", "AROUND", engine.publish_on_session_end),
    (f"{_SCHED}.record_weight_version_change", "AROUND", engine.publish_on_version_change),
    # bad input: an invalid publication label is refused in the launcher before anything changes
    ("sglang.srt.managers.tokenizer_control_mixin.TokenizerControlMixin.update_weight_version", "BEFORE",
     engine.reject_bad_version_label),
    ("sglang.srt.managers.tokenizer_manager.TokenizerManager.update_weights_from_disk", "AROUND",
     engine.reject_bad_update_label),
    # overlap safety: nothing in flight while weights change
    (f"{_SCHED}.pause_generation", "BEFORE", engine.drain_before_in_place_pause),
    (f"{_SCHED}.process_batch_result", "AROUND", overlap.skip_drained_result),
    # 3. reclaim: lock-aware, at release and on flush
    (f"{_COMMON}.release_kv_cache", "AROUND", engine.reclaim_on_release),
    (f"{_SCHED}.flush_cache", "AROUND", engine.lock_aware_flush),
    # 4. report
    ("sglang.srt.managers.scheduler_components.flush_wrapper.SchedulerFlushWrapper.handle", "AFTER",
     engine.report_flush),
    ("sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController.get_internal_state",
     "AFTER", engine.report_server_info),
    # 5. provenance: scheduler -> customized_info -> tokenizer manager meta_info -> OpenAI metadata
    (f"{_OUT}._GenerationStreamAccumulator.accept", "AROUND", report.attach_provenance),
    (f"{_TM}.update_request_meta_info", "AROUND", report.provenance_to_meta_info),
    ("sglang.srt.utils.weight_versions.build_endpoint_weight_version_metadata", "AFTER",
     report.provenance_to_openai_metadata),
    # the /flush_cache HTTP body says what the invalidation did (launcher process)
    ("sglang.srt.managers.tokenizer_control_mixin.TokenizerControlMixin.flush_cache", "AROUND",
     report.remember_flush_message),
    ("sglang.srt.entrypoints.http_server.launch_server", "BEFORE", report.add_flush_report_middleware),
    # 6. LoRA-scoped invalidation: an adapter's entries are freed when it is unloaded
    ("sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.checkpoint_into_tree", "AFTER",
     engine.remember_adapter_insert),
    (f"{_SCHED}.load_lora_adapter", "AFTER", engine.count_adapter_load),
    (f"{_SCHED}.load_lora_adapter_from_tensors", "AFTER", engine.count_adapter_load),
    (f"{_SCHED}.unload_lora_adapter", "AFTER", engine.free_unloaded_adapter),
]


class VradixInstallError(SystemExit):
    """vradix could not install a required hook; the engine must not serve an unversioned radix cache."""


def disabled() -> bool:
    return os.environ.get("VRADIX_DISABLE", "").strip().lower() in ("1", "true", "yes", "on")


def register() -> None:
    """Install every hook in `HOOKS` and verify each one took, or exit with `VradixInstallError`."""
    if disabled():
        logger.warning("vradix %s installed but disabled by VRADIX_DISABLE: stock SGLang radix cache", __version__)
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    sglang_version = dist_version("sglang")
    if sglang_version != SUPPORTED_SGLANG and os.environ.get("VRADIX_ALLOW_UNTESTED_SGLANG") != "1":
        raise VradixInstallError(
            f"vradix {__version__} supports sglang=={SUPPORTED_SGLANG}, found {sglang_version}; refusing to start "
            "(set VRADIX_DISABLE=1 for stock behaviour)")
    try:
        GuardConfig.from_env()
    except GuardConfigError as e:
        raise VradixInstallError(f"vradix {__version__}: {e}") from None
    hooks = [(_fault_injected(target), getattr(HookType, kind), hook) for target, kind, hook in HOOKS]
    for target, kind, hook in hooks:
        HookRegistry.register(target, hook, kind)
    HookRegistry.apply_hooks()
    missing = [target for target, _, hook in hooks if not is_installed(target, hook)]
    if missing:
        raise VradixInstallError(
            f"vradix {__version__}: could not install hook(s) {', '.join(missing)} on sglang {sglang_version}; "
            "refusing to serve an unversioned radix cache (set VRADIX_DISABLE=1 for stock behaviour)")
    logger.info("vradix %s: %d hooks installed", __version__, len(hooks))


def is_installed(target: str, hook) -> bool:
    """Whether the callable now at `target` is a HookRegistry wrapper chain that contains `hook`."""
    try:
        fn = pkgutil.resolve_name(target)
    except (ImportError, AttributeError, ValueError):
        return False
    fn = getattr(fn, "__func__", fn)
    while fn is not None:
        if any(getattr(cell, "cell_contents", None) is hook for cell in (getattr(fn, "__closure__", None) or ())):
            return True
        fn = getattr(fn, "__wrapped__", None)
    return False


def _fault_injected(target: str) -> str:
    """Fault injection for the fail-closed test: VRADIX_FAULT_MISSING_HOOK=<suffix> renames that target to one that
    does not exist, as a different sglang version would."""
    fault = os.environ.get("VRADIX_FAULT_MISSING_HOOK")
    return target + "_missing_in_this_sglang" if fault and target.endswith(fault) else target
