"""Cache-level contract tests against SGLang's real UnifiedRadixCache (Rust and Python TreeCores, page sizes 1/16),
real allocators and ReqToTokenPool on CPU, driven through the scheduler's own mem_cache functions with the vradix
hooks installed by `load_plugins()`."""
import pytest
import torch

from vradix import identity
from vradix.identity import ReservedNamespaceError
from vradix.testing.harness.cache_fixture import seq
from vradix.testing.harness.cache_steps import bump, check, new_req, run_to_end


def test_stale_prefix_misses_after_bump_and_is_cached_again(env):
    fx, state = env
    P = seq(10, 64)
    assert run_to_end(fx, state, P + [1]) == 0
    assert run_to_end(fx, state, P + [2]) == 64  # shared within the epoch
    check(fx)
    inv = bump(fx, state)
    assert inv.tokens_freed > 0 and fx.cache.evictable_size() == 0
    assert fx.allocator.available_size() == fx.total  # unlocked stale KV freed at the bump, in bulk
    assert run_to_end(fx, state, P + [3]) == 0  # no stale reuse
    assert run_to_end(fx, state, P + [4]) == 64  # new epoch caches again
    check(fx)


def test_queued_request_is_rebound_before_prefill(env):
    fx, state = env
    P = seq(100, 32)
    holder = new_req(fx, state, P + [7])
    fx.admit(holder)
    fx.prefill(holder)  # running; its prompt is in the tree, locked
    queued = new_req(fx, state, P + [8])  # admitted under epoch 0, holds nothing
    assert state.epoch_of(queued.extra_key) == 0
    inv = bump(fx, state, live=[holder], queued=[queued])
    assert inv.requeued_rebound == 1 and state.epoch_of(queued.extra_key) == 1
    # the stale prompt is still in the tree (pinned by the crossing holder) but the queued request cannot match it
    assert fx.cache.protected_size() >= 32
    assert fx.admit(queued) == 0
    fx.prefill(queued)
    check(fx, [holder, queued])
    fx.finish(queued)
    fx.finish(holder)
    check(fx)


def test_lazy_rebind_at_match_covers_requests_the_bump_did_not_see(env):
    fx, state = env
    P = seq(300, 32)
    holder = new_req(fx, state, P + [1])
    fx.admit(holder)
    fx.prefill(holder)
    elsewhere = new_req(fx, state, P + [2])  # e.g. in a queue the bump does not walk
    bump(fx, state, live=[holder], queued=[])
    assert fx.admit(elsewhere) == 0 and state.epoch_of(elsewhere.extra_key) == 1
    fx.prefill(elsewhere)
    fx.finish(elsewhere)
    fx.finish(holder)
    check(fx)


def test_crossing_request_keeps_its_kv_and_frees_stale_path_at_release(env):
    fx, state = env
    P = seq(50, 48)
    r = new_req(fx, state, P + [9])
    fx.admit(r)
    fx.prefill(r)
    fx.decode(r, 5)
    row_before = fx.req_pool.req_to_token[r.kv.req_pool_idx, : r.kv.kv_committed_len].clone()
    protected = fx.cache.protected_size()
    inv = bump(fx, state, live=[r])
    assert inv.crossing_requests == 1 and inv.tokens_pinned == protected > 0
    assert r.skip_radix_cache_insert
    assert torch.equal(fx.req_pool.req_to_token[r.kv.req_pool_idx, : r.kv.kv_committed_len], row_before)
    assert fx.cache.protected_size() == protected  # still valid for its holder
    other = new_req(fx, state, P + [9])
    assert fx.admit(other) == 0  # ...and for its holder only: the pinned stale prompt is not matchable
    fx.prefill(other)
    fx.finish(other)
    for t in (6, 7, 8):
        fx.decode(r, t)
        check(fx, [r])
    fx.finish(r)
    assert fx.cache.protected_size() == 0  # the crossing request inserted nothing; its stale path is gone
    assert state.freed.tokens_at_release == protected and not state.crossing
    assert run_to_end(fx, state, P + [9]) == 48 // fx.page_size * fx.page_size  # other's new-epoch KV is shared
    check(fx)


def test_shared_stale_prefix_is_freed_when_the_last_holder_releases(env):
    fx, state = env
    P = seq(400, 32)
    a, b = new_req(fx, state, P + seq(900, 16)), new_req(fx, state, P + seq(950, 16))
    fx.admit(a)
    fx.prefill(a)
    assert fx.admit(b) == 32
    fx.prefill(b)
    bump(fx, state, live=[a, b])
    fx.finish(a)
    check(fx, [b])
    assert fx.cache.protected_size() >= 32  # b still needs the shared stale prefix
    fx.finish(b)
    assert fx.cache.protected_size() == 0 and fx.cache.evictable_size() == 0
    assert fx.allocator.available_size() == fx.total
    check(fx)


def test_chunked_prefill_crossing_a_bump_never_inserts(env):
    fx, state = env
    tokens = seq(600, 96) + [1]
    r = new_req(fx, state, tokens)
    fx.admit(r)
    fx.prefill(r, upto=32)  # first chunk checkpointed into the tree under epoch 0
    bump(fx, state, live=[r])
    fx.prefill(r, upto=64)  # later chunks: no checkpoint into any namespace
    fx.prefill(r)
    check(fx, [r])
    fx.finish(r)
    assert fx.cache.evictable_size() == 0 and fx.allocator.available_size() == fx.total
    assert run_to_end(fx, state, tokens) == 0
    check(fx)


def test_retracted_crossing_request_reprefills_under_new_epoch(env):
    fx, state = env
    P = seq(700, 32)
    r = new_req(fx, state, P + [1])
    fx.admit(r)
    fx.prefill(r)
    bump(fx, state, live=[r])
    fx.retract(r)
    assert not r.skip_radix_cache_insert and not state.crossing
    assert fx.allocator.available_size() == fx.total  # stale prompt freed at retraction
    assert fx.admit(r) == 0 and state.epoch_of(r.extra_key) == 1
    fx.prefill(r)
    fx.finish(r)
    assert run_to_end(fx, state, P + [2]) == 32  # its new-epoch KV was inserted and is shared
    check(fx)


def test_many_bumps_no_double_free_and_pool_full_when_all_released(env):
    fx, state = env
    live = []
    for i in range(6):
        r = new_req(fx, state, seq(1000 + 16 * (i % 2), 32) + [i])
        fx.admit(r)
        fx.prefill(r)
        live.append(r)
        run_to_end(fx, state, seq(2000, 16 * (i + 1)) + [i])
        bump(fx, state, live=live)
        check(fx, live)
    for r in live:
        fx.finish(r)
        check(fx, [x for x in live if x.kv.holds_kv])
    assert not state.crossing
    bump(fx, state)
    assert fx.allocator.available_size() == fx.total


def test_user_extra_key_and_lora_isolation_unchanged(env):
    fx, state = env
    P = seq(1500, 32)
    assert run_to_end(fx, state, P + [1], extra_key="tenantA") == 0
    assert run_to_end(fx, state, P + [2], extra_key="tenantA") == 32
    assert run_to_end(fx, state, P + [3], extra_key="tenantB") == 0
    assert run_to_end(fx, state, P + [4]) == 0
    assert run_to_end(fx, state, P + [5], lora_id="adapter-1") == 0
    assert run_to_end(fx, state, P + [6], lora_id="adapter-1") == 32
    assert run_to_end(fx, state, P + [7], lora_id="adapter-2") == 0
    r = new_req(fx, state, P, extra_key="tenantA", lora_id="adapter-1")
    # epoch prefix, then the adapter's content tag (a process-local nonce here: no adapter was loaded for this
    # lora_id), and the LoRA id stays the suffix
    tag = identity.adapter_tag(state.lora.adapter_ids["adapter-1"])
    assert r.extra_key == state.prefix_of_epoch(state.epoch) + tag + "tenantAadapter-1"
    check(fx)


@pytest.mark.parametrize("forged", [identity.namespace("nonce:00"), identity.namespace("fp:ab", 7), "x\x1evradix:e1\x1f", "\x1e"])
def test_reserved_marker_in_user_key_is_rejected(env, forged):
    fx, state = env
    req = fx.make_req(seq(1, 8), extra_key=forged)
    with pytest.raises(ReservedNamespaceError):
        state.admit_or_raise(req)


def test_only_a_request_that_never_left_its_epoch_releases_on_the_plain_path(env):
    """`Engine.release_is_plain` lets a release skip vradix entirely: never for a crossing request (its stale path must
    be freed and its provenance spans read), nor for a bounded one."""
    fx, state = env
    release_is_plain = type(state).release_is_plain
    plain = new_req(fx, state, seq(3000, 32) + [1])
    fx.admit(plain)
    fx.prefill(plain)
    assert release_is_plain(state, plain)
    crossing = new_req(fx, state, seq(3100, 32) + [1])
    fx.admit(crossing)
    fx.prefill(crossing)
    bump(fx, state, live=[plain, crossing])
    assert not release_is_plain(state, crossing) and not release_is_plain(state, plain)
    fx.finish(crossing)
    fx.finish(plain)
    assert not state.crossing
    bounded = new_req(fx, state, seq(3200, 32) + [1])
    bounded._vradix.max_staleness = 1
    assert not release_is_plain(state, bounded)
    check(fx)
