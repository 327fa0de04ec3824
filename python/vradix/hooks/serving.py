"""The serving hooks (scheduler process): the seven places every request and every forward batch pass through, each a
short adapter that finds the engine (`vradix.engine.Engine`, the `_vradix` attribute of the tree cache) once and makes
one call into it.

A plain request (no user key, salt, adapter, custom parameters or staleness bound, between publications) enters
four of them (`accept_generate`, `admit`, `before_match`, `release`); the other three run once per prefill pass or
forward batch (`prefill_pass`, `before_forward`, `at_result`). `test/test_engine.py` counts what they cost.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

from sglang.srt.disaggregation.utils import DisaggregationMode
from sglang.srt.managers.schedule_policy import IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD

from vradix import request
from vradix.core import dedup
from vradix.hooks import control, pd, reclaim
from vradix.hooks.ledger import fail_stale_reads
from vradix.observability import metrics

_NO_DISAGGREGATION = DisaggregationMode.NULL

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache


def accept_generate(original: Callable, scheduler: "Scheduler", recv_req: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND Scheduler.handle_generate_request: the scheduler's own refusals of a generate request, decided before
    SGLang builds anything of it: inside a bucketed update that holds generation here
    (`control.refuse_requests_inside_held_bucketed_update`), and, on a P/D role, a decode request without bootstrap
    fields (`pd.refuse_decode_request_without_bootstrap`). A scheduler with no P/D role whose engine has no publication
    open runs SGLang's handler after one look at each."""
    engine = getattr(scheduler.tree_cache, "_vradix", None)
    if engine is not None and engine.publication is None and scheduler.disaggregation_mode is _NO_DISAGGREGATION:
        return original(scheduler, recv_req, *args, **kwargs)

    def checked_for_bootstrap(s: "Scheduler", r: Any, *a: Any, **k: Any) -> Any:
        return pd.refuse_decode_request_without_bootstrap(original, s, r, *a, **k)

    return control.refuse_requests_inside_held_bucketed_update(checked_for_bootstrap, scheduler, recv_req,
                                                               *args, **kwargs)


def admit(scheduler: "Scheduler", req: "Req", *args: Any, **kwargs: Any) -> None:
    """BEFORE Scheduler._add_request_to_queue (every request SGLang queues, whatever path it came by, before its first
    match and before HiCache's storage prefetch reads its key): bind it to the current epoch (`Engine.admit`). A
    retracted request coming back to the queue is bound already and keeps its binding."""
    engine = getattr(scheduler.tree_cache, "_vradix", None)
    if engine is not None and getattr(req, request.ATTR, None) is None:
        engine.admit(req, scheduler)


def before_match(req: "Req", tree_cache: "UnifiedRadixCache", *args: Any, **kwargs: Any) -> None:
    """BEFORE mem_cache.common.match_kv_cache: a request holding no KV matches under the current epoch, and a stale
    streaming-session slot is released before it is lent (`Engine.before_match`)."""
    engine = getattr(tree_cache, "_vradix", None)
    if engine is not None:
        engine.before_match(req, tree_cache, kwargs.get("token_ids", args[0] if args else None))


def release(original: Callable, req: "Req", tree_cache: "UnifiedRadixCache", *args: Any, **kwargs: Any) -> Any:
    """AROUND mem_cache.common.release_kv_cache: a plain release is SGLang's alone (`Engine.release_is_plain`); a
    crossing or bounded request's goes through `hooks.reclaim.release_tracked` (stale KV it unlocked is freed)."""
    engine = getattr(tree_cache, "_vradix", None)
    if engine is None or engine.release_is_plain(req):
        return original(req, tree_cache, *args, **kwargs)
    return reclaim.release_tracked(engine, original, req, tree_cache, *args, **kwargs)


def prefill_pass(original: Callable, scheduler: "Scheduler", *args: Any, **kwargs: Any) -> Any:
    """AROUND Scheduler._get_new_batch_prefill_raw (one prefill admission pass): prefill dedup holds back a request
    whose uncached prefix a launched or admitted request is computing (`vradix.core.dedup`: the pass's pending set,
    SGLang's in-batch threshold deciding what sharing is worth a wait); the requests the pass admitted count their
    prefix hits (`Engine.count_prefix_hits`)."""
    engine = getattr(scheduler.tree_cache, "_vradix", None)
    if engine is None:
        return original(scheduler, *args, **kwargs)
    continuing = scheduler.chunked_req
    dedup_pass = engine.dedup.enabled and dedup.applies_to(scheduler.tree_cache)
    if dedup_pass:
        threshold = max(IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD, scheduler.page_size, 1)
        engine.dedup.start_pass(dedup.begin_pass(scheduler, threshold))
    try:
        result = original(scheduler, *args, **kwargs)
    finally:
        if dedup_pass:
            engine.dedup.end_pass()
    batch: Optional["ScheduleBatch"] = result[0] if isinstance(result, tuple) else result
    if batch is not None:
        engine.count_prefix_hits(batch.reqs, continuing)
    return result


def before_forward(scheduler: "Scheduler", batch: Optional["ScheduleBatch"], *args: Any, **kwargs: Any) -> None:
    """BEFORE Scheduler.run_batch: the backstop's check of what an extend batch reads is launched, then the ledger
    records the batch's writes under the current epoch (`Engine.before_forward`: once per batch, no device sync)."""
    engine = getattr(scheduler.tree_cache, "_vradix", None)
    if engine is not None:
        engine.before_forward(batch, scheduler.req_to_token_pool.req_to_token,
                              lambda req, what: fail_stale_reads(scheduler, req, what))


def at_result(scheduler: "Scheduler", batch: Optional["ScheduleBatch"], *args: Any, **kwargs: Any) -> None:
    """BEFORE Scheduler.process_batch_result: SGLang is about to wait for this batch's output, so the checks launched
    with it and before it are complete: read them, failing their violating requests before the result commits
    anything of them (`Engine.at_result`; normal and overlap loops alike)."""
    engine = getattr(scheduler.tree_cache, "_vradix", None)
    if engine is not None and engine.at_result(batch):
        metrics.export_metrics(scheduler)
