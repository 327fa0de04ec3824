"""The engine object: vradix on one scheduler (one per scheduler process), built by `attach`.

One `Engine` is attached to each versioned tree cache and its scheduler (`tree_cache._vradix`,
`scheduler._vradix`: the only attribute vradix hangs on either). It is only touched from the scheduler thread
(admission, publication, release and flush all run there), so it needs no locking. Every TP/PP rank runs the same
control messages in the same order, so every rank computes the same epoch sequence.
"""
from __future__ import annotations

import contextlib
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, Optional, Sequence, Union

from vradix import identity, request, settings
from vradix.core import dedup, deferred_reclaim, host_tier, reclaim, staleness
from vradix.core.crossing import CrossingRequests
from vradix.core.deferred_reclaim import DeferredReclaim
from vradix.core.lora import LoraRecord
from vradix.core.epochs import Invalidation
from vradix.core.sessions import SessionSlots, slots_of
from vradix.core.staleness import StalenessRecord
from vradix.core.state import (Bump, BucketedUpdate, DedupRecord, EpochIdentity, FreedCounters, GuardRecord,
                               StorageCounters, TreelessState, treeless_of)
from vradix.ledger import device as kv_ledger
from vradix.ledger.device import PageLedger
from vradix.ledger import guard
from vradix.ledger.guard import GuardConfig
from vradix.request import HistoryEntry, ReqState

if TYPE_CHECKING:
    import torch
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    from vradix.scheduler.publication import Publication


# ---- the engine's parts defined here -------------------------------------------------------------------------------
# Which cached prefixes admissions reused, counted by vradix itself (SGLang 0.5.23's Rust tree core exposes no per-node
# hits): at most `capacity` entries, least recently hit dropped. The cache inspector's top-N reads it
# (`vradix.observability.snapshot`).
#: tokens of a prefix's head kept per entry
MAX_HEAD_TOKENS = 16


@dataclass
class PrefixHit:
    """What vradix saw of one cached prefix: the node a match ended at, under which epoch, how often it was reused."""

    node_id: int
    epoch: int
    tokens: int
    hits: int = 0
    last_hit: float = 0.0
    head: tuple = ()


@dataclass
class PrefixHits:
    """node id -> PrefixHit for the most recently reused prefixes (at most `capacity`, least recently hit dropped).
    Node ids are never reused by either TreeCore, so an entry whose node is gone is only skipped at read time. Changes
    only through `record` and `record_admitted` (the hits of a prefill pass, `Engine.count_prefix_hits`)."""

    capacity: int = 4096
    entries: "OrderedDict[int, PrefixHit]" = field(default_factory=OrderedDict)

    def record(self, node_id: int, epoch: int, tokens: int, head: Iterable[int], now: Optional[float] = None) -> None:
        hit = self.entries.get(node_id)
        if hit is None:
            hit = self.entries[node_id] = PrefixHit(node_id, epoch, tokens, head=tuple(head)[:MAX_HEAD_TOKENS])
            if len(self.entries) > self.capacity:
                self.entries.popitem(last=False)
        else:
            self.entries.move_to_end(node_id)
        hit.hits += 1
        hit.tokens = max(hit.tokens, tokens)
        hit.last_hit = time.time() if now is None else now

    def record_admitted(self, reqs: Iterable["Req"], continuing: Optional["Req"],
                        virtual: Optional[Callable[[Any], bool]]) -> None:
        """The requests a prefill pass admitted (`reqs`, less the `continuing` chunk of an earlier admission): one hit
        for each that reuses cached KV (`req.prefix_len > 0`, ending at `req.last_node`), in one pass with no call per
        request; a request vradix never bound, or one standing on a virtual node (`virtual`: a streaming-session
        slot's, no tree node), is no hit."""
        now = None
        entries = self.entries
        for req in reqs:
            tokens = req.prefix_len
            if tokens <= 0 or req is continuing:
                continue
            st = getattr(req, request.ATTR, None)
            node_id = req.last_node
            if st is None or node_id is None or (virtual is not None and virtual(node_id)):
                continue
            hit = entries.get(node_id)
            if hit is None:
                hit = entries[node_id] = PrefixHit(node_id, st.bound.epoch, tokens,
                                                   head=tuple(req.origin_input_ids[:min(tokens, MAX_HEAD_TOKENS)]))
                if len(entries) > self.capacity:
                    entries.popitem(last=False)
            else:
                entries.move_to_end(node_id)
            hit.hits += 1
            if tokens > hit.tokens:
                hit.tokens = tokens
            hit.last_hit = now = now or time.time()



def virtual_node_test() -> Callable[[Any], bool]:
    """SGLang's streaming-session virtual-node test (imported when an engine is attached: this module loads before
    SGLang's session module may be imported)."""
    from sglang.srt.session.streaming_session import is_virtual_node
    test: Callable[[Any], bool] = is_virtual_node
    return test


@dataclass
class Engine:
    """vradix on one engine (one scheduler process): its epochs, its parts, and the hot path every plain request
    takes through them.

    The hot path (`admit`, `before_match`, `release_is_plain`, `before_forward`, `at_result`, `count_prefix_hits`)
    is what a hook adapter (`vradix.hooks.serving`) calls: one call per hook, and a plain request (no user key,
    salt, adapter, custom parameters or staleness bound, bound to the current epoch) takes one path through each with
    no lookup beyond this object and its request record; the checks and stamps of the KV page ledger run once per
    forward batch. Settings are read once, at `attach`.

    Its own fields are the epoch's and its publications': set by `attach`, then changed only through its methods:
    the bump (`bump` = `invalidate` + `finish_bump`; `advance` is its first step), the release of a crossing request
    (`on_release`), an idle reset's record (`record_reset`), admission (`admit`, `admit_or_raise`, `admit_refused`,
    `rebind_if_unheld`, `before_match`), `open_publication`, `close_publication`, `open_bucketed` and
    `close_bucketed` (only `vradix.scheduler.publication.Publication`), `add_drain`, `take_drain` and
    `discard_drain` (`vradix.scheduler.publication`), `count_forged_key` (`hooks.admission`). `last` is derived: the
    later of `last_publication` and `last_flush`. Each part keeps its own state and changes it only through its own
    methods (`crossing`, `sessions`, `staleness`, `deferred`, `prefix_hits`, `guard`, `lora`, `dedup`, `freed`,
    `storage`; each class's docstring names them). The metrics handle is not state: it lives on the scheduler
    (`vradix.observability.metrics`)."""

    tree_core: str
    epoch: int = 0
    label: Optional[str] = None
    publications: int = 0
    flushes: int = 0
    forged_keys_rejected: int = 0
    #: the live requests that hold a lock on KV of an older epoch (freed when they release it)
    crossing: CrossingRequests = field(default_factory=CrossingRequests)
    #: the publication open on this engine (`vradix.scheduler.publication.Publication`): an update call's while it
    #: runs, a bucketed update's from its begin to its end; the hooks SGLang calls inside it hand it their events
    publication: Optional[Any] = None
    #: open from a successful begin_weight_update to end_weight_update: one publication, bumped once at its end
    bucketed: Optional["BucketedUpdate"] = None
    #: device-side record of which epoch wrote each KV page (None for allocators vradix cannot observe)
    ledger: Optional[PageLedger] = None
    #: the last bump that was a publication (not a lock-aware flush)
    last_publication: Optional[Bump] = None
    #: the last lock-aware flush's bump, or the last idle flush (which keeps the epoch)
    last_flush: Optional[Bump] = None
    #: how each epoch's weight identity is chosen (`vradix.identity.MODES`)
    identity_mode: str = "nonce"
    #: a P/D role's scope (role + KV layout, `vradix.pd.layout.scope_of`), the start of every namespace it stamps, so
    #: its L3 objects are role-local; None on a non-P/D engine
    scope: Optional[str] = None
    #: the nonce identities of this engine, equal on all its ranks (`vradix.identity.EngineNonces`; set by `attach`)
    nonces: identity.EngineNonces = field(default_factory=identity.EngineNonces.fresh)
    #: epoch -> its identity and namespace prefix, for every epoch this engine has served (one entry per bump)
    identities: Dict[int, EpochIdentity] = field(default_factory=dict)
    _epoch_by_prefix: Dict[str, int] = field(default_factory=dict)
    #: epoch -> the label it carried when it ended (the current epoch's is `label`)
    epoch_labels: Dict[int, Optional[str]] = field(default_factory=dict)
    guard: GuardRecord = field(default_factory=GuardRecord)
    lora: LoraRecord = field(default_factory=LoraRecord)
    dedup: DedupRecord = field(default_factory=DedupRecord)
    freed: FreedCounters = field(default_factory=FreedCounters)
    storage: StorageCounters = field(default_factory=StorageCounters)
    sessions: SessionSlots = field(default_factory=SessionSlots)
    #: the unlocked stale KV a bump left in the tree, reclaimed after it (`vradix.core.deferred_reclaim`)
    deferred: DeferredReclaim = field(default_factory=DeferredReclaim)
    #: the cached prefixes admitted requests reused, for the cache inspector (`vradix.observability.snapshot`; written
    #: only by `vradix.core.prefix_hits`, at admission)
    prefix_hits: PrefixHits = field(default_factory=PrefixHits)
    #: bounded staleness: the server window, namespace choice and what bounded requests reused (the window at attach)
    staleness: StalenessRecord = field(default_factory=StalenessRecord)
    #: drain time (ms) the publication under way has spent so far, taken by its bump (`Bump.drain_ms`);
    #: written only by `vradix.scheduler.publication`
    drain_ms_pending: float = 0.0
    #: what the cache has, read once by `attach` (neither changes while the engine runs): a HiCache host tier, whose
    #: stale copies the bump frees (`vradix.core.host_tier`); streaming-session slots a bump settles
    #: (`vradix.core.sessions`; False only when the engine was started without `--enable-streaming-session`, so no
    #: slot can ever exist)
    host_tier: bool = False
    streaming_sessions: bool = True
    #: the current epoch's bind entry and namespace prefix: what a request bound now is bound to (set only by
    #: `bind_current`, at `attach` and at every `advance`)
    current: Optional[HistoryEntry] = None
    current_prefix: str = ""
    #: the test-only fault switch VRADIX_FAULT_NO_NAMESPACE (a bind writes no namespace, so only the ledger's guard
    #: stands between a request and stale KV), read once at `attach`
    fault_no_namespace: bool = False
    #: the publication steps this engine runs (`vradix.scheduler.publication.EngineSteps`: derived at startup and
    #: after every runtime reconfiguration, `use_steps`) and its Prometheus series (`vradix.observability.metrics
    #: .Metrics`, None without --enable-metrics; `use_metrics`, at startup)
    steps: Optional[Any] = None
    metrics: Optional[Any] = None
    #: SGLang's streaming-session virtual-node test (None on an engine without streaming sessions, where no request
    #: can stand on a virtual node), resolved once at `attach`
    virtual_node: Optional[Callable[[Any], bool]] = None

    @property
    def last(self) -> Optional[Bump]:
        """The last bump's record, publication or flush. A publication always advances the epoch, so on equal
        `epoch_after` the flush (an idle flush keeps the epoch) is the later one."""
        p, f = self.last_publication, self.last_flush
        if f is None or (p is not None and p.epoch_after > f.epoch_after):
            return p
        return f

    def advance(self, ident: identity.WeightIdentity, label: Optional[str], is_publication: bool) -> None:
        """The bump's first step: the next epoch, under `ident` and `label`; the ending epoch keeps its label."""
        self.bind_identity(self.epoch + 1, ident)
        self.epoch_labels[self.epoch] = self.label
        self.epoch += 1
        self.label = label
        self.bind_current()
        if is_publication:
            self.publications += 1
        else:
            self.flushes += 1

    def bind_current(self) -> None:
        """Requests bound from now on are bound to the current epoch, its label and its weight identity."""
        self.current = HistoryEntry(0, self.epoch, self.label, self.weight_id)
        self.current_prefix = self.prefix_of_epoch(self.epoch)

    def use_steps(self, steps: Any) -> None:
        self.steps = steps

    def use_metrics(self, series: Any) -> None:
        self.metrics = series

    def count_forged_key(self) -> None:
        self.forged_keys_rejected += 1

    def open_publication(self, publication: "Publication") -> None:
        """`publication` is the engine's open one (`vradix.scheduler.publication.opened`) until `close_publication`."""
        self.publication = publication

    def close_publication(self) -> None:
        self.publication = None

    def open_bucketed(self, bucketed: "BucketedUpdate") -> None:
        self.bucketed = bucketed

    def close_bucketed(self) -> Optional["BucketedUpdate"]:
        """End the open bucketed update; returns it."""
        bucketed, self.bucketed = self.bucketed, None
        return bucketed

    def add_drain(self, ms: float) -> None:
        self.drain_ms_pending += ms

    def take_drain(self) -> float:
        """The drain time the publication under way spent, which its bump takes."""
        ms, self.drain_ms_pending = self.drain_ms_pending, 0.0
        return ms

    def discard_drain(self) -> None:
        self.drain_ms_pending = 0.0

    def bind_identity(self, epoch: int, ident: identity.WeightIdentity) -> str:
        """Record `ident` as epoch `epoch`'s identity and return its namespace prefix: the bare `weight_id` the
        first time this process serves it, else disambiguated by the epoch (one namespace per epoch)."""
        reused = any(e.identity.weight_id == ident.weight_id for e in self.identities.values())
        prefix = identity.namespace(ident.weight_id, epoch if reused else None, self.scope)
        self.identities[epoch] = EpochIdentity(ident, prefix)
        self._epoch_by_prefix[prefix] = epoch
        return prefix

    @property
    def weight_id(self) -> str:
        return self.identities[self.epoch].identity.weight_id

    def prefix_of_epoch(self, epoch: int) -> str:
        return self.identities[epoch].prefix

    def epoch_of(self, extra_key: Optional[str]) -> Optional[int]:
        """The epoch whose namespace `extra_key` was stamped with, or None (unstamped, or another engine's)."""
        prefix = identity.prefix_of(extra_key)
        return self._epoch_by_prefix.get(prefix) if prefix is not None else None

    def label_of(self, epoch: Optional[int]) -> Optional[str]:
        """The label epoch `epoch` was published under (the current label for the current epoch)."""
        if epoch == self.epoch:
            return self.label
        return self.epoch_labels.get(epoch) if epoch is not None else None

    def declared_before(self, text: str) -> bool:
        """Whether an epoch of this process already carries the declared identity `text`."""
        wid = identity.declared(text).weight_id
        return any(e.identity.weight_id == wid for e in self.identities.values())

    @property
    def window_floor(self) -> int:
        """The oldest epoch whose KV is kept now (`StalenessRecord.floor_at`; the current epoch with no window)."""
        return self.staleness.floor_at(self.epoch)

    # ---- the bump: one per publication or lock-aware flush (`vradix.core.epochs` states the contract) -------------
    def bump(self, cache: "UnifiedRadixCache", live_reqs: Iterable["Req"], queued_reqs: Iterable["Req"], *,
             reason: str, label: Optional[str] = None, is_publication: bool = True,
             identity: Optional[identity.WeightIdentity] = None) -> Bump:
        """Advance the epoch and invalidate everything older, lock-aware (`invalidate`), and record the bump
        (`finish_bump`), with nothing of a scheduler step around it. Returns the bump's record."""
        done = self.invalidate(cache, live_reqs, queued_reqs, reason=reason, label=label,
                               is_publication=is_publication, identity=identity)
        return self.finish_bump(done, is_publication)

    def invalidate(self, cache: "UnifiedRadixCache", live_reqs: Iterable["Req"], queued_reqs: Iterable["Req"], *,
                   reason: str, label: Optional[str] = None, is_publication: bool = True,
                   identity: Optional[identity.WeightIdentity] = None) -> Invalidation:
        """Steps 1-5 of `vradix.core.epochs`: advance the epoch and invalidate everything older, lock-aware.
        `identity` is the new weights' identity: None means the engine's nonce of the new epoch for a publication
        (`nonces`), and the current identity for a lock-aware flush (same weights). The bump is not recorded yet:
        `finish_bump` records it."""
        t0 = time.perf_counter()
        if identity is None:
            identity = (self.nonces.for_epoch(self.epoch + 1) if is_publication
                        else self.identities[self.epoch].identity)
        epoch_before, label = self.epoch, label if label is not None else self.label
        self.advance(identity, label, is_publication)
        self.crossing.sweep_released()
        live_reqs, queued_reqs = list(live_reqs), list(queued_reqs)
        slots_released = (self.sessions.settle_at_bump(cache, live_reqs, queued_reqs) if self.streaming_sessions
                          else 0)
        holders, mid_prefill = self._mark_holders(live_reqs)
        rebound = sum(self.rebind_if_unheld(req) for req in queued_reqs)
        with self._counting_host_freed(cache) as host:
            freed, deferred = self._reclaim_stale(cache, holders)
        host_left = host_tier.stale_left(cache) if self.host_tier else None
        self.freed.count(freed)
        self.freed.count_host(host.tokens)
        return Invalidation(epoch_before=epoch_before, epoch_after=self.epoch, label=label, reason=reason,
                            weight_id=identity.weight_id, session_slots_released=slots_released,
                            crossing_mid_prefill=mid_prefill, requeued_rebound=rebound, tokens_freed=freed,
                            tokens_deferred=deferred, host_tokens_freed=host.tokens, host_tokens_left=host_left,
                            crossing_requests=len(self.crossing), tokens_pinned=self.crossing.tokens_pinned(cache),
                            latency_ms=(time.perf_counter() - t0) * 1e3)

    def finish_bump(self, done: Invalidation, is_publication: bool, *, identity_ms: float = 0.0,
                    drain_ms: float = 0.0, promises_revoked: int = 0, mm_embeddings_cleared: int = 0,
                    position_grids_cleared: int = 0, bump_ms: float = 0.0) -> Bump:
        """Build the bump's record once, whole, from the epoch step's values (`done`) and those the scheduler step
        gathered around it (`vradix.scheduler.publication.bump_scheduler`), and keep it as the last publication or
        last flush. Returns it."""
        inv = Bump(**vars(done), identity_ms=identity_ms, drain_ms=drain_ms,
                   promises_revoked=promises_revoked, mm_embeddings_cleared=mm_embeddings_cleared,
                   position_grids_cleared=position_grids_cleared, bump_ms=bump_ms)
        self._keep_bump(inv, is_publication)
        return inv

    def record_reset(self, reason: str, tokens_freed: int, host_tokens_freed: Optional[int],
                     mm_embeddings_cleared: int) -> Bump:
        """Record a flush that reset an idle engine's whole cache (SGLang's own flush, which ran just before):
        nothing was locked, so the epoch stays; the deferred reclaim has nothing left to free. Returns the flush's
        record."""
        self.deferred.cancel()
        self.flushes += 1
        self.freed.count(tokens_freed)
        inv = Bump(self.epoch, self.epoch, self.label, reason, tokens_freed=tokens_freed,
                   mm_embeddings_cleared=mm_embeddings_cleared, host_tokens_freed=host_tokens_freed)
        self._keep_bump(inv, is_publication=False)
        self.freed.count_host(host_tokens_freed)
        return inv

    def age_out_on_flush(self, cache: "UnifiedRadixCache", after_next_bump: bool = False) -> None:
        """A flush with a staleness window: nothing computed before it stays reusable, not even by bounded requests
        (a flush is a flush). The floor is the current epoch (the flush's own bump, or the bump of the update that
        asked for it), or the next one inside a bucketed update (its bump comes at `end_weight_update`); the deferred
        reclaim then frees every older namespace. No window: nothing to do (the bump already made older KV
        unmatchable)."""
        if self.staleness.window == 0:
            return
        self.staleness.age_out(self.epoch + (1 if after_next_bump else 0))
        if not after_next_bump and not self.deferred.active:
            self.deferred.defer(cache)

    def _keep_bump(self, inv: Bump, is_publication: bool) -> None:
        if is_publication:
            self.last_publication = inv
        else:
            self.last_flush = inv

    def _counting_host_freed(self, cache: "UnifiedRadixCache") -> Any:
        """`host_tier.counting_freed` on a cache with a HiCache host tier; without one, a count that stays None."""
        return (host_tier.counting_freed(cache) if self.host_tier
                else contextlib.nullcontext(host_tier.HostFreed()))

    def _mark_holders(self, live_reqs: Sequence["Req"]) -> tuple[int, int]:
        """The bump's crossing marks: mark every live request that holds KV (or a retraction backup with its KV)
        crossing. Returns (KV holders, how many of them were mid-prefill)."""
        holders = mid_prefill = 0
        for req in live_reqs:
            if request.holds_kv(req):
                holders += 1
                self.crossing.mark(self, req)
                mid_prefill += req.kv.kv_committed_len < len(req.origin_input_ids)
            elif request.holds_backup(req):
                # a `host_pool` backup or a host-staged destination lives in the host pool the tree's reset would clear
                holders += 1
                if request.retracted_with_backup(req):
                    self.crossing.mark(self, req)  # its KV is off the device: it pins no slot and no node
        return holders, mid_prefill

    def _reclaim_stale(self, cache: "UnifiedRadixCache", holders: int) -> tuple[int, int]:
        """Steps 4 and 5 (inside the host tier's freed-token count): drop the whole tree, defer the stale KV, or free
        it in one batch. Returns (stale tokens freed, stale tokens deferred)."""
        if self.host_tier:
            host_tier.settle_transfers(cache)
        # the reset drops session slots without freeing their rows: only once every slot was released above
        # a staleness window keeps the older epochs' KV: never drop the whole tree then
        if (holders == 0 and not (self.streaming_sessions and slots_of(cache)) and cache.protected_size() == 0
                and reclaim.resettable(cache) and self.staleness.window == 0 and not reclaim.storage_attached(cache)):
            freed = reclaim.free_all_by_reset(cache)
            self.deferred.cancel()
            return freed, 0
        if deferred_reclaim.supported(cache):
            return 0, self.deferred.defer(cache)
        freed = reclaim.free_all_unlocked(cache)
        host_tier.free_stale_host(cache)
        return freed, 0

    def on_release(self, cache: "UnifiedRadixCache", req: "Req", released_node: Any) -> int:
        """After `release_kv_cache`: free the stale path a crossing request just unlocked; reset a retracted crossing
        request. Returns the stale tokens freed.

        A retracted request without a KV backup gives back all its KV and will be prefilled again from scratch, so it
        stops being a crossing request: it is re-bound at its next match and may insert its (pure new-epoch) KV
        again. One retracted with a backup (P/D decode, `vradix.core.retraction`; `release_req` takes the backup
        before it releases) resumes from its mixed KV, so it stays crossing and never inserts it."""
        freed = 0
        st = request.of(req)
        in_window = self.staleness.window > 0 and st is not None and st.epoch >= self.window_floor
        if self.crossing.release(req) and not in_window:
            with self._counting_host_freed(cache) as host:
                freed = reclaim.free_released_path(cache, released_node)
            self.freed.count_at_release(freed)
            self.freed.count_host(host.tokens)
        if st is not None and st.crossed and not req.finished() and not request.holds_backup(req):
            req.skip_radix_cache_insert = st.skip_insert_before
            st.end_crossing()
        return freed

    def release_stale_slot(self, cache: "UnifiedRadixCache", req: "Req") -> bool:
        """Before SGLang lends a streaming-session slot's record to `req`: release the slot when a crossing turn wrote
        it (`SessionSlots.take_stale`), and free the stale tree path its lock kept. Whether a slot was released."""
        stale = self.sessions.take_stale(cache, req)
        if stale is None:
            return False
        node = stale.lock.node if stale.lock is not None else None
        evictable_before = cache.evictable_size()
        cache.release_session(req.session.session_id)
        freed = reclaim.free_released_path(cache, node)
        self.freed.count_at_release(freed)
        self.deferred.note_release(evictable_before, cache.evictable_size())
        return True

    # ---- admission: binding a request to an epoch (the plain request's path is `admit`, below) --------------------
    def admit_or_raise(self, req: "Req") -> None:
        """Bind a newly admitted request to the current epoch: its record (`request.ReqState`) and
        `req.extra_key == namespace(current epoch) + adapter tag + user key`. Raises `identity.ReservedNamespaceError`
        on a forged key and `staleness.StalenessError` on a bound above the server window."""
        user_key = req.extra_key
        if user_key:
            identity.check_user_key(user_key)
        salt = getattr(req, "cache_salt", None)
        if salt:
            identity.check_user_key(salt)
        assert self.current is not None  # bound at attach
        st = request.attach(req, user_key, self.current)
        lora_id = getattr(req, "lora_id", None)
        if lora_id is not None:
            st.set_adapter(self.lora.identity_of(lora_id))
        self._bind(req, st)
        staleness.bind_bound(st, req, self.staleness.window)

    def admit_refused(self, req: "Req") -> None:
        """Bind a request whose user key was refused (it is being aborted) to the current epoch without that key. A
        LoRA request keeps its adapter tag: SGLang still prefills it (with the adapter) before the abort lands, so
        its KV must stay out of the base model's namespace."""
        req.extra_key = None
        assert self.current is not None  # bound at attach
        st = request.attach(req, None, self.current)
        st.set_adapter(self.lora.identity_of(getattr(req, "lora_id", None)))
        self._bind(req, st)

    def rebind_if_unheld(self, req: "Req") -> bool:
        """Re-bind a request that holds no KV, on the device or in a retraction backup, to the current epoch (a
        request holding KV is crossing: its row points at slots of its own epoch); True if it changed epoch. Raises
        `request.UnstampedRequestError` for a request vradix never admitted."""
        st = request.require(req)
        if st.epoch == self.epoch or request.holds_own_kv(req):
            return False
        self._bind(req, st)
        return True

    def prepare_for_match(self, cache: "UnifiedRadixCache", req: "Req",
                          token_ids: Optional[Sequence[int]] = None) -> None:
        """Before a match, for a request not plainly bound to the current epoch: `rebind_if_unheld`; then a bounded
        request that holds no KV adopts one window epoch's namespace (`StalenessRecord.choose_namespace`), its
        provenance starting with that epoch."""
        st = request.require(req)
        if st.epoch == self.epoch and st.max_staleness == 0:
            return
        self.rebind_if_unheld(req)
        if staleness.is_bounded(st) and not request.holds_own_kv(req):
            self.staleness.choose_namespace(self, cache, req, token_ids)

    def _bind(self, req: "Req", st: request.ReqState) -> None:
        """Bind `req` (holding no KV) to the current epoch: all its KV will be computed or matched under it (a
        re-bound request has received no P/D KV yet), and its namespace is the epoch's."""
        assert self.current is not None  # bound at attach
        st.bind(self.current)
        if self.fault_no_namespace:
            return  # test-only fault: the namespace is lost, so only the KV page ledger's guard stands between
        req.extra_key = identity.stamped(self.current_prefix, st.user_key, st.adapter)

    # ---- the hot path: what every request pays (one call per hook adapter) ------------------------------------------
    def admit(self, req: "Req", scheduler: Optional["Scheduler"] = None) -> None:
        """Bind a request entering a queue to the current epoch: its record and its namespace. A plain request takes
        one path (its record, its namespace: no other call); any other goes through `admit_or_raise`. A request
        vradix refuses (a forged key, a bound above the window) is bound without its key and aborted with HTTP 400.
        `scheduler` (None in cache-level tests) holds the LoRA adapters a LoRA request's identity is read from."""
        if (not req.extra_key and not getattr(req, "cache_salt", None) and getattr(req, "lora_id", None) is None
                and not self.staleness.window and not self.fault_no_namespace
                and not getattr(req.sampling_params, "custom_params", None)):
            assert self.current is not None  # bound at attach
            setattr(req, request.ATTR, ReqState(None, self.current))
            req.extra_key = self.current_prefix
            return
        if scheduler is not None:
            self.lora.identify(scheduler, getattr(req, "lora_id", None))
        try:
            self.admit_or_raise(req)
        except staleness.StalenessError as e:
            req.set_finish_with_abort(f"Invalid request: {e}")
        except identity.ReservedNamespaceError as e:
            self.count_forged_key()
            self.admit_refused(req)  # bound without the forged key, so it can match nothing foreign
            req.set_finish_with_abort(f"Invalid request: {e}")

    def before_match(self, req: "Req", cache: "UnifiedRadixCache", token_ids: Optional[Sequence[int]] = None) -> None:
        """Before every prefix match: a request holding no KV matches under the current epoch (re-bound, or, bounded,
        under one epoch of its window: `prepare_for_match`), and a streaming-session slot a publication left stale is
        released before it can be lent (`release_stale_slot`). A plain request bound to the
        current epoch returns after three compares. Raises `request.UnstampedRequestError` for a request vradix never
        admitted."""
        st = getattr(req, request.ATTR, None)
        if st is not None and st.bound.epoch == self.epoch and not st.max_staleness and not self.sessions.stale_slots:
            return
        self.prepare_for_match(cache, req, token_ids)
        if self.sessions.stale_slots:
            self.release_stale_slot(cache, req)

    def release_is_plain(self, req: "Req") -> bool:
        """Whether releasing `req` needs nothing of vradix: an exact request bound to one epoch all its life (no
        crossing, no retraction to reset), not awaited by the deferred reclaim. Then `on_release` would free
        nothing and change nothing, and no ledger spans are read (those are read for crossing or bounded requests)."""
        st = getattr(req, request.ATTR, None)
        return (st is not None and not st.crossed and not st.max_staleness and id(req) not in self.crossing.held
                and (not st.crossings or len(st.kv_history) == 1))

    def before_forward(self, batch: Optional["ScheduleBatch"], req_to_token: "torch.Tensor",
                       fail: Callable[["Req", str], None]) -> None:
        """Once per forward batch, before it runs: the strict guard's backstop launches its check of every cached
        position an extend batch reads (read at the batch's result, `at_result`: no device synchronisation here;
        `fail(req, message)` fails a violating request then), then the ledger records that the batch's writes are
        this epoch's (publications drain in-flight batches first, so no forward straddles a weight change)."""
        ledger = self.ledger
        if ledger is None or batch is None:
            return
        if batch.forward_mode.is_extend() and not getattr(batch, "split_index", 0):
            guard.launch_backstop(ledger, self.guard.config, self.guard.stats, self.guard.verdicts, batch, self.epoch,
                                  req_to_token, fail)
        ledger.stamp_written(getattr(batch, "out_cache_loc", None), self.epoch)

    def at_result(self, batch: Optional["ScheduleBatch"]) -> bool:
        """Where SGLang waits for a batch's output: read the verdicts launched with it and before it (their
        violating requests fail before the result commits anything of them). Whether a violation was caught."""
        return batch is not None and self.guard.verdicts.read_at_result(batch.out_cache_loc, self.guard.stats)

    def count_prefix_hits(self, reqs: Iterable["Req"], continuing: Optional["Req"] = None) -> None:
        """After a prefill admission pass: each request it admitted (`reqs`, less the `continuing` chunk of an
        earlier admission) that reuses cached KV is one hit on the node its prefix ends on (the cache inspector's
        ranking, `vradix.core.prefix_hits`). One call per pass."""
        self.prefix_hits.record_admitted(reqs, continuing, self.virtual_node)


def attach(tree_cache: "UnifiedRadixCache", with_ledger: bool = True, weight_identity: Optional[identity.WeightIdentity] = None,
           identity_mode: str = "nonce", scope: Optional[str] = None, staleness_window: int = 0,
           label: Optional[str] = None, streaming_sessions: bool = True,
           nonces: Optional[identity.EngineNonces] = None) -> Engine:
    """Start versioning `tree_cache` (a UnifiedRadixCache) at epoch 0 under `weight_identity` (epoch 0's nonce of
    `nonces`, the engine's launch-wide nonces, when None; a fresh set of nonces when that is None too) and `label`, with a KV page ledger on its allocator unless `with_ledger` is False; on a P/D role every
    namespace starts with its `scope` (`vradix.pd.layout`); `staleness_window` epochs older than the current one
    keep their KV for bounded requests (`vradix.core.staleness`); `streaming_sessions` is False only for an
    engine started without `--enable-streaming-session` (no session slot can exist). Invariant: a window above 0
    has a ledger (its responses' spans are read from it): `staleness.StalenessError` otherwise. Raises
    `settings.SettingsError` for an invalid VRADIX_VERIFY / VRADIX_AUDIT / VRADIX_VERIFY_SAMPLE_EVERY /
    VRADIX_PREFILL_DEDUP / VRADIX_FAULT_NO_NAMESPACE setting (every setting the engine uses is read here, once)."""
    staleness.check_ledger(staleness_window, [] if with_ledger else ["a path the KV page ledger cannot observe"])
    state = Engine(tree_core=type(tree_cache.tree_core).__name__, guard=GuardRecord(GuardConfig.from_env()),
                       identity_mode=identity_mode, dedup=DedupRecord(enabled=dedup.enabled_from_env()), scope=scope,
                       staleness=StalenessRecord(window=staleness_window), label=label,
                       host_tier=host_tier.enabled(tree_cache), streaming_sessions=streaming_sessions,
                       nonces=nonces or identity.EngineNonces.fresh(),
                       fault_no_namespace=bool(settings.value("VRADIX_FAULT_NO_NAMESPACE")),
                       virtual_node=virtual_node_test() if streaming_sessions else None)
    state.bind_identity(0, weight_identity or state.nonces.for_epoch(0))
    state.bind_current()
    if with_ledger:
        state.ledger = kv_ledger.attach(tree_cache.token_to_kv_pool_allocator)
    tree_cache._vradix = state
    return state


def state_of(tree_cache: Any) -> Optional[Engine]:
    """The vradix state of a tree cache, or None when vradix is not versioning it."""
    return getattr(tree_cache, "_vradix", None)


def of_scheduler(scheduler: Any) -> Optional[Union[Engine, TreelessState]]:
    """vradix on `scheduler`: its `Engine`, or the `TreelessState` of an engine without a radix cache, or None. The
    one attribute vradix sets on a scheduler (`scheduler._vradix`, at startup); a stand-in scheduler a test builds
    is looked up through its tree cache."""
    found = getattr(scheduler, "_vradix", None)
    if found is None and scheduler is not None:
        cache = getattr(scheduler, "tree_cache", None)
        found = state_of(cache) or treeless_of(cache)
    return found


def state_of_scheduler(scheduler: Optional["Scheduler"]) -> Optional[Engine]:
    """The vradix state of `scheduler`'s tree cache, or None (no scheduler, or vradix is not versioning its cache)."""
    return state_of(scheduler.tree_cache) if scheduler is not None else None
