"""Data-path step 2 (publication): one epoch bump per weight change (or lock-aware flush), and the release of crossing KV.

`Engine.bump` is the whole contract of a publication, in order (`Engine.invalidate` runs steps 1-5; `finish_bump` then
builds the bump's record, `Bump`, once, whole, and keeps it; a scheduler's bump gathers its own values between the
two, `vradix.scheduler.publication.bump_scheduler`):
1. advance the epoch (and the label, when the publication names one) and bind the new epoch's weight identity
   (`identity`; a lock-aware flush keeps the weights and so the identity), which names its namespace;
2. forget crossing requests whose lock was released by a path other than `release_kv_cache` (P/D decode, streaming
   sessions unlock directly; `CrossingRequests.sweep_released`); settle the streaming-session slots
   (`SessionSlots.settle_at_bump`: a slot no running turn borrows is released through SGLang's own
   `release_session`, a borrowed one is remembered as stale and released before its next lend, a queued turn gives
   back the record it borrowed); then mark every live request that holds KV as *crossing*
   (`CrossingRequests.mark`): it keeps its own KV and continues, but never inserts into the tree
   (`skip_radix_cache_insert`), because its KV is now mixed-version; its lock on stale nodes is remembered so those
   nodes are freed when it releases (`Engine.on_release`); a P/D decode request retracted with a KV backup
   (`vradix.core.retraction`) is marked crossing too: it holds no slot or lock, but resumes from that KV;
3. re-bind every queued request that holds no KV to the new epoch;
4. when no request holds KV (nor a host backup), no session slot is left and nothing is locked, drop the whole tree
   at once (`reclaim.free_all_by_reset`, what stock `flush_cache` does; full-attention trees only,
   `reclaim.resettable`); otherwise leave the unlocked stale nodes to the deferred reclaim (`DeferredReclaim.defer`,
   O(1): they are freed in bounded slices per scheduler iteration, on demand when SGLang evicts, and at idle), or,
   for a cache that cannot defer (HiCache host tier, hybrid components), free them in one batched eviction
   (`reclaim.free_all_unlocked`);
5. with a HiCache host tier, free the stale host copies too (`host_tier`): transfers in flight are settled before 4,
   and every host copy nothing pins is evicted after it.
Between 1 and 5 nothing can be inserted under the new epoch, so "evictable" is exactly "unlocked and stale".
Nothing in 1-5 is proportional to the cached size on the deferred path: 2 and 3 walk the live and queued requests,
and `CrossingRequests.tokens_pinned` reads the crossing requests' paths.

Bad publication input is refused before a publication starts, by the same rules in the launcher (its early copy) and
in the scheduler: `check_label` (a label) and `check_disk_update_request` (an `/update_weights_from_disk` request).
"""
from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Optional


#: longest accepted publication label (SGLang `weight_version`); labels travel in every response's meta_info
MAX_LABEL_CHARS = 256


class InvalidLabelError(ValueError):
    """A publication label that vradix refuses to publish under."""


def check_label(label) -> None:
    """A label is None (keep the current one) or a non-empty string of at most MAX_LABEL_CHARS printable
    characters. Anything else raises InvalidLabelError before the publication starts, so nothing changes."""
    if label is None:
        return
    if not isinstance(label, str):
        raise InvalidLabelError(f"invalid weight_version label: expected a string, got {type(label).__name__}")
    if not label:
        raise InvalidLabelError("invalid weight_version label: empty string (omit it to keep the current label)")
    if len(label) > MAX_LABEL_CHARS:
        raise InvalidLabelError(f"invalid weight_version label: {len(label)} characters, "
                                f"at most {MAX_LABEL_CHARS} allowed")
    if not label.isprintable():
        raise InvalidLabelError("invalid weight_version label: contains control characters")


class InvalidUpdateRequest(ValueError):
    """A weight-update request that would fail (or stop the engine) inside the scheduler."""


def check_disk_update_request(obj) -> None:
    """Every field of an `UpdateWeightFromDiskReqInput` has its declared type (the Python Engine API builds the
    request without validation), `model_path` is a non-empty string, `load_format` is None or a value of SGLang's own
    `LoadFormat`, and `weight_version` is a valid label. Raises InvalidUpdateRequest / InvalidLabelError."""
    for name, expected, value in declared_fields(obj):
        if not has_declared_type(value, expected):
            raise InvalidUpdateRequest(f"invalid update_weights_from_disk request: {name}={value!r} is not "
                                       f"{getattr(expected, '__name__', expected)}")
    if not obj.model_path.strip():
        raise InvalidUpdateRequest("invalid update_weights_from_disk request: model_path is empty")
    check_load_format(obj.load_format)
    check_label(obj.weight_version)


def declared_fields(obj):
    import msgspec
    return [(f.name, f.type, getattr(obj, f.name)) for f in msgspec.structs.fields(type(obj))]


def has_declared_type(value, expected) -> bool:
    """Whether `value` fits a field type made of bool / int / str / dict / list and Optional; other types pass."""
    if typing.get_origin(expected) is typing.Union:
        return any(has_declared_type(value, arg) for arg in typing.get_args(expected))
    base = typing.get_origin(expected) or expected
    if expected is type(None):
        return value is None
    if base is int:  # a bool is an int to Python, not to a request
        return isinstance(value, int) and not isinstance(value, bool)
    if base in (bool, str, dict, list):
        return isinstance(value, base)
    return True


def check_load_format(load_format) -> None:
    """None (the server's own format) or a value of SGLang's `LoadFormat`, case-insensitive as `LoadConfig` reads it."""
    from sglang.srt.configs.load_config import LoadFormat
    if load_format is None:
        return
    valid = [f.value for f in LoadFormat]
    if load_format.lower() not in valid:
        raise InvalidUpdateRequest(f"invalid update_weights_from_disk request: load_format {load_format!r} is not a "
                                   f"valid LoadFormat (one of: {', '.join(valid)})")


@dataclass(frozen=True)
class Invalidation:
    """What steps 1-5 of one epoch bump did (`Engine.invalidate`): the core values of its `Bump`, which
    `Engine.finish_bump` builds once the scheduler step gathered the rest."""

    epoch_before: int
    epoch_after: int
    label: Optional[str]
    reason: str
    weight_id: str
    session_slots_released: int
    crossing_mid_prefill: int
    requeued_rebound: int
    tokens_freed: int
    tokens_deferred: int
    host_tokens_freed: Optional[int]
    host_tokens_left: Optional[int]
    crossing_requests: int
    tokens_pinned: int
    latency_ms: float


def current_label() -> Optional[str]:
    """The label SGLang serves now (`weight_version`), which a publication records."""
    from sglang.srt.runtime_context import get_serving
    return get_serving().weight_version
