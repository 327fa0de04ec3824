"""A publication: a change of the weights one scheduler serves from, or of their label (docs/architecture.md), and
nothing else: an `update_weights_*` call, a bucketed update, a new label by itself, and the weight writes of
`check_weights` and `resume_memory_occupation`. Each is one `Publication`, which runs the same sequence:

1. open (`Publication.open`): the in-flight batches drain (`drain_for_publication`); a bucketed update already
   open on the engine is joined, not doubled; refusals answer before anything changes (`refuse`); SGLang's change
   runs inside `running`, which registers the publication on the engine's state (`Engine.publication`,
   `TreelessState.publication`), so the hooks SGLang calls from inside the change hand their events to it
   (`version_recorded`, `flush`), and taps the tensors it publishes (the engine's `tapping`);
2. apply (`Publication.apply`), at most once: the engine's publication step (`publish`);
3. close (`close_update`, `end_bucketed`, ...): the response says what the publication did (the engine's
   `describe`).

The engine is the scheduler-side object a publication runs on (`engine_of`), one of two variants with the same
small interface (`holder`, `tapping`, `declaration_refusal`, `prepare_relabel`, `publish`, `describe`,
`discard_drain`, `flush_within`, `flush`): `VersionedEngine` (a radix cache vradix versions: its step is an epoch
bump, `bump_scheduler`: identity, crossing marks, re-binds, sessions, deferred reclaim, L3 and P/D revocations,
derived caches, audit, metrics) and `scheduler.treeless.TreelessEngine` (no radix cache: its step drops the
weight-derived caches). What is not a publication has its own operation: a flush by itself (`scheduler.flush`: an
idle reset or a lock-aware bump, through the engine's `flush`) and an adapter unload (`scheduler.adapters`); a flush
SGLang runs inside an open publication is that publication's (`Publication.flush`).

A step the engine lacks is never entered: what it has (overlap scheduler, external KV lookups, weight-derived caches,
metrics) is read at startup and after each runtime reconfiguration (`EngineSteps`), like the cache's host tier and
streaming sessions inside the bump (`Engine.host_tier`, `Engine.streaming_sessions`).
"""
from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Optional, Union

from vradix import identity
from vradix.core import epochs, overlap, weight_derived
from vradix.core.epochs import current_label
from vradix.core.state import Bump, BucketedUpdate, treeless_of
from vradix.engine import Engine, of_scheduler, state_of_scheduler
from vradix.l3 import prefetch
from vradix.ledger import guard
from vradix.observability import metrics
from vradix.pd import revocation
from vradix.scheduler import flush, identity_proof
from vradix.scheduler.treeless import TreelessEngine

logger = logging.getLogger("vradix")


@dataclass(frozen=True)
class EngineSteps:
    """The publication steps an engine has beyond the bump itself, read from the live scheduler at startup
    (`install_steps`, after vradix attached its state and metrics) and again after every runtime change of its
    configuration (`scheduler.reconfigure.rederive`: a storage attach turns `storage_lookups` on); a step an engine
    lacks is never entered."""

    #: the overlap scheduler runs: the batch in flight drains before the weights change (`overlap`)
    overlap_drain: bool
    #: queued requests are looked up in an external KV store: their prefetches are revoked and re-issued under the
    #: new namespace (`vradix.l3.prefetch`)
    storage_lookups: bool
    #: the model can fill a weight-derived cache, dropped at every publication (`weight_derived.present`)
    derived_caches: bool
    #: `--enable-metrics`: the bump's values are exported (`vradix.observability.metrics`)
    metrics: bool

    @classmethod
    def of_scheduler(cls, scheduler) -> "EngineSteps":
        return cls(overlap_drain=bool(getattr(scheduler, "enable_overlap", False)),
                   storage_lookups=prefetch.storage_lookups(scheduler),
                   derived_caches=weight_derived.present(scheduler),
                   metrics=metrics.metrics_of(scheduler) is not None)


def install_steps(scheduler) -> EngineSteps:
    """Read the engine's publication steps (`EngineSteps`) and give them to its engine; called where vradix attaches
    to a scheduler, and again after a runtime reconfiguration."""
    steps = EngineSteps.of_scheduler(scheduler)
    holder = of_scheduler(scheduler)
    assert holder is not None, "publication steps for a scheduler vradix is not attached to"
    holder.use_steps(steps)
    return steps


def steps_of(scheduler) -> EngineSteps:
    """The engine's publication steps (read now for a scheduler vradix attached to without `install_steps`)."""
    holder = of_scheduler(scheduler)
    steps = holder.steps if holder is not None else None
    return steps if steps is not None else install_steps(scheduler)


def opened(scheduler) -> Optional["Publication"]:
    """The publication open on the scheduler's engine (an update call's, or a bucketed update's), or None."""
    holder = of_scheduler(scheduler)
    return holder.publication if holder is not None else None


def engine_of(scheduler) -> Optional[Union["VersionedEngine", TreelessEngine]]:
    """The scheduler-side engine vradix attached to: `VersionedEngine` on a radix cache it versions,
    `TreelessEngine` without one, None when vradix is not attached (or there is no scheduler)."""
    if scheduler is None:
        return None
    state = state_of_scheduler(scheduler)
    if state is not None:
        return VersionedEngine(scheduler, state)
    treeless = treeless_of(scheduler.tree_cache)
    return TreelessEngine(scheduler, treeless) if treeless is not None else None


class Publication:
    """One change of the weights one scheduler serves from, or of their label; see the module docstring for its
    sequence. It runs on its engine (`engine`, a `VersionedEngine` or a `TreelessEngine`) through their shared
    interface only.

    Invariants: `apply` runs at most once (`result` holds what it did); while open, the publication is the engine's
    only open one (`opened`), from `running` to the end of the call, or from `begin_bucketed` to `end_bucketed`; an
    update call inside a bucketed update is a bucket of its publication and never applies."""

    def __init__(self, engine: Union["VersionedEngine", TreelessEngine], source: str):
        self.engine, self.source = engine, source
        #: the bucket counts, while this publication is a bucketed update
        self.bucketed: Optional[BucketedUpdate] = None
        #: what `apply` did: the engine's record (a `Bump` on a radix cache, the treeless record without one)
        self.result: Union[Bump, dict, None] = None
        #: whether this bucketed update holds generation itself (`hold_generation`): it then refuses the requests that
        #: reach the scheduler (`refuses_requests`) and resumes generation at `end_bucketed`
        self.holds_generation = False

    @classmethod
    def open(cls, scheduler, source: str, *, drain: bool = True) -> Optional["Publication"]:
        """The publication of a change about to run: the engine's open one (a bucketed update's), or a new one; None
        when vradix is not attached to the scheduler. With `drain`, the in-flight batches finish first."""
        if drain and scheduler is not None:
            drain_for_publication(scheduler)
        engine = engine_of(scheduler)
        if engine is None:
            return None
        return engine.holder.publication or cls(engine, source)

    @property
    def scheduler(self):
        return self.engine.scheduler

    @property
    def is_open(self) -> bool:
        return self.engine.holder.publication is self

    def refuse(self, refused, source: str):
        """A change (`source`: a bucket of a bucketed update names its own) refused before it touched anything: no
        apply; its drain is no later publication's (a bucketed update's drains stay its own). Returns the refusal."""
        logger.error("vradix: %s refused before loading: %s", source, refused.message)
        if self.bucketed is None:
            self.engine.discard_drain()
        return refused

    @contextlib.contextmanager
    def running(self):
        """SGLang's change runs inside: the publication is the engine's open one, and (the engine's `tapping`,
        fingerprint mode) the tensors it loads are recorded. A bucketed update's publication stays open after one
        of its calls."""
        self.engine.holder.open_publication(self)
        try:
            with self.engine.tapping():
                yield self
        finally:
            if self.bucketed is None:
                self.engine.holder.close_publication()

    def apply(self, reason: str, *, weights_changed: bool = True):
        """The publication's one step on its engine (`publish`) under the label SGLang serves now; `weights_changed`
        is False for a new label by itself. Returns what it did (`result`)."""
        assert self.result is None, f"{self.source}: a publication applies once"
        self.result = self.engine.publish(reason, label=current_label(), weights_changed=weights_changed)
        return self.result

    def apply_conservatively(self) -> None:
        """A failed change that may have touched the weights is a publication all the same, applied once."""
        self.apply(f"failed {self.source} (conservative)")

    def version_recorded(self) -> None:
        """SGLang recorded the new weights' label: the success point of an update call. Outside a bucketed update it
        applies (the flush SGLang runs after it is part of it); inside one, the bucketed update's end applies."""
        if self.bucketed is None and self.result is None:
            self.apply(self.source)

    def close_update(self, out, may_touch_weights: bool):
        """The end of an update call: a bucket of a bucketed update is counted; a returned failure that may have
        touched the weights applies once, conservatively, when nothing applied yet. Returns `out`, saying what was
        done."""
        if self.bucketed is not None:
            return record_bucket(self.bucketed, out, self.engine.PUBLISHES)
        if self.result is None and may_touch_weights and not out.success:
            self.apply_conservatively()
        if self.result is not None:
            out.message = f"{out.message} [{self.engine.describe(self.result)}]"
        return out

    def flush(self, sglang_flush) -> bool:
        """The flush SGLang runs inside this open publication (`sglang_flush` runs SGLang's): part of it, never a
        second publication (the engine's `flush_within`). Returns whether the cache was flushed."""
        return self.engine.flush_within(self, sglang_flush)

    def begin_bucketed(self) -> None:
        """A successful begin_weight_update: this publication stays open until `end_bucketed`, which applies once."""
        self.bucketed = BucketedUpdate()
        self.engine.holder.open_bucketed(self.bucketed)
        self.engine.holder.open_publication(self)
        self.hold_generation()

    def hold_generation(self, *, take_over: bool = False) -> None:
        """Inside a bucketed update no forward may read half-written weights. When generation runs at begin (the
        launcher's hold, `hooks.launcher.hold_generation_for_bucketed_update`, did not pause it), the bucketed update
        pauses it in place with SGLang's own pause and holds it until `end_bucketed`; a pause someone else made (the
        launcher's, an explicit one) stays theirs to resume. `take_over`: a continue_generation refused inside the
        bucketed update (`hooks.control`) makes the hold the bucketed update's whatever paused it, since the caller that
        asked to continue now sends requests (they are refused) and expects generation to run after the end.

        Invariant: while `holds_generation`, the scheduler is paused and no request that reaches it is held (each is
        refused, `refuses_requests`): a held request would keep its TokenizerManager's `model_update_lock` reader,
        and that TokenizerManager's next call of the bucketed update would wait for it forever."""
        from sglang.srt.managers.io_struct import PauseGenerationReqInput

        if self.bucketed is None or self.holds_generation or (self.scheduler._engine_paused and not take_over):
            return
        if not self.scheduler._engine_paused:
            self.scheduler.pause_generation(PauseGenerationReqInput(mode="in_place"))
        self.holds_generation = True

    @property
    def refuses_requests(self) -> bool:
        """Whether a generate or embedding request reaching the scheduler is refused: the bucketed update holds
        generation."""
        return self.holds_generation

    def release_generation(self) -> bool:
        """At the bucketed update's end: resume generation if it held it (SGLang's own continue). Returns whether it
        resumed."""
        from sglang.srt.managers.io_struct import ContinueGenerationReqInput

        if not self.holds_generation:
            return False
        self.holds_generation = False
        self.scheduler.continue_generation(ContinueGenerationReqInput(torch_empty_cache=False))
        return True

    def end_bucketed(self, out):
        """A successful end_weight_update: the bucketed update closes and applies, once, with the last label a bucket
        applied, whatever the number of buckets (none: a P2P/RDMA write)."""
        bucketed, self.bucketed = self.bucketed, None
        self.engine.holder.close_publication()
        self.engine.holder.close_bucketed()
        how = (f"{bucketed.buckets} bucket(s), {bucketed.failed_buckets} failed" if bucketed.buckets
               else "no bucket: P2P/RDMA")
        self.apply(f"bucketed update ({how})")
        out.message = f"{out.message} [{self.engine.describe(self.result)}]"
        self.close_hold(out)
        return out

    def close_hold(self, out) -> None:
        """After the end's publication: the generation the bucketed update held resumes, and `out` says so."""
        if self.release_generation():
            out.message = f"{out.message} [vradix: generation resumed (the scheduler held it for the bucketed update)]"

    def relabel(self, sglang_relabel, new_version):
        """`/update_weight_version` by itself: a new label is one publication of the same weights; the same label
        again is none. An invalid label (`epochs.check_label`), and a label the engine refuses
        (`prepare_relabel`: in `declared` mode, one an earlier publication declared), is refused and the label stays
        (SGLang's reply to this call has no failure field: the launcher refuses both first, with HTTP 400). Returns
        SGLang's result."""
        try:
            epochs.check_label(new_version)
        except epochs.InvalidLabelError as e:
            logger.error("vradix: refused update_weight_version: %s; the label stays %r", e, current_label())
            return None
        if not self.engine.prepare_relabel(new_version):
            return None
        before = current_label()
        result = sglang_relabel()
        if new_version is not None and new_version != before:
            self.apply(self.source, weights_changed=False)
        else:
            self.engine.discard_drain()
        return result

    def write(self, reason: str) -> str:
        """A control request that wrote the weights outside every update call: one publication, or, inside a
        bucketed update, one more write of it (its end applies). Returns what was done, for the log and the response."""
        if self.bucketed is not None:
            return f"vradix: {reason} inside a bucketed update; {self.engine.PUBLISHES} at end_weight_update"
        return self.engine.describe(self.apply(reason))


class VersionedEngine:
    """A scheduler whose radix cache vradix versions (`Engine`): a publication on it is one epoch bump
    (`bump_scheduler`). The variant of `scheduler.treeless.TreelessEngine`, with the same interface; built per use
    (`engine_of`), it keeps no state of its own."""

    #: what a publication does on this engine, for the responses that announce it
    PUBLISHES = "the epoch bumps"

    def __init__(self, scheduler, state: Engine):
        self.scheduler, self.state = scheduler, state

    @property
    def holder(self) -> Engine:
        """Where the open publication and bucketed update are registered."""
        return self.state

    def tapping(self):
        """In `fingerprint` mode the tensors an update publishes are recorded (`identity_proof.tapping_publication`)."""
        if self.state.identity_mode == "fingerprint":
            return identity_proof.tapping_publication(self.scheduler)
        return contextlib.nullcontext()

    def declaration_refusal(self, label) -> Optional[str]:
        """Why an update call declaring `label` is refused before it loads (`declared` mode: an invalid declaration,
        or one an earlier publication of this engine already used), or None."""
        state = self.state
        if state.identity_mode != "declared" or not identity.is_declaration(label) or label == state.label:
            return None
        try:
            identity.check_declared(label)
        except identity.InvalidIdentityError as e:
            return f"vradix refused the update: {e}"
        if state.declared_before(label):
            return (f"vradix refused the update: declared weight identity {label!r} was already used by an earlier "
                    "publication of this engine; declare a new identity (for example run id + step)")
        return None

    def prepare_relabel(self, new_version) -> bool:
        """Before a new label by itself: in `declared` mode a label an earlier publication declared is refused
        (False, logged); otherwise the in-flight batches drain (True)."""
        state = self.state
        if (state.identity_mode == "declared" and new_version is not None and new_version != state.label
                and state.declared_before(new_version)):
            logger.error("vradix: refused label %r: declared identity already used by an earlier publication",
                         new_version)
            return False
        drain_for_publication(self.scheduler)
        return True

    def publish(self, reason: str, *, label, weights_changed: bool = True) -> Bump:
        """A publication's step: one epoch bump (`bump_scheduler`)."""
        return bump_scheduler(self.scheduler, reason=reason, label=label, weights_changed=weights_changed)

    def describe(self, record: Union[Bump, dict]) -> str:
        assert isinstance(record, Bump), "a versioned engine's publication records a Bump"
        return record.summary()

    def discard_drain(self) -> None:
        """A publication refused before it touched the weights does not bump: its drain is no later publication's."""
        self.state.discard_drain()

    def flush_within(self, publication: Publication, sglang_flush) -> bool:
        """A flush inside an open publication: never a second bump. Once it applied, or inside a bucketed update, the
        flush ages the staleness window out (`Engine.age_out_on_flush`: the floor is the bump it applied, or
        the bucketed update's coming one). Before it applied, an idle engine's flush is SGLang's own reset
        (`scheduler.flush.reset_idle`, its own record); with KV holders it is the open update's conservative bump:
        SGLang flushes after an update whose target runner loaded although the call failed (a draft runner after it), so
        the weights may have changed."""
        if publication.bucketed is not None or publication.result is not None:
            self.state.age_out_on_flush(self.scheduler.tree_cache, after_next_bump=publication.bucketed is not None)
            return True
        if self.is_idle():
            return flush.reset_idle(self, sglang_flush)
        publication.apply_conservatively()
        return True

    def flush(self, sglang_flush) -> bool:
        """A flush by itself (`scheduler.flush.by_itself`): an idle reset, or a lock-aware bump."""
        return flush.by_itself(self, sglang_flush)

    def is_idle(self) -> bool:
        """Whether the scheduler holds no request (waiting ones count only while generation runs)."""
        return self.scheduler.is_fully_idle(ignore_waiting=self.scheduler._engine_paused)

    def bump(self, reason: str, *, is_publication: bool) -> Bump:
        """One epoch bump on this engine (`bump_scheduler`), under the current label."""
        return bump_scheduler(self.scheduler, reason=reason, is_publication=is_publication)

    def export_metrics(self) -> None:
        export_metrics(self.scheduler)


def record_bucket(bucketed: BucketedUpdate, out, publishes: str):
    """Count one update call of an open bucketed update and say, in its response, that the publication (`publishes`:
    what it does on the engine) waits for its end."""
    bucketed.count_bucket(failed=not out.success)
    out.message = (f"{out.message} [vradix: bucket {bucketed.buckets} of a bucketed update; {publishes} once "
                   "at end_weight_update]")
    return out


def bump_scheduler(scheduler, *, reason: str, label=None, is_publication: bool = True,
                   weights_changed: bool = True) -> Bump:
    """One epoch bump on the scheduler's engine: a publication's step, or (`is_publication` False) a lock-aware
    flush's. With an external KV store, the queued requests the bump re-binds end their cache attempt first (their
    storage prefetches are revoked) and are looked up again afterwards under the new namespace
    (`vradix.l3.prefetch`). On a P/D decode role a publication also revokes the prefix promises prefill has not
    fulfilled yet (`vradix.pd.revocation`). `weights_changed` is False for a publication of a label alone.

    The bump's record is built once, whole, at the end (`Engine.finish_bump`), from the epoch step's values
    (`Engine.invalidate`) and those gathered here: the identity's time, the drain, the revoked promises, the cleared
    caches and the whole step's duration (`Bump.bump_ms`)."""
    t_bump = time.perf_counter()
    state = versioned_state(scheduler)
    # the publication drained the in-flight batches, so no check is left in flight; read any a dropped result left
    state.guard.verdicts.read_all()
    live = live_requests(scheduler)
    queued = [*scheduler.waiting_queue, *disagg_requests(scheduler)]
    t0 = time.perf_counter()
    # nonce mode: the bump draws the fresh nonce itself
    ident = (identity_proof.publication_identity(scheduler, state, label, weights_changed)
             if is_publication and state.identity_mode != "nonce" else None)
    identity_ms = (time.perf_counter() - t0) * 1e3
    steps = steps_of(scheduler)
    lookups = steps.storage_lookups
    revoked = prefetch.end_queued_attempts(scheduler.tree_cache, queued) if lookups else 0
    done = state.invalidate(scheduler.tree_cache, live, queued,
                            reason=reason, label=label, is_publication=is_publication, identity=ident)
    drain_ms, promises_revoked = 0.0, 0
    if is_publication:
        drain_ms = state.take_drain()
        queue = getattr(scheduler, "disagg_decode_transfer_queue", None)  # only a decode role promises prefixes
        if queue is not None:
            promises_revoked = revocation.revoke_unfulfilled(queue, done.weight_id, done.epoch_after)
    # multimodal embeddings (keyed by content only) and vision position grids the old weights computed
    cleared = weight_derived.clear_at_publication(scheduler) if steps.derived_caches else weight_derived.Cleared()
    if lookups:
        reissued = prefetch.reissue(scheduler, state, queued)
        logger.info("vradix: %d storage prefetch(es) revoked, %d lookup(s) re-issued under the new namespace",
                    revoked, reissued)
    if state.ledger is not None:
        guard.audit(state.guard.config, state.guard.stats, state.ledger, scheduler.tree_cache, live, state.epoch)
    inv = state.finish_bump(done, is_publication, identity_ms=identity_ms, drain_ms=drain_ms,
                            promises_revoked=promises_revoked, mm_embeddings_cleared=cleared.mm_embeddings,
                            position_grids_cleared=cleared.position_grids,
                            bump_ms=(time.perf_counter() - t_bump) * 1e3)
    logger.info(inv.summary() + " in %.3f ms; %d multimodal embedding(s), %d position grid(s) cleared",
                inv.latency_ms, inv.mm_embeddings_cleared, inv.position_grids_cleared)
    export_metrics(scheduler, bump_seconds=inv.latency_ms / 1e3,
                   pause_seconds=inv.pause_ms / 1e3 if is_publication else None)
    return inv


def versioned_state(scheduler) -> Engine:
    """The engine of a scheduler with a radix cache (the steps that bump, reset or unload run only there)."""
    state = state_of_scheduler(scheduler)
    assert state is not None, "a publication step that needs the epoch state ran on an engine without one"
    return state


def export_metrics(scheduler, **observed) -> None:
    """Export the engine's values after a publication step (`metrics.export_metrics`), on an engine with metrics."""
    if steps_of(scheduler).metrics:
        metrics.export_metrics(scheduler, **observed)


def drain_for_publication(scheduler) -> int:
    """Finish the in-flight batches before the weights change (`overlap.drain_inflight_batch`), and add the time it
    took to the drain of the publication under way (`Engine.drain_ms_pending`), which its bump records
    (`Bump.drain_ms`). Returns the number of batches drained."""
    t0 = time.perf_counter()
    drained = overlap.drain_inflight_batch(scheduler) if steps_of(scheduler).overlap_drain else 0
    state = state_of_scheduler(scheduler)
    if state is not None:
        state.add_drain((time.perf_counter() - t0) * 1e3)
    return drained


def live_requests(scheduler) -> set:
    """The requests one scheduler holds, wherever SGLang keeps them: batches, the waiting queue, the chunked request,
    HiSparse staging and the P/D roles' own queues (`disagg_requests`). A publication treats every one of them
    (crossing or re-bound)."""
    reqs = {*scheduler.collect_inflight_reqs(), *scheduler.waiting_queue}
    if scheduler.chunked_req is not None:
        reqs.add(scheduler.chunked_req)
    coordinator = getattr(scheduler, "hisparse_coordinator", None)
    if coordinator is not None:
        reqs.update(act.req for act in coordinator.ack_staging_queue)
    reqs.update(disagg_requests(scheduler))
    return reqs


def disagg_requests(scheduler) -> list:
    """A P/D role's requests outside SGLang's waiting queue and batches.

    Decode: those waiting for a KV allocation (holding nothing yet: the bump re-binds them, so they match and promise
    prefill a prefix in the new namespace) and those in the transfer queue (holding their preallocated row and
    matched prefix: they cross the bump, keep their KV and never insert it; a publication then revokes the promises
    among them prefill has not fulfilled, `vradix.pd.revocation.revoke_unfulfilled`).
    Prefill: those waiting for decode's bootstrap (nothing matched yet: re-bound) and those whose KV prefill computed
    and is still sending (`disagg_prefill_inflight_queue`: they cross the bump, so at release their old-weights KV
    is freed instead of inserted)."""
    reqs = []
    prealloc = getattr(scheduler, "disagg_decode_prealloc_queue", None)
    if prealloc is not None:
        reqs += [d.req for d in (*prealloc.queue, *prealloc.pending_reqs)] + list(prealloc.retracted_queue)
    transfer = getattr(scheduler, "disagg_decode_transfer_queue", None)
    if transfer is not None:
        reqs += [d.req for d in transfer.queue]
    bootstrap = getattr(scheduler, "disagg_prefill_bootstrap_queue", None)
    if bootstrap is not None:
        reqs += list(bootstrap.queue)
    reqs += list(getattr(scheduler, "disagg_prefill_inflight_queue", None) or ())
    return reqs
