"""Ledger hooks (scheduler process): the strict guard's backstop checks what an extend batch is about to read, and
the KV page ledger records the epoch of every page a forward writes."""
from __future__ import annotations

from http import HTTPStatus

from vradix.ledger import guard
from vradix.ledger.device import ledger_of
from vradix.engine import state_of


def hold_stash_until_verdict(original, scheduler, req, *args, **kwargs):
    """AROUND Scheduler.stash_chunked_request: the overlap loop checkpoints a chunk into the tree while it schedules
    the next batch, before the chunk's result (and its verdict) is processed. A complete verdict is read here (a
    violating request then inserts nothing); one the device has not finished is not waited for: the chunk is not
    inserted now (SGLang's own path for a request barred from the tree, which still advances its prefix), and the
    next checkpoint or the final insert inserts from where the tree's copy ends."""
    state = state_of(scheduler.tree_cache)
    verdicts = state.guard.verdicts if state is not None else None
    if not verdicts or not verdicts.awaits(req) or verdicts.read_if_ready(req):
        return original(scheduler, req, *args, **kwargs)
    state.guard.stats.checkpoints_held += 1
    barred = req.skip_radix_cache_insert
    req.skip_radix_cache_insert = True
    try:
        return original(scheduler, req, *args, **kwargs)
    finally:
        req.skip_radix_cache_insert = barred


def backstop_prebuilt_batch(_result, scheduler, batch, *args, **kwargs):
    """AFTER SchedulerDisaggregationDecodeMixin._verify_kv_checksums (P/D decode, strict guard): the prebuilt batch a
    transferred request enters decode through never runs a forward, so it is where its KV is first read: its whole
    committed KV, decode's own prefix and what prefill sent (stamped at the commit, `hooks.pd.stamp_received_kv`),
    must carry its bound epoch (`guard.allowed_epochs`). Each request is checked once, at its first prebuilt batch
    (a resumed retracted request is not re-checked), in one gather for the batch; a violating request fails the
    way SGLang fails a prebuilt request whose received KV is corrupt, and is dropped from the batch
    (`fail_prebuilt_reads`). With more than one rank it is only counted and logged."""
    state = state_of(scheduler.tree_cache)
    if state is None or state.ledger is None or state.guard.config.verify != "strict" or batch is None:
        return
    reads = guard.first_decode_reads(batch, state.epoch)
    if not reads:
        return
    r2t = scheduler.req_to_token_pool.req_to_token
    # read at once: the batch runs no forward, and failing a request means dropping it before it joins decode
    counts = guard.DeviceValues(guard.launch_prefix_check(state.ledger, state.guard.stats, r2t, reads)).read()
    bad = guard.reads_to_fail(state.ledger, state.guard.config, state.guard.stats, r2t, reads, counts, state.epoch)
    if bad:
        fail_prebuilt_reads(scheduler, batch, bad)


def fail_prebuilt_reads(scheduler, batch, bad) -> None:
    """Fail each (req, message) of a prebuilt batch through SGLang's decode-side abort: the error is streamed, its
    row and prefix lock are released without inserting anything (`checkpoint=False`), and it leaves the batch."""
    from sglang.srt.disaggregation.utils import prepare_abort
    from sglang.srt.mem_cache.common import release_kv_cache

    failed = {id(req) for req, _ in bad}
    for req, what in bad:
        req.skip_radix_cache_insert = True
        prepare_abort(req, what, status_code=HTTPStatus.INTERNAL_SERVER_ERROR)
        scheduler.output_streamer.stream_output([req], req.return_logprob)
        release_kv_cache(req, scheduler.tree_cache, checkpoint=False)
    batch.filter_batch(keep_indices=[i for i, r in enumerate(batch.reqs) if id(r) not in failed])


def fail_stale_reads(scheduler, req, message: str) -> None:
    """Fail `req` the way SGLang fails a request whose forward ran on KV that must not be used (an external KV load
    that did not land): the forward still runs, its output for `req` is discarded, `req` finishes with `message`,
    and nothing it computed reaches the tree (`skip_radix_cache_insert`, and a release without checkpoint). A
    request mid chunked prefill is torn down like a client abort, so its next chunk never runs."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    req.skip_radix_cache_insert = True
    req.discard_output_reason = FINISH_ABORT(message, HTTPStatus.INTERNAL_SERVER_ERROR)
    if getattr(scheduler, "chunked_req", None) is req:
        scheduler._pending_chunked_abort_req = req


# ---- allocator hooks: which pages are free -------------------------------------------------------------
def on_free_slots(allocator, free_index, *args, **kwargs):
    """BEFORE <allocator>.free: the slots' pages go back to the allocator."""
    ledger = ledger_of(allocator)
    if ledger is not None and free_index is not None:
        ledger.mark_freed_slots(free_index)


def on_free_pages(allocator, page_ids, *args, **kwargs):
    """BEFORE PagedTokenToKVPoolAllocator.free_page_ids."""
    ledger = ledger_of(allocator)
    if ledger is not None and page_ids is not None:
        ledger.mark_freed_pages(page_ids)


def on_clear(_result, allocator, *args, **kwargs):
    """AFTER <allocator>.clear: every page is free."""
    ledger = ledger_of(allocator)
    if ledger is not None:
        ledger.mark_all_free()
