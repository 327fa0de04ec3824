"""Revoking decode's unfulfilled prefix promises at a publication on decode (`must_revoke` and `message` are pure;
`revoke_unfulfilled` applies them to a scheduler's transfer queue).

A P/D decode request promises prefill a prefix (`decode_prefix_len`): the first tokens of its prompt are already in
decode's own cache, under the identity the request is bound to, so prefill sends only the rest. SGLang makes that
promise in one step (`DecodePreallocQueue.pop_preallocated`: match, pre-allocate, `send_metadata`) and the request
then waits in `DecodeTransferQueue` until its receiver reports `KVPoll.Success`. Decode never sees a transfer begin:
prefill writes into decode's pages and reports once, after its last chunk. So at a publication on decode the only
line decode can draw is between a promise prefill has *fulfilled* (the receiver concluded `Success`) and one it has
*not* (the receiver is still `Bootstrapping` or `WaitingForInput`).

Invariants:
- a promise is revoked at a publication exactly when it is unfulfilled, promised a non-empty prefix of decode's cache
  (`decode_prefix_len > 0`: a request that promised nothing holds no KV of the old identity; the handshake alone
  decides it), is not already finished, does not belong to SGLang's fake transfer (warmup, health checks: no
  prefill), and was made under a `weight_id` other than the one just published;
- a revoked request fails with HTTP 503 (retryable) and `message`, which names the publication and both identities;
  nothing of it is inserted into decode's tree (it crosses the bump, then SGLang's failed-transfer path releases it
  with `checkpoint=False`);
- a fulfilled promise (KV received, waiting for its commit or its HiCache restore) crosses the publication.
"""
from __future__ import annotations

import logging
from http import HTTPStatus

from vradix import request

logger = logging.getLogger("vradix")

#: a revocation is transient (the request meets a publication in flight): retry
STATUS = HTTPStatus.SERVICE_UNAVAILABLE

#: receiver states (`KVPoll` values) in which prefill has not yet reported the request's KV sent
UNFULFILLED_POLLS = frozenset({1, 2})  # KVPoll.Bootstrapping, KVPoll.WaitingForInput


def must_revoke(poll: int, promised_len: int, *, finished: bool, fake: bool, promised_under: str,
                published: str) -> bool:
    """Whether a decode transfer-queue request's promise is revoked by the publication of `published` (see the
    module invariants). `poll` is the receiver's state, reduced across the attention TP group as SGLang does."""
    return (int(poll) in UNFULFILLED_POLLS and promised_len > 0 and not finished and not fake
            and promised_under != published)


def message(rid: str, promised_len: int, promised_under: str, published: str, epoch: int) -> str:
    return (f"vradix P/D promise revoked for request {rid}: decode promised prefill the first {promised_len} prompt "
            f"tokens from its cache under weight_id {promised_under!r}, but a publication on decode (epoch {epoch}) "
            f"installed weight_id {published!r} before prefill finished sending the rest. Nothing was cached; retry: "
            f"the retry is matched and promised under the new weights.")


def revoke_unfulfilled(queue, published_id: str, epoch: int) -> int:
    """At a publication on a P/D decode role, right after the bump to `epoch` (every transfer-queue request already
    crosses it): revoke each unfulfilled prefix promise of the role's transfer queue (`queue`, SGLang's
    `DecodeTransferQueue`; `must_revoke`). Returns how many were revoked.

    A revoked request is failed the way SGLang's own `/abort_request` fails a transfer-queue request: its receiver is
    aborted, which tells prefill (an abort notification, so prefill stops and drops the request) and marks its room
    Failed. The next `DecodeTransferQueue.pop_transferred` then streams the error and releases the request's prefix
    lock and preallocated row with `checkpoint=False` (nothing inserted), after prefill acknowledged the abort when
    it may still be writing (SGLang's deferred release); `answer_decode_failures_with_their_cause` keeps the 503 on
    that path. A request staged to host memory keeps its receiver, as SGLang's abort does, until prefill stops
    writing. The receivers' states are reduced over the attention TP group (MIN), as `pop_transferred` reduces them,
    so every rank revokes the same requests."""
    entries = [d for d in queue.queue if d.kv_receiver is not None]
    if not entries:
        return 0
    import torch.distributed as dist
    from sglang.srt.disaggregation.utils import all_reduce_flags

    polls = [int(d.kv_receiver.poll()) for d in entries]
    if queue.gloo_group is not None:
        polls = all_reduce_flags(polls, queue.gloo_group, dist.ReduceOp.MIN)
    return sum(revoke_one(decode_req, poll, published_id, epoch) for decode_req, poll in zip(entries, polls))


def revoke_one(decode_req, poll: int, published_id: str, epoch: int) -> bool:
    """Revoke one transfer-queue request's promise when `must_revoke` says so; returns whether it was revoked."""
    from sglang.srt.disaggregation.utils import _is_fake_transfer, prepare_abort

    req, st = decode_req.req, request.of(decode_req.req)
    if st is None or not st.kv_history:
        return False
    promised = decode_req.prefix_match.decode_prefix_len if decode_req.prefix_match is not None else 0
    under = st.kv_history[0].weight_id
    if not must_revoke(poll, promised, finished=req.finished_reason is not None, fake=_is_fake_transfer(req),
                       promised_under=under, published=published_id):
        return False
    st.revoke(message(req.rid, promised, under, published_id, epoch))
    logger.warning(st.revoked)
    prepare_abort(req, st.revoked, status_code=STATUS)
    if not decode_req.host_staged:
        decode_req.kv_receiver.abort()
    return True
