"""The requests one scheduler holds, wherever SGLang keeps them: batches, the waiting queue, the chunked request,
HiSparse staging and the P/D roles' own queues. A publication treats every one of them (crossing or re-bound)."""
from __future__ import annotations


def live_requests(scheduler) -> set:
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
