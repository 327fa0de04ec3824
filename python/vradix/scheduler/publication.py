"""A publication: every change of what one scheduler serves from (its weights, their label, a flush of its cache, an
adapter unload) is one `Publication`, which runs the same sequence:

1. open (`Publication.open`): the in-flight batches drain (`drain_for_publication`); a weight-update session already
   open on the engine is joined, not doubled; refusals answer before anything changes (`refuse`); SGLang's change
   runs inside `running`, which registers the publication on the engine's state (`EpochState.publication`,
   `TreelessState.publication`), so the hooks SGLang calls from inside the change hand their events to it
   (`version_recorded`, `flush`), and taps the tensors it publishes (`identity_proof.tapping_publication`);
2. apply (`Publication.apply`), at most once: the engine's step, calling the core functions: an epoch bump
   (`bump_scheduler`: identity, crossing marks, re-binds, sessions, deferred reclaim, L3 and P/D revocations, derived
   caches, audit, census, metrics), the record of an idle reset (`core.epochs.record_reset`), an adapter's entries
   freed (`core.lora`), or, on an engine without a radix cache, the weight-derived caches dropped
   (`publish_without_tree`);
3. close (`close_update`, `end_session`, ...): the response says what the publication did.

A step the engine lacks is never entered: what it has (overlap scheduler, external KV lookups, weight-derived caches,
metrics) is read at startup and after each runtime reconfiguration (`EngineSteps`), like the cache's host tier and streaming sessions inside the bump
(`EpochState.host_tier`, `EpochState.streaming_sessions`).
"""
from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Optional, Union

from vradix.core import deferred_reclaim, epochs, host_tier, lora, mm_embeddings, overlap, weight_derived
from vradix.core.state import Bump, EpochState, WeightSession, state_of_scheduler, treeless_of
from vradix.l3 import prefetch
from vradix.ledger import guard
from vradix.observability import metrics
from vradix.pd import revocation
from vradix.scheduler import census, identity_proof

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
    """Read the engine's publication steps (`EngineSteps`) once; called where vradix attaches to a scheduler."""
    scheduler._vradix_steps = EngineSteps.of_scheduler(scheduler)
    return scheduler._vradix_steps


def steps_of(scheduler) -> EngineSteps:
    """The engine's publication steps (read now for a scheduler vradix attached to without `install_steps`)."""
    steps = getattr(scheduler, "_vradix_steps", None)
    return steps if steps is not None else install_steps(scheduler)


def opened(scheduler) -> Optional["Publication"]:
    """The publication open on the scheduler's engine (an update call's, or a weight-update session's), or None."""
    if scheduler is None:
        return None
    holder = state_of_scheduler(scheduler) or treeless_of(scheduler.tree_cache)
    return holder.publication if holder is not None else None


class Publication:
    """One change of what one scheduler serves from; see the module docstring for its sequence.

    Invariants: `apply` runs at most once (`result` holds what it did); while open, the publication is the engine's
    only open one (`opened`), from `running` to the end of the call, or from `begin_session` to `end_session`; an
    update call inside a session is a bucket of the session's publication and never applies."""

    def __init__(self, scheduler, source: str):
        self.scheduler, self.source = scheduler, source
        self.state: Optional[EpochState] = state_of_scheduler(scheduler)
        self.treeless = treeless_of(scheduler.tree_cache) if scheduler is not None and self.state is None else None
        #: the bucket counts, while this publication is a weight-update session
        self.session: Optional[WeightSession] = None
        #: what `apply` did: a `Bump` on a radix cache, the treeless record without one
        self.result: Union[Bump, dict, int, None] = None
        #: whether this session holds generation itself (`hold_generation`): it then refuses the requests that reach
        #: the scheduler (`refuses_requests`) and resumes generation at `end_session`
        self.holds_generation = False

    @classmethod
    def open(cls, scheduler, source: str, *, drain: bool = True) -> "Publication":
        """The publication of a change about to run: the engine's open one (a session's), or a new one. With `drain`,
        the in-flight batches finish first."""
        if drain and scheduler is not None:
            drain_for_publication(scheduler)
        return opened(scheduler) or cls(scheduler, source)

    @property
    def attached(self) -> bool:
        return self.state is not None or self.treeless is not None

    @property
    def holder(self):
        return self.state if self.state is not None else self.treeless

    @property
    def is_open(self) -> bool:
        return self.holder is not None and self.holder.publication is self

    def refuse(self, refused, source: str):
        """A change (`source`: a bucket of a session names its own) refused before it touched anything: no apply;
        its drain is no later publication's (a session's drains stay the session's). Returns the refusal."""
        logger.error("vradix: %s refused before loading: %s", source, refused.message)
        if self.session is None:
            discard_drain(self.state)
        return refused

    @contextlib.contextmanager
    def running(self):
        """SGLang's change runs inside: the publication is the engine's open one, and (fingerprint mode) the tensors
        it loads are recorded. A session's publication stays open after one of its calls."""
        self.holder.open_publication(self)
        tap = (identity_proof.tapping_publication(self.scheduler)
               if self.state is not None and self.state.identity_mode == "fingerprint" else contextlib.nullcontext())
        try:
            with tap:
                yield self
        finally:
            if self.session is None:
                self.holder.close_publication()

    def apply(self, reason: str, *, label=None, is_publication: bool = True, weights_changed: bool = True,
              reset: Optional[tuple] = None, adapter=None):
        """The publication's one step on the engine (see the module docstring): `reset` is the (device, host) tokens
        an idle reset freed; `adapter` the unload request of a LoRA adapter. Returns what it did (`result`)."""
        assert self.result is None, f"{self.source}: a publication applies once"
        if self.treeless is not None:
            self.result = publish_without_tree(self.scheduler, reason, is_publication=is_publication)
        elif reset is not None:
            self.result = record_idle_reset(self.scheduler, reason, *reset)
        elif adapter is not None:
            self.result = unload_adapter(self.scheduler, adapter)
        else:
            self.result = bump_scheduler(self.scheduler, reason=reason, label=label, is_publication=is_publication,
                                         weights_changed=weights_changed)
        return self.result

    def version_recorded(self) -> None:
        """SGLang recorded the new weights' label: the success point of an update call. Outside a session it applies
        (the flush SGLang runs after it is part of it); inside one, the session's end applies."""
        if self.state is not None and self.session is None and self.result is None:
            self.apply(self.source, label=current_label())

    def close_update(self, out, may_touch_weights: bool):
        """The end of an update call: a bucket of a session is counted; a returned failure that may have touched the
        weights applies once, conservatively, when nothing applied yet. Returns `out`, saying what was done."""
        if self.treeless is not None:
            return self.close_update_without_tree(out, may_touch_weights)
        if self.session is not None:
            return record_bucket(self.session, out)
        if self.result is None and may_touch_weights and not out.success:
            self.apply(f"failed {self.source} (conservative)", label=current_label())
        if isinstance(self.result, Bump):
            out.message = f"{out.message} [{self.result.summary()}]"
        return out

    def close_update_without_tree(self, out, may_touch_weights: bool):
        if self.session is not None or not (out.success or may_touch_weights):
            return out
        reason = self.source if out.success else f"failed {self.source} (conservative)"
        cleared = self.apply(reason)
        out.message = (f"{out.message} [vradix: {reason} without a radix cache: "
                       f"{cleared['mm_embeddings_cleared']} multimodal embedding(s), "
                       f"{cleared['position_grids_cleared']} position grid(s) cleared]")
        return out

    def begin_session(self) -> None:
        """A successful begin_weight_update: this publication stays open until `end_session`, which applies once."""
        self.session = WeightSession()
        self.holder.open_session(self.session)
        self.holder.open_publication(self)
        self.hold_generation()

    def hold_generation(self, *, take_over: bool = False) -> None:
        """Inside a session no forward may read half-written weights. When generation runs at begin (the launcher's
        hold, `hooks.launcher.hold_generation_for_session`, did not pause it), the session pauses it in place with
        SGLang's own pause and holds it until `end_session`; a pause someone else made (the launcher's, an explicit
        one) stays theirs to resume. `take_over`: a continue_generation refused inside the session
        (`hooks.control`) makes the hold the session's whatever paused it, since the caller that asked to continue
        now sends requests (they are refused) and expects generation to run after the end.

        Invariant: while `holds_generation`, the scheduler is paused and no request that reaches it is held (each is
        refused, `refuses_requests`): a held request would keep its TokenizerManager's `model_update_lock` reader,
        and that TokenizerManager's next session call would wait for it forever."""
        from sglang.srt.managers.io_struct import PauseGenerationReqInput

        if self.session is None or self.holds_generation or (self.scheduler._engine_paused and not take_over):
            return
        if not self.scheduler._engine_paused:
            self.scheduler.pause_generation(PauseGenerationReqInput(mode="in_place"))
        self.holds_generation = True

    @property
    def refuses_requests(self) -> bool:
        """Whether a generate or embedding request reaching the scheduler is refused: the session holds generation."""
        return self.holds_generation

    def release_generation(self) -> bool:
        """At the session's end: resume generation if the session held it (SGLang's own continue). Returns whether it
        resumed."""
        from sglang.srt.managers.io_struct import ContinueGenerationReqInput

        if not self.holds_generation:
            return False
        self.holds_generation = False
        self.scheduler.continue_generation(ContinueGenerationReqInput(torch_empty_cache=False))
        return True

    def end_session(self, out):
        """A successful end_weight_update: the session closes and applies, once, with the last label a bucket
        applied, whatever the number of buckets (none: a P2P/RDMA write)."""
        session, self.session = self.session, None
        self.holder.close_publication()
        self.holder.close_session()
        if self.state is None:
            self.apply("weight-update session")
            self.close_hold(out)
            return out
        how = (f"{session.buckets} bucket(s), {session.failed_buckets} failed" if session.buckets
               else "no bucket: P2P/RDMA")
        inv = self.apply(f"weight-update session ({how})", label=current_label())
        out.message = f"{out.message} [{inv.summary()}]"
        self.close_hold(out)
        return out

    def close_hold(self, out) -> None:
        """After the end's publication: the generation the session held resumes, and `out` says so."""
        if self.release_generation():
            out.message = f"{out.message} [vradix: generation resumed (the scheduler held it for the session)]"

    def relabel(self, sglang_relabel, new_version):
        """`/update_weight_version` by itself: a new label is one publication of the same weights; the same label
        again is none. An invalid label (`epochs.check_label`), and in `declared` mode a label an earlier publication
        declared, is refused and the label stays (SGLang's reply to this call has no failure field: the launcher
        refuses both first, with HTTP 400). Returns SGLang's result."""
        try:
            epochs.check_label(new_version)
        except epochs.InvalidLabelError as e:
            logger.error("vradix: refused update_weight_version: %s; the label stays %r", e, current_label())
            return None
        state = self.state
        if state is not None:
            if (state.identity_mode == "declared" and new_version is not None and new_version != state.label
                    and state.declared_before(new_version)):
                logger.error("vradix: refused label %r: declared identity already used by an earlier publication",
                             new_version)
                return None
            drain_for_publication(self.scheduler)
        before = current_label()
        result = sglang_relabel()
        if new_version is not None and new_version != before:
            self.apply(self.source, label=current_label(), weights_changed=False)
        else:
            discard_drain(self.state)
        return result

    def write(self, reason: str) -> str:
        """A control request that wrote the weights outside every update call: one publication, or, inside a
        session, one more write of it (its end applies). Returns what was done, for the log and the response."""
        if self.session is not None:
            return (f"vradix: {reason} inside a weight-update session; the epoch bumps at end_weight_update"
                    if self.state is not None else f"vradix: {reason}")
        if self.state is not None:
            return self.apply(reason, label=current_label()).summary()
        if self.treeless is None:
            return f"vradix: {reason}"
        self.apply(reason)
        return f"vradix: {reason} without a radix cache: weight-derived caches dropped"

    def flush(self, sglang_flush) -> bool:
        """A flush of the cache (`sglang_flush` runs SGLang's): inside an open publication, the flush it asked for
        (never a second bump: it ages the window out, or it is the failed update's conservative bump); by itself,
        an idle engine's reset or, with KV holders, a lock-aware bump. Returns whether the cache was flushed."""
        if self.state is None:
            ok = sglang_flush()
            if ok and self.treeless is not None and not self.is_open:
                self.apply("flush", is_publication=False)
            return ok
        cache = self.scheduler.tree_cache
        if self.session is not None or self.result is not None:
            deferred_reclaim.age_out_on_flush(self.state, cache, after_next_bump=self.session is not None)
            return True
        if self.scheduler.is_fully_idle(ignore_waiting=self.scheduler._engine_paused):
            return (Publication(self.scheduler, "flush") if self.is_open else self).reset(sglang_flush)
        if self.is_open:
            # SGLang flushes after an update whose target runner loaded although the call failed (a draft runner
            # after it): the weights may have changed, so this flush is that update's conservative bump
            self.apply(f"failed {self.source} (conservative)", label=current_label())
            return True
        self.apply("lock-aware flush", is_publication=False)
        deferred_reclaim.age_out_on_flush(self.state, cache)
        return True

    def reset(self, sglang_flush) -> bool:
        """SGLang's own flush of an idle engine, recorded as this publication's reset."""
        cache = self.scheduler.tree_cache
        cached = cache.evictable_size() + cache.protected_size()
        with host_tier.counting_freed(cache) as host:
            ok = sglang_flush()
        if ok:
            self.apply("flush (idle reset)", reset=(cached, host.tokens))
        return ok


def record_bucket(session: WeightSession, out):
    """Count one update call of an open session and say, in its response, that the bump waits for the session end."""
    session.count_bucket(failed=not out.success)
    out.message = (f"{out.message} [vradix: bucket {session.buckets} of a weight-update session; the epoch bumps once "
                   "at end_weight_update]")
    return out


def bump_scheduler(scheduler, *, reason: str, label=None, is_publication: bool = True,
                   weights_changed: bool = True) -> Bump:
    """One epoch bump on the scheduler's engine. With an external KV store, the queued requests the bump re-binds
    end their cache attempt first (their storage prefetches are revoked) and are looked up again afterwards under the
    new namespace (`vradix.l3.prefetch`). On a P/D decode role a publication also revokes the prefix promises prefill
    has not fulfilled yet (`vradix.pd.revocation`). `weights_changed` is False for a publication of a label alone.
    """
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
    inv = epochs.bump(state, scheduler.tree_cache, live, queued,
                      reason=reason, label=label, is_publication=is_publication, identity=ident)
    inv.took_identity(identity_ms)
    if is_publication:
        inv.took_drain(state.take_drain())
        queue = getattr(scheduler, "disagg_decode_transfer_queue", None)  # only a decode role promises prefixes
        if queue is not None:
            assert inv.weight_id is not None, "a bump records the identity it published"
            inv.count_revoked(revocation.revoke_unfulfilled(queue, inv.weight_id, inv.epoch_after))
    # multimodal embeddings (keyed by content only) and vision position grids the old weights computed
    cleared = weight_derived.clear_at_publication(scheduler) if steps.derived_caches else weight_derived.Cleared()
    inv.count_cleared(cleared.mm_embeddings, cleared.position_grids)
    if lookups:
        reissued = prefetch.reissue(scheduler, state, queued)
        logger.info("vradix: %d storage prefetch(es) revoked, %d lookup(s) re-issued under the new namespace",
                    revoked, reissued)
    if state.ledger is not None:
        guard.audit(state.guard.config, state.guard.stats, state.ledger, scheduler.tree_cache, live, state.epoch)
    logger.info(inv.summary() + " in %.3f ms; %d multimodal embedding(s), %d position grid(s) cleared",
                inv.latency_ms, inv.mm_embeddings_cleared, inv.position_grids_cleared)
    if is_publication and weights_changed:
        census.record_weights(scheduler, f"the publication to epoch {inv.epoch_after} ({reason})")
    census.check_requests(scheduler, live, inv.epoch_after)
    inv.took_bump((time.perf_counter() - t_bump) * 1e3)
    export_metrics(scheduler, bump_seconds=inv.latency_ms / 1e3,
                   pause_seconds=inv.pause_ms / 1e3 if is_publication else None)
    return inv


def versioned_state(scheduler) -> EpochState:
    """The epoch state of an engine with a radix cache (the steps that bump, reset or unload run only there)."""
    state = state_of_scheduler(scheduler)
    assert state is not None, "a publication step that needs the epoch state ran on an engine without one"
    return state


def export_metrics(scheduler, **observed) -> None:
    """Export the engine's values after a publication step (`metrics.export_metrics`), on an engine with metrics."""
    if steps_of(scheduler).metrics:
        metrics.export_metrics(scheduler, **observed)


def record_idle_reset(scheduler, reason: str, tokens_freed: int, host_tokens_freed) -> Bump:
    """The record of a flush that reset an idle engine (`epochs.record_reset`): it also drops the multimodal
    embeddings, as every flush does."""
    inv = epochs.record_reset(versioned_state(scheduler), reason, tokens_freed, host_tokens_freed,
                              mm_embeddings.clear_all())
    export_metrics(scheduler)
    return inv


def unload_adapter(scheduler, recv_req) -> int:
    """A LoRA adapter unloaded: its entries, and only those, are freed; no epoch changes. Returns the tokens freed."""
    state = versioned_state(scheduler)
    state.lora.count_event()
    lora.forget_adapter(state, recv_req.lora_id)
    freed = lora.free_adapter_entries(state, scheduler.tree_cache, recv_req.lora_id)
    state.lora.count_freed(freed)
    logger.info("vradix: adapter %r (lora_id %s) unloaded: freed %d of its cached tokens; other namespaces untouched",
                recv_req.lora_name, recv_req.lora_id, freed)
    export_metrics(scheduler)
    return freed


def drain_for_publication(scheduler) -> int:
    """Finish the in-flight batches before the weights change (`overlap.drain_inflight_batch`), and add the time it
    took to the drain of the publication under way (`EpochState.drain_ms_pending`), which its bump records
    (`Bump.drain_ms`). Returns the number of batches drained."""
    t0 = time.perf_counter()
    drained = overlap.drain_inflight_batch(scheduler) if steps_of(scheduler).overlap_drain else 0
    state = state_of_scheduler(scheduler)
    if state is not None:
        state.add_drain((time.perf_counter() - t0) * 1e3)
    return drained


def discard_drain(state: Optional[EpochState]) -> None:
    """A publication refused before it touched the weights does not bump: its drain is no later publication's."""
    if state is not None:
        state.discard_drain()


def publish_without_tree(scheduler, reason: str, *, is_publication: bool = True) -> dict:
    """One publication on an engine without a radix cache (`state.TreelessState`): no tree, no epoch, but the
    weight-derived caches the old weights filled are dropped, once (`weight_derived.clear_at_publication`)."""
    treeless = treeless_of(scheduler.tree_cache)
    assert treeless is not None, "an engine without a radix cache has a treeless record"
    cleared = weight_derived.clear_at_publication(scheduler)
    treeless.record({"reason": reason, "label": current_label(), "mm_embeddings_cleared": cleared.mm_embeddings,
                     "position_grids_cleared": cleared.position_grids}, is_publication)
    if is_publication:
        census.record_weights(scheduler, f"the publication {treeless.publications} ({reason})")
    logger.info("vradix: %s without a radix cache: %d multimodal embedding(s), %d position grid(s) cleared", reason,
                cleared.mm_embeddings, cleared.position_grids)
    last = treeless.last
    assert last is not None, "just recorded"
    return last


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


def current_label():
    from sglang.srt.runtime_context import get_serving
    return get_serving().weight_version
