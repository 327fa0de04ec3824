"""Every private SGLang name vradix reads, calls or imports outside the hook table (`HOOKS`), in one place.

`HOOKS` names the places vradix attaches, and the install checks each carries its hook. vradix's steps also read
private attributes of SGLang objects, call their private methods and import private functions; under an SGLang whose
internals moved, such a name would fail mid-serving (an `AttributeError` in the middle of a publication) instead of
at startup. `vradix.plugin` therefore checks every `PrivateName` here before it installs a single hook, and refuses
to start naming the ones that are missing (`missing()`).

How each kind is checked, without running SGLang code:
- `MEMBER`: a method or class attribute: `getattr` on the owner class (or module) finds it;
- `INSTANCE`: an attribute SGLang sets on its instances: the source of the owner class, or of an SGLang class it
  inherits from, assigns `self.<name>` (read as text, per class, so the check costs milliseconds);
- `ASSIGNED`: an attribute an SGLang function sets on another object (a derived copy on a torch module, set
  plainly, in a tuple or by `setattr`): the source of the module that builds it still names `.<name>` or
  `"<name>"` (read as text, nothing imported), the tripwire a rename trips.

Invariants: every leading-underscore attribute, `getattr`/`hasattr` name and `from sglang... import _name` in
vradix's product code (not `vradix.testing`) that vradix does not define itself is listed here
(test/hooks/test_sglang_names.py scans the source); `missing(PRIVATE_NAMES)` is empty on SGLang 0.5.23.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import re
from dataclasses import dataclass
from typing import Any

MEMBER, INSTANCE, ASSIGNED = "member", "instance", "assigned"

_SCHED = "sglang.srt.managers.scheduler:Scheduler"
_URC = "sglang.srt.mem_cache.unified_radix_cache:UnifiedRadixCache"
_UPDATER = "sglang.srt.managers.scheduler_components.weight_updater:SchedulerWeightUpdaterManager"


@dataclass(frozen=True)
class PrivateName:
    """`owner` ("module:Qualname", or "module" for a module-level name) has `name`, of `kind`; `used_in` says
    where vradix uses it."""

    owner: str
    name: str
    kind: str
    used_in: str

    def label(self) -> str:
        return f"{self.owner.replace(':', '.')}.{self.name}"


PRIVATE_NAMES = (
    # the tree cache: eviction, cache actions and storage prefetch, driven by vradix's reclaim and L3 steps
    PrivateName(_URC, "_evict_device_next_node", MEMBER, "core.deferred_reclaim (the next evictable node)"),
    PrivateName(_URC, "_evict_device_leaf", MEMBER, "core.reclaim.evict_node"),
    PrivateName(_URC, "_apply_eviction_result", MEMBER, "core.reclaim.evict_node (write-back trees)"),
    PrivateName(_URC, "_accumulate_tracker", MEMBER, "core.reclaim.evict_node (write-back trees)"),
    PrivateName(_URC, "_apply_cache_actions", MEMBER, "core.staleness (a window epoch's device prefix length)"),
    PrivateName(_URC, "_finish_storage_prefetch", MEMBER, "l3.prefetch (revoking a prefetch at a publication)"),
    PrivateName(_URC, "_retire_ongoing_prefetch", MEMBER, "l3.prefetch (revoking a prefetch at a publication)"),
    PrivateName("sglang.srt.mem_cache.common", "_req_radix_key", MEMBER, "core.staleness (the key a match uses)"),
    # the scheduler
    PrivateName(_SCHED, "_engine_paused", INSTANCE, "scheduler.publication, hooks.server_info (is generation paused)"),
    PrivateName(_SCHED, "_pending_chunked_abort_req", INSTANCE, "hooks.ledger (a chunked request being aborted)"),
    PrivateName(_SCHED, "_prefetch_kvcache", MEMBER, "l3.prefetch (re-issuing a revoked prefetch)"),
    PrivateName("sglang.srt.managers.scheduler_components.flush_wrapper:SchedulerFlushWrapper", "_flush_cache",
                INSTANCE, "hooks.server_info.report_flush (the scheduler behind a flush)"),
    # weight updates
    PrivateName(_UPDATER, "_session", MEMBER, "hooks.publication (the open bucketed update)"),
    PrivateName(_UPDATER, "_select_runners", MEMBER, "hooks.publication (the target and draft models)"),
    PrivateName("sglang.srt.model_executor.model_runner_components.weight_updater",
                "_unsupported_derived_weight_cache_error", MEMBER, "closed_world.post_load.bypassed_sglang_refusal"),
    PrivateName("sglang.srt.managers.tokenizer_control_mixin:TokenizerControlMixin",
                "_update_weight_version_if_provided", MEMBER, "hooks.launcher (a bucketed update's label)"),
    # P/D and storage
    PrivateName("sglang.srt.disaggregation.utils", "_is_fake_transfer", MEMBER,
                "hooks.pd, pd.revocation (warm-up transfers carry no KV)"),
    PrivateName("sglang.srt.disaggregation.decode:DecodePreallocQueue", "_rebootstrap_prefill_len", MEMBER,
                "hooks.pd (the length prefill computed for a re-bootstrap)"),
    PrivateName("sglang.srt.disaggregation.decode_kvcache_offload_manager:DecodeKVCacheOffloadManager",
                "_compute_prefix_hash", MEMBER, "hooks.storage.record_decode_offload (the pages' storage keys)"),
    PrivateName("sglang.srt.mem_cache.hicache_storage:HiCacheStorageFailureInjector", "_backend", INSTANCE,
                "l3.manifest, observability.snapshot (the store behind SGLang's fault injector)"),
    PrivateName("sglang.srt.plugins.hook_registry", "_propagate_patch", MEMBER,
                "plugin.one_scan_propagation (every hook's `from X import Y` rebinding in one scan)"),
)


def derived_copy_names() -> tuple:
    """The attributes vradix reads off SGLang modules to find weight-derived state: the copies of
    `closed_world.post_load.GPU_DERIVED_COPIES` (assigned by their builders), the buffers of its `LOADER_DERIVED`, and
    the position-grid memos `core.weight_derived` drops at a publication."""
    from vradix.closed_world.post_load import GPU_DERIVED_COPIES, LOADER_DERIVED
    from vradix.core.weight_derived import POSITION_GRID_CACHES

    copies = tuple(PrivateName(copy.assigned_in.split(":")[0], copy.attr, ASSIGNED,
                               f"closed_world.post_load ({copy.family}: {copy.what})") for copy in GPU_DERIVED_COPIES)
    loader = tuple(PrivateName(holder.split(":")[0], attr, ASSIGNED, f"closed_world.post_load.LOADER_DERIVED ({what})")
                   for holder, attr, what in LOADER_DERIVED)
    grids = tuple(PrivateName(module, attr, ASSIGNED, f"core.weight_derived ({cls} position grid)")
                  for cls, module, attr, _ in POSITION_GRID_CACHES)
    return copies + loader + grids


def all_names() -> tuple:
    return PRIVATE_NAMES + derived_copy_names()


def missing(names=None) -> list[str]:
    """The labels ("module.Class.name") of `names` (default: `all_names()`) that SGLang does not have."""
    return [n.label() for n in (all_names() if names is None else names) if not present(n)]


def present(n: PrivateName) -> bool:
    if n.kind == ASSIGNED:
        return _mentions(_module_text(n.owner), n.name)
    owner = _resolve(n.owner)
    if owner is None:
        return False
    if n.kind == MEMBER:
        return hasattr(owner, n.name)
    if n.kind == INSTANCE:
        return any(_assigns_on_self(_class_text(cls), n.name) for cls in _sglang_classes(owner))
    raise ValueError(f"unknown kind {n.kind!r} for {n.label()}")


def _resolve(owner: str):
    """The SGLang class or module `owner` names, or None when it is gone."""
    module_name, _, qualname = owner.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError:
        return None
    for part in filter(None, qualname.split(".")):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _sglang_classes(cls) -> list:
    return [c for c in getattr(cls, "__mro__", ()) if c.__module__.startswith("sglang.")]


def _assigns_on_self(text: str, name: str) -> bool:
    """Whether `text` assigns `self.<name>`, plain or annotated."""
    return re.search(r"\bself\." + re.escape(name) + r"\b\s*(?::|=(?!=))", text) is not None


def _mentions(text: str, name: str) -> bool:
    """Whether `text` names the attribute `<name>`: `.<name>`, or the string `"<name>"` (`setattr`)."""
    return re.search(rf"\.{re.escape(name)}\b|['\"]{re.escape(name)}['\"]", text) is not None


@functools.lru_cache(maxsize=None)
def _module_text(module_name: str) -> str:
    spec = importlib.util.find_spec(module_name)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return ""
    with open(spec.origin, encoding="utf-8") as f:
        return f.read()


def _class_text(cls) -> str:
    """The lines of `cls`'s body in its module's source: from `class <Name>` to the next top-level statement."""
    lines = _module_text(cls.__module__).splitlines()
    start = next((i for i, ln in enumerate(lines) if re.match(rf"class {re.escape(cls.__name__)}\b", ln)), None)
    if start is None:
        return ""
    end = next((i for i in range(start + 1, len(lines)) if lines[i][:1] not in ("", " ", "\t", "#", ")")),
               len(lines))
    return "\n".join(lines[start:end])
