"""Revoking decode's unfulfilled prefix promises at a publication on decode (pure).

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

from http import HTTPStatus

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
