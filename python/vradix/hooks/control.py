"""Control hooks (scheduler process): control requests that would change what later responses are computed from
without a publication are refused per call, and the refusal says what to do instead.

- `/continue_generation` while a bucketed update is open: its buckets are live in the model as soon as each
  returns, but the epoch bumps only at `end_weight_update`, so a request resumed inside the bucketed update would
  compute on partly written weights and reuse the old epoch's KV under it. The launcher refuses it with HTTP 400
  (`launcher.refuse_continue_inside_bucketed_update`); this is the scheduler's own check for callers that bypass that
  TokenizerManager (a multi-tokenizer worker): generation stays paused until the bucketed update ends.
- a generate or embedding request reaching a scheduler whose bucketed update holds generation itself (the launcher's
  hold did not pause it, `scheduler.publication.Publication.hold_generation`) is answered with HTTP 400 naming
  end_weight_update, never held: held, it would keep its TokenizerManager's next call of the bucketed update waiting
  forever.
- an RPC (`Engine.collective_rpc`, `RpcReqInput`) calls any scheduler method by name, so it could flush, load, relabel
  or write weights around every hook; only methods that change no served state run.
"""
from __future__ import annotations

import logging

from vradix.engine import state_of_scheduler

from vradix.core.state import treeless_of
from vradix.scheduler.publication import opened
from vradix.scheduler.requests import answer_refused

logger = logging.getLogger("vradix")

#: scheduler methods an RPC may call: each reads the served weights or state and changes nothing a response reads
READ_ONLY_RPC_METHODS = ("save_remote_model", "save_sharded_model")

CONTINUE_INSIDE_BUCKETED_UPDATE = (
    "vradix refused continue_generation: a bucketed update is open, its buckets are already in the model and "
    "the publication happens at end_weight_update. Call end_weight_update first (it resumes generation when its "
    "begin paused it), or continue_generation after it")


def bucketed_update_open(scheduler) -> bool:
    """Whether a bucketed update (`begin_weight_update ... end_weight_update`) is open on the scheduler's engine."""
    state = state_of_scheduler(scheduler)
    if state is not None:
        return state.bucketed is not None
    treeless = treeless_of(scheduler.tree_cache)
    return treeless is not None and treeless.bucketed_open


def refuse_continue_inside_bucketed_update(original, scheduler, recv_req, *args, **kwargs):
    """AROUND Scheduler.continue_generation: inside an open bucketed update generation stays paused (nothing resumes
    on half-published weights) and the bucketed update takes the hold over (`Publication.hold_generation`): the
    requests the caller now sends are refused, and generation resumes at its end, as the continue asked. Outside a
    bucketed update, SGLang's continue runs unchanged. (SGLang sends no reply to a continue.)"""
    if bucketed_update_open(scheduler):
        logger.error(CONTINUE_INSIDE_BUCKETED_UPDATE)
        pub = opened(scheduler)
        if pub is not None:
            pub.hold_generation(take_over=True)
        return None
    return original(scheduler, recv_req, *args, **kwargs)


REQUEST_INSIDE_BUCKETED_UPDATE = (
    "vradix refused the request: a bucketed update is open, its buckets are already in the model and "
    "generation is held until end_weight_update publishes them. Send it again after end_weight_update")


def refuse_requests_inside_held_bucketed_update(original, scheduler, recv_req, *args, **kwargs):
    """AROUND Scheduler.handle_generate_request / handle_embedding_request: while a bucketed update holds
    generation in this scheduler (`Publication.refuses_requests`), a request is answered with HTTP 400 naming
    end_weight_update and nothing of it is built; otherwise SGLang's handler runs unchanged."""
    pub = opened(scheduler)
    if pub is not None and pub.refuses_requests:
        answer_refused(scheduler, recv_req, REQUEST_INSIDE_BUCKETED_UPDATE)
        return None
    return original(scheduler, recv_req, *args, **kwargs)


def refuse_state_changing_rpc(original, scheduler, recv_req, *args, **kwargs):
    """AROUND Scheduler.handle_rpc_request: an RPC to a method outside `READ_ONLY_RPC_METHODS` fails with a message
    naming the method and the endpoints that do the same under vradix's publication rules; nothing is called."""
    from sglang.srt.managers.io_struct import RpcReqOutput

    if recv_req.method in READ_ONLY_RPC_METHODS:
        return original(scheduler, recv_req, *args, **kwargs)
    message = (f"vradix refused rpc {recv_req.method!r}: an RPC may only call {', '.join(READ_ONLY_RPC_METHODS)}; "
               "a method called by name bypasses the publication every change of weights, labels or cache goes "
               "through. Use the engine's own endpoint instead (update_weights_*, update_weight_version, "
               "flush_cache, load_lora_adapter, ...), or VRADIX_DISABLE=1 for stock behaviour")
    logger.error(message)
    return RpcReqOutput(success=False, message=message)
