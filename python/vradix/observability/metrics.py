"""Prometheus gauges `sglang:vradix_*` (bounded staleness too: `bounded_requests`, `stale_tokens_reused{staleness}`), refreshed from the engine state after every invalidation and on every
server-info read (only when SGLang runs with `--enable-metrics`)."""
from __future__ import annotations

from typing import Optional

from vradix.core.state import state_of

GAUGES = {
    # name suffix: (state.as_dict key, documentation)
    "epoch": ("epoch", "vradix weight epoch (one bump per publication or lock-aware flush)."),
    "publications": ("publications", "Weight publications seen by vradix."),
    "lock_aware_flushes": ("lock_aware_flushes", "Flushes performed lock-aware (epoch bump, not a publication)."),
    "crossing_requests": ("crossing_requests", "Live requests holding KV computed under an older epoch."),
    "stale_tokens_pinned": ("stale_tokens_pinned", "Stale KV tokens still locked by crossing requests."),
    "stale_tokens_freed_total": ("stale_tokens_freed_total", "Stale KV tokens freed since start."),
    "stale_tokens_freed_last": ("stale_tokens_freed_last", "Stale KV tokens freed by the last invalidation."),
    "last_publication_latency_ms": ("last_publication_latency_ms", "Latency of the last epoch bump (ms)."),
}

#: bounded staleness (`bounded_staleness` block): name suffix -> documentation; the per-staleness gauge carries a
#: `staleness` label (epochs between a request's admission and the oldest KV it read)
BOUNDED_REQUESTS = ("bounded_requests", "Requests admitted with a staleness bound above 0.")
STALE_REUSED = ("stale_tokens_reused", "Prompt tokens bounded requests read from KV computed by older weights, "
                                       "by staleness.")


class Metrics:
    """`sglang:vradix_*` gauges with the scheduler collector's labels (multiprocess mode 'mostrecent', like SGLang's
    scheduler gauges)."""

    def __init__(self, labels: dict):
        from prometheus_client import Gauge

        self.labels = labels
        self.gauges = {key: Gauge(name=f"sglang:vradix_{name}", documentation=doc, labelnames=list(labels.keys()),
                                  multiprocess_mode="mostrecent")
                       for name, (key, doc) in GAUGES.items()}
        names = list(labels.keys())
        self.bounded = Gauge(name=f"sglang:vradix_{BOUNDED_REQUESTS[0]}", documentation=BOUNDED_REQUESTS[1],
                             labelnames=names, multiprocess_mode="mostrecent")
        self.stale_reused = Gauge(name=f"sglang:vradix_{STALE_REUSED[0]}", documentation=STALE_REUSED[1],
                                  labelnames=names + ["staleness"], multiprocess_mode="mostrecent")

    def export(self, block: dict) -> None:
        for key, gauge in self.gauges.items():
            value = block.get(key)
            gauge.labels(**self.labels).set(0 if value is None else value)
        bounded = block.get("bounded_staleness") or {}
        self.bounded.labels(**self.labels).set(bounded.get("bounded_requests", 0))
        for staleness, tokens in (bounded.get("stale_tokens_reused_by_staleness") or {}).items():
            self.stale_reused.labels(**self.labels, staleness=str(staleness)).set(tokens)


def metrics_for(scheduler) -> Optional[Metrics]:
    """Create the gauges once per scheduler when SGLang's --enable-metrics collector exists."""
    collector = getattr(scheduler, "metrics_collector", None)
    try:
        from sglang.srt.runtime_context import get_observability

        enabled = get_observability().enable_metrics
    except Exception:  # noqa: BLE001 - no runtime context: no metrics
        enabled = False
    if not enabled or collector is None:
        return None
    return Metrics(dict(getattr(collector, "labels", {}) or {}))


def attach(scheduler) -> None:
    """Give `scheduler` its gauges (`metrics_for`). The handle is kept on the scheduler, apart from the engine's
    versioned-cache state: it is an output of that state, never part of it."""
    scheduler._vradix_metrics = metrics_for(scheduler)


def metrics_of(scheduler) -> Optional[Metrics]:
    """The gauges `attach` gave `scheduler`, or None (no --enable-metrics, or vradix is not versioning its cache)."""
    return getattr(scheduler, "_vradix_metrics", None)


def export_metrics(scheduler) -> None:
    """Refresh the gauges from the engine state (after every invalidation and on every server-info read)."""
    gauges = metrics_of(scheduler)
    if gauges is None or state_of(scheduler.tree_cache) is None:
        return
    gauges.export(state_block(scheduler))


def state_block(scheduler) -> dict:
    from vradix.core import epochs, reclaim

    cache = scheduler.tree_cache
    state = state_of(cache)
    return state.as_dict(reclaim.stale_tokens_pinned(cache, epochs.holder_nodes(state)))
