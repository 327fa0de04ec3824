"""Bookkeeping that cannot grow or collide, on SGLang's real UnifiedRadixCache (Rust and Python
TreeCores, page sizes 1/16) with its real allocators, driven through the scheduler's own `mem_cache.common` functions
with the vradix hooks installed by `load_plugins()`:
- crossing requests are tracked by identity, so two live requests sharing a user rid both get their stale path freed;
- a crossing request whose lock was released outside `release_kv_cache` is forgotten at the next bump;
- the per-adapter node sets are pruned in amortised O(1) per insert;
- the release-time reclaim reads lock state without changing it and walks a path with one path query."""
import collections

import pytest

from sglang.srt.mem_cache import common

from vradix.core import reclaim
from vradix.engine import attach
from vradix.testing.harness.cache_fixture import build_cache, seq



def running(fx, state, tokens, rid=None):
    """A request admitted and prefilled: it holds a row and a tree lock on its inserted prompt."""
    req = fx.make_req(tokens)
    if rid is not None:
        req.rid = rid
    state.admit_or_raise(req)
    fx.admit(req)
    fx.prefill(req)
    return req


def bump(fx, state, live=()):
    """A publication, then the deferred reclaim of the unlocked stale KV to completion (what an idle engine does)."""
    inv = state.bump(fx.cache, list(live), [], reason="test", label=f"v{state.epoch + 1}")
    state.deferred.finish(state, fx.cache)
    return inv


def pool_is_full(fx):
    return (fx.cache.evictable_size() == 0 and fx.cache.protected_size() == 0
            and fx.allocator.available_size() == fx.total)


# ---- crossing requests: keyed by identity, swept when their lock is gone ---------------------------------------------
def test_two_live_requests_sharing_a_rid_both_free_their_stale_paths_at_release(env):
    fx, state = env
    a = running(fx, state, seq(100, 40) + [1], rid="dup")
    b = running(fx, state, seq(500, 40) + [2], rid="dup")  # a user-supplied rid need not be unique
    bump(fx, state, live=[a, b])
    fx.finish(a)
    fx.finish(b)
    assert not state.crossing
    assert state.freed.tokens_at_release >= 2 * (40 // fx.page_size * fx.page_size)
    assert pool_is_full(fx), fx.accounting()  # neither stale path was left to LRU


def test_crossing_request_unlocked_outside_release_is_dropped_at_next_bump_and_its_kv_freed(env):
    fx, state = env
    r = running(fx, state, seq(300, 40) + [3])
    bump(fx, state, live=[r])
    assert any(c is r for c in state.crossing.values())
    # P/D decode and streaming sessions give the lock back directly, without release_kv_cache
    fx.cache.unlock(r.lock)
    r.lock = None
    fx.req_pool.free(r)
    stale = fx.cache.evictable_size()
    assert stale >= 40 // fx.page_size * fx.page_size
    inv = bump(fx, state)
    assert not any(c is r for c in state.crossing.values()) and inv.crossing_requests == 0
    assert inv.tokens_freed == stale and fx.cache.evictable_size() == 0 and fx.cache.protected_size() == 0


# ---- LoRA: nothing per insert; the unload frees the adapter's entries, and only those, in one walk -------------------
@pytest.mark.parametrize("core", ["rust", "python"])
def test_adapter_unload_frees_exactly_its_unlocked_entries_in_one_walk(core):
    """200 inserts of adapter X and some of Y and of the base model: the unload of X frees every unlocked X entry
    (the locked one stays), nothing of Y's or the base model's, and looks each evictable node up once."""
    fx = build_cache(core, 1, kv_tokens=4096)
    state = attach(fx.cache)

    def run(tokens, lora_id=None):
        r = fx.make_req(tokens, lora_id=lora_id)
        state.admit_or_raise(r)
        fx.admit(r)
        fx.prefill(r)
        return r

    for i in range(200):
        fx.finish(run([1000 + i, 7, 7, 7, 7, 1], "X"))  # distinct first token: one new leaf per request
    for i in range(20):
        fx.finish(run([1000 + i, 7, 7, 7, 7, 1], "Y"))
        fx.finish(run([1000 + i, 7, 7, 7, 7, 1]))
    held = run([5000, 7, 7, 7, 7, 1], "X")
    others = fx.cache.evictable_size() - 200 * 6
    lookups = []
    real = fx.cache.tree_core.prefetch_anchor_info
    fx.cache.tree_core.prefetch_anchor_info = lambda n: lookups.append(n) or real(n)
    try:
        freed = state.lora.free_entries(fx.cache, "X")
    finally:
        del fx.cache.tree_core.prefetch_anchor_info
    assert freed == 200 * 6 and fx.cache.evictable_size() == others == 2 * 20 * 6
    assert len(lookups) == len(set(lookups)) <= 200 + 2 * 20 + 1  # each candidate once
    fx.finish(held)
    assert state.lora.free_entries(fx.cache, "X") == 6  # released: now unlocked, freed by the next unload


# ---- release-time reclaim: read-only lock probe, one path query per released path ------------------------------------
def finished(fx, state, tokens):
    r = fx.make_req(tokens)
    state.admit_or_raise(r)
    fx.admit(r)
    fx.prefill(r)
    fx.finish(r)
    q = fx.make_req(tokens)  # the node the prompt ends on (match, no lock)
    state.admit_or_raise(q)
    common.match_kv_cache(q, fx.cache, q.origin_input_ids)
    return q.last_node


def alive(fx, node_id):
    try:
        fx.cache.tree_core.collect_path_info([node_id])
    except KeyError:
        return False
    return True


def lock_and_lru_state(fx, nodes):
    """What a probe must not change: the sizes, and on the Python core each node's lock counts and LRU stamp and its
    membership of the evictable-leaf set (the Rust core exposes no per-node state; its LRU order is checked by
    eviction in the test)."""
    seen = [fx.cache.evictable_size(), fx.cache.protected_size()]
    core = fx.cache.tree_core
    if fx.tree_core_name == "UnifiedTreeCore":
        for n in nodes:
            node = core.node_by_id(n)
            seen.append((n, node.last_access_time, [(cd.lock_ref, cd.host_lock_ref) for cd in node.component_data],
                         node in core.evictable_device_leaves))
    return seen


def test_lock_probe_changes_neither_lock_counts_nor_lru_order(env):
    fx, state = env
    ps = fx.page_size
    older = finished(fx, state, seq(100, 2 * ps) + [1])
    newer = finished(fx, state, seq(600, 2 * ps) + [1])
    held = fx.make_req(seq(900, 2 * ps) + [1])
    state.admit_or_raise(held)
    fx.admit(held)
    fx.prefill(held)
    nodes = [older, newer, held.lock.node]
    before = lock_and_lru_state(fx, nodes)
    paths = fx.cache.tree_core.collect_path_info(nodes)
    assert [reclaim.unlocked_suffix_len(fx.cache, p) for p in paths] == [len(paths[0]), len(paths[1]), 0]
    assert lock_and_lru_state(fx, nodes) == before
    common.evict_from_tree_cache(fx.cache, fx.allocator.available_size() + 1)  # LRU frees the oldest leaf first
    assert not alive(fx, older) and alive(fx, newer)
    fx.finish(held)


def test_long_released_path_is_walked_with_one_path_query(env, monkeypatch):
    fx, state = env
    step, depth = fx.page_size * 2, 24
    P = seq(3000, step * depth)
    for k in range(1, depth + 1):  # a chain of `depth` nodes, one per prompt extension
        finished(fx, state, P[: step * k] + [1])
    r = fx.make_req(P + [2])
    state.admit_or_raise(r)
    assert fx.admit(r) == len(P)
    fx.prefill(r)
    bump(fx, state, live=[r])  # r crosses; its lock keeps the whole stale chain
    assert len(fx.cache.tree_core.collect_path_info([r.lock.node])[0]) >= depth
    queries = []
    core = fx.cache.tree_core
    real = core.collect_path_info
    monkeypatch.setattr(core, "collect_path_info", lambda ids: queries.append(list(ids)) or real(ids))
    fx.finish(r)
    assert len(queries) == 1, f"{len(queries)} path queries to free one released path"
    monkeypatch.undo()
    assert state.freed.tokens_at_release >= len(P)
    assert pool_is_full(fx), fx.accounting()


# a leaf SGLang does not evict at once (HiCache write-back returns a BackupKV and keeps the node until its backup ran)
# stops the eviction walk: victims chosen up front would go on to evict its parent, an inner node (an assertion on the
# Python core, a panic that poisons the Rust core)
def test_a_deferred_leaf_eviction_stops_the_walk(env, monkeypatch):
    fx, state = env
    step = fx.page_size * 2
    P = seq(5000, step * 4)
    for k in range(1, 5):
        finished(fx, state, P[: step * k] + [1])
    r = running(fx, state, P + [2])
    bump(fx, state, live=[r])
    core = fx.cache.tree_core
    (path,) = core.collect_path_info([r.lock.node])
    deferred, evicted = path[-1].node_id, []
    real = fx.cache._evict_device_leaf

    def write_back_defers(node_id, tracker):
        if node_id == deferred:
            return object()  # SGLang's BackupKV: the node stays until its backup runs
        evicted.append(node_id)
        return real(node_id, tracker)

    monkeypatch.setattr(fx.cache, "_evict_device_leaf", write_back_defers)
    fx.finish(r)
    assert evicted == [], "a parent of a leaf that was not evicted was evicted"
    monkeypatch.undo()
    assert core.collect_path_info([deferred])[0][-1].node_id == deferred  # the tree is intact


def test_a_node_without_device_kv_ends_the_victims(env):
    """A node HiCache demoted to host has no device value (and no lock): it is no device leaf to evict."""
    Info = collections.namedtuple("Info", "node_id num_children full_value_len")
    path = [Info(1, 1, 16), Info(2, 1, 16), Info(3, 0, 16)]
    assert reclaim.evictable_tail(path, unlocked=3) == [3, 2, 1]
    host_only = [Info(1, 1, 16), Info(2, 1, None), Info(3, 0, 16)]
    assert reclaim.evictable_tail(host_only, unlocked=3) == [3]
    assert reclaim.evictable_tail([Info(3, 0, 0)], unlocked=1) == []
