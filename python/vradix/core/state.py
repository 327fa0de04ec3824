"""The records of vradix's engine parts (`vradix.engine.Engine`): the bump's record, the guard, LoRA, prefill dedup,
freed counters, storage, streaming-session slots; the bucketed update; the engine without a radix tree.

Everything here is only touched from the scheduler thread (admission, publication, release and flush all run there),
so it needs no locking.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Optional

from vradix import identity
from vradix.core import dedup
from vradix.ledger.guard import GuardConfig, GuardStats, PendingVerdicts


@dataclass(frozen=True)
class Bump:
    """The bump's record: what one epoch bump (publication or lock-aware flush), or an idle flush, did. Built whole,
    once, from values gathered first: by `Engine.finish_bump` (an epoch bump: the core step's values, then
    the scheduler step's identity, drain, revocation, cleared caches and its own duration) or
    `Engine.record_reset` (the idle flush). Frozen: it changes only through its constructor, never after.
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
    #: stale host-pool tokens the bump could not free because something held them (`host_tier.stale_left`: a storage
    #: backup in flight, or with storage attached a crossing request's device copy); the host pool's eviction frees
    #: them later, and nothing matches them (None without a host tier)
    host_tokens_left: Optional[int] = None
    #: the pause the publication added on the scheduler, in two parts: waiting for the in-flight batches before the
    #: weights changed (`drain_ms`, every drain the publication ran, a bucketed update's begin included), and the whole
    #: bump step after they changed (`bump_ms`: identity, epoch bump, revocations, audit; it contains `latency_ms` and
    #: `identity_ms`). `pause_ms` in `as_dict` is their sum. The weight load itself is not part of either.
    drain_ms: float = 0.0
    bump_ms: float = 0.0

    def summary(self) -> str:
        host = f" and {self.host_tokens_freed} stale host tokens" if self.host_tokens_freed is not None else ""
        if self.host_tokens_left:
            host += f" ({self.host_tokens_left} held, left to the host pool's eviction)"
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
    flush (`Engine.record_reset`); each only adds."""

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
class BucketedUpdate:
    """One bucketed update (`begin_weight_update ... end_weight_update`): its buckets (update calls) so far. A bucketed
    update is one publication: its buckets apply their labels but never bump; `end_weight_update` bumps once. Changes
    only through `count_bucket` (`scheduler.publication.record_bucket`)."""

    buckets: int = 0
    failed_buckets: int = 0

    def count_bucket(self, failed: bool) -> None:
        self.buckets += 1
        self.failed_buckets += failed

    def as_dict(self) -> dict:
        return {"buckets": self.buckets, "failed_buckets": self.failed_buckets}


@dataclass
class TreelessState:
    """vradix on an engine without a radix cache (`--disable-radix-cache`): there is no tree to version, so there is
    no epoch; each publication drops the weight-derived caches (`vradix.core.weight_derived`) once. Its publications are
    counted the way an `Engine` counts them: an update call outside a bucketed update is one, a bucketed update is
    one at its end, a new label by itself is one; a flush by itself drops them too, recorded but not counted. Changes
    only through `open_publication`, `close_publication`, `open_bucketed` and `close_bucketed` (only
    `vradix.scheduler.publication.Publication`), `record` (`vradix.scheduler.treeless.TreelessEngine.drop`), and
    `use_steps` / `use_metrics` (at startup and after a runtime reconfiguration)."""

    publications: int = 0
    #: the publication open on this engine (`vradix.scheduler.publication.Publication`; the label change and the
    #: flush SGLang runs inside it are part of it, not publications of their own)
    publication: Optional[Any] = None
    #: a bucketed update is open (its end publishes once)
    bucketed_open: bool = False
    #: what the last publication (or flush) dropped: reason, mm_embeddings_cleared, position_grids_cleared
    last: Optional[dict] = None
    last_publication: Optional[dict] = None
    #: the publication steps this engine runs (`vradix.scheduler.publication.EngineSteps`) and its Prometheus series
    #: (`vradix.observability.metrics.Metrics`, None without --enable-metrics)
    steps: Optional[Any] = None
    metrics: Optional[Any] = None

    def open_publication(self, publication) -> None:
        self.publication = publication

    def close_publication(self) -> None:
        self.publication = None

    def use_steps(self, steps: Any) -> None:
        self.steps = steps

    def use_metrics(self, series: Any) -> None:
        self.metrics = series

    def open_bucketed(self, _bucketed) -> None:
        self.bucketed_open = True

    def close_bucketed(self) -> None:
        self.bucketed_open = False

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
