"""Forward hooks (scheduler process): the strict guard's backstop checks what an extend batch is about to read, and
the KV page ledger records the epoch of every page a forward writes."""
from __future__ import annotations

from http import HTTPStatus

from vradix import guard
from vradix.state import state_of


def backstop_extend_batch(scheduler, batch, *args, **kwargs):
    """BEFORE Scheduler.run_batch (strict guard): every cached KV position an extend batch's requests read must carry
    the epoch each request is bound to (or, crossing, its own KV's epochs): one gather over the batch
    (`guard.check_prefix_reads`). A violating request fails (`fail_stale_reads`); with more than one TP/PP rank the
    violation is only counted and logged, so every rank runs the same batch."""
    state = state_of(scheduler.tree_cache)
    if (state is None or state.ledger is None or state.guard.verify != "strict" or batch is None
            or not batch.forward_mode.is_extend() or getattr(batch, "split_index", 0)):
        return
    reads = guard.prefix_reads(batch, state.epoch)
    if not reads:
        return
    req_to_token = scheduler.req_to_token_pool.req_to_token
    for read, n in guard.check_prefix_reads(state.ledger, state.guard_stats, req_to_token, reads):
        what = guard.violation_message(state.ledger, req_to_token, read, n, state.epoch)
        guard.record_violation(state.guard_stats, what + ("; detected only (more than one TP/PP rank)"
                                                         if state.guard.detect_only else "; failing the request"))
        if not state.guard.detect_only:
            fail_stale_reads(scheduler, read.req, what)


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


def stamp_forward_batch(scheduler, batch, *args, **kwargs):
    """BEFORE Scheduler.run_batch: the pages this forward writes are written under the current epoch's weights
    (publications drain in-flight batches first, so no forward straddles a weight change)."""
    state = state_of(scheduler.tree_cache)
    if state is not None and state.ledger is not None and batch is not None:
        state.ledger.stamp_written(getattr(batch, "out_cache_loc", None), state.epoch)
