"""One publication on one scheduler, across every step: the epoch bump (`core.epochs`), its weight identity, the
L3 storage prefetches it revokes and re-issues (`l3.prefetch`), the P/D decode promises it revokes (`pd.revocation`),
the weight-derived caches it drops (`core.weight_derived`), the guard's audit and the metrics. An engine without a
radix cache has no epoch and only drops the weight-derived caches (`publish_without_tree`)."""
from __future__ import annotations

import contextlib
import logging
import time
from typing import Optional

from vradix import identity, request
from vradix.core import epochs, published, weight_derived
from vradix.core import overlap
from vradix.core.state import EpochState, Invalidation, state_of, state_of_scheduler, treeless_of
from vradix.l3 import prefetch
from vradix.ledger import guard
from vradix.observability import metrics
from vradix.pd import revocation
from vradix.scheduler import census
from vradix.scheduler.requests import disagg_requests, live_requests

logger = logging.getLogger("vradix")


def bump_scheduler(scheduler, *, reason: str, label=None, is_publication: bool = True,
                   weights_changed: bool = True) -> Invalidation:
    """One epoch bump on the scheduler's engine. With an external KV store, the queued requests the bump re-binds
    end their cache attempt first (their storage prefetches are revoked) and are looked up again afterwards under the
    new namespace (`vradix.l3.prefetch`). On a P/D decode role a publication also revokes the prefix promises prefill
    has not fulfilled yet (`vradix.pd.revocation`). `weights_changed` is False for a publication of a label alone.
    """
    t_bump = time.perf_counter()
    state = state_of(scheduler.tree_cache)
    # the publication drained the in-flight batches, so no check is left in flight; read any a dropped result left
    state.guard.verdicts.read_all()
    live = live_requests(scheduler)
    queued = [*scheduler.waiting_queue, *disagg_requests(scheduler)]
    t0 = time.perf_counter()
    ident = publication_identity(scheduler, state, label, weights_changed) if is_publication else None
    identity_ms = (time.perf_counter() - t0) * 1e3
    lookups = prefetch.storage_lookups(scheduler)
    revoked = prefetch.end_queued_attempts(scheduler.tree_cache, queued) if lookups else 0
    inv = epochs.bump(state, scheduler.tree_cache, live, queued,
                      reason=reason, label=label, is_publication=is_publication, identity=ident)
    inv.took_identity(identity_ms)
    if is_publication:
        inv.took_drain(state.take_drain())
        inv.count_revoked(revoke_unfulfilled_promises(scheduler, inv))
    # multimodal embeddings (keyed by content only) and vision position grids the old weights computed
    cleared = weight_derived.clear_at_publication(scheduler)
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
    metrics.export_metrics(scheduler, bump_seconds=inv.latency_ms / 1e3,
                           pause_seconds=inv.pause_ms / 1e3 if is_publication else None)
    return inv


def drain_for_publication(scheduler) -> int:
    """Finish the in-flight batches before the weights change (`overlap.drain_inflight_batch`), and add the time it
    took to the drain of the publication under way (`EpochState.drain_ms_pending`), which its bump records
    (`Invalidation.drain_ms`). Returns the number of batches drained."""
    t0 = time.perf_counter()
    drained = overlap.drain_inflight_batch(scheduler)
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
    cleared = weight_derived.clear_at_publication(scheduler)
    treeless.last = {"reason": reason, "label": current_label(), "mm_embeddings_cleared": cleared.mm_embeddings,
                     "position_grids_cleared": cleared.position_grids}
    if is_publication:
        treeless.publications += 1
        treeless.last_publication = treeless.last
        census.record_weights(scheduler, f"the publication {treeless.publications} ({reason})")
    logger.info("vradix: %s without a radix cache: %d multimodal embedding(s), %d position grid(s) cleared", reason,
                cleared.mm_embeddings, cleared.position_grids)
    return treeless.last


def publication_identity(scheduler, state: EpochState, label, weights_changed: bool = True) -> identity.WeightIdentity:
    """The identity of the weights a publication just installed, by the engine's mode: proven from what was published
    (`published_identity`; a label-only publication keeps the weights and so their identity), the declared label
    (when the publication set a new one), or a fresh nonce."""
    if state.identity_mode == "fingerprint":
        current = state.identities[state.epoch].identity
        return published_identity(scheduler, current) if weights_changed else current
    if state.identity_mode == "declared" and identity.is_declaration(label) and label != state.label:
        if not state.declared_before(label):
            return identity.declared(label)
        logger.error("vradix: declared identity %r was already used by an earlier publication of this engine; "
                     "this epoch gets a fresh nonce instead", label)
    return identity.nonce()


def published_identity(scheduler, previous: Optional[identity.WeightIdentity] = None) -> identity.WeightIdentity:
    """The proven identity of what was published into the scheduler's model since the last identity point (the
    engine's start when `previous` is None), the same on every rank and every TP layout (`vradix.core.published`):
    one all-gather over the TP group. A tainted publication gets a nonce; one no tap saw, or one the ranks saw
    differently, the layout-dependent fingerprint of the loaded shards (`loaded_shards_identity`)."""
    model = scheduler.tp_worker.model_runner.model
    record = published.of(model)
    pending = record.take()
    group = tp_cpu_group(scheduler)
    merged = published.merge(gather(pending.share(), group), pending.names)
    outcome, hex_ = published.identity_of(merged, engine_salt(scheduler), record.start_names,
                                          previous.weight_id if previous is not None else None)
    if outcome == published.Outcome.TAINTED:
        logger.error("vradix: a weight load raised on some rank, so the weights are partly written: this epoch gets "
                     "a fresh nonce identity")
        return identity.nonce(merged.nonce)
    if outcome in (published.Outcome.UNTAPPED, published.Outcome.INCONSISTENT):
        logger.warning("vradix: the weights changed where vradix saw no published tensor (%s: a direct or P2P "
                       "write, or a loader that bypasses load_weights): this epoch's identity is the fingerprint of "
                       "the loaded shards, which matches only engines of the same TP layout", outcome)
        return loaded_shards_identity(scheduler)
    if previous is None:
        record.start_names = merged.names
    logger.info("vradix: weight identity proven from %d published tensor(s) (%s; %d tensor(s), %.1f MB digested on "
                "this rank)", len(merged.records), outcome, len(pending.lanes), pending.bytes_digested / 1e6)
    return identity.proven(hex_, basis=f"published ({outcome})")


def tapping_publication(scheduler, state: EpochState):
    """The context an update call runs in: in `fingerprint` mode, every tensor that reaches the scheduler's model's
    `load_weights` is recorded for the publication's identity (`vradix.core.published.tapping`); otherwise nothing."""
    if state.identity_mode != "fingerprint":
        return contextlib.nullcontext()
    runner = scheduler.tp_worker.model_runner
    rank, world = tp_rank_and_size()
    return published.tapping(runner.model, rank, world, model_device(runner.model))


def tp_rank_and_size() -> tuple:
    """This process's (rank, size) in its TP group; (0, 1) where no TP group exists."""
    try:
        from sglang.srt.distributed.parallel_state import get_tp_group

        group = get_tp_group()
        return group.rank_in_group, group.world_size
    except Exception:  # noqa: BLE001 - no parallel context (a single process built without one)
        return 0, 1


def model_device(model):
    """The device of the model's first parameter (where its published tensors are digested), or None."""
    param = first_parameter(model)
    return param.device if param is not None else None


def first_parameter(model):
    return next(iter(model.parameters()), None)


def loaded_shards_identity(scheduler) -> identity.WeightIdentity:
    """The content fingerprint of the loaded model's shards (every parameter and buffer of every rank): the same on
    every rank of this engine, but it depends on the TP layout."""
    return identity.proven(identity.fingerprint_model(scheduler.tp_worker.model_runner.model, tp_cpu_group(scheduler)),
                           basis="loaded shards")


def tp_cpu_group(scheduler):
    """The scheduler's TP CPU (gloo) group, or None on a single rank."""
    return getattr(getattr(scheduler, "tp_group", None), "cpu_group", None)


def gather(share, group) -> list:
    """Every rank's `share`, in rank order (one all_gather_object over `group`; just this rank's without one)."""
    if group is None:
        return [share]
    import torch.distributed as dist

    if dist.get_world_size(group) == 1:
        return [share]
    shares = [None] * dist.get_world_size(group)
    dist.all_gather_object(shares, share, group=group)
    return shares


def engine_salt(scheduler) -> str:
    """What turns equal published tensors into equal computation, whatever the layout: the model's architecture,
    its dtype and its quantization."""
    runner = scheduler.tp_worker.model_runner
    config = getattr(runner, "model_config", None)
    arch = ",".join(getattr(getattr(config, "hf_config", None), "architectures", None) or [type(runner.model).__name__])
    dtype = getattr(config, "dtype", None) or getattr(first_parameter(runner.model), "dtype", None)
    quant = getattr(getattr(scheduler, "server_args", None), "quantization", None)
    return f"{arch}|{dtype}|{quant}"


def refuse_reused_declaration(state: EpochState, label, output_type):
    """In `declared` mode, a publication naming a declared identity an earlier publication of this engine already
    used is refused before any weight changes: returns the failed response, or None."""
    if state.identity_mode != "declared" or not identity.is_declaration(label) or label == state.label:
        return None
    try:
        identity.check_declared(label)
    except identity.InvalidIdentityError as e:
        return output_type(success=False, message=f"vradix refused the update: {e}")
    if state.declared_before(label):
        return output_type(success=False, message=(
            f"vradix refused the update: declared weight identity {label!r} was already used by an earlier "
            "publication of this engine; declare a new identity (for example run id + step)"))
    return None


def current_label():
    from sglang.srt.runtime_context import get_serving
    return get_serving().weight_version


def revoke_unfulfilled_promises(scheduler, inv) -> int:
    """At a publication on a P/D decode role, right after the bump (every transfer-queue request already crosses it):
    revoke each transfer-queue request's unfulfilled prefix promise (`vradix.pd.revocation.must_revoke`). Returns how
    many were revoked.

    A revoked request is failed the way SGLang's own `/abort_request` fails a transfer-queue request: its receiver is
    aborted, which tells prefill (an abort notification, so prefill stops and drops the request) and marks its room
    Failed. The next `DecodeTransferQueue.pop_transferred` then streams the error and releases the request's prefix
    lock and preallocated row with `checkpoint=False` (nothing inserted), after prefill acknowledged the abort when
    it may still be writing (SGLang's deferred release); `answer_decode_failures_with_their_cause` keeps the 503 on that path. A
    request staged to host memory keeps its receiver, as SGLang's abort does, until prefill stops writing.
    The receivers' states are reduced over the attention TP group (MIN), as `pop_transferred` reduces them, so every
    rank revokes the same requests."""
    queue = getattr(scheduler, "disagg_decode_transfer_queue", None)
    entries = [d for d in (queue.queue if queue is not None else ()) if d.kv_receiver is not None]
    if not entries:
        return 0
    import torch.distributed as dist
    from sglang.srt.disaggregation.utils import _is_fake_transfer, all_reduce_flags, prepare_abort

    polls = [int(d.kv_receiver.poll()) for d in entries]
    if queue.gloo_group is not None:
        polls = all_reduce_flags(polls, queue.gloo_group, dist.ReduceOp.MIN)
    revoked = 0
    for decode_req, poll in zip(entries, polls):
        req, st = decode_req.req, request.of(decode_req.req)
        if st is None or not st.kv_history:
            continue
        promised = decode_req.prefix_match.decode_prefix_len if decode_req.prefix_match is not None else 0
        under = st.kv_history[0].weight_id
        if not revocation.must_revoke(poll, promised, finished=req.finished_reason is not None,
                                      fake=_is_fake_transfer(req), promised_under=under, published=inv.weight_id):
            continue
        st.revoke(revocation.message(req.rid, promised, under, inv.weight_id, inv.epoch_after))
        logger.warning(st.revoked)
        prepare_abort(req, st.revoked, status_code=revocation.STATUS)
        if not decode_req.host_staged:
            decode_req.kv_receiver.abort()
        revoked += 1
    return revoked
