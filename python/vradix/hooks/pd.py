"""P/D disaggregation hooks (scheduler process); the launcher-process refusals are in `hooks.pd_launcher`.

The weight-identity handshake (`vradix.pd.handshake`):
- prefill writes the identity of each request's KV into the metadata row that travels with its last chunk;
- decode commits the received KV only when that identity equals the one the decode request is bound to; otherwise the
  request fails with HTTP 503 naming both identities, and its KV is released without being inserted.
A publication on decode (`vradix.pd.revocation`): a transfer-queue request whose prefix promise prefill has not
fulfilled yet is revoked: it fails with HTTP 503 naming the publication and both identities.
Retraction backups (`vradix.core.retraction`) keep their pages' epochs across offload and restore.
Bad input: a decode-role request without usable bootstrap fields is refused where the decode scheduler receives it
(HTTP 400 naming the fields, `vradix.pd.bootstrap`), whatever frontend sent it (the launcher refuses it first).
"""
from __future__ import annotations

import logging

import torch

from vradix import request
from vradix.ledger import device as ledger
from vradix.core import retraction
from vradix.pd import bootstrap, handshake, layout, lost_restore, revocation
from vradix.scheduler.requests import answer_refused
from vradix.engine import state_of

logger = logging.getLogger("vradix")


def refuse_decode_request_without_bootstrap(original, scheduler, recv_req, *args, **kwargs):
    """AROUND Scheduler.handle_generate_request: on a decode role, a request whose bootstrap fields do not name its
    prefill peer is answered with HTTP 400 naming them (`bootstrap.check_decode_request`), before SGLang builds
    anything for it (building the peer's address from a missing host stops the engine). Other roles pass."""
    from sglang.srt.runtime_context import get_disagg

    if layout.role_of(getattr(getattr(scheduler, "disaggregation_mode", None), "value", None)) == "decode":
        try:
            bootstrap.check_decode_request(recv_req.bootstrap_host, recv_req.bootstrap_port, recv_req.bootstrap_room,
                                           get_disagg().disaggregation_transfer_backend)
        except bootstrap.MissingBootstrapError as e:
            answer_refused(scheduler, recv_req, str(e))
            return None
    return original(scheduler, recv_req, *args, **kwargs)


def send_prefill_identity(_result, buffers, req, *args, **kwargs):
    """AFTER MetadataBuffers.set_buf (prefill, last chunk): write the identity of the request's KV (the weight_ids
    of its provenance history over the prompt, and its adapter's content identity) into bytes 8..63 of its
    `bootstrap_room` row, which the transfer engine moves to decode with the KV. A request vradix never admitted
    writes nothing (decode then refuses it)."""
    st = request.of(req)
    if st is None or not st.kv_history:
        return
    import torch

    raw = handshake.encode(handshake.sent_weight_ids(st.kv_history, len(req.origin_input_ids)), st.adapter)
    row = buffers.bootstrap_room[req.metadata_buffer_index].view(torch.uint8)
    row[8:] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)


def check_prefill_identity(original, queue, decode_req, *args, **kwargs):
    """AROUND DecodeTransferQueue._commit_transfer_to_req (decode, the transfer succeeded): when prefill's identity
    differs from the one the decode request is bound to (its first provenance entry: the namespace decode matched
    and promised its prefix in, with the content identity of decode's adapter for a LoRA request), fail the request
    with HTTP 503 instead of committing; SGLang's own abort path then streams the error and releases the KV without
    inserting it. A metadata row whose room does not match is left to
    SGLang's own corruption check. An accepted handoff is recorded for the response's provenance (`pd_spans`)."""
    import torch
    from sglang.srt.disaggregation.utils import _is_fake_transfer, prepare_abort

    req = decode_req.req
    st = request.of(req)
    idx = decode_req.metadata_buffer_index
    row = queue.metadata_buffers.bootstrap_room[idx]
    if st is None or not st.kv_history or _is_fake_transfer(req) or int(row[0].item()) != int(req.bootstrap_room or 0):
        return original(queue, decode_req, *args, **kwargs)
    prefill = handshake.decode(row.view(torch.uint8)[8:].numpy().tobytes())
    error = handshake.mismatch(prefill, st.kv_history[0].weight_id, req.rid, st.adapter)
    if error is None:
        match = getattr(decode_req, "prefix_match", None)
        st.hand_off(match.decode_prefix_len if match is not None else 0, st.kv_history[0].weight_id)
        received = received_positions(req)
        result = original(queue, decode_req, *args, **kwargs)
        if req.finished_reason is None:
            stamp_received_kv(queue.tree_cache, req, st, received)
        return result
    logger.warning(error)
    prepare_abort(req, error, status_code=handshake.STATUS)
    decode_req.kv_receiver.clear()
    decode_req.kv_receiver = None


def received_positions(req) -> tuple[int, int]:
    """The positions of `req`'s row prefill wrote: from the prefix decode promised (`cache_protected_len`, its
    `decode_prefix_len`) to the length prefill computed (the prompt, or prompt plus outputs on a re-bootstrap),
    as `DecodePreallocQueue` sent them. Read before the commit, which appends the handoff token."""
    from sglang.srt.disaggregation.decode import DecodePreallocQueue

    return int(req.kv.cache_protected_len or 0), DecodePreallocQueue._rebootstrap_prefill_len(req)


def stamp_received_kv(tree_cache, req, st, received: tuple[int, int]) -> None:
    """At a committed transfer (the handshake verified prefill's identity equals the one `req` is bound to): its
    received positions were written under `req`'s bound epoch (the first provenance entry's, whose identity the
    handshake compared), so the ledger says so; the request's first prebuilt batch then checks its whole prompt KV
    once (`hooks.ledger.backstop_prebuilt_batch`). (Host-staged receiving, which lands the KV in device pages
    later, keeps the ledger off: `hooks.startup.ledger_blind_spots`.)"""
    state = state_of(tree_cache)
    if state is None or state.ledger is None:
        return
    start, end = received
    if end > start:
        slots = tree_cache.req_to_token_pool.req_to_token[req.kv.req_pool_idx, start:end]
        state.ledger.stamp_written(slots, st.kv_history[0].epoch)
    st.await_first_read()


def answer_decode_failures_with_their_cause(original, req, error_message, status_code=None, *args, **kwargs):
    """AROUND disaggregation.utils.prepare_abort: two decode failures SGLang answers with a generic 500 are
    transient, and answered 503 with their cause instead:
    - a request whose promise a publication revoked keeps the revocation's reason, whichever SGLang path finishes
      it (the failed-transfer path would otherwise replace it with "Decode transfer failed ... Aborted by AbortReq.");
    - a restore that came up short of its promise (`vradix.pd.lost_restore`) says that pages were lost.
    Every other abort is SGLang's."""
    st = request.of(req)
    if st is not None and st.revoked is not None:
        return original(req, st.revoked, status_code=revocation.STATUS)
    if lost_restore.is_lost_restore(error_message):
        return original(req, lost_restore.message(error_message), status_code=lost_restore.STATUS)
    return original(req, error_message, status_code, *args, **kwargs)


def restore_into_node_slots_only(original, cache, *args, req=None, **kwargs):
    """AROUND UnifiedRadixCache._load_back_transfers: on a P/D decode role, a restore from the host tier (L2, or L3
    via its prefetch) loads a prefix's cached recurrent state into its node's own slot only, never into the request's
    slot. That slot holds the live state prefill sent for the whole prompt; SGLang's load-back also copies the node's
    state there (the per-request CoW leg of `MambaComponent.build_hicache_transfers`), and decode's restore may run
    after the transfer landed, so the copy would overwrite it. Both tree cores read `req` only for that leg, so the
    restore builds its spec without it. Other roles (whose requests continue from the prefix state), and caches
    without a Mamba component, are SGLang's. The role is the one vradix stamps namespaces with (`Engine.scope`)."""
    state = state_of(cache)
    on_decode = state is not None and layout.role_of_scope(state.scope) == "decode"
    if req is not None and on_decode and cache.supports_mamba():
        req = None
    return original(cache, *args, req=req, **kwargs)


def keep_epochs_of_cpu_backup(req, req_to_token_pool, token_to_kv_pool_allocator, *args, **kwargs):
    """BEFORE Req.offload_kv_cache (P/D decode retraction, `cpu_tensor` backup): remember the ledger epoch of each
    position the backup copies, before the release frees its pages."""
    _keep_backup_epochs(ledger.ledger_of(token_to_kv_pool_allocator), req_to_token_pool.req_to_token, req)


def stamp_restored_cpu_backup(_result, req, req_to_token_pool, token_to_kv_pool_allocator, *args, **kwargs):
    """AFTER Req.load_kv_cache: the restored pages take the epochs their positions had at the backup."""
    _stamp_restored(ledger.ledger_of(token_to_kv_pool_allocator), req_to_token_pool.req_to_token, req)


def keep_epochs_of_host_backup(cache, req, *args, **kwargs):
    """BEFORE UnifiedRadixCache.backup_kv_cache (`host_pool` backup): as `keep_epochs_of_cpu_backup`."""
    state = state_of(cache)
    _keep_backup_epochs(state.ledger if state is not None else None, cache.req_to_token_pool.req_to_token, req)


def stamp_restored_host_backup(_result, cache, req, *args, **kwargs):
    """AFTER UnifiedRadixCache.restore_kv_cache: as `stamp_restored_cpu_backup`."""
    state = state_of(cache)
    _stamp_restored(state.ledger if state is not None else None, cache.req_to_token_pool.req_to_token, req)


def _keep_backup_epochs(page_ledger, req_to_token, req) -> None:
    st = request.of(req)
    if page_ledger is not None and st is not None and req.seqlen > 1:
        st.keep_backup_epochs(retraction.epochs_at_backup(page_ledger, req_to_token, req))


def _stamp_restored(page_ledger, req_to_token, req) -> None:
    st = request.of(req)
    if page_ledger is None or st is None or st.backup_epochs is None:
        return
    assert isinstance(st.backup_epochs, torch.Tensor), "kept by `_keep_backup_epochs` (`retraction.epochs_at_backup`)"
    retraction.stamp_restored(page_ledger, req_to_token, req, st.backup_epochs)
    st.forget_backup_epochs()
