"""Report hooks (data-path step 5, scheduler process): each finished request's provenance, on its way to the launcher
(`hooks.report` puts it in the response), and what /flush_cache and /get_server_info report."""
from __future__ import annotations

from vradix import __version__, collectives
from vradix.core import host_tier, mm_embeddings, provenance
from vradix.observability import metrics, server_info
from vradix.engine import state_of, state_of_scheduler
from vradix.core.state import treeless_of


def attach_provenance(original, acc, *args, **kwargs):
    """AROUND _GenerationStreamAccumulator.accept: add a finished request's provenance to the batch output."""
    req = kwargs.get("req", args[0] if args else None)
    emitted = len(acc.rids)
    result = original(acc, *args, **kwargs)
    if len(acc.rids) > emitted and req is not None and req.finished():
        info = provenance.response_provenance(req)
        if info is not None:
            # SGLang pads every existing column for each emitted request; ours holds one entry per request
            column = acc.customized_info.setdefault(provenance.PROVENANCE_KEY, [])
            column.extend([None] * (len(acc.rids) - len(column)))
            column[len(acc.rids) - 1] = info
    return result


def report_flush(result, wrapper, *args, **kwargs):
    """AFTER SchedulerFlushWrapper.handle: say what the flush did."""
    scheduler = getattr(wrapper._flush_cache, "__self__", None)
    state = state_of_scheduler(scheduler)
    if result is not None and result.success and state is not None and state.last is not None:
        result.message = state.last.summary()
    return result


def report_server_info(result, internal_state, *args, **kwargs):
    """AFTER InternalState.get_internal_state: a `vradix` block in /get_server_info."""
    scheduler = internal_state.scheduler
    cache = scheduler.tree_cache
    state = state_of(cache)
    treeless = treeless_of(cache) if state is None else None
    if treeless is not None:
        block = server_info.treeless_block(treeless)
        block["mm_embedding_cache"] = mm_embeddings.stats()
    elif state is None:
        block = {"active": False, "version": __version__, "reason": "radix cache disabled"}
    else:
        block = metrics.state_block(scheduler)
        block["chunked_prefill_in_progress"] = scheduler.chunked_req is not None
        block["pool"] = pool_accounting(scheduler)
        block["mm_embedding_cache"] = mm_embeddings.stats()
        gauges = metrics.metrics_of(scheduler)
        if gauges is not None:
            gauges.export(block)
    ranks = tp_rank_blocks(block) if getattr(scheduler, "tp_size", 1) > 1 else None
    if ranks is not None:
        block["tp_ranks"] = ranks
    result.internal_state["vradix"] = block
    return result


def tp_rank_blocks(block: dict):
    """Every TP rank's `vradix` block, in rank order, or None on a one-rank engine and with DP attention.

    SGLang answers /get_server_info from TP rank 0 only, yet each rank keeps its own epoch, identity, ledger and
    pools. Every rank of the TP group handles the same broadcast control requests in the same order, so all of them
    run this hook for one server-info request and the all-gather over the group's CPU (gloo) group cannot hang. With
    DP attention a control request may be broadcast within an attention-TP group only: no gather then."""
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()  # what SGLang's request receiver broadcasts control requests by
    if parallel.tp_size <= 1 or parallel.attn_dp_enabled:
        return None
    return collectives.gather(block, parallel.tp_group.cpu_group)


def req_slots_total(pool) -> int:
    """Every request slot of the pool: a P/D decode role's pool also holds `pre_alloc_size` slots for requests whose
    KV is pre-allocated before it arrives (`DecodeReqToTokenPool`)."""
    return pool.size + getattr(pool, "pre_alloc_size", 0)


def pool_accounting(scheduler) -> dict:
    """The terms of SGLang's idle memory check, read on the scheduler thread (one consistent snapshot).

    When `idle` is true, no request holds KV, so `available + evictable + protected == total` and
    `req_slots_free == req_slots_total` must hold exactly (clients use this as a strict leak check). With a HiCache
    host tier, `host` gives the host pool's terms (`host_tier.pool_figures`): right after a bump on an idle engine
    its `available == total`."""
    cache = scheduler.tree_cache
    return {
        "total": scheduler.max_total_num_tokens,
        "available": scheduler.token_to_kv_pool_allocator.available_size(),
        "evictable": cache.evictable_size(),
        "protected": cache.protected_size(),
        "req_slots_free": len(scheduler.req_to_token_pool.free_slots),
        "req_slots_total": req_slots_total(scheduler.req_to_token_pool),
        "waiting_requests": len(scheduler.waiting_queue),
        "running_requests": len(scheduler.running_batch.reqs),
        "paused": bool(scheduler._engine_paused),
        "idle": bool(scheduler.is_fully_idle()),
        "host": host_tier.pool_figures(cache),
    }
