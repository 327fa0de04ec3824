"""The KV page ledger and its backstop on a P/D decode role (received pages are stamped at commit with the
identity the handshake verified), at cache level on SGLang's real UnifiedRadixCache (both tree cores, page sizes 1
and 16), its real `DecodeTransferQueue._commit_transfer_to_req` (hooked), real `MetadataBuffers`, `DecodeRequest`,
`DecodePrefixMatch` and `FakeKVReceiver`, and the real `SchedulerDisaggregationDecodeMixin._verify_kv_checksums`
(hooked) over a real prebuilt `ScheduleBatch`.

Stand-ins: the decode scheduler is the fixture's `SchedulerView` plus the few attributes the commit and the prebuilt
check read (`kv_checksum_computer=None`, an output streamer that records what it streams); the transfer queue is
SGLang's class built without its constructor (which needs a transfer backend and a peer); prefill's KV write into
decode's pages is what mooncake does outside any decode forward, so nothing stamps it but the commit.
"""
import types

import pytest
import torch
from sglang.srt.disaggregation.base import KVPoll
from sglang.srt.disaggregation.decode import DecodeRequest, DecodeTransferQueue, SchedulerDisaggregationDecodeMixin
from sglang.srt.disaggregation.decode_hicache_mixin import DecodePrefixMatch
from sglang.srt.disaggregation.fake.conn import FakeKVReceiver
from sglang.srt.disaggregation.utils import MetadataBuffers
from sglang.srt.managers.schedule_batch import FINISH_ABORT, ScheduleBatch
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from vradix import request
from vradix.hooks.startup import ledger_blind_spots
from vradix.kernels import FREE
from vradix.pd import handshake
from vradix.testing.harness.cache_fixture import seq

PREFIX = seq(10, 32)  # decode's own cached prefix (a multiple of 16: a whole number of pages)
PROMPT = PREFIX + seq(200, 20)
ROOM = 7


@pytest.fixture
def env(env):
    """conftest's versioned cache (both tree cores, page sizes 1 and 16) as a decode role's: its tree holds a prefix
    decode computed under epoch 0, and a scheduler view that records what it streams."""
    fx, state = env
    fx.finish(fx.running(state, PREFIX + [1]))  # decode's cache holds the prefix, computed by decode under epoch 0
    sched = fx.scheduler_view()
    sched.kv_checksum_computer = None
    sched.streamed = []
    sched.output_streamer = types.SimpleNamespace(stream_output=lambda reqs, *a, **k: sched.streamed.extend(reqs))
    sched.batch_result_processor = types.SimpleNamespace(_maybe_update_reasoning_tokens=lambda *a, **k: None)
    return fx, state, sched


def cached_tokens(fx):
    return fx.cache.evictable_size() + fx.cache.protected_size()


def preallocated(fx, state):
    """A decode request as `DecodePreallocQueue` leaves it: bound, its prefix matched and locked in decode's tree,
    a row, and slots for the positions prefill will write ([prefix, prompt)), promised as `decode_prefix_len`."""
    req = fx.make_req(PROMPT)
    state.admit_or_raise(req)
    req.bootstrap_host, req.bootstrap_room = "10.0.0.2", ROOM
    hit = fx.admit(req)
    assert hit == len(PREFIX)
    n = len(PROMPT)
    locs = fx._alloc(hit, n - hit, fx.req_pool.req_to_token[req.kv.req_pool_idx])
    fx.req_pool.write((req.kv.req_pool_idx, slice(hit, n)), locs.to(torch.int32))
    req.kv.kv_allocated_len = req.kv.kv_committed_len = n
    return req


def transferred(fx, sched, req, prefill_weight_id: str):
    """The request's transfer as prefill completed it: its metadata row (room, first token, prefill's identity) and a
    receiver at Success; returns SGLang's transfer queue and `DecodeRequest`."""
    bufs = MetadataBuffers(4, hidden_size=8, hidden_states_dtype=torch.float32, max_sampling_mask_tokens=4)
    bufs.bootstrap_room[1, 0] = ROOM
    bufs.output_ids[1, 0] = 5
    raw = handshake.encode([prefill_weight_id], request.of(req).adapter)
    bufs.bootstrap_room[1].view(torch.uint8)[8:] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    receiver = FakeKVReceiver(mgr=None, bootstrap_addr="10.0.0.2:8998", bootstrap_room=ROOM)
    receiver.init(0)
    receiver.send_metadata([])
    assert receiver.poll() == KVPoll.Success
    match = DecodePrefixMatch(prefix_indices=torch.zeros(len(PREFIX), dtype=torch.int64), l2_host_hit_length=0,
                              l3_storage_hit_length=0, last_device_node=req.last_node)
    decode_req = DecodeRequest(req=req, kv_receiver=receiver, prefix_match=match, metadata_buffer_index=1)
    queue = DecodeTransferQueue.__new__(DecodeTransferQueue)
    queue.metadata_buffers, queue.scheduler, queue.tree_cache = bufs, sched, fx.cache
    queue.spec_algorithm = SpeculativeAlgorithm.NONE
    return queue, decode_req


def prebuilt(fx, reqs):
    """SGLang's prebuilt batch for `reqs`, as `_get_new_prebuilt_batch` builds it."""
    model_config = types.SimpleNamespace(vocab_size=1000, is_encoder_decoder=False, hf_text_config=None)
    batch = ScheduleBatch.init_new(reqs, fx.req_pool, fx.allocator, fx.cache, model_config, False,
                                   SpeculativeAlgorithm.NONE)
    for r in reqs:
        r.init_next_round_input(None)
        r.extend_end = r.kv.kv_committed_len
    batch.prepare_for_prebuilt()
    return batch


def row_epochs(fx, state, req, start, end):
    slots = fx.req_pool.req_to_token[req.kv.req_pool_idx, start:end].long()
    return set(state.ledger.page_epoch[slots // fx.page_size].tolist())


def test_a_received_transfer_is_stamped_at_commit_and_passes_its_first_prebuilt_check(env):
    """The handshake verified prefill's identity equals the one the request is bound to: the commit stamps the
    received positions with the request's epoch, and its prebuilt batch (where decode first reads its KV) checks the
    whole prompt once and keeps it. Before: the received pages stayed FREE in the ledger (and the ledger was off on
    P/D roles)."""
    fx, state, sched = env
    req = preallocated(fx, state)
    assert row_epochs(fx, state, req, len(PREFIX), len(PROMPT)) == {FREE}  # prefill's write is outside any forward
    queue, decode_req = transferred(fx, sched, req, state.weight_id)
    queue._commit_transfer_to_req(decode_req)
    assert req.finished_reason is None and list(req.output_ids) == [5]
    assert row_epochs(fx, state, req, 0, len(PROMPT)) == {state.epoch}
    batch = prebuilt(fx, [req])
    before = state.guard.stats.batches_verified
    SchedulerDisaggregationDecodeMixin._verify_kv_checksums(sched, batch)
    assert state.guard.stats.batches_verified == before + 1 and state.guard.stats.prefixes_verified >= 1
    assert batch.reqs == [req] and req.finished_reason is None and state.guard.stats.violations_caught == 0
    SchedulerDisaggregationDecodeMixin._verify_kv_checksums(sched, prebuilt(fx, [req]))  # a resumed request: once
    assert state.guard.stats.batches_verified == before + 1


@pytest.mark.parametrize("where", ["decode prefix, older epoch", "received, freed page"])
def test_stale_kv_in_front_of_a_decode_requests_first_read_fails_it_and_inserts_nothing(env, where):
    """After the commit, a page the request would read says other weights wrote it (one of decode's own prefix pages
    stamped with an older epoch), or it was freed: the prebuilt check fails the request with the backstop's error
    (vradix, epochs, count), streams it, releases its row without inserting anything, and drops it from the batch.
    Before: nothing checked decode's first read; the request decoded on that KV."""
    fx, state, sched = env
    req = preallocated(fx, state)
    queue, decode_req = transferred(fx, sched, req, state.weight_id)
    queue._commit_transfer_to_req(decode_req)
    pos = 3 if where.startswith("decode") else len(PREFIX) + 2
    slot = int(fx.req_pool.req_to_token[req.kv.req_pool_idx, pos])
    state.ledger.page_epoch[slot // fx.page_size] = -5 if where.startswith("decode") else FREE
    before = cached_tokens(fx)
    batch = prebuilt(fx, [req])
    SchedulerDisaggregationDecodeMixin._verify_kv_checksums(sched, batch)
    reason = req.finished_reason
    assert isinstance(reason, FINISH_ABORT), "decode ran on KV the ledger says other weights wrote"
    assert reason.message.startswith("vradix KV backstop") and "of 52 prefix KV positions" in reason.message
    assert ("[-5]" if where.startswith("decode") else "[-1]") in reason.message, reason.message
    assert batch.reqs == [] and sched.streamed == [req] and state.guard.stats.violations_caught == 1
    assert not req.kv.holds_kv and cached_tokens(fx) <= before, "the failed request inserted KV"


def test_a_refused_handshake_stamps_nothing_and_leaves_nothing_to_check(env):
    """Prefill's identity differs from the one the request is bound to: the commit is refused (503), the received
    positions stay FREE in the ledger and no prebuilt check is owed; the same flow with the verified identity (the
    control) stamps them. Before: neither was stamped (the control fails)."""
    fx, state, sched = env
    refused = preallocated(fx, state)
    queue, decode_req = transferred(fx, sched, refused, "sha256:" + "ab" * 32)
    queue._commit_transfer_to_req(decode_req)
    assert refused.finished_reason.status_code == 503 and decode_req.kv_receiver is None
    assert row_epochs(fx, state, refused, len(PREFIX), len(PROMPT)) == {FREE}
    assert not request.of(refused).pd_first_read_pending
    accepted = preallocated(fx, state)
    queue, decode_req = transferred(fx, sched, accepted, state.weight_id)
    queue._commit_transfer_to_req(decode_req)
    assert row_epochs(fx, state, accepted, len(PREFIX), len(PROMPT)) == {state.epoch}


def test_the_ledger_is_on_for_both_pd_roles_except_decode_host_staged_receiving(env):
    """Prefill's KV is written by its own forwards, decode's received KV is stamped at the commit: neither role is a
    ledger blind spot any more. A decode role that stages received KV in host memory (copied into device pages at
    its first batch, outside the commit) keeps it off. Before: both roles listed "P/D disaggregation"."""
    from sglang.srt import runtime_context

    fx, state, sched = env
    for mode in ("prefill", "decode"):
        sched.disaggregation_mode = types.SimpleNamespace(value=mode)
        assert ledger_blind_spots(sched) == []
    with runtime_context.get_disagg().override(disaggregation_decode_host_receive_threshold=0.5):
        assert ledger_blind_spots(sched) == [
            "P/D decode host-staged receiving (--disaggregation-decode-host-receive-threshold < 1)"]
