"""Engine start (scheduler process): version the tree cache, or refuse loudly."""
from __future__ import annotations

import logging
from typing import Optional

from vradix import __version__, identity
from vradix.closed_world import epd, loops
from vradix.ledger import host as host_ledger
from vradix.observability import metrics
from vradix.core import deferred_reclaim, published, staleness
from vradix.scheduler import launch, publication
from vradix.collectives import tp_cpu_group, tp_rank_and_size
from vradix.scheduler.identity_proof import published_identity
from vradix.core.epochs import current_label
from vradix.pd import layout
from vradix.engine import attach
from vradix.core.state import attach_treeless

logger = logging.getLogger("vradix")


def refuse_encoder_server(encoder, server_args, *args, **kwargs):
    """BEFORE MMEncoder.__init__: SGLang's encoder-only launch (`launch_server.run_server` -> the encoder's HTTP or
    gRPC server) skips `check_server_args`, so the encoder refuses itself before it loads a weight."""
    epd.check(server_args)


def refuse_unversioned_launch(scheduler, server_args, *args, **kwargs):
    """BEFORE Scheduler.__init__: the launch rules the launcher applies in SGLang's argument check, decided again in
    the scheduler process before it builds anything (`vradix.scheduler.launch`): an engine vradix cannot version
    does not start, whichever way it was launched."""
    launch.check(server_args)


def attach_to_scheduler(_result, scheduler, server_args=None, port_args=None, *args, **kwargs):
    """AFTER Scheduler.__init__(server_args, port_args, ...): version the tree cache, or say loudly why vradix is a
    no-op / refuses. A scheduler that selected an event loop a publication cannot treat does not start
    (`closed_world.loops`). The engine's nonces come from its launch (`port_args`), so all its ranks agree."""
    loops.check(scheduler)
    cache = scheduler.tree_cache
    if not cache.supports_prefix_sharing():
        refuse_treeless_decode(scheduler)
        scheduler._vradix = attach_treeless(cache)
        publication.install_steps(scheduler)
        logger.info("vradix %s active without a radix cache: no prefix tree to version; every publication drops the "
                    "weight-derived caches (multimodal embedding cache, vision position-embedding grids)",
                    __version__)
        return
    tree_core = getattr(cache, "tree_core", None)
    if tree_core is None or not hasattr(tree_core, "collect_path_info"):
        raise RuntimeError(
            f"vradix {__version__} cannot version {type(cache).__name__} (it supports SGLang's UnifiedRadixCache). "
            "Refusing to serve an unversioned prefix cache: use the default radix backend, pass "
            "--disable-radix-cache, or set VRADIX_DISABLE=1 for stock behaviour.")
    unobserved = ledger_blind_spots(scheduler)
    if unobserved:
        # KV written by these paths bypasses run_batch's stamp; a strict guard would reject every such prefix.
        logger.warning("vradix: KV page ledger disabled (KV also arrives via %s); the epoch namespace still applies",
                       ", ".join(unobserved))
    window = staleness.server_window()
    staleness.check_ledger(window, unobserved)
    staleness.check_cache(cache, window, deferred_reclaim.supported(cache))
    mode = engine_identity_mode(scheduler.server_args)
    scope = role_scope(scheduler)
    nonces = identity.EngineNonces(identity.launch_seed(port_args, tp_cpu_group(scheduler)))
    state = attach(cache, with_ledger=not unobserved, weight_identity=startup_identity(scheduler, mode, nonces),
                   identity_mode=mode, scope=scope, staleness_window=window, label=current_label(),
                   streaming_sessions=bool(getattr(scheduler.server_args, "enable_streaming_session", True)),
                   nonces=nonces)
    scheduler._vradix = state  # the one attribute vradix sets on the scheduler (`engine.of_scheduler`)
    if state.ledger is not None and getattr(scheduler, "enable_hierarchical_cache", False):
        host_ledger.attach(cache, state.ledger)
    state.guard.narrow_to_ranks(getattr(scheduler, "tp_size", 1), getattr(scheduler, "pp_size", 1))
    metrics.attach(scheduler)
    metrics.export_metrics(scheduler)
    publication.install_steps(scheduler)
    logger.info("vradix %s active: epoch-namespaced radix cache (%s, tree core %s), epoch %d, weight_id %s (%s)%s; "
                "KV page ledger %s (verify=%s, audit=%s)", __version__, type(cache).__name__, state.tree_core,
                state.epoch, state.weight_id, mode, f", role-local scope {scope}" if scope else "",
                "on" if state.ledger is not None else "off", state.guard.config.verify, state.guard.config.audit)


def refuse_treeless_decode(scheduler) -> None:
    """A P/D decode role without a radix cache would run treeless: no request is bound to an epoch, so the P/D
    handshake (`hooks.pd.check_prefill_identity`) could not compare prefill's identity and would commit KV of any
    weights. The launcher refuses it first (`closed_world.unversioned`); this stops an engine built without it."""
    args = getattr(scheduler, "server_args", None)
    if layout.role_of(getattr(args, "disaggregation_mode", None)) == "decode":
        raise RuntimeError(
            f"vradix {__version__} refuses a P/D decode role without a radix cache: it could not check which weights "
            "computed the KV prefill sends. Start decode with --disaggregation-decode-enable-radix-cache, or set "
            "VRADIX_DISABLE=1 for stock behaviour.")


def role_scope(scheduler) -> Optional[str]:
    """A P/D role's scope (its role and KV layout, `vradix.pd.layout`), or None on a non-P/D engine. Raises
    IncompatibleLayoutError, so the engine does not start, for a layout L3 storage cannot shard."""
    args = scheduler.server_args
    if layout.role_of(getattr(args, "disaggregation_mode", None)) == "unified":
        return None
    runner = scheduler.tp_worker.model_runner
    kv_layout = layout.layout_of(args, runner.kv_cache_dtype, is_mla=bool(getattr(runner, "use_mla_backend", False)))
    layout.check_layout(kv_layout)
    return layout.scope_of(kv_layout)


def engine_identity_mode(server_args) -> str:
    """The identity mode this engine runs (`auto` resolved for its P/D role, `vradix.identity.resolve_mode`)."""
    return identity.resolve_mode(identity.mode_from_env(), getattr(server_args, "disaggregation_mode", None))


def tap_startup_load(original, model, weights, target_device, *args, **kwargs):
    """AROUND DefaultModelLoader.load_weights_only (startup, and `update_weights_from_disk` inside its update's own
    tap): in `fingerprint` mode the checkpoint tensors that reach the model's `load_weights` are recorded, so the
    engine's start proves its identity from what it loaded, the same on every TP layout (`vradix.core.published`)."""
    if not startup_taps(model):
        return original(model, weights, target_device, *args, **kwargs)
    rank, world = tp_rank_and_size()
    with published.tapping(model, rank, world, target_device):
        return original(model, weights, target_device, *args, **kwargs)


def startup_taps(model) -> bool:
    """Whether a load into `model` is recorded: in `fingerprint` mode, or inside an update that records already."""
    if published.of(model).tapping:
        return True
    try:
        from sglang.srt.runtime_context import get_server_args

        return engine_identity_mode(get_server_args()) == "fingerprint"
    except (AttributeError, RuntimeError, ValueError):  # no server args in this process: record (costs time only)
        return identity.mode_from_env() in ("fingerprint", "auto")


def startup_identity(scheduler, mode: str, nonces: identity.EngineNonces) -> identity.WeightIdentity:
    """The identity of the weights the engine started with: proven from the tensors it loaded, declared by an
    explicit `--weight-version` (not SGLang's default), or the engine's nonce of epoch 0 (`nonces`)."""
    if mode == "fingerprint":
        return published_identity(scheduler, nonces.for_epoch(0))
    label = current_label()
    if mode == "declared" and label is not None and identity.is_declaration(label):
        return identity.declared(label)
    return nonces.for_epoch(0)


def decode_host_staging(scheduler) -> bool:
    """Whether this P/D decode role receives (some) transfers into host memory first."""
    from sglang.srt.runtime_context import get_disagg

    return float(get_disagg().disaggregation_decode_host_receive_threshold) < 1


def ledger_blind_spots(scheduler) -> list[str]:
    """KV write paths the ledger does not observe in this engine: speculative drafts, external KV stores (the cache
    linker, LMCache), P/D decode's host-staged receiving, and HiCache only where its host pool cannot carry epochs
    (`host_ledger.unobservable_host_pool`). A P/D transfer is observed: prefill's KV is written by its own
    forwards, and decode stamps what it receives at the commit the handshake accepted (`hooks.pd`)."""
    spots = []
    if getattr(scheduler, "enable_hierarchical_cache", False):
        host_spot = host_ledger.unobservable_host_pool(scheduler.tree_cache)
        if host_spot:
            spots.append(host_spot)
    # these load device KV straight from an external store, outside the HiCache host pool
    if getattr(scheduler, "enable_unified_cache_external_linker", False):
        spots.append("the external cache linker")
    if getattr(scheduler, "enable_lmcache", False):
        spots.append("LMCache")
    # a P/D decode role that stages received KV in host memory copies it into device pages at its first batch,
    # outside both the forward and the commit that stamps received KV (`hooks.pd.stamp_received_kv`)
    mode = getattr(getattr(scheduler, "disaggregation_mode", None), "value", "null")
    if mode == "decode" and decode_host_staging(scheduler):
        spots.append("P/D decode host-staged receiving (--disaggregation-decode-host-receive-threshold < 1)")
    spec = getattr(scheduler, "spec_algorithm", None)
    if spec is not None and not getattr(spec, "is_none", lambda: True)():
        spots.append("speculative decoding")
    return spots
