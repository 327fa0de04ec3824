"""Deferred reclaim (`vradix.core.deferred_reclaim`) on SGLang's real UnifiedRadixCache (Rust and Python TreeCores, page sizes
1/16), real allocators, with the vradix hooks installed by `load_plugins()`:
- a lock-aware publication does no eviction work at all, whatever the cached size;
- the per-iteration slices are bounded, evict only stale KV, and end with the pool whole;
- an eviction on demand (an allocation that needs memory) frees stale KV before any fresh KV, under LRU, LFU and
  priority policies, although LFU and priority would pick the fresh KV first;
- a publication while the previous epoch's stale KV is only partly reclaimed, and a crossing request released while
  its epoch's stale KV is pending, keep the accounting exact and the pool whole;
- the post-publication audit does not report pages awaiting the deferred reclaim as leaks.
The hooks are driven through their real functions (`vradix.hooks.reclaim`), the scheduler through `SchedulerView`."""
from array import array

import pytest

from sglang.srt.mem_cache import common
from sglang.srt.mem_cache.base_prefix_cache import InsertParams
from sglang.srt.mem_cache.radix_cache import RadixKey

from vradix.engine import attach
from vradix.testing.harness.cache_fixture import build_cache, seq

CONFIGS = [("rust", 1), ("rust", 16), ("python", 1), ("python", 16)]
IDS = [f"{c}-ps{p}" for c, p in CONFIGS]



def insert(fx, state, tokens, times=1, priority=0):
    """Cache `tokens` under the current epoch (a finished request's insert); `times` > 1 re-inserts the same key,
    raising its nodes' hit counts (LFU)."""
    key = RadixKey(array("q", tokens), extra_key=state.prefix_of_epoch(state.epoch))
    for _ in range(times):
        fx.cache.insert(InsertParams(key=key, value=fx.allocator.alloc(len(tokens)), priority=priority))



def fill(fx, state, groups, width=48):
    """`groups` x 4 cached sequences sharing a prefix per group (~5 nodes per group), then one running request on
    the first sequence (it will cross the next publication)."""
    for g in range(groups):
        base = seq(10_000 + g * 1000, width)
        for k in range(4):
            insert(fx, state, base + seq(500_000 + g * 100 + k * 20, width))
    return fx.running(state, seq(10_000, width) + seq(500_000, width) + [7])


def bump(fx, state, live=()):
    return state.bump(fx.cache, list(live), [], reason="test", label=f"v{state.epoch + 1}")


def tree_slots(fx):
    return set(fx.cache.tree_core.all_values_flatten().tolist())


def pool_is_whole(fx):
    return (fx.cache.evictable_size() == 0 and fx.cache.protected_size() == 0
            and fx.allocator.available_size() == fx.total)


class EvictionCounter:
    """Counts SGLang's device-eviction steps on a real tree core: candidates looked at and leaves evicted."""

    def __init__(self, monkeypatch, fx):
        self.next_node = self.leaves = 0
        core = fx.cache.tree_core
        nxt, leaf = core.evict_device_next_node, core.evict_device_leaf

        def count_next(*a, **k):
            self.next_node += 1
            return nxt(*a, **k)

        def count_leaf(*a, **k):
            self.leaves += 1
            return leaf(*a, **k)

        monkeypatch.setattr(core, "evict_device_next_node", count_next)
        monkeypatch.setattr(core, "evict_device_leaf", count_leaf)

    def total(self):
        return self.next_node + self.leaves


# ---- the publication itself ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("core,page_size", CONFIGS, ids=IDS)
def test_publication_does_no_eviction_work_whatever_the_cached_size(core, page_size, monkeypatch):
    """The bump (epoch, crossing marks, re-binds) evicts nothing and reads no node: the unlocked stale KV stays in the
    tree, evictable, for the deferred reclaim. Same (zero) work for a 10x larger cache."""
    work = []
    for groups in (4, 40):
        fx = build_cache(core, page_size, kv_tokens=1 << 14)
        state = attach(fx.cache)
        holder = fill(fx, state, groups)
        stale = fx.cache.evictable_size()
        counter = EvictionCounter(monkeypatch, fx)
        inv = bump(fx, state, live=[holder])
        work.append(counter.total())
        assert fx.cache.evictable_size() == stale, "the publication evicted stale KV itself"
        assert inv.tokens_deferred == stale == state.deferred.pending_tokens and inv.tokens_freed == 0
        monkeypatch.undo()
    assert work == [0, 0], f"eviction steps during the publication: {work}"


# ---- slices ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("core,page_size", CONFIGS, ids=IDS)
def test_slices_are_bounded_evict_only_stale_kv_and_end_with_the_pool_whole(core, page_size, monkeypatch):
    from vradix.core import deferred_reclaim
    from vradix.hooks.reclaim import reclaim_slice
    fx = build_cache(core, page_size, kv_tokens=1 << 14)
    state = attach(fx.cache)
    holder = fill(fx, state, 12)
    bump(fx, state, live=[holder])
    stale_slots = tree_slots(fx)
    fresh = fx.running(state, seq(90_000, 64) + [3])  # new-epoch KV cached after the bump
    fx.finish(fresh)
    fresh_slots = tree_slots(fx) - stale_slots
    assert fresh_slots
    q = state.deferred
    counter = EvictionCounter(monkeypatch, fx)
    scheduler = fx.scheduler_view(running=[holder])
    per_slice, pending = [], [q.pending_tokens]
    while q.active:
        before = counter.leaves
        reclaim_slice(scheduler)
        per_slice.append(counter.leaves - before)
        pending.append(q.pending_tokens)
        assert len(per_slice) < 100, "the deferred reclaim does not progress"
    assert len(per_slice) > 1, "the stale KV of 12 groups was reclaimed in one slice"
    assert max(per_slice) <= deferred_reclaim.SLICE_NODES and q.max_slice_visits <= deferred_reclaim.SLICE_VISITS
    assert pending == sorted(pending, reverse=True) and pending[-1] == 0
    assert fresh_slots <= tree_slots(fx), "a slice evicted fresh KV"
    reclaim_slice(scheduler)  # nothing pending: no work
    assert counter.leaves == sum(per_slice)
    monkeypatch.undo()
    fx.finish(holder)
    common.evict_from_tree_cache(fx.cache, fx.total)
    assert pool_is_whole(fx), fx.accounting()


# ---- eviction on demand: stale first, whatever the policy ------------------------------------------------------------
@pytest.mark.parametrize("policy", ["lru", "lfu", "priority"])
@pytest.mark.parametrize("core,page_size", [("rust", 1), ("python", 16)], ids=["rust-ps1", "python-ps16"])
def test_an_allocation_that_needs_memory_frees_stale_kv_first(core, page_size, policy):
    """Stale KV that the policy ranks *above* the fresh KV (hot for LFU, high priority) is still evicted first."""
    fx = build_cache(core, page_size, kv_tokens=1024, eviction_policy=policy)
    state = attach(fx.cache)
    for g in range(4):  # stale: hit many times, high priority
        insert(fx, state, seq(1000 + 100 * g, 64), times=6, priority=10)
    holder = fx.running(state, seq(9000, 32) + [1])
    bump(fx, state, live=[holder])
    stale, stale_slots = fx.cache.evictable_size(), tree_slots(fx)
    assert stale > 0, "the publication left no stale KV to reclaim"
    insert(fx, state, seq(5000, 64))  # fresh: hit once, priority 0, inserted after the bump
    insert(fx, state, seq(6000, 64))
    fresh = tree_slots(fx) - stale_slots
    need = fx.allocator.available_size() + stale // 2
    common.evict_from_tree_cache(fx.cache, need)  # the scheduler's eviction for an allocation
    assert fx.allocator.available_size() >= need
    assert fresh <= tree_slots(fx), f"{policy}: fresh KV evicted while stale KV was left"
    assert state.deferred.tokens_freed_on_demand >= stale // 2
    common.evict_from_tree_cache(fx.cache, fx.allocator.available_size() + stale)  # more than the stale KV
    assert not state.deferred.active and state.deferred.pending_tokens == 0
    fx.finish(holder)
    common.evict_from_tree_cache(fx.cache, fx.total)
    assert pool_is_whole(fx), fx.accounting()


# ---- a publication mid-reclaim, a crossing release during pending reclaim --------------------------------------------
@pytest.mark.parametrize("core,page_size", CONFIGS, ids=IDS)
def test_a_publication_mid_reclaim_and_a_crossing_release_keep_the_accounting_exact(core, page_size, monkeypatch):
    from vradix.core import deferred_reclaim
    from vradix.hooks.reclaim import finish_reclaim_when_idle, reclaim_slice
    monkeypatch.setattr(deferred_reclaim, "SLICE_NODES", 2)
    fx = build_cache(core, page_size, kv_tokens=1 << 14)
    state = attach(fx.cache)
    q = state.deferred
    a = fill(fx, state, 6)
    bump(fx, state, live=[a])  # epoch 1: a crosses, the rest of epoch 0 is pending
    reclaim_slice(fx.scheduler_view(running=[a]))
    assert q.active and 0 < q.pending_tokens
    b = fx.running(state, seq(70_000, 40) + [2])  # epoch-1 KV, locked by b
    insert(fx, state, seq(80_000, 40))  # epoch-1 KV, unlocked
    freed_at_second, tree_at_second = (state.freed.tokens_total,
                                       fx.cache.evictable_size() + fx.cache.protected_size())
    bump(fx, state, live=[a, b])  # epoch 2 while epoch 0 is partly reclaimed: epoch 1 joins the pending KV
    assert q.active and q.pending_tokens == fx.cache.evictable_size()
    reclaim_slice(fx.scheduler_view(running=[a, b]))
    freed_before = state.freed.tokens_total
    fx.finish(a)  # a crossing request released while its epoch's stale KV is pending
    assert state.freed.tokens_total >= freed_before
    assert q.pending_tokens <= fx.cache.evictable_size()
    fresh = fx.running(state, seq(60_000, 40) + [5])
    fx.finish(fresh)
    kept = tree_slots(fx)
    fx.finish(b)
    assert q.active
    finish_reclaim_when_idle(fx.scheduler_view())
    assert not q.active and q.pending_tokens == 0
    # only epoch-2 KV is left, all of it unlocked, and everything freed as stale was counted once
    assert fx.cache.protected_size() == 0
    left = fx.cache.evictable_size()
    assert 0 < left <= len(kept)
    common.evict_from_tree_cache(fx.cache, fx.total)
    assert pool_is_whole(fx), fx.accounting()
    # every token of epochs 0 and 1 was freed once and counted once
    assert state.freed.tokens_total == freed_at_second + tree_at_second


# ---- the audit after a publication -----------------------------------------------------------------------------------
@pytest.mark.parametrize("core,page_size", [("rust", 16), ("python", 1)], ids=["rust-ps16", "python-ps1"])
def test_the_audit_does_not_count_pages_awaiting_the_deferred_reclaim_as_leaks(core, page_size):
    from vradix.scheduler.publication import bump_scheduler
    fx = build_cache(core, page_size, kv_tokens=1 << 13)
    state = attach(fx.cache)
    holder = fill(fx, state, 4)
    bump_scheduler(fx.scheduler_view(running=[holder]), reason="test")
    assert state.deferred.pending_tokens > 0 and state.guard.stats.audits == 1
    assert state.guard.stats.leaked_pages_total == 0


def test_node_ids_only_grow():
    """The prefix hits rest on this (an entry whose node is gone is skipped, never confused with a new node): both
    tree cores mint node ids from one increasing counter and never reuse one, across evictions and resets."""
    for core in ("rust", "python"):
        fx = build_cache(core, 1, kv_tokens=1024)
        state = attach(fx.cache)
        seen = []
        for round_ in range(3):
            for k in range(4):
                r = fx.running(state, seq(100 * k + 1, 8) + [round_ + 1])
                seen.extend(info.node_id for info in fx.cache.tree_core.collect_path_info([r.lock.node])[0])
                fx.finish(r)
            common.evict_from_tree_cache(fx.cache, fx.total) if round_ == 0 else fx.cache.reset()
        new_ids = []
        for k in range(3):
            r = fx.running(state, seq(7000 + 100 * k, 8) + [1])
            new_ids.append(max(info.node_id for info in fx.cache.tree_core.collect_path_info([r.lock.node])[0]))
            fx.finish(r)
        assert new_ids == sorted(new_ids) and min(new_ids) > max(seen), (core, seen, new_ids)


# ---- a slice's work does not grow with the cache ---------------------------------------------------------------------
class SliceWork:
    """Work units one slice spends, counted on the real tree core and allocator (not timed): every eviction walk
    started (on the Python TreeCore the start builds a heap over every evictable leaf: it counts as that many units;
    the Rust core starts natively: one unit), every candidate SGLang's walk yields, every leaf evicted, every frontier
    candidate taken, and every allocator `free` (each one copies the allocator's whole free list)."""

    def __init__(self, monkeypatch, fx):
        from vradix.core import deferred_reclaim
        self.units = self.frees = 0
        core, alloc = fx.cache.tree_core, fx.allocator
        python_core = hasattr(core, "evictable_device_leaves")
        start, nxt, leaf, free = (core.evict_device_start, core.evict_device_next_node, core.evict_device_leaf,
                                  alloc.free)
        take = deferred_reclaim._Frontier.take

        def count_start(*a, **k):
            self.units += len(core.evictable_device_leaves) if python_core else 1
            return start(*a, **k)

        def count(fn):
            def counted(*a, **k):
                self.units += 1
                return fn(*a, **k)
            return counted

        def count_free(*a, **k):
            self.frees += getattr(alloc, "free_group", None) is None  # a free inside a free group only appends
            return free(*a, **k)

        monkeypatch.setattr(core, "evict_device_start", count_start)
        monkeypatch.setattr(core, "evict_device_next_node", count(nxt))
        monkeypatch.setattr(core, "evict_device_leaf", count(leaf))
        monkeypatch.setattr(alloc, "free", count_free)
        monkeypatch.setattr(deferred_reclaim._Frontier, "take", count(take))


@pytest.mark.parametrize("core,page_size", CONFIGS, ids=IDS)
def test_a_slice_does_bounded_work_whatever_the_cached_size(core, page_size, monkeypatch):
    """Each slice's work (tree-core steps, candidates, heap elements built, allocator frees) stays under a bound set by
    the slice budget alone, the same for a cache 10x larger: no slice rebuilds a collection over every leaf, restarts
    a walk whose cost grows with the tree, or hands the allocator more than one free. The Python TreeCore's frontier
    is seeded at most twice per reclaim (one list copy each)."""
    from vradix.core import deferred_reclaim
    from vradix.hooks.reclaim import reclaim_slice
    bound = 1 + deferred_reclaim.SLICE_VISITS + deferred_reclaim.SLICE_NODES
    worst = []
    for groups in (8, 80):
        fx = build_cache(core, page_size, kv_tokens=1 << 16)
        state = attach(fx.cache)
        holder = fill(fx, state, groups)
        bump(fx, state, live=[holder])
        fresh = fx.running(state, seq(90_000, 64) + [3])
        fx.finish(fresh)
        work = SliceWork(monkeypatch, fx)
        scheduler = fx.scheduler_view(running=[holder])
        per_slice = []
        while state.deferred.active:
            units, frees = work.units, work.frees
            reclaim_slice(scheduler)
            per_slice.append((work.units - units, work.frees - frees))
            assert len(per_slice) < 1000, "the deferred reclaim does not progress"
        monkeypatch.undo()
        assert len(per_slice) > 1
        assert max(f for _, f in per_slice) <= 1, f"a slice freed to the allocator more than once: {per_slice}"
        assert max(u for u, _ in per_slice) <= bound, f"a slice's work grows with the cache ({groups} groups): {per_slice}"
        assert state.deferred.frontier.seeds <= 2
        assert state.deferred.max_slice_tokens <= deferred_reclaim.SLICE_TOKENS + 2 * 48
        worst.append(max(u for u, _ in per_slice))
        fx.finish(holder)
        common.evict_from_tree_cache(fx.cache, fx.total)
        assert pool_is_whole(fx), fx.accounting()
    assert worst[1] <= bound and worst[0] <= bound, worst


@pytest.mark.parametrize("core,page_size", CONFIGS, ids=IDS)
def test_two_identical_caches_free_the_same_slots_in_the_same_slices(core, page_size, monkeypatch):
    """What a slice frees depends only on the tree, not on the process (object addresses, hash order): every TP rank
    holds the same tree and must free the same KV in the same scheduler iteration."""
    from vradix.core import reclaim as core_reclaim
    from vradix.hooks.reclaim import reclaim_slice
    runs = []
    for _ in range(2):
        fx = build_cache(core, page_size, kv_tokens=1 << 14)
        state = attach(fx.cache)
        holder = fill(fx, state, 12)
        bump(fx, state, live=[holder])
        freed, free = [], core_reclaim.free_stale_leaf

        def recording(cache, node_id, tracker, free=free, freed=freed):
            (path,) = cache.tree_core.collect_path_info([node_id])
            freed[-1].append((path[-1].path_start, path[-1].path_end, path[-1].full_value_len))
            return free(cache, node_id, tracker)

        monkeypatch.setattr("vradix.core.deferred_reclaim.free_stale_leaf", recording)
        scheduler = fx.scheduler_view(running=[holder])
        slots = set(fx.allocator.free_pages.tolist())
        per_slice = []
        while state.deferred.active:
            freed.append([])
            reclaim_slice(scheduler)
            now = set(fx.allocator.free_pages.tolist())
            per_slice.append((freed[-1], sorted(now - slots)))
            slots = now
        monkeypatch.undo()
        runs.append(per_slice)
        # the other run's objects live elsewhere: keep this one's alive so the next cache gets new addresses
        runs.append(fx)
    assert runs[0] == runs[2]
