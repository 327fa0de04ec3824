"""P/D decode retraction with a KV backup, at cache level: SGLang's real UnifiedRadixCache (Rust
and Python TreeCores, page sizes 1/16), pools and `DecodePreallocQueue`, driven through SGLang's own calls in the
scheduler's order: `release_req` (backup, release, evict), `DecodePreallocQueue.add(is_retracted=True)`, a
publication (`bump_scheduler`), `resume_retracted_reqs` (new row, backup restored, no re-match), decode steps, and the
finish's `release_kv_cache(checkpoint=True)`.

Contract (`vradix.core.retraction`): a request whose backed-up KV was computed, even partly, under an older epoch keeps
that KV to finish, is never re-bound, and inserts it into no namespace, so no later match (the length decode promises
prefill) reaches it."""
import contextlib
from array import array

import pytest
import torch

from sglang.srt.managers.schedule_batch import release_req
from sglang.srt.mem_cache import common
from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

from vradix import request
from vradix.scheduler.publication import bump_scheduler
from vradix.pd import layout
from vradix.engine import attach
from vradix.testing.harness.cache_fixture import build_cache, seq
from vradix.testing.harness.decode_queue import DECODE_SERVER_ARGS, decode_scheduler

CONFIGS = [("rust", 1), ("rust", 16), ("python", 1), ("python", 16)]


@pytest.fixture(params=CONFIGS, ids=[f"{c}-ps{p}" for c, p in CONFIGS])
def env(request):
    core, ps = request.param
    fx = build_cache(core, ps, kv_tokens=1024, **DECODE_SERVER_ARGS)
    # a P/D role: role-local namespaces, with the KV page ledger (on for P/D roles: `hooks.startup.ledger_blind_spots`)
    state = attach(fx.cache, scope=layout.scope_of(layout.KvLayout("decode", 1, 1, ps, "bfloat16")))
    yield fx, state
    set_global_server_args_for_scheduler(ServerArgs(model_path="dummy"))  # later tests see a non-P/D process


def new_req(fx, state, tokens):
    req = fx.make_req(tokens)
    state.admit_or_raise(req)
    return req


def decoding(fx, state, prompt, outputs):
    """A decode request: its prefix matched and locked, the rest of its prompt received (no checkpoint, as on
    decode), then `outputs` decoded."""
    req = new_req(fx, state, prompt)
    fx.admit(req)
    fx.prefill(req, checkpoint=False)
    for t in outputs:
        fx.decode(req, t)
    return req


def write_kv(fx, req):
    """Distinct values in the request's KV slots (what its forwards computed); returns them."""
    kv = fx.allocator.get_kvcache()
    slots = fx.req_pool.req_to_token[req.kv.req_pool_idx, : req.seqlen - 1].long()
    values = torch.randn(len(slots), *kv.k_buffer[0].shape[1:]).to(kv.k_buffer[0].dtype)
    kv.k_buffer[0][slots] = values
    return values


def row_kv(fx, req):
    slots = fx.req_pool.req_to_token[req.kv.req_pool_idx, : req.seqlen - 1].long()
    return fx.allocator.get_kvcache().k_buffer[0][slots]


def retract(fx, sched, req):
    """What `ScheduleBatch.retract_decode` and the decode event loop do: `release_req` (the backup, then the release)
    and queue it for resumption."""
    assert release_req(req=req, remaing_req_count=1, req_to_token_pool=fx.req_pool,
                       token_to_kv_pool_allocator=fx.allocator, tree_cache=fx.cache, hisparse_coordinator=None)
    assert req.kv.retraction_backup is not None and not req.kv.holds_kv and req.lock is None
    sched.running.remove(req)
    sched.disagg_decode_prealloc_queue.add(req, is_retracted=True)


def resume(fx, sched, req):
    assert sched.disagg_decode_prealloc_queue.resume_retracted_reqs() == [req]
    assert req.kv.holds_kv and req.kv.retraction_backup is None and req.prefix_len == 0  # restored, no re-match
    sched.running.append(req)


def finish(fx, sched, req):
    sched.running.remove(req)
    fx.finish(req)


def probe(fx, state, tokens) -> int:
    """The prefix a new request for `tokens` matches now (the length decode would promise prefill)."""
    req = new_req(fx, state, tokens)
    common.match_kv_cache(req, fx.cache, req.origin_input_ids, max_prefix_len=len(tokens) - 1)  # locks nothing
    return req.prefix_len


def tree_hit(fx, tokens, extra_key) -> int:
    """The device prefix of `tokens` the tree holds under `extra_key` (a namespace no request can be bound to any
    more, read through the tree's own match)."""
    key = RadixKey(array("q", tokens), extra_key=extra_key)
    return fx.cache.match_prefix(MatchPrefixParams(key=key)).device_prefix_len


def nothing_cached(fx) -> bool:
    cache = fx.cache
    return cache.evictable_size() == 0 and cache.protected_size() == 0 and fx.allocator.available_size() == fx.total


def restored_epochs(state, fx, req) -> set:
    """The ledger epochs of the request's backed-up positions [0, seqlen - 1) in its (new) row."""
    slots = fx.req_pool.req_to_token[req.kv.req_pool_idx, : req.seqlen - 1].long()
    return set(state.ledger.page_epoch[slots // fx.page_size].tolist())


def test_a_restored_backup_keeps_its_epochs_in_the_ledger(env):
    """A restore writes the backup into new device pages without a forward (`Req.load_kv_cache`): the ledger carries
    the epochs the positions had at the backup, so the request's KV is not FREE (or another request's epoch) to the
    backstop and the audit. Before the carry, the restored pages stayed FREE."""
    fx, state = env
    r = decoding(fx, state, seq(100, 40) + [1], outputs=[5, 6])
    sched = decode_scheduler(fx, running=[r])
    assert restored_epochs(state, fx, r) == {0}
    retract(fx, sched, r)
    resume(fx, sched, r)
    assert restored_epochs(state, fx, r) == {0}
    assert request.of(r).backup_epochs is None
    finish(fx, sched, r)
    assert fx.idle_invariant_holds()


def test_a_request_retracted_before_a_publication_resumes_crossing_and_never_inserts(env):
    fx, state = env
    P = seq(100, 48)
    r = decoding(fx, state, P + [1], outputs=[5, 6, 7])
    sched = decode_scheduler(fx, running=[r])
    values = write_kv(fx, r)
    retract(fx, sched, r)
    kept = r.seqlen - 1
    inv = bump_scheduler(sched, reason="test publication", label="B")
    resume(fx, sched, r)
    assert torch.equal(row_kv(fx, r), values)  # it continues from its own (old-weights) KV
    fx.decode(r, 8)
    fx.decode(r, 9)
    finish(fx, sched, r)
    # the outcome first: its old-weights KV is promised under the new weights by no match, in no namespace
    assert probe(fx, state, P + [1, 5, 6, 7, 8, 9]) == 0
    assert nothing_cached(fx)
    st = request.of(r)
    assert inv.requeued_rebound == 0 and st.epoch == 0  # never re-bound as if it held nothing
    assert st.crossed and r.skip_radix_cache_insert
    assert [(s, e) for s, e, *_ in st.kv_history] == [(0, 0), (kept, 1)]  # the backup's positions are epoch 0's


def test_a_crossing_request_retracted_after_a_publication_stays_crossing(env):
    fx, state = env
    P = seq(300, 48)
    r = decoding(fx, state, P + [1], outputs=[5, 6])
    sched = decode_scheduler(fx, running=[r])
    bump_scheduler(sched, reason="test publication", label="B")
    fx.decode(r, 7)  # computed under the new weights: r's KV is now mixed
    retract(fx, sched, r)
    resume(fx, sched, r)
    fx.decode(r, 8)
    finish(fx, sched, r)
    tokens = P + [1, 5, 6, 7, 8]
    assert tree_hit(fx, tokens, r.extra_key) == 0  # the mixed KV is not in the old namespace...
    assert probe(fx, state, tokens) == 0  # ...nor in the new one
    assert nothing_cached(fx)
    st = request.of(r)
    assert st.crossed and r.skip_radix_cache_insert and st.epoch == 0  # the retraction kept the crossing mark


def test_a_retracted_request_without_a_publication_inserts_and_is_shared(env):
    """No over-blocking: with no publication in between, the resumed request's KV is its epoch's and is cached."""
    fx, state = env
    P = seq(500, 48)
    r = decoding(fx, state, P + [1], outputs=[5, 6])
    sched = decode_scheduler(fx, running=[r])
    retract(fx, sched, r)
    resume(fx, sched, r)
    assert not request.of(r).crossed and not r.skip_radix_cache_insert
    fx.decode(r, 7)
    finish(fx, sched, r)
    tokens = P + [1, 5, 6, 7]
    assert probe(fx, state, tokens) == (len(tokens) - 1) // fx.page_size * fx.page_size


def test_a_host_staged_request_is_rebound_like_any_request_that_holds_nothing(env):
    """SGLang also keeps a host-staged request's transfer destination in `retraction_backup` (`_pre_alloc_host`). It
    holds no KV of its own yet (the handshake checks what prefill writes there), so a publication re-binds it."""
    from sglang.srt.mem_cache.common import RetractionBackup

    fx, state = env
    staged = new_req(fx, state, seq(700, 16))
    staged.kv.retraction_backup = RetractionBackup(host_indices=torch.arange(16))  # what _pre_alloc_host records
    inv = bump_scheduler(decode_scheduler(fx, waiting=[staged]), reason="test publication", label="B")
    st = request.of(staged)
    assert inv.requeued_rebound == 1 and st.epoch == 1 and not st.crossed


@contextlib.contextmanager
def host_pool_decode(core: str):
    """A decode role's HiCache cache whose retraction backups go to the host pool (`host_pool`), with vradix attached
    in the decode scope: `(fixture, state)`; the server args are restored on exit."""
    from vradix.testing.harness.hicache_fixture import build_hicache

    fx = build_hicache(core, 1, kv_tokens=256)
    set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", page_size=1, hicache_io_backend="direct",
                                                    hicache_mem_layout="layer_first",
                                                    **{**DECODE_SERVER_ARGS,
                                                       "disaggregation_decode_retraction_backup": "host_pool"}))
    try:
        yield fx, attach(fx.cache, scope=layout.scope_of(layout.KvLayout("decode", 1, 1, 1, "float32")))
    finally:
        set_global_server_args_for_scheduler(ServerArgs(model_path="dummy"))


@pytest.mark.parametrize("core", ["rust", "python"])
def test_a_host_pool_backup_survives_the_publication_and_restores_the_requests_own_kv(core):
    """The `host_pool` backend backs a retracted request up into the HiCache host pool, which the tree's reset also
    clears: the publication must not take the reset fast path while a request holds a host backup, or a later host
    write reuses the backup's slots and the request resumes from another request's KV."""
    with host_pool_decode(core) as (fx, state):
        fx.kv_code = lambda req, pos: 1000 * (int(req.rid[1:]) + 1) + pos  # each request's KV is its own
        r = decoding(fx, state, seq(100, 24), outputs=[5, 6, 7])
        sched = decode_scheduler(fx, running=[r])
        own = fx.device_codes(fx.req_pool.req_to_token[r.kv.req_pool_idx, : r.seqlen - 1].tolist())
        retract(fx, sched, r)
        backup = r.kv.retraction_backup.host_indices.tolist()
        bump_scheduler(sched, reason="test publication", label="B")
        other = new_req(fx, state, seq(400, 60))  # under B: its KV is written through to the host pool
        fx.admit(other)
        fx.prefill(other)
        fx.process_acks()
        resume(fx, sched, r)
        assert fx.device_codes(fx.req_pool.req_to_token[r.kv.req_pool_idx, : r.seqlen - 1].tolist()) == own
        assert not set(backup) & set(fx.host_used_slots())  # the restore gave the backup's host slots back
        assert request.of(r).crossed
        assert restored_epochs(state, fx, r) == {0}  # the restored pages keep the epoch that wrote them


@pytest.mark.parametrize("core", ["rust", "python"])
def test_a_restored_host_pool_backup_keeps_its_epochs_in_the_ledger(core):
    """The `host_pool` restore (`UnifiedRadixCache.restore_kv_cache`) writes the backup into new device pages without
    a forward: they take the epochs the positions had at the backup. Before the carry, they read FREE."""
    with host_pool_decode(core) as (fx, state):
        r = decoding(fx, state, seq(100, 24), outputs=[5, 6, 7])
        sched = decode_scheduler(fx, running=[r])
        assert restored_epochs(state, fx, r) == {0}
        retract(fx, sched, r)
        resume(fx, sched, r)
        assert restored_epochs(state, fx, r) == {0}
