"""The server-info schema: the `vradix` block `/get_server_info` answers (and `/metrics` exports,
`vradix.observability.metrics`), built from the engine's records (`vradix.core.state`), which hold the values and
never their presentation."""
from __future__ import annotations

from typing import Optional

from vradix import __version__
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from vradix.engine import Engine
from vradix.core.state import TreelessState


def engine_block(state: Engine, pinned_tokens: int) -> dict:
    """The `vradix` block of server info on an engine with a versioned cache (plain JSON types)."""
    last = state.last
    return {
        "active": True,
        "version": __version__,
        "tree_core": state.tree_core,
        "epoch": state.epoch,
        "label": state.label,
        "weight_id": state.weight_id,
        "weight_identity": {"mode": state.identity_mode, "source": state.identities[state.epoch].identity.source},
        "l3_scope": state.scope,
        "publications": state.publications,
        "lock_aware_flushes": state.flushes,
        "crossing_requests": len(state.crossing),
        "stale_tokens_pinned": pinned_tokens,
        "stale_tokens_freed_total": state.freed.tokens_total,
        "stale_tokens_freed_at_release": state.freed.tokens_at_release,
        "stale_tokens_freed_last": last.tokens_freed if last else 0,
        "stale_tokens_pending": state.deferred.pending_tokens,
        "stale_reclaim": state.deferred.as_dict(),
        "stale_host_tokens_freed_total": state.freed.host_tokens_total,
        "stale_host_tokens_freed_last": last.host_tokens_freed if last else None,
        "last_publication_latency_ms": (round(state.last_publication.latency_ms, 3)
                                        if state.last_publication else None),
        "last_publication_pause_ms": publication_pause(state),
        "last_invalidation": last.summary() if last else None,
        "forged_keys_rejected": state.forged_keys_rejected,
        "session_slots_released": state.sessions.slots_released,
        "last_invalidation_detail": last.as_dict() if last else None,
        "last_publication": state.last_publication.as_dict() if state.last_publication else None,
        "lora_adapter_events": state.lora.events,
        "lora_stale_tokens_freed": state.lora.tokens_freed,
        "kv_ledger": ledger_block(state),
        "weight_session": state.bucketed.as_dict() if state.bucketed is not None else None,
        "prefill_dedup": state.dedup.stats.as_dict(state.dedup.enabled),
        "bounded_staleness": state.staleness.as_dict(),
        "stale_tokens_reused_total": state.staleness.stale_tokens_total,
    }


def publication_pause(state: Engine) -> Optional[dict]:
    """The pause the last publication added on the scheduler (ms): drain, bump and their sum; None before one."""
    p = state.last_publication
    if p is None:
        return None
    return {"drain_ms": round(p.drain_ms, 3), "bump_ms": round(p.bump_ms, 3), "total_ms": round(p.pause_ms, 3)}


def ledger_block(state: Engine) -> dict:
    """The KV page ledger's guard and audit counters."""
    g, st = state.guard.config, state.guard.stats
    return {
        "enabled": state.ledger is not None,
        "kernels": state.ledger.kernels.name if state.ledger is not None else None,
        "verify_mode": g.verify,
        "audit_mode": g.audit,
        "prefixes_verified": st.prefixes_verified,
        "verify_host_reads": st.verify_host_reads,
        "batches_verified": st.batches_verified,
        "verdicts_pending": len(state.guard.verdicts),
        "checkpoints_held": st.checkpoints_held,
        "violations_caught": st.violations_caught,
        "last_violation": st.last_violation or None,
        "audits": st.audits,
        "leaked_pages_total": st.leaked_pages_total,
        "leaked_pages_last": st.leaked_pages_last,
        "leaked_pages_repaired": st.leaked_pages_repaired,
    }


def treeless_block(treeless: TreelessState) -> dict:
    """The `vradix` block of server info on an engine without a radix cache."""
    return {"active": True, "version": __version__, "radix_cache": False,
            "versioned": ["multimodal embedding cache", "vision position-embedding grids"],
            "publications": treeless.publications, "last_invalidation_detail": treeless.last,
            "last_publication": treeless.last_publication, "weight_session_open": treeless.bucketed_open}
