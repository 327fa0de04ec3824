"""The weight identity a publication installs, proven on one scheduler: from the tensors published into its model
(`vradix.core.published`, one all-gather over the TP group), from a declared label, or a fresh nonce; and the tap
that records what an update call publishes (`tapping_publication`)."""
from __future__ import annotations

import logging
from typing import Optional

from vradix import collectives, identity
from vradix.core import published
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from vradix.engine import Engine

logger = logging.getLogger("vradix")


def publication_identity(scheduler, state: Engine, label, weights_changed: bool = True) -> identity.WeightIdentity:
    """The identity of the weights a publication just installed, by the engine's mode: proven from what was published
    (`published_identity`; a label-only publication keeps the weights and so their identity), the declared label
    (when the publication set a new one), or the engine's nonce of the new epoch (`state.nonces`)."""
    fresh = state.nonces.for_epoch(state.epoch + 1)
    if state.identity_mode == "fingerprint":
        current = state.identities[state.epoch].identity
        return published_identity(scheduler, fresh, current) if weights_changed else current
    if state.identity_mode == "declared" and identity.is_declaration(label) and label != state.label:
        if not state.declared_before(label):
            return identity.declared(label)
        logger.error("vradix: declared identity %r was already used by an earlier publication of this engine; "
                     "this epoch gets a fresh nonce instead", label)
    return fresh


def published_identity(scheduler, nonce: identity.WeightIdentity,
                       previous: Optional[identity.WeightIdentity] = None) -> identity.WeightIdentity:
    """The proven identity of what was published into the scheduler's model since the last identity point (the
    engine's start when `previous` is None), the same on every rank and every TP layout (`vradix.core.published`):
    one all-gather over the TP group. A tainted publication gets `nonce` (the engine's nonce of its epoch); one no tap saw, or one the ranks saw
    differently, the layout-dependent fingerprint of the loaded shards (`loaded_shards_identity`)."""
    model = scheduler.tp_worker.model_runner.model
    record = published.of(model)
    pending = record.take()
    group = collectives.tp_cpu_group(scheduler)
    merged = published.merge(collectives.gather(pending.share(), group), pending.names)
    outcome, hex_ = published.identity_of(merged, engine_salt(scheduler), record.start_names,
                                          previous.weight_id if previous is not None else None)
    if outcome == published.Outcome.TAINTED:
        logger.error("vradix: a weight load raised on some rank, so the weights are partly written: this epoch gets "
                     "a fresh nonce identity")
        return nonce
    if outcome in (published.Outcome.UNTAPPED, published.Outcome.INCONSISTENT):
        logger.warning("vradix: the weights changed where vradix saw no published tensor (%s: a direct or P2P "
                       "write, or a loader that bypasses load_weights): this epoch's identity is the fingerprint of "
                       "the loaded shards, which matches only engines of the same TP layout", outcome)
        return loaded_shards_identity(scheduler)
    if previous is None:
        record.start_names = merged.names
    logger.info("vradix: weight identity proven from %d published tensor(s) (%s; %d tensor(s), %.1f MB digested on "
                "this rank)", len(merged.records), outcome, len(pending.lanes), pending.bytes_digested / 1e6)
    assert hex_ is not None, "a complete or chained publication has a fingerprint"
    return identity.proven(hex_, basis=f"published ({outcome})")


def tapping_publication(scheduler):
    """The context an update call runs in on a `fingerprint`-mode engine: every tensor that reaches the scheduler's
    model's `load_weights` is recorded for the publication's identity (`vradix.core.published.tapping`)."""
    runner = scheduler.tp_worker.model_runner
    rank, world = collectives.tp_rank_and_size()
    return published.tapping(runner.model, rank, world, model_device(runner.model))


def model_device(model):
    """The device of the model's first parameter (where its published tensors are digested), or None."""
    param = first_parameter(model)
    return param.device if param is not None else None


def first_parameter(model):
    return next(iter(model.parameters()), None)


def loaded_shards_identity(scheduler) -> identity.WeightIdentity:
    """The content fingerprint of the loaded model's shards (every parameter and buffer of every rank): the same on
    every rank of this engine, but it depends on the TP layout."""
    model = scheduler.tp_worker.model_runner.model
    return identity.proven(identity.fingerprint_model(model, collectives.tp_cpu_group(scheduler)),
                           basis="loaded shards")


def engine_salt(scheduler) -> str:
    """What turns equal published tensors into equal computation, whatever the layout: the model's architecture,
    its dtype and its quantization."""
    runner = scheduler.tp_worker.model_runner
    config = getattr(runner, "model_config", None)
    arch = ",".join(getattr(getattr(config, "hf_config", None), "architectures", None) or [type(runner.model).__name__])
    dtype = getattr(config, "dtype", None) or getattr(first_parameter(runner.model), "dtype", None)
    quant = getattr(getattr(scheduler, "server_args", None), "quantization", None)
    return f"{arch}|{dtype}|{quant}"
