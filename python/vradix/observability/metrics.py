"""Prometheus metrics `sglang:vradix_*`, with the scheduler collector's labels (only when SGLang runs with
`--enable-metrics`), following Prometheus' and SGLang's conventions:

* counters for monotonic totals (exported as `<name>_total`): publications, lock-aware flushes, stale tokens freed,
  guard violations, bounded requests, stale tokens bounded requests read, by staleness;
* gauges for levels: the epoch, the crossing requests and the stale tokens they pin, what the last invalidation freed;
* histograms in seconds: the epoch bump's duration, observed at every bump, and the pause a publication adds on
  the scheduler (draining in-flight batches + the bump step; server info's `last_publication_pause_ms`).

SGLang's `/metrics` is served by another process (Prometheus multiprocess mode), so a collector in the scheduler could
not answer a scrape. Instead the values are written when they change (`refresh`): at every bump and flush, when a
request that crossed a publication or read stale KV releases it, when a reclaim slice frees stale KV, and when the
guard records a violation; a scrape between two changes reads current values. Nothing is written per request in the
steady state.
"""
from __future__ import annotations

import weakref
from typing import Any, Optional

from vradix.engine import of_scheduler, state_of

#: gauge name suffix: (server-info key, documentation)
GAUGES = {
    "epoch": ("epoch", "vradix weight epoch (one bump per publication or lock-aware flush)."),
    "crossing_requests": ("crossing_requests", "Live requests holding KV computed under an older epoch."),
    "stale_tokens_pinned": ("stale_tokens_pinned", "Stale KV tokens still locked by crossing requests."),
    "stale_tokens_freed_last": ("stale_tokens_freed_last", "Stale KV tokens freed by the last invalidation."),
}
#: counter name (exported with `_total`): (where its cumulative value is in the server-info block, documentation)
COUNTERS = {
    "publications": (("publications",), "Weight publications seen by vradix."),
    "lock_aware_flushes": (("lock_aware_flushes",), "Flushes performed lock-aware (epoch bump, not a publication)."),
    "stale_tokens_freed": (("stale_tokens_freed_total",), "Stale KV tokens freed."),
    "guard_violations": (("kv_ledger", "violations_caught"),
                         "Requests the KV page ledger's guard found reading KV of other weights."),
    "bounded_requests": (("bounded_staleness", "bounded_requests"),
                         "Requests admitted with a staleness bound above 0."),
}
STALE_REUSED = ("stale_tokens_reused", "Prompt tokens bounded requests read from KV computed by older weights, by "
                                       "staleness (epochs between a request's admission and the KV it read).")
BUMP_SECONDS = ("epoch_bump_seconds", "Duration of an epoch bump (a publication's or a flush's), seconds.")
PAUSE_SECONDS = ("publication_pause_seconds", "The pause a publication adds on the scheduler: draining the in-flight "
                                              "batches and the bump step (not the weight load), seconds.")
#: bump durations are sub-millisecond to a few ms (docs/benchmarks.md); a drain waits for a forward
BUMP_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5, 10.0)


def lookup(block: dict, path: tuple) -> float:
    """The number at `path` in `block` (0 where a level is missing or empty)."""
    value: Any = block
    for key in path:
        value = (value or {}).get(key)
    return value or 0


class Metrics:
    """The scheduler's `sglang:vradix_*` series (multiprocess modes as SGLang's scheduler metrics: gauges
    'mostrecent'). Counters are driven from the engine state's cumulative values: `export` adds what each grew
    since the last export (`_exported`)."""

    def __init__(self, labels: dict):
        from prometheus_client import Counter, Gauge, Histogram

        self.labels = labels
        names = list(labels.keys())
        self.gauges = {key: Gauge(name=f"sglang:vradix_{name}", documentation=doc, labelnames=names,
                                  multiprocess_mode="mostrecent")
                       for name, (key, doc) in GAUGES.items()}
        self.counters = {name: Counter(name=f"sglang:vradix_{name}", documentation=doc, labelnames=names)
                         for name, (_, doc) in COUNTERS.items()}
        self.stale_reused = Counter(name=f"sglang:vradix_{STALE_REUSED[0]}", documentation=STALE_REUSED[1],
                                    labelnames=names + ["staleness"])
        self.bump_seconds = Histogram(name=f"sglang:vradix_{BUMP_SECONDS[0]}", documentation=BUMP_SECONDS[1],
                                      labelnames=names, buckets=BUMP_BUCKETS)
        self.pause_seconds = Histogram(name=f"sglang:vradix_{PAUSE_SECONDS[0]}", documentation=PAUSE_SECONDS[1],
                                       labelnames=names, buckets=BUMP_BUCKETS)
        self._exported: dict = {}

    def export(self, block: dict) -> None:
        for key, gauge in self.gauges.items():
            gauge.labels(**self.labels).set(block.get(key) or 0)
        for name, (path, _) in COUNTERS.items():
            self._advance(self.counters[name].labels(**self.labels), name, lookup(block, path))
        by_staleness = (block.get("bounded_staleness") or {}).get("stale_tokens_reused_by_staleness") or {}
        for staleness, tokens in by_staleness.items():
            self._advance(self.stale_reused.labels(**self.labels, staleness=str(staleness)),
                          ("stale_tokens_reused", str(staleness)), tokens)

    def observe_bump(self, seconds: float, pause_seconds: Optional[float] = None) -> None:
        self.bump_seconds.labels(**self.labels).observe(seconds)
        if pause_seconds is not None:
            self.pause_seconds.labels(**self.labels).observe(pause_seconds)

    def _advance(self, counter, key, value: float) -> None:
        """Add to `counter` what the cumulative `value` grew since the last export (never a negative step)."""
        step = value - self._exported.get(key, 0)
        if step > 0:
            counter.inc(step)
            self._exported[key] = value


def metrics_for(scheduler) -> Optional[Metrics]:
    """Create the series once per scheduler when SGLang's --enable-metrics collector exists."""
    collector = getattr(scheduler, "metrics_collector", None)
    try:
        from sglang.srt.runtime_context import get_observability

        enabled = get_observability().enable_metrics
    except Exception:  # noqa: BLE001 - no runtime context: no metrics
        enabled = False
    if not enabled or collector is None:
        return None
    return Metrics(dict(getattr(collector, "labels", {}) or {}))


#: the scheduler of this process whose series `refresh` writes (a scheduler process runs one scheduler)
_attached: Optional[weakref.ref] = None


def attach(scheduler) -> None:
    """Give `scheduler`'s engine its series (`metrics_for`; `Engine.metrics`)."""
    global _attached
    holder = of_scheduler(scheduler)
    assert holder is not None, "metrics for a scheduler vradix is not attached to"
    holder.use_metrics(metrics_for(scheduler))
    _attached = weakref.ref(scheduler)


def metrics_of(scheduler) -> Optional[Metrics]:
    """The series `attach` gave `scheduler`, or None (no --enable-metrics, or vradix is not versioning its cache)."""
    holder = of_scheduler(scheduler)
    return holder.metrics if holder is not None else None


def export_metrics(scheduler, bump_seconds: Optional[float] = None, pause_seconds: Optional[float] = None) -> None:
    """Write the current values (and, after a bump, its duration; after a publication, its pause) from the engine
    state."""
    series = metrics_of(scheduler)
    if series is None or state_of(scheduler.tree_cache) is None:
        return
    if bump_seconds is not None:
        series.observe_bump(bump_seconds, pause_seconds)
    series.export(state_block(scheduler))


def refresh() -> None:
    """`export_metrics` for this process's scheduler, from a step that sees only the cache (a release, a reclaim
    slice, a guard verdict): called where a value changed, never per request in the steady state."""
    scheduler = _attached() if _attached is not None else None
    if scheduler is not None:
        export_metrics(scheduler)


def state_block(scheduler) -> dict:
    from vradix.observability import server_info

    cache = scheduler.tree_cache
    state = state_of(cache)
    assert state is not None, "state_block is read only for a versioned cache"
    return server_info.engine_block(state, state.crossing.tokens_pinned(cache))
