"""Data-path step 2 (publication): one epoch bump per weight change (or lock-aware flush), and the release of crossing KV.

`bump` is the whole contract of a publication, in order (`invalidate` runs steps 1-5; `finish` then builds the bump's
record, `Bump`, once, whole, and keeps it; a scheduler's bump gathers its own values between the two,
`vradix.scheduler.publication.bump_scheduler`):
1. advance the epoch (and the label, when the publication names one) and bind the new epoch's weight identity
   (`identity`; a lock-aware flush keeps the weights and so the identity), which names its namespace;
2. forget crossing requests whose lock was released by a path other than `release_kv_cache` (P/D decode, streaming
   sessions unlock directly); settle the streaming-session slots (`sessions.settle_at_bump`: a slot no running turn
   borrows is released through SGLang's own `release_session`, a borrowed one is remembered as stale and released
   before its next lend, a queued turn gives back the record it borrowed); then mark every live request that holds
   KV as *crossing*: it keeps its own KV and continues, but never inserts into the tree (`skip_radix_cache_insert`),
   because its KV is now mixed-version; its lock on stale nodes is remembered so those nodes are freed when it
   releases; a P/D decode request retracted with a KV backup (`vradix.core.retraction`) is marked crossing too: it holds
   no slot or lock, but resumes from that KV;
3. re-bind every queued request that holds no KV to the new epoch;
4. when no request holds KV (nor a host backup), no session slot is left and nothing is locked, drop the whole tree
   at once
   (`reclaim.free_all_by_reset`, what stock `flush_cache` does; full-attention trees only, `reclaim.resettable`);
   otherwise leave the unlocked stale nodes to the deferred reclaim (`deferred_reclaim.defer`, O(1): they are freed in
   bounded slices per scheduler iteration, on demand when SGLang evicts, and at idle), or, for a cache that cannot
   defer (HiCache host tier, hybrid components), free them in one batched eviction (`reclaim.free_all_unlocked`);
5. with a HiCache host tier, free the stale host copies too (`host_tier`): transfers in flight are settled before 4,
   and every host copy nothing pins is evicted after it.
Between 1 and 5 nothing can be inserted under the new epoch, so "evictable" is exactly "unlocked and stale".
Nothing in 1-5 is proportional to the cached size on the deferred path: 2 and 3 walk the live and queued requests,
and `stale_tokens_pinned` reads the crossing requests' paths.

Bad publication input is refused before a publication starts, by the same rules in the launcher (its early copy) and
in the scheduler: `check_label` (a label) and `check_disk_update_request` (an `/update_weights_from_disk` request).
"""
from __future__ import annotations

import contextlib
import time
import typing
from dataclasses import dataclass
from typing import Iterable, Optional

from vradix import identity as weight_identity, request
from vradix.core import (admission, host_tier, reclaim, deferred_reclaim, sessions,
                         staleness)
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from vradix.engine import Engine
from vradix.core.state import Bump

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
    """What steps 1-5 of one epoch bump did (`invalidate`): the core values of its `Bump`, which `finish` builds once
    the scheduler step gathered the rest."""

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


def bump(state: Engine, cache, live_reqs: Iterable, queued_reqs: Iterable, *, reason: str,
         label: Optional[str] = None, is_publication: bool = True,
         identity: Optional[weight_identity.WeightIdentity] = None) -> Bump:
    """Advance the epoch and invalidate everything older, lock-aware (`invalidate`), and record the bump (`finish`),
    with nothing of a scheduler step around it. Returns the bump's record."""
    done = invalidate(state, cache, live_reqs, queued_reqs, reason=reason, label=label,
                      is_publication=is_publication, identity=identity)
    return finish(state, done, is_publication)


def invalidate(state: Engine, cache, live_reqs: Iterable, queued_reqs: Iterable, *, reason: str,
               label: Optional[str] = None, is_publication: bool = True,
               identity: Optional[weight_identity.WeightIdentity] = None) -> Invalidation:
    """Steps 1-5 of the module docstring: advance the epoch and invalidate everything older, lock-aware. `identity`
    is the new weights' identity: None means the engine's nonce of the new epoch for a publication
    (`state.nonces`), and the current identity for a lock-aware flush (same weights). The bump is not recorded yet:
    `finish` records it."""
    t0 = time.perf_counter()
    if identity is None:
        identity = (state.nonces.for_epoch(state.epoch + 1) if is_publication
                    else state.identities[state.epoch].identity)
    epoch_before, label = state.epoch, label if label is not None else state.label
    state.advance(identity, label, is_publication)
    sweep_released_crossing(state)
    live_reqs, queued_reqs = list(live_reqs), list(queued_reqs)
    slots_released = (sessions.settle_at_bump(state, cache, live_reqs, queued_reqs) if state.streaming_sessions
                      else 0)
    holders, mid_prefill = mark_holders(state, live_reqs)
    rebound = sum(admission.rebind_if_unheld(state, req) for req in queued_reqs)
    with counting_host_freed(state, cache) as host:
        freed, deferred = reclaim_stale(state, cache, holders)
    host_left = host_tier.stale_left(cache) if state.host_tier else None
    state.freed.count(freed)
    state.freed.count_host(host.tokens)
    return Invalidation(epoch_before=epoch_before, epoch_after=state.epoch, label=label, reason=reason,
                        weight_id=identity.weight_id, session_slots_released=slots_released,
                        crossing_mid_prefill=mid_prefill, requeued_rebound=rebound, tokens_freed=freed,
                        tokens_deferred=deferred, host_tokens_freed=host.tokens,
                        host_tokens_left=host_left,
                        crossing_requests=len(state.crossing), tokens_pinned=stale_tokens_pinned(state, cache),
                        latency_ms=(time.perf_counter() - t0) * 1e3)


def finish(state: Engine, done: Invalidation, is_publication: bool, *, identity_ms: float = 0.0,
           drain_ms: float = 0.0, promises_revoked: int = 0, mm_embeddings_cleared: int = 0,
           position_grids_cleared: int = 0, bump_ms: float = 0.0) -> Bump:
    """Build the bump's record once, whole, from the epoch step's values (`done`) and those the scheduler step
    gathered around it (`vradix.scheduler.publication.bump_scheduler`), and keep it as the engine's last publication
    or last flush. Returns it."""
    inv = Bump(**vars(done), identity_ms=identity_ms, drain_ms=drain_ms,
               promises_revoked=promises_revoked, mm_embeddings_cleared=mm_embeddings_cleared,
               position_grids_cleared=position_grids_cleared, bump_ms=bump_ms)
    state.record_bump(inv, is_publication)
    return inv


def counting_host_freed(state: Engine, cache):
    """`host_tier.counting_freed` on a cache with a HiCache host tier; without one, a count that stays None."""
    return host_tier.counting_freed(cache) if state.host_tier else contextlib.nullcontext(host_tier.HostFreed())


def mark_holders(state: Engine, live_reqs: list) -> tuple[int, int]:
    """The bump's crossing marks: mark every live request that holds KV (or a retraction backup with its KV) crossing. Returns (KV
    holders, how many of them were mid-prefill)."""
    holders = mid_prefill = 0
    for req in live_reqs:
        if request.holds_kv(req):
            holders += 1
            mark_crossing(state, req)
            mid_prefill += req.kv.kv_committed_len < len(req.origin_input_ids)
        elif request.holds_backup(req):
            # a `host_pool` backup or a host-staged destination lives in the host pool the tree's reset would clear
            holders += 1
            if request.retracted_with_backup(req):
                mark_crossing(state, req)  # its KV is off the device: it pins no slot and no node
    return holders, mid_prefill


def reclaim_stale(state: Engine, cache, holders: int) -> tuple[int, int]:
    """Steps 4 and 5 (inside the host tier's freed-token count): drop the whole tree, defer the stale KV, or free it
    in one batch. Returns (stale tokens freed, stale tokens deferred)."""
    if state.host_tier:
        host_tier.settle_transfers(cache)
    # the reset drops session slots without freeing their rows: only once every slot was released above
    # a staleness window keeps the older epochs' KV: never drop the whole tree then
    if (holders == 0 and not (state.streaming_sessions and sessions.slots_of(cache)) and cache.protected_size() == 0
            and reclaim.resettable(cache) and state.staleness.window == 0 and not reclaim.storage_attached(cache)):
        freed = reclaim.free_all_by_reset(cache)
        deferred_reclaim.cancel(state)
        return freed, 0
    if deferred_reclaim.supported(cache):
        return 0, deferred_reclaim.defer(state, cache)
    freed = reclaim.free_all_unlocked(cache)
    host_tier.free_stale_host(cache)
    return freed, 0


def mark_crossing(state: Engine, req) -> None:
    """A request that holds KV across a bump: keep its KV, never insert it, free its stale locks at release.
    Its KV history gets the new epoch from its committed position on (`request.record_crossing`).
    `state.crossing` is keyed by object identity: two live requests may share a user-supplied rid."""
    st = request.require(req)
    request.record_crossing(req, st, state)
    if st.mark_crossed(req.skip_radix_cache_insert):
        req.skip_radix_cache_insert = True
    if getattr(req, "lock", None) is not None:
        state.add_crossing(req)


def sweep_released_crossing(state: Engine) -> int:
    """Forget crossing requests that no longer hold a tree lock (released without `release_kv_cache`); the bump's
    reclaim (deferred or bulk) frees what they left unlocked. Returns how many were forgotten."""
    gone = [k for k, r in state.crossing.items() if getattr(r, "lock", None) is None]
    for k in gone:
        state.forget_crossing(k)
    return len(gone)


def holder_nodes(state: Engine) -> list:
    return [r.lock.node for r in state.crossing.values() if getattr(r, "lock", None) is not None]


def stale_tokens_pinned(state: Engine, cache) -> int:
    """Tokens of the distinct stale nodes on the paths the crossing requests lock (`holder_nodes`)."""
    nodes = [n for n in holder_nodes(state) if n is not None and not cache.is_root(n)]
    if not nodes:
        return 0
    seen = {}
    for path in cache.tree_core.collect_path_info(nodes):
        for info in path:
            seen[info.node_id] = info.path_end - info.path_start
    return sum(seen.values())


def on_release(state: Engine, cache, req, released_node) -> int:
    """After `release_kv_cache`: free the stale path the request just unlocked; reset a retracted crossing request.

    A retracted request without a KV backup gives back all its KV and will be prefilled again from scratch, so it
    stops being a crossing request: it is re-bound at its next match and may insert its (pure new-epoch) KV again.
    One retracted with a backup (P/D decode, `vradix.core.retraction`; `release_req` takes the backup before it releases)
    resumes from its mixed KV, so it stays crossing and never inserts it.
    """
    freed = 0
    st = request.of(req)
    in_window = state.staleness.window > 0 and st is not None and st.epoch >= staleness.window_floor(state)
    if state.release_crossing(req) and not in_window:
        with counting_host_freed(state, cache) as host:
            freed = reclaim.free_released_path(cache, released_node)
        state.freed.count_at_release(freed)
        state.freed.count_host(host.tokens)
    if st is not None and st.crossed and not req.finished() and not request.holds_backup(req):
        req.skip_radix_cache_insert = st.skip_insert_before
        st.end_crossing()
    return freed


def record_reset(state: Engine, reason: str, tokens_freed: int, host_tokens_freed: Optional[int],
                 mm_embeddings_cleared: int) -> Bump:
    """Record a flush that reset an idle engine's whole cache (SGLang's own flush, which ran just before): nothing
    was locked, so the epoch stays; the deferred reclaim has nothing left to free. Returns the flush's record."""
    deferred_reclaim.cancel(state)
    state.count_flush()
    state.freed.count(tokens_freed)
    inv = Bump(state.epoch, state.epoch, state.label, reason, tokens_freed=tokens_freed,
               mm_embeddings_cleared=mm_embeddings_cleared, host_tokens_freed=host_tokens_freed)
    state.record_bump(inv, is_publication=False)
    state.freed.count_host(host_tokens_freed)
    return inv


def current_label() -> Optional[str]:
    """The label SGLang serves now (`weight_version`), which a publication records."""
    from sglang.srt.runtime_context import get_serving
    return get_serving().weight_version
