"""The cache inspector's snapshot (`vradix.observability.snapshot`) on SGLang's real UnifiedRadixCache, Rust and Python TreeCores:
per-epoch figures after a publication, stale KV pinned by a crossing request, top prefixes by hits, pagination
bounds, and that a snapshot changes nothing in the tree. The HTTP endpoint and the CLI run in
test_e2e_provenance.py."""
import msgspec
import pytest
from sglang.srt.mem_cache import common

from vradix import engine as prefix_hits
from vradix.observability import snapshot
from vradix.engine import attach
from vradix.testing.harness.cache_fixture import build_cache, seq

CONFIGS = [("rust", 1), ("rust", 16), ("python", 1), ("python", 16)]


@pytest.fixture(params=CONFIGS, ids=[f"{c}-ps{p}" for c, p in CONFIGS])
def env(request):
    core, ps = request.param
    fx = build_cache(core, ps, kv_tokens=4096)
    return fx, attach(fx.cache)




def finished(fx, state, tokens):
    req = fx.running(state, tokens)
    fx.finish(req)
    return req


def snap(fx, state, live=(), **query):
    return snapshot.snapshot(state, fx.cache, list(live), snapshot.Query(**query))


def is_python(fx):
    return fx.tree_core_name == "UnifiedTreeCore"


def test_per_epoch_figures_after_a_publication_with_a_crossing_request(env):
    fx, state = env
    ps = fx.page_size
    for i in range(3):
        finished(fx, state, seq(1000 * (i + 1), 3 * ps) + [7])
    held = fx.running(state, seq(5000, 4 * ps) + [7])
    before = snap(fx, state, [held])
    assert [r["epoch"] for r in before["epochs"]] == [0]
    assert before["epochs"][0]["cached_tokens"] == fx.cache.evictable_size() + fx.cache.protected_size() > 0

    inv = state.bump(fx.cache, [held], [], reason="test", label="v1")
    view = snap(fx, state, [held])
    current, old = view["epochs"]
    assert (current["epoch"], current["label"], current["current"]) == (1, "v1", True)
    assert (old["epoch"], old["label"], old["current"]) == (0, None, False)
    (path,) = fx.cache.tree_core.collect_path_info([held.lock.node])
    assert old["pinned_tokens"] == old["cached_tokens"] == inv.tokens_pinned == path[-1].path_end > 0
    assert old["nodes"] == len(path) and old["pinned_by"] == [held.rid] and old["crossing_requests"] == 1
    stale = view["stale"]
    assert stale["pinned_tokens"] == inv.tokens_pinned
    assert stale["crossing"] == [{"rid": held.rid, "epoch": 0, "pinned_tokens": path[-1].path_end}]
    assert stale["awaiting_reclaim_tokens"] == state.deferred.pending_tokens == inv.tokens_deferred
    assert current["cached_tokens"] == view["cached_tokens"] - inv.tokens_pinned - inv.tokens_deferred == 0

    fresh = [finished(fx, state, seq(9000 + 100 * i, 2 * ps) + [3]) for i in range(2)]
    view = snap(fx, state, [held])
    assert view["epochs"][0]["cached_tokens"] == sum(len(r.origin_input_ids) // ps * ps for r in fresh)
    if is_python(fx):  # a walk of the whole tree, by namespace, agrees with the walk-free figures
        census = view["census"]
        assert not census["truncated"]
        assert census["epochs"]["1"]["tokens"] == view["epochs"][0]["cached_tokens"]
        assert census["epochs"]["0"]["tokens"] == inv.tokens_pinned + state.deferred.pending_tokens
        assert view["epochs"][0]["nodes"] == census["epochs"]["1"]["nodes"]
    else:
        assert view["census"] is None and view["epochs"][0]["nodes"] is None
    fx.finish(held)
    view = snap(fx, state)
    assert [r["epoch"] for r in view["epochs"]] == [1] and view["stale"]["pinned_tokens"] == 0


def test_top_prefixes_rank_by_hits_with_lock_counts_and_paginate(env):
    fx, state = env
    ps = fx.page_size
    prefixes = {"A": seq(100, 2 * ps), "B": seq(300, 3 * ps), "C": seq(600, 2 * ps)}
    uses = {"A": 4, "B": 3, "C": 2}  # the first use of each caches it; the others hit it
    for name, n in uses.items():
        for i in range(n):
            finished(fx, state, prefixes[name] + [900 + i, 901])
    holder = fx.running(state, prefixes["B"] + [950, 951])  # a 3rd hit on B, still locked
    view = snap(fx, state, [holder], limit=10, head=4)
    msgspec.msgpack.encode(view)  # the reply crosses to the HTTP process as msgpack: plain Python values only
    items = view["top_prefixes"]["items"]
    assert [(i["hits"], i["tokens"]) for i in items] == [(3, 2 * ps), (3, 3 * ps), (1, 2 * ps)] or \
        [(i["hits"], i["tokens"]) for i in items] == [(3, 3 * ps), (3, 2 * ps), (1, 2 * ps)]
    by_tokens_head = {tuple(i["head_tokens"]): i for i in items}
    a, b, c = (by_tokens_head[tuple(prefixes[k][:4])] for k in "ABC")
    assert (a["hits"], b["hits"], c["hits"]) == (3, 3, 1)
    assert b["last_access"] >= a["last_access"] and items.index(b) == 0  # equal hits: most recent first
    assert (b["lock_count"], a["lock_count"], c["lock_count"]) == (1, 0, 0)
    assert all(i["epoch"] == 0 and not i["stale"] and i["on_device"] for i in items)
    if is_python(fx):  # SGLang's own lock count agrees with the one vradix derives from the lock holders
        assert [i["core"]["lock_ref"] for i in items] == [i["lock_count"] for i in items]
    else:
        assert all(i["core"] is None for i in items)

    page1 = snap(fx, state, [holder], limit=2)["top_prefixes"]
    page2 = snap(fx, state, [holder], limit=2, offset=page1["next_offset"])["top_prefixes"]
    assert page1["next_offset"] == 2 and page2["next_offset"] is None
    assert [i["node"] for i in page1["items"] + page2["items"]] == [i["node"] for i in items]
    assert snap(fx, state, [holder], limit=0)["top_prefixes"]["items"] == []

    state.bump(fx.cache, [holder], [], reason="test", label="v1")
    stale_b = snap(fx, state, [holder])["top_prefixes"]["items"][0]
    assert stale_b["node"] == b["node"] and stale_b["stale"] and stale_b["epoch"] == 0
    fx.finish(holder)
    common.evict_from_tree_cache(fx.cache, fx.allocator.size)  # everything leaves the tree
    gone = snap(fx, state)["top_prefixes"]
    assert gone["items"] == [] and gone["tracked"] == 3


def lru_and_lock_state(fx, node_ids):
    seen = [fx.cache.evictable_size(), fx.cache.protected_size()]
    if is_python(fx):
        core = fx.cache.tree_core
        for n in node_ids:
            node = core.node_by_id(n)
            seen.append((n, node.last_access_time, node.hit_count, [cd.lock_ref for cd in node.component_data],
                         node in core.evictable_device_leaves))
    return seen


def test_a_snapshot_changes_nothing_in_the_tree(env):
    fx, state = env
    ps = fx.page_size
    older = finished(fx, state, seq(100, 2 * ps) + [1])
    finished(fx, state, seq(100, 2 * ps) + [2])  # a hit on the older prefix
    newer = finished(fx, state, seq(600, 2 * ps) + [1])
    held = fx.running(state, seq(900, 2 * ps) + [1])
    nodes = [older.last_node, newer.last_node, held.lock.node] + list(state.prefix_hits.entries)
    before = lru_and_lock_state(fx, nodes)
    hits_before = [(h.node_id, h.hits, h.last_hit) for h in state.prefix_hits.entries.values()]
    for _ in range(3):
        snap(fx, state, [held], limit=10, head=16)
    assert lru_and_lock_state(fx, nodes) == before
    assert [(h.node_id, h.hits, h.last_hit) for h in state.prefix_hits.entries.values()] == hits_before
    # LRU order unchanged on both cores: the oldest unlocked leaf still goes first
    (older_path,) = fx.cache.tree_core.collect_path_info([older.last_node])
    common.evict_from_tree_cache(fx.cache, fx.allocator.available_size() + older_path[-1].full_value_len)
    assert snapshot.path_of(fx.cache, older.last_node) is None
    assert snapshot.path_of(fx.cache, newer.last_node) is not None
    fx.finish(held)


def test_query_bounds_and_the_hit_table_capacity():
    assert snapshot.Query.parse({"limit": "5", "offset": "10", "head": "3"}) == snapshot.Query(5, 10, 3)
    for bad in ({"limit": "201"}, {"limit": "-1"}, {"offset": str(snapshot.MAX_OFFSET + 1)}, {"head": "17"},
                {"limit": "x"}, {"depth": "1"}):
        with pytest.raises(snapshot.QueryError):
            snapshot.Query.parse(bad)
    hits = prefix_hits.PrefixHits(capacity=8)
    for node in range(20):
        hits.record(node, 0, 16, range(32), now=float(node))
    assert list(hits.entries) == list(range(12, 20))  # the least recently hit are dropped
    assert all(len(h.head) == prefix_hits.MAX_HEAD_TOKENS for h in hits.entries.values())


def test_a_staleness_window_keeps_older_namespaces_and_the_snapshot_says_so(env):
    from vradix.inspector import render
    fx, state = env
    ps = fx.page_size
    assert snap(fx, state)["window"] is None and "includes_in_window_older" in snap(fx, state)["epochs"][0]
    state.staleness.window = 1
    old = finished(fx, state, seq(1000, 3 * ps) + [7])
    state.bump(fx.cache, [], [], reason="test", label="v1")
    assert state.deferred.finish(state, fx.cache) == 0  # the walk after the bump: nothing aged out of the window
    new = finished(fx, state, seq(4000, 2 * ps) + [7])
    old_tokens, new_tokens = ((3 * ps + 1) // ps * ps), ((2 * ps + 1) // ps * ps)  # whole pages of each prompt
    view = snap(fx, state)
    w = view["window"]
    assert (w["window"], w["floor"], w["epochs"]) == (1, 0, [1, 0])
    # the older namespace is kept unlocked (not pinned, not awaiting reclaim): the walk-free current row includes it
    assert view["stale"]["pinned_tokens"] == view["stale"]["awaiting_reclaim_tokens"] == 0
    current = view["epochs"][0]
    assert current["includes_in_window_older"] and current["cached_tokens"] == old_tokens + new_tokens
    if is_python(fx):
        assert w["tokens_by_namespace"] == {"0": old_tokens, "1": new_tokens}
    else:
        assert w["tokens_by_namespace"] is None
    assert "staleness window 1: epochs [1, 0] kept" in render(view)
    assert old.rid != new.rid
