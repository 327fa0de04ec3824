"""HiCache host tier (L2) at a publication, on SGLang's real UnifiedRadixCache with its real host pool,
HybridCacheController and L2 transfer engine (Rust and Python TreeCores, page sizes 1 and 16, write-through and
write-back), on CPU (`vradix.testing.harness.hicache_fixture`).

Every KV slot the fixture 'computes' carries a code naming the epoch it was computed under, and real backups and
load-backs copy it between device and host; `check` reads it back after every step:
- device accounting: available + evictable + protected + request-owned == total; no slot free twice or free and owned;
- host accounting: the host pool's allocation flags agree with its free count, and every allocated host page holds KV
  of the current epoch (a stale host copy is a leak of the publication);
- the strict KV page ledger guard (on with HiCache, as at engine start) never fires;
- SGLang's own tree sanity check.
"""
import pytest

from sglang.srt.mem_cache import common

from vradix.observability import server_info
from vradix.engine import attach
from vradix.testing.harness.cache_fixture import seq
from vradix.testing.harness.hicache_fixture import build_hicache, versioned

CONFIGS = [("rust", 1), ("rust", 16), ("python", 1), ("python", 16)]
IDS = [f"{c}-ps{p}" for c, p in CONFIGS]
STRIDE = 1 << 12  # code = (epoch + 1) * STRIDE + position


@pytest.fixture(params=CONFIGS, ids=IDS)
def core_ps(request):
    return request.param


def env(core_ps, write_policy="write_through", **kw):
    fx = build_hicache(*core_ps, write_policy=write_policy, **kw)
    state = versioned(fx)  # as at engine start: the KV page ledger and the host ledger are on
    fx.kv_code = lambda req, pos: (state.epoch + 1) * STRIDE + pos
    return fx, state


def epoch_of_code(code):
    return code // STRIDE - 1



def new_req(fx, state, tokens):
    req = fx.make_req(tokens)
    state.admit_or_raise(req)
    return req


def run_to_end(fx, state, tokens):
    req = new_req(fx, state, tokens)
    hit = fx.admit(req)
    fx.prefill(req)
    fx.finish(req)
    fx.process_acks()
    return hit


def demote_all(fx):
    """Device pressure: evict every unlocked node (HiCache demotes the backed-up ones to host)."""
    common.evict_from_tree_cache(fx.cache, fx.total)


def bump(fx, state, live=()):
    return state.bump(fx.cache, list(live), [], reason="test", label=f"v{state.epoch + 1}")


def check(fx, state, live=()):
    assert fx.busy_invariant_holds(list(live)), fx.accounting()
    free = free_slots(fx)
    assert len(free) == len(set(free)), "a device slot is free twice"
    for r in live:
        if r.kv.holds_kv:
            row = fx.req_pool.req_to_token[r.kv.req_pool_idx, : r.kv.kv_committed_len].tolist()
            assert not set(row) & set(free), "a device slot is both free and owned by a live request"
    figures = fx.host_figures()
    assert figures["used"] == len(fx.host_used_slots()), figures
    codes = fx.host_codes()
    stale = {h: c for h, c in codes.items() if epoch_of_code(c) != state.epoch}
    assert not stale, f"{len(stale)} host slots hold KV of older epochs (current {state.epoch})"
    assert state.guard.stats.violations_caught == 0, state.guard.stats.last_violation  # the strict ledger guard
    fx.cache.sanity_check()


def check_idle(fx):
    assert fx.idle_invariant_holds(), fx.accounting()
    assert fx.allocator.available_size() == fx.total
    assert fx.host_idle_leaks() == []


def free_slots(fx):
    pages = fx.allocator.free_pages.tolist()
    if fx.page_size == 1:
        return pages
    return [p * fx.page_size + i for p in pages for i in range(fx.page_size)]


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_stale_host_copies_are_unmatchable_and_freed_at_a_publication(core_ps, policy):
    fx, state = env(core_ps, policy)
    P, Q = seq(100, 64), seq(900, 48)
    assert run_to_end(fx, state, P + [1]) == 0
    demote_all(fx)
    assert fx.cache.evictable_size() == 0 and fx.host_figures()["used"] >= 64  # P lives on host only
    probe = new_req(fx, state, P + [2])
    common.match_kv_cache(probe, fx.cache, probe.origin_input_ids)
    assert probe.host_hit_length == 64  # matchable from host within its epoch
    crossing = new_req(fx, state, Q + [3])
    fx.admit(crossing)
    fx.prefill(crossing)
    fx.process_acks()  # its Q path is on device and, under write-through, backed up on host as well
    check(fx, state, [crossing])
    used = fx.host_figures()["used"]

    inv = bump(fx, state, [crossing])
    assert inv.host_tokens_freed == used > 0 and inv.host_tokens_left == 0, inv
    assert state.freed.host_tokens_total == used
    assert server_info.engine_block(state, 0)["stale_host_tokens_freed_last"] == used
    assert fx.host_figures()["used"] == 0  # host-only stale nodes and host copies of held stale nodes, all freed
    check(fx, state, [crossing])
    stale = new_req(fx, state, P + [2])
    assert fx.admit(stale) == 0 and stale.host_hit_length == 0  # the stale host copy is gone, not just unmatchable
    fx.prefill(stale)
    fx.finish(stale)
    fx.finish(crossing)
    fx.process_acks()
    check(fx, state)
    bump(fx, state)
    check(fx, state)
    check_idle(fx)


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_a_crossing_release_frees_its_stale_path_from_device_and_host(core_ps, policy):
    fx, state = env(core_ps, policy)
    P = seq(300, 96)
    run_to_end(fx, state, P[:48] + [1])  # a stale branch next to the crossing request's path
    crossing = new_req(fx, state, P + [2])
    assert fx.admit(crossing) == 48
    fx.prefill(crossing)
    fx.process_acks()
    bump(fx, state, [crossing])
    check(fx, state, [crossing])
    for tok in (7, 8, 9):  # it keeps decoding across the publication
        fx.decode(crossing, tok)
    fx.finish(crossing)
    fx.process_acks()
    # the stale path is freed at the release, not demoted to host (and not backed up first under write-back)
    assert fx.cache.evictable_size() == 0 and fx.cache.protected_size() == 0, fx.accounting()
    assert fx.host_figures()["used"] == 0
    assert state.freed.tokens_at_release >= 96
    check(fx, state)
    check_idle(fx)


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_a_crossing_requests_mixed_version_kv_is_never_backed_up(core_ps, policy):
    fx, state = env(core_ps, policy, host_ratio=4.0)
    P = seq(500, 64)
    decoding = new_req(fx, state, P + [1])
    fx.admit(decoding)
    fx.prefill(decoding)
    chunked = new_req(fx, state, seq(2000, 80))
    fx.admit(chunked)
    fx.prefill(chunked, upto=32)  # mid-prefill at the publication: its next chunks are new-epoch KV
    fx.process_acks()
    bump(fx, state, [decoding, chunked])
    cc = fx.cache.cache_controller
    for step in range(3):
        fx.decode(decoding, 10 + step)
        fx.prefill(chunked, upto=32 + 24 * (step + 1))  # checkpoints: skipped for a crossing request
        fx.process_acks()
        assert not cc.write_queue and not cc.ack_write_queue and not fx.cache.ongoing_write_through
        check(fx, state, [decoding, chunked])
    fx.finish(decoding)
    fx.finish(chunked)
    fx.process_acks()
    demote_all(fx)  # device pressure (write-back backs up on eviction): nothing of theirs is left to back up
    assert not cc.write_queue and not fx.cache.ongoing_write_through
    assert fx.host_figures()["used"] == 0, "KV of a crossing request reached the host pool"
    check(fx, state)
    check_idle(fx)


@pytest.mark.parametrize("live", [False, True], ids=["idle", "with-crossing"])
def test_a_backup_in_flight_at_the_publication_leaves_nothing_behind(core_ps, live):
    """A write-through backup is issued at the insert and acknowledged at the scheduler's next poll; until then it
    locks its node. A publication in between must still free that node and its host copy."""
    fx, state = env(core_ps)
    crossing = None
    if live:
        crossing = new_req(fx, state, seq(4000, 40) + [1])
        fx.admit(crossing)
        fx.prefill(crossing)
        fx.process_acks()
    req = new_req(fx, state, seq(700, 64) + [1])
    fx.admit(req)
    fx.prefill(req)
    fx.finish(req)  # its backup is queued, not acknowledged
    assert fx.cache.ongoing_write_through and fx.cache.protected_size() > 0
    inv = bump(fx, state, [crossing] if live else [])
    assert inv.tokens_freed >= 64 and not fx.cache.ongoing_write_through
    fx.process_acks()  # the acks are processed afterwards: nothing is left to settle
    live_reqs = [crossing] if live else []
    assert fx.cache.evictable_size() == 0, "a stale node outlived the publication, unlocked"
    assert fx.host_figures()["used"] == 0
    check(fx, state, live_reqs)
    if live:
        fx.finish(crossing)
        fx.process_acks()
    check(fx, state)
    check_idle(fx)


def test_a_load_back_in_flight_at_the_publication_leaves_nothing_behind(core_ps):
    """A load-back locks its node (and host-locks it) until its ack; a publication between the copy and the ack
    must not leave that stale node behind once the request that loaded it releases."""
    fx, state = env(core_ps)
    P = seq(100, 64)
    run_to_end(fx, state, P + [1])
    demote_all(fx)
    req = new_req(fx, state, P + [2])
    assert fx.admit(req) == 64 and fx.cache.ongoing_load_back  # loaded back from host, ack not yet processed
    assert epoch_of_code(fx.device_codes(fx.req_pool.req_to_token[req.kv.req_pool_idx, :64].tolist())[0]) == 0
    fx.prefill(req)
    bump(fx, state, [req])
    assert not fx.cache.ongoing_load_back and fx.host_figures()["used"] == 0
    check(fx, state, [req])
    fx.decode(req, 5)
    fx.finish(req)
    fx.process_acks()
    assert fx.cache.evictable_size() == 0, "the loaded stale path outlived its last holder"
    check(fx, state)
    check_idle(fx)


def test_host_pressure_after_a_publication_evicts_only_current_kv(core_ps):
    """Host eviction (SGLang's LRU under host-pool pressure) keeps working on the new epoch's copies, and the host
    pool never holds a stale page."""
    fx, state = env(core_ps, host_ratio=1.0)
    for i in range(3):
        run_to_end(fx, state, seq(1000 * (i + 1), 64) + [1])
        demote_all(fx)
    bump(fx, state)
    for i in range(6):
        run_to_end(fx, state, seq(1000 * (i + 1), 64) + [2])
        demote_all(fx)
        check(fx, state)
    assert fx.cache.evict_host(fx.host_figures()["total"]) > 0
    check(fx, state)
    bump(fx, state)
    check_idle(fx)


def test_the_kits_python_inspector_sees_no_stale_host_node(core_ps, monkeypatch):
    """SGLang's own test kit (`fixtures.build_fixture`, Python TreeCore inspector; the Rust inspector is a separate
    binding the wheel does not ship) with vradix's host tier: after a publication no tree node holds a host value,
    and the host values the tree holds always add up to the host pool's use."""
    from array import array

    from sglang.srt.mem_cache.base_prefix_cache import InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
    from sglang.test.kits.unified_radix_cache.config import CacheConfig
    from sglang.test.kits.unified_radix_cache import fixtures

    from vradix import identity
    from vradix.testing.harness.hicache_fixture import init_host_tier

    core, ps = core_ps
    if core != "python":
        pytest.skip("the kit's Rust inspector needs the Rust inspection binding, which the sglang wheel omits")
    monkeypatch.setattr(fixtures, "get_device", lambda: "cpu")  # the kit builds on the accelerator it finds
    cache, allocator, _ = fixtures.build_fixture(CacheConfig(page_size=ps, kv_size=512), tree_core_backend="python")
    init_host_tier(cache)
    state = attach(cache, with_ledger=False)  # the kit's token allocator serves page size 16 too: no page ledger
    core_ = cache.tree_core
    pool = cache.cache_controller.mem_pool_host

    def host_tokens_in_tree():
        values = (core_.get_component_host_value(n, ComponentType.FULL) for n in core_.get_all_node_ids())
        return sum(len(v) for v in values if v is not None)

    def insert(tokens, epoch):
        key = RadixKey(array("q", tokens), extra_key=identity.stamped(state.prefix_of_epoch(epoch), None))
        result = cache.insert(InsertParams(key=key, value=allocator.alloc(len(tokens))))
        cache.writing_check(write_back=True)  # write-through backed it up at the insert; take the ack
        return result.last_device_node

    insert(seq(10, 4 * ps), 0)
    held = insert(seq(10, 4 * ps) + seq(90, 2 * ps), 0)
    insert(seq(500, 3 * ps), 0)
    lock = cache.lock(held)  # a crossing request's hold
    common.evict_from_tree_cache(cache, allocator.available_size() + cache.evictable_size())
    assert host_tokens_in_tree() == pool.size - pool.available_size() == 9 * ps
    state.bump(cache, [], [], reason="test")
    assert host_tokens_in_tree() == 0 == pool.size - pool.available_size()
    insert(seq(10, 4 * ps), state.epoch)
    assert host_tokens_in_tree() == pool.size - pool.available_size() == 4 * ps
    cache.unlock(lock)
    cache.sanity_check()
