"""The runtime census: every place SGLang 0.5.23 changes the engine's configuration, an engine step, a cache tier or
the served adapters after the launch checked it, read from SGLang's live code and classified.

Three enumerations, one table (`RUNTIME`, rendered on docs/census/runtime.md):

- `override[<source>]`: every call that changes a resolved `ServerArgs` field after the launch, found in SGLang's
  installed sources by `ast`: `get_context().override(source, **fields)` and `record_config_updates(source,
  **fields)` (the TokenizerManager's forwarder to it; its own definition is not a site). A call whose source is not a
  literal (nor a name the function assigns one to) is named `override[<module>:<function>]`. These are what the scheduler's `/server_info` overlays on the
  startup configuration (`RuntimeContext.resolved_server_args_dict`).
- `SetInternalStateReq[<key>]`: every key `/set_internal_state` may change (`control.internal_state_keys`: the
  controller's update handlers).
- request types: every type the scheduler dispatches (`control.dispatched`) whose handler's own code attaches,
  detaches or clears a storage backend, loads or unloads an adapter, or overrides the configuration (`CHANGES`,
  matched in the handler's source).

Classes: `re-checked` (the scheduler re-runs the launch rules on the resulting configuration, refusing what the
launch refuses with nothing changed, and derives again what startup derived: `vradix.scheduler.reconfigure`, hooked
where the scheduler receives the request, `RECHECKED_BY`), `refused`, `publication`, `versioned`, `irrelevant` (the
reason says why it cannot change served state). Startup-time overrides (inside the engine's construction, before it
serves) are `irrelevant`: vradix attaches after the scheduler is built and derives its state from the result.

Invariants: the enumerations import SGLang but never start it; a table has exactly the names its enumeration returns
(test/closed_world/test_census.py; test/closed_world/test_runtime_census.py plants entries).
"""
from __future__ import annotations

import ast
import importlib.util
import inspect
import pathlib
import re
from typing import Iterable, Optional

from vradix_census import Entry, control

#: the page the table is rendered on (docs/)
DOC = "census/runtime.md"
#: what a dispatched handler's own code does when it changes a cache tier, the served adapters or the configuration
CHANGES = re.compile(r"\.override\(|_storage_backend\(|_lora_adapter")
#: the forwarders whose own definition passes a caller's source on (their callers are the sites)
FORWARDERS = ("record_config_updates",)
#: scheduler components a dispatched handler may be a method of (`control.Placeholder` paths)
COMPONENTS = {
    "weight_updater": "sglang.srt.managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager",
    "flush_wrapper": "sglang.srt.managers.scheduler_components.flush_wrapper.SchedulerFlushWrapper",
}


# ---------------------------------------------------------------------------------------- enumeration: overrides

def sglang_sources() -> list[pathlib.Path]:
    """SGLang's installed runtime sources (`sglang.srt`)."""
    spec = importlib.util.find_spec("sglang.srt")
    assert spec is not None and spec.submodule_search_locations, "sglang is not installed as a package"
    root = pathlib.Path(spec.submodule_search_locations[0])
    return sorted(root.rglob("*.py"))


def _is_override(call: ast.Call) -> bool:
    func = call.func
    if not isinstance(func, ast.Attribute):
        return False
    if func.attr in FORWARDERS:
        return True
    return (func.attr == "override" and isinstance(func.value, ast.Call) and isinstance(func.value.func, ast.Name)
            and func.value.func.id == "get_context")


def override_sites(files: Optional[Iterable[pathlib.Path]] = None) -> dict[str, list[str]]:
    """{`override[<source>]`: ["<module path>:<function>(<fields>)", ...]} for every configuration override call in
    `files` (SGLang's sources by default)."""
    files = sglang_sources() if files is None else list(files)
    sites: dict[str, list[str]] = {}
    for path in files:
        text = path.read_text(errors="ignore")
        if "get_context().override" not in text and not any(f"{f}(" in text for f in FORWARDERS):
            continue
        module = path.stem
        for function in ast.walk(ast.parse(text)):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) or function.name in FORWARDERS:
                continue
            constants = {t.id: n.value.value for n in ast.walk(function) if isinstance(n, ast.Assign)
                         and isinstance(n.value, ast.Constant) for t in n.targets if isinstance(t, ast.Name)}
            for call in ast.walk(function):
                if not isinstance(call, ast.Call) or not _is_override(call):
                    continue
                source = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "source"),
                                                             None)
                if isinstance(source, ast.Name) and source.id in constants:  # `source = "..."` in the function
                    source = ast.Constant(constants[source.id])
                name = str(source.value) if isinstance(source, ast.Constant) else f"{module}:{function.name}"
                fields = ", ".join(k.arg or "**" for k in call.keywords if k.arg != "source")
                sites.setdefault(f"override[{name}]", []).append(f"{module}:{function.name}({fields})")
    return sites


# ----------------------------------------------------------------------------------------- enumeration: requests

def handler_function(handler):
    """The function a dispatched handler runs: a Scheduler method, or a component's (`COMPONENTS`)."""
    if isinstance(handler, control.Placeholder):
        owner, _, name = handler.path.partition(".")
        module, _, cls = COMPONENTS[owner].rpartition(".")
        return getattr(getattr(importlib.import_module(module), cls), name)
    return getattr(handler, "__func__", handler)


def changing_requests(scheduler_class=None) -> list[str]:
    """The dispatched request types whose handler's own code changes a tier, the adapters or the configuration."""
    names = []
    for request_type, handler in control.dispatched(scheduler_class).items():
        try:
            source = inspect.getsource(inspect.unwrap(handler_function(handler)))
        except (OSError, TypeError):  # a lambda registered inline (the profiler's): its source is the dispatcher's
            continue
        if CHANGES.search(source):
            names.append(request_type.__name__)
    return names


def enumerate_runtime(scheduler_class=None, files=None) -> list[str]:
    """Every runtime change site: overrides, `/set_internal_state` keys, changing request types."""
    keys = [f"SetInternalStateReq[{k}]" for k in control.internal_state_keys(scheduler_class)]
    return sorted(set(override_sites(files)) | set(keys) | set(changing_requests(scheduler_class)))


# -------------------------------------------------------------------------------------------------- classification

_TESTS = "test_reconfigure.py::"
_ATTACH = Entry(
    "re-checked", "attaches an L3 backend at runtime (SGLang: idle engine only; sets `hicache_storage_backend` and "
    "the policies it names): the scheduler runs every launch rule on the resulting configuration first (streaming "
    "sessions with L3, the P/D restore policy, the staleness window's flags, ...) and the engine's startup rules "
    "(the KV page ledger against its blind spots, the window's preconditions); refused: `success=false` with the "
    "launch's reason (HTTP 400), nothing attached. After it, the publication steps are derived again (L3 lookups: "
    "a publication revokes and re-issues queued prefetches)",
    (f"{_TESTS}test_a_storage_attached_at_runtime_makes_the_next_publication_revoke_queued_prefetches",
     f"{_TESTS}test_a_runtime_attach_the_launch_refuses_is_refused_by_the_scheduler_and_changes_nothing",
     "test_pd_rules.py::test_a_runtime_attach_with_another_policy_is_refused_before_any_scheduler"))
_DETACH = Entry(
    "re-checked", "detaches the L3 backend (idle engine only): nothing a launch refuses is turned on; the publication "
    "steps are derived again (L3 lookups off)",
    (f"{_TESTS}test_a_storage_attached_at_runtime_makes_the_next_publication_revoke_queued_prefetches",))
_THRESHOLD = Entry(
    "re-checked", "speculative acceptance threshold: the scheduler refuses a value below 1 (`updated=false`, nothing "
    "set; the launcher answers HTTP 400 first), as the same flag is refused at launch; 1 or more applies and the "
    "steps are derived again",
    (f"{_TESTS}test_relaxed_speculative_acceptance_is_refused_by_the_scheduler_without_the_launcher",
     "test_control_requests.py::test_relaxing_speculative_acceptance_at_runtime_is_refused"))
_INTERNAL_STATE = Entry(
    "re-checked", "`/set_internal_state`'s keys (rows `SetInternalStateReq[...]`), checked together by the scheduler "
    "on the resulting configuration before any applies", _THRESHOLD.tests)
_LORA = "no launch rule and nothing startup derives reads the served adapters (the LoRA flags are launch-only)"
_STARTUP = "set while the engine is built, before it serves and before vradix attaches, which derives its state " \
           "from the result; "
_PUBLICATION_RECORD = ("records what a weight publication loaded (control census row `{}`): the publication bumps "
                       "the epoch; no launch rule reads the field")
_DRAFT_WIDTH = ("adaptive speculative decoding's draft width (steps, draft tokens, their graph batch sizes): draft "
                "proposals only, which the target verifies losslessly at the thresholds vradix allows")
_ROLE_SWITCH = control.REQUESTS["PdRoleSwitchReqInput"]
_ELASTIC_EP = control.REQUESTS["ScaleElasticEPReqInput"]


def _publication(request: str) -> Entry:
    source = control.REQUESTS[request]
    return Entry("publication", _PUBLICATION_RECORD.format(request), source.tests)


RUNTIME = {
    # control requests that change a tier or the adapters
    "AttachHiCacheStorageReqInput": _ATTACH,
    "DetachHiCacheStorageReqInput": _DETACH,
    "ClearHiCacheReqInput": Entry("irrelevant", "deletes the L3 backend's pages: the configuration and the steps are "
                                  "unchanged, later lookups miss"),
    "LoadLoRAAdapterReqInput": Entry("versioned", f"adds a served adapter, its own namespace identified by its "
                                     f"content; {_LORA}", control.REQUESTS["LoadLoRAAdapterReqInput"].tests),
    "LoadLoRAAdapterFromTensorsReqInput": Entry(
        "versioned", f"adds a served adapter from tensors, identified by them; {_LORA}",
        control.REQUESTS["LoadLoRAAdapterFromTensorsReqInput"].tests),
    "UnloadLoRAAdapterReqInput": Entry("versioned", f"removes a served adapter and frees its entries; {_LORA}",
                                       control.REQUESTS["UnloadLoRAAdapterReqInput"].tests),
    # /set_internal_state
    "SetInternalStateReq[speculative_accept_threshold_single]": _THRESHOLD,
    "SetInternalStateReq[speculative_accept_threshold_acc]": _THRESHOLD,
    "SetInternalStateReq[pp_max_micro_batch_size]": Entry(
        "irrelevant", "the pipeline-parallel micro-batch size: scheduling only, read by no launch rule or derived "
        "step (the scheduler re-checks it with the other keys)"),
    "SetInternalStateReq[dspark_force_budget_frac]": Entry(
        "irrelevant", "a DSpark draft worker command: draft proposals only, verified losslessly"),
    "SetInternalStateReq[dspark_clear_info_records]": Entry("irrelevant", "clears the DSpark draft's statistics"),
    # configuration overrides, by source
    "override[update_server_args]": _INTERNAL_STATE,
    "override[scheduler.attach_hicache]": _ATTACH,
    "override[scheduler.detach_hicache]": _DETACH,
    "override[tokenizer.attach_hicache]": Entry(
        "irrelevant", "the TokenizerManager's mirror of a scheduler attach, written after every scheduler answered "
        "success (row `override[scheduler.attach_hicache]`); `GET /hicache/storage-backend` reads it"),
    "override[tokenizer.detach_hicache]": Entry(
        "irrelevant", "the TokenizerManager's mirror of a scheduler detach (row `override[scheduler.detach_hicache]`)"),
    "override[scheduler.weight_version]": _publication("UpdateWeightVersionReqInput"),
    "override[tokenizer.weight_version]": _publication("UpdateWeightVersionReqInput"),
    "override[model_runner.update_model_fields]": _publication("UpdateWeightFromDiskReqInput"),
    "override[tokenizer.update_weights]": _publication("UpdateWeightFromDiskReqInput"),
    "override[role_switch.flip]": _ROLE_SWITCH,
    "override[tokenizer.pd_role_switch]": _ROLE_SWITCH,
    "override[model_runner.ensure_decode_cuda_graphs]": Entry(
        _ROLE_SWITCH.class_, "captures decode graphs when a role switch makes prefill a decode role: the role "
        "switch does not start (row `PdRoleSwitchReqInput`)", _ROLE_SWITCH.tests, _ROLE_SWITCH.alternative),
    "override[elastic_ep.scale]": _ELASTIC_EP,
    "override[elastic_ep.scale_join]": _ELASTIC_EP,
    "override[adaptive_spec.restore]": Entry("irrelevant", _DRAFT_WIDTH),
    "override[adaptive_spec.capture_override]": Entry("irrelevant", _DRAFT_WIDTH),
    "override[adaptive_spec.capture_restore]": Entry("irrelevant", _DRAFT_WIDTH),
    "override[grammar.import_fallback]": Entry("irrelevant", _STARTUP + "the grammar backend (constrained decoding "
                                               "of sampled tokens, no cached state)"),
    "override[template-detection]": Entry("irrelevant", _STARTUP + "the chat template's parsers (launcher)"),
    "override[scheduler.pp_max_micro_batch_size_default]": Entry("irrelevant", _STARTUP + "scheduling only"),
    "override[metrics_reporter.ipc_endpoint]": Entry("irrelevant", _STARTUP + "where forward-pass metrics go"),
    "override[hicache.auto_size]": Entry("irrelevant", _STARTUP + "the host pool's size, which vradix reads from "
                                         "the pool it attaches to"),
    **{f"override[mamba_pool.{site}]": Entry("irrelevant", _STARTUP + "the recurrent-state pool's size")
       for site in ("per_dp_shard", "from_max_running_requests", "memory_budget_spec", "memory_budget")},
    "override[ModelRunner._sm80_dtype_fallback]": Entry("irrelevant", _STARTUP + "the model dtype on GPUs without "
                                                        "bfloat16, before the weights load"),
    "override[model_runner.chunked_prefix_cache_gate]": Entry("irrelevant", _STARTUP + "a prefill kernel choice"),
    "override[kv_cache_builder.decode_retraction]": Entry(
        "irrelevant", _STARTUP + "where a P/D decode role backs up retracted requests' KV (its epochs are kept "
        "through the backup: `hooks.pd`)"),
}

#: each `re-checked` row's scheduler-side hook: (HOOKS target, `vradix.hooks` module.function)
_SCHED = "sglang.srt.managers.scheduler.Scheduler"
_CONTROLLER = "sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController"
RECHECKED_BY = {
    _ATTACH: (f"{_SCHED}.attach_hicache_storage_wrapped", "reconfigure.recheck_storage_attach"),
    _DETACH: (f"{_SCHED}.detach_hicache_storage_wrapped", "reconfigure.rederive_after_storage_detach"),
    _THRESHOLD: (f"{_CONTROLLER}.set_internal_state", "reconfigure.recheck_internal_state"),
    _INTERNAL_STATE: (f"{_CONTROLLER}.set_internal_state", "reconfigure.recheck_internal_state"),
}

TABLES = {
    "runtime": ("Runtime changes of the configuration, a tier or the adapters (`get_context().override` sites, "
                "`/set_internal_state` keys, changing request types)", enumerate_runtime, RUNTIME),
}
