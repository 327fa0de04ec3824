"""Per-engine vradix state: the current epoch, its label, the live crossing requests and the counters.

One `EpochState` is attached to each tree cache (`tree_cache._vradix`). It is only touched from the scheduler thread
(admission, publication, release and flush all run there), so it needs no locking. Every TP/PP rank runs the same
control messages in the same order, so every rank computes the same epoch sequence.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Optional

from vradix import identity
from vradix.core.prefix_hits import PrefixHits
from vradix.core import dedup, host_tier
from vradix.core import staleness
from vradix.core.staleness import StalenessRecord
from vradix.core.deferred_reclaim import DeferredReclaim
from vradix.ledger.guard import GuardConfig, GuardStats, PendingVerdicts
from vradix.ledger.device import PageLedger
from vradix.ledger import device as kv_ledger


@dataclass
class Bump:
    """The bump's record: what one epoch bump (publication or lock-aware flush), or an idle flush, did. Built whole
    by the bump (`vradix.core.epochs.bump`) or the idle flush; afterwards it changes only through `took_identity`,
    `took_drain`, `took_bump`, `count_revoked` and `count_cleared` (the publication's own steps,
    `vradix.scheduler.publication`).
    `tokens_deferred` is what the bump left to the deferred reclaim at that moment, not the reclaim's live
    `DeferredReclaim.pending_tokens`."""

    epoch_before: int
    epoch_after: int
    label: Optional[str]
    reason: str
    tokens_freed: int = 0
    #: unlocked stale tokens left in the tree for the deferred reclaim (`vradix.core.deferred_reclaim`)
    tokens_deferred: int = 0
    crossing_requests: int = 0
    crossing_mid_prefill: int = 0
    tokens_pinned: int = 0
    requeued_rebound: int = 0
    #: P/D decode: transfer-queue requests whose unfulfilled prefix promise the publication revoked
    #: (`vradix.pd.revocation`)
    promises_revoked: int = 0
    #: entries dropped from SGLang's multimodal embedding cache (`mm_embeddings.clear_all`)
    mm_embeddings_cleared: int = 0
    #: streaming-session slots no running turn borrowed, released by the bump (`vradix.core.sessions`)
    session_slots_released: int = 0
    #: interpolated position-embedding grids dropped from vision towers (`weight_derived.clear_position_grids`)
    position_grids_cleared: int = 0
    latency_ms: float = 0.0
    #: the global identity of the new epoch's weights, and the time spent establishing it (a fingerprint reads every
    #: weight; not part of `latency_ms`)
    weight_id: Optional[str] = None
    identity_ms: float = 0.0
    #: HiCache host-pool tokens given back by the bump (None without a host tier)
    host_tokens_freed: Optional[int] = None
    #: the pause the publication added on the scheduler, in two parts: waiting for the in-flight batches before the
    #: weights changed (`drain_ms`, every drain the publication ran, a session's begin included), and the whole bump
    #: step after they changed (`bump_ms`: identity, epoch bump, revocations, audit; it contains `latency_ms` and
    #: `identity_ms`). `pause_ms` in `as_dict` is their sum. The weight load itself is not part of either.
    drain_ms: float = 0.0
    bump_ms: float = 0.0

    def summary(self) -> str:
        host = f" and {self.host_tokens_freed} stale host tokens" if self.host_tokens_freed is not None else ""
        deferred = (f" (+{self.tokens_deferred} unlocked stale tokens reclaimed after the bump)"
                    if self.tokens_deferred else "")
        return (f"vradix: epoch {self.epoch_before}->{self.epoch_after} ({self.reason}, label={self.label!r}, "
                f"weight_id={self.weight_id}): "
                f"freed {self.tokens_freed} stale tokens{host}{deferred}, {self.tokens_pinned} stale tokens pinned by "
                f"{self.crossing_requests} crossing request(s) ({self.crossing_mid_prefill} mid-prefill), "
                f"{self.requeued_rebound} queued request(s) re-bound"
                + (f", {self.promises_revoked} unfulfilled P/D promise(s) revoked" if self.promises_revoked else "")
                + (f", {self.session_slots_released} streaming-session slot(s) released"
                   if self.session_slots_released else ""))

    def as_dict(self) -> dict:
        d = asdict(self)
        d["latency_ms"] = round(self.latency_ms, 3)
        d["identity_ms"] = round(self.identity_ms, 3)
        d["drain_ms"] = round(self.drain_ms, 3)
        d["bump_ms"] = round(self.bump_ms, 3)
        d["pause_ms"] = round(self.pause_ms, 3)
        return d

    @property
    def pause_ms(self) -> float:
        """The pause the publication added on the scheduler: drain + bump."""
        return self.drain_ms + self.bump_ms

    def took_identity(self, ms: float) -> None:
        self.identity_ms = ms

    def took_drain(self, ms: float) -> None:
        self.drain_ms = ms

    def took_bump(self, ms: float) -> None:
        self.bump_ms = ms

    def count_revoked(self, promises: int) -> None:
        self.promises_revoked = promises

    def count_cleared(self, mm_embeddings: int, position_grids: int) -> None:
        """The weight-derived caches the publication dropped."""
        self.mm_embeddings_cleared, self.position_grids_cleared = mm_embeddings, position_grids


@dataclass(frozen=True)
class EpochIdentity:
    """An epoch's weight identity and the namespace prefix its requests are stamped with."""

    identity: identity.WeightIdentity
    prefix: str


@dataclass
class GuardRecord:
    """The KV page ledger's verify guard and audit. `config` changes only at startup: from the settings at `attach`,
    then through `narrow_to_ranks` (`hooks.startup`: detection only on a multi-rank engine); `stats` only by the
    guard's checks and the audit (`vradix.ledger.guard`, run by `hooks.ledger`, `hooks.admission` and
    `scheduler.publication`); `verdicts` only through its own methods (`vradix.ledger.guard.PendingVerdicts`)."""

    config: GuardConfig = field(default_factory=GuardConfig)
    stats: GuardStats = field(default_factory=GuardStats)
    #: the checks launched before a forward and not read yet (read at their batch's result)
    verdicts: PendingVerdicts = field(default_factory=PendingVerdicts)

    def narrow_to_ranks(self, tp_size: int, pp_size: int) -> None:
        """The guard's configuration for an engine of `tp_size` x `pp_size` ranks (`GuardConfig.for_ranks`)."""
        self.config = self.config.for_ranks(tp_size, pp_size)


@dataclass
class LoraRecord:
    """LoRA adapters and the KV their requests inserted. Changes only through `count_event` and `count_freed`
    (`hooks.lora` at an adapter load, `scheduler.publication.unload_adapter` at an unload), `nodes_of` and
    `take_nodes` (the nodes an adapter's requests inserted, `vradix.core.lora`), `identify`, `identity_or` and
    `forget` (the adapters' content identities, `vradix.core.lora`)."""

    #: adapter loads/unloads seen
    events: int = 0
    #: lora_id -> `lora.AdapterNodes`, the tree nodes its requests inserted (freed when the adapter is unloaded)
    adapter_nodes: Dict[str, Any] = field(default_factory=dict)
    tokens_freed: int = 0
    #: lora_id -> the content identity of the adapter loaded under it (`vradix.core.lora.identify_adapter`), which
    #: every LoRA request's namespace and P/D handshake carry
    adapter_ids: Dict[str, str] = field(default_factory=dict)

    def count_event(self) -> None:
        self.events += 1

    def count_freed(self, tokens: int) -> None:
        self.tokens_freed += tokens

    def nodes_of(self, lora_id: str, empty: Any) -> Any:
        """The nodes adapter `lora_id`'s requests inserted; `empty` becomes them the first time."""
        return self.adapter_nodes.setdefault(lora_id, empty)

    def take_nodes(self, lora_id: Optional[str]) -> Any:
        """The nodes adapter `lora_id`'s requests inserted (None: none), forgotten here."""
        return self.adapter_nodes.pop(lora_id, None) if lora_id is not None else None

    def identify(self, lora_id: str, adapter_id: str) -> None:
        self.adapter_ids[lora_id] = adapter_id

    def identity_or(self, lora_id: str, fallback: str) -> str:
        """The identity of adapter `lora_id`; `fallback` becomes it when it has none."""
        return self.adapter_ids.setdefault(lora_id, fallback)

    def forget(self, lora_id: Optional[str]) -> None:
        if lora_id is not None:  # no adapter is keyed None
            self.adapter_ids.pop(lora_id, None)


@dataclass
class DedupRecord:
    """Prefill dedup (`vradix.core.dedup`): `enabled` is set only at `attach` (from the settings); `stats` is counted
    by `dedup.should_hold_back`, and `current` changes only through `start_pass` and `end_pass` (the prefill step,
    `hooks.prefill`)."""

    #: hold back a request whose uncached prefix another request is computing
    enabled: bool = True
    stats: dedup.DedupStats = field(default_factory=dedup.DedupStats)
    #: the prefill scheduling pass in progress (None between passes)
    current: Optional[dedup.Pass] = None

    def start_pass(self, p: dedup.Pass) -> None:
        self.current = p

    def end_pass(self) -> None:
        self.current = None


@dataclass
class FreedCounters:
    """Stale KV given back so far (server info `stale_tokens_freed_*`, `stale_host_tokens_freed_total`). Changes only
    through `count`, `count_at_release` and `count_host`, called by the steps that free stale KV: the bump and the
    release (`vradix.core.epochs`), the deferred reclaim, the LoRA unload, the streaming-session release and the idle
    flush (`epochs.record_reset`); each only adds."""

    tokens_total: int = 0
    #: the part of `tokens_total` freed when a crossing request (or a stale session slot) released it
    tokens_at_release: int = 0
    #: HiCache host-pool tokens of older epochs given back (bumps and crossing releases)
    host_tokens_total: int = 0

    def count(self, tokens: int) -> None:
        """Add stale device tokens freed."""
        self.tokens_total += tokens

    def count_at_release(self, tokens: int) -> None:
        """Add stale device tokens freed when a crossing request (or a stale session slot) released them."""
        self.tokens_total += tokens
        self.tokens_at_release += tokens

    def count_host(self, tokens: Optional[int]) -> None:
        """Add host tokens freed (None: no host tier, nothing to count)."""
        if tokens is not None:
            self.host_tokens_total += tokens


@dataclass
class StorageCounters:
    """HiCache L3 backups. Changes only through `count_backed_up` (the storage step, `hooks.storage`)."""

    #: weight_id -> HiCache L3 pages this process backed up under it
    pages_backed_up: Dict[str, int] = field(default_factory=dict)

    def count_backed_up(self, weight_id: str, pages: int) -> None:
        self.pages_backed_up[weight_id] = self.pages_backed_up.get(weight_id, 0) + pages


@dataclass
class SessionRecord:
    """Streaming-session slots a bump left stale. Changes only through `settle`, `forget_all`, `forget` and
    `count_released` (`vradix.core.sessions`)."""

    #: session id -> the streaming-session slot a turn was running on at the last bump (its record mixes epochs):
    #: released before it could be lent again
    stale_slots: Dict[str, Any] = field(default_factory=dict)
    #: streaming-session slots released because a publication made their record stale
    slots_released: int = 0

    def settle(self, stale: Dict[str, Any], released: int) -> None:
        """At a bump: `stale` are the slots a running turn borrowed; `released` others were released."""
        self.stale_slots = stale
        self.slots_released += released

    def forget_all(self) -> None:
        self.stale_slots.clear()

    def forget(self, sid: str) -> None:
        del self.stale_slots[sid]

    def count_released(self) -> None:
        self.slots_released += 1


@dataclass
class EpochState:
    """The versioned-cache state of one engine (one scheduler process).

    Its own fields are the epoch's and its publications': set by `attach`, then changed only through its methods:
    `advance` and `record_bump` (the bump, `vradix.core.epochs`), `count_flush` and `record_bump` (the idle reset,
    `vradix.core.epochs.record_reset`), `add_crossing`, `forget_crossing` and `release_crossing`
    (`vradix.core.epochs`), `open_publication`, `close_publication`, `open_session` and `close_session` (only
    `vradix.scheduler.publication.Publication`), `add_drain`, `take_drain` and `discard_drain`
    (`vradix.scheduler.publication`), `count_forged_key` (`hooks.admission`). `last` is derived: the later of
    `last_publication` and `last_flush`. Each step that keeps state of its own keeps it in its record here (`guard`,
    `lora`, `dedup`, `freed`, `storage`, `sessions`, and the step-owned `deferred`, `prefix_hits` and `staleness`),
    which changes only through the methods the record's docstring names. The metrics handle is not state: it lives on
    the scheduler (`vradix.observability.metrics`)."""

    tree_core: str
    epoch: int = 0
    label: Optional[str] = None
    publications: int = 0
    flushes: int = 0
    forged_keys_rejected: int = 0
    #: id(req) -> live request that holds a lock on KV of an older epoch (freed when it releases); keyed by identity
    #: because user rids need not be unique
    crossing: Dict[int, Any] = field(default_factory=dict)
    #: the publication open on this engine (`vradix.scheduler.publication.Publication`): an update call's while it
    #: runs, a weight-update session's from its begin to its end; the hooks SGLang calls inside it hand it their events
    publication: Optional[Any] = None
    #: open from a successful begin_weight_update to end_weight_update: one publication, bumped once at its end
    session: Optional["WeightSession"] = None
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
    sessions: SessionRecord = field(default_factory=SessionRecord)
    #: the unlocked stale KV a bump left in the tree, reclaimed after it (written only by
    #: `vradix.core.deferred_reclaim`)
    deferred: DeferredReclaim = field(default_factory=DeferredReclaim)
    #: the cached prefixes admitted requests reused, for the cache inspector (`vradix.observability.snapshot`; written
    #: only by `vradix.core.prefix_hits`, at admission)
    prefix_hits: PrefixHits = field(default_factory=PrefixHits)
    #: bounded staleness: the server window and what bounded requests reused (written only by
    #: `vradix.core.staleness`; the window at attach)
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
        if is_publication:
            self.publications += 1
        else:
            self.flushes += 1

    def record_bump(self, inv: Bump, is_publication: bool) -> None:
        """Keep `inv` as the last publication, or as the last flush."""
        if is_publication:
            self.last_publication = inv
        else:
            self.last_flush = inv

    def count_flush(self) -> None:
        """An idle flush (SGLang's own reset; no bump)."""
        self.flushes += 1

    def count_forged_key(self) -> None:
        self.forged_keys_rejected += 1

    def add_crossing(self, req) -> None:
        self.crossing[id(req)] = req

    def forget_crossing(self, key: int) -> None:
        del self.crossing[key]

    def release_crossing(self, req) -> bool:
        """Forget `req` as a crossing request; whether it was one."""
        return self.crossing.pop(id(req), None) is not None

    def open_publication(self, publication) -> None:
        """`publication` is the engine's open one (`vradix.scheduler.publication.opened`) until `close_publication`."""
        self.publication = publication

    def close_publication(self) -> None:
        self.publication = None

    def open_session(self, session: "WeightSession") -> None:
        self.session = session

    def close_session(self) -> Optional["WeightSession"]:
        """End the open weight-update session; returns it."""
        session, self.session = self.session, None
        return session

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


@dataclass
class WeightSession:
    """One `begin_weight_update ... end_weight_update` session: its buckets (update calls) so far. A session is one
    publication: its buckets apply their labels but never bump; `end_weight_update` bumps once. Changes only through
    `count_bucket` (`hooks.publication`)."""

    buckets: int = 0
    failed_buckets: int = 0

    def count_bucket(self, failed: bool) -> None:
        self.buckets += 1
        self.failed_buckets += failed

    def as_dict(self) -> dict:
        return {"buckets": self.buckets, "failed_buckets": self.failed_buckets}


def attach(tree_cache, with_ledger: bool = True, weight_identity: Optional[identity.WeightIdentity] = None,
           identity_mode: str = "nonce", scope: Optional[str] = None, staleness_window: int = 0,
           label: Optional[str] = None, streaming_sessions: bool = True,
           nonces: Optional[identity.EngineNonces] = None) -> EpochState:
    """Start versioning `tree_cache` (a UnifiedRadixCache) at epoch 0 under `weight_identity` (epoch 0's nonce of
    `nonces`, the engine's launch-wide nonces, when None; a fresh set of nonces when that is None too) and `label`, with a KV page ledger on its allocator unless `with_ledger` is False; on a P/D role every
    namespace starts with its `scope` (`vradix.pd.layout`); `staleness_window` epochs older than the current one
    keep their KV for bounded requests (`vradix.core.staleness`); `streaming_sessions` is False only for an
    engine started without `--enable-streaming-session` (no session slot can exist). Invariant: a window above 0
    has a ledger (its responses' spans are read from it): `staleness.StalenessError` otherwise. Raises
    `settings.SettingsError` for an invalid VRADIX_VERIFY / VRADIX_AUDIT / VRADIX_VERIFY_SAMPLE_EVERY /
    VRADIX_PREFILL_DEDUP setting."""
    staleness.check_ledger(staleness_window, [] if with_ledger else ["a path the KV page ledger cannot observe"])
    state = EpochState(tree_core=type(tree_cache.tree_core).__name__, guard=GuardRecord(GuardConfig.from_env()),
                       identity_mode=identity_mode, dedup=DedupRecord(enabled=dedup.enabled_from_env()), scope=scope,
                       staleness=StalenessRecord(window=staleness_window), label=label,
                       host_tier=host_tier.enabled(tree_cache), streaming_sessions=streaming_sessions,
                       nonces=nonces or identity.EngineNonces.fresh())
    state.bind_identity(0, weight_identity or state.nonces.for_epoch(0))
    if with_ledger:
        state.ledger = kv_ledger.attach(tree_cache.token_to_kv_pool_allocator)
    tree_cache._vradix = state
    return state


@dataclass
class TreelessState:
    """vradix on an engine without a radix cache (`--disable-radix-cache`): there is no tree to version, so there is
    no epoch; each publication drops the weight-derived caches (`vradix.core.weight_derived`) once. Its publications are
    counted the way an `EpochState` counts them: an update call outside a session is one, a session is one at its
    end, a new label by itself is one. Changes only through `open_publication`, `close_publication`, `open_session`
    and `close_session` (only `vradix.scheduler.publication.Publication`) and `record` (its
    `publish_without_tree`)."""

    publications: int = 0
    #: the publication open on this engine (`vradix.scheduler.publication.Publication`; its label change and flush
    #: are part of it, not publications of their own)
    publication: Optional[Any] = None
    #: a weight-update session is open (its end publishes once)
    session_open: bool = False
    #: what the last publication (or flush) dropped: reason, mm_embeddings_cleared, position_grids_cleared
    last: Optional[dict] = None
    last_publication: Optional[dict] = None

    def open_publication(self, publication) -> None:
        self.publication = publication

    def close_publication(self) -> None:
        self.publication = None

    def open_session(self, _session) -> None:
        self.session_open = True

    def close_session(self) -> None:
        self.session_open = False

    def record(self, dropped: dict, is_publication: bool) -> None:
        """What a publication (or a flush, `is_publication` False) dropped."""
        self.last = dropped
        if is_publication:
            self.publications += 1
            self.last_publication = dropped


def attach_treeless(tree_cache) -> TreelessState:
    """Start vradix on an engine whose `tree_cache` shares no prefix (SGLang's chunk cache)."""
    state = TreelessState()
    tree_cache._vradix_treeless = state
    return state


def treeless_of(tree_cache) -> Optional[TreelessState]:
    """The vradix state of an engine without a radix cache, or None."""
    return getattr(tree_cache, "_vradix_treeless", None)


def state_of(tree_cache) -> Optional[EpochState]:
    """The vradix state of a tree cache, or None when vradix is not versioning it."""
    return getattr(tree_cache, "_vradix", None)


def state_of_scheduler(scheduler) -> Optional[EpochState]:
    """The vradix state of `scheduler`'s tree cache, or None (no scheduler, or vradix is not versioning its cache)."""
    return state_of(scheduler.tree_cache) if scheduler is not None else None
