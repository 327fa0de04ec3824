"""Data-path step 3 (reclaim): free stale KV, lock-aware.

Three entry points, all against SGLang's real tree cache API (identical on the Rust and Python TreeCores):
- `free_all_unlocked(cache)`: at a bump the new namespace is still empty, so every evictable node is stale. One
  `evict(evictable_size)` call frees them all (cascading up to locked paths) inside one allocator free group, i.e. one
  batched `free` of the slot tensors. Used only by caches that cannot defer this work (`deferred_reclaim.supported`:
  HiCache host tier, hybrid components); the others leave it to `vradix.core.deferred_reclaim`, after the bump.
- `free_all_by_reset(cache)`: the same result when no request holds KV at all (nothing can be locked), at the cost
  of a stock flush: drop the tree and free all its slots in one call (SGLang's reset also clears a HiCache host pool).
  Full-attention trees only (`resettable`): a hybrid tree's recurrent states are not slots of the KV allocator.
- `free_released_path(cache, node)`: when a crossing request releases its lock on a stale node, read its path once
  and evict, from the node towards the root, each node that is now an unlocked leaf. Stops at the first node another
  holder still locks or that still has children. Linear in the path length. Stale KV is dropped, never backed up to
  a HiCache host pool (`free_stale_leaf`).
The HiCache host copies of stale nodes are freed by `vradix.core.host_tier` at the bump.

Invariant maintained between bumps: every node of an older epoch is locked by a live crossing request, or awaits the
deferred reclaim (`vradix.core.deferred_reclaim`). Nothing of an old epoch is ever inserted (crossing requests skip
insertion), so a stale node can only lose locks; the moment it loses its last one it is freed here when it is a leaf,
and otherwise (its unlocked stale children await the deferred reclaim) joins the deferred reclaim, never left to LRU.

Safety: the Rust TreeCore panics (and poisons itself) if asked to evict a locked or inner node, so the victims are
chosen from the path's child counts and its unlocked suffix (`unlocked_suffix_len`), which reads lock state without
changing it.
"""
from __future__ import annotations

from contextlib import contextmanager

from sglang.srt.mem_cache.base_prefix_cache import EvictParams
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore


def free_all_unlocked(cache) -> int:
    """Evict every unlocked node in one batched operation. Returns full-attention tokens freed."""
    if cache.evictable_size() == 0:
        return 0
    with batched_frees(cache.token_to_kv_pool_allocator):
        result = cache.evict(EvictParams(
            num_tokens=cache.evictable_size(),
            swa_num_tokens=cache.swa_evictable_size() if cache.supports_swa() else 0,
            mamba_num=cache.mamba_evictable_size() if cache.supports_mamba() else 0,
        ))
    return result.num_tokens_evicted


def resettable(cache) -> bool:
    """Whether `free_all_by_reset` frees everything `cache`'s tree holds: its values are full-attention KV slots
    only. A hybrid component's slots live elsewhere (a Mamba node's recurrent state is a slot of the request pool's
    Mamba allocator, which the tree's reset does not free; stock `flush_cache` clears that pool wholesale), so such a
    cache frees its stale nodes by eviction, which frees every component of each node."""
    return tuple(cache.tree_components) == (ComponentType.FULL,)


def storage_attached(cache) -> bool:
    """Whether `cache` has a HiCache storage (L3) backend attached. Its tree's reset stops and restarts the cache
    controller's storage threads, and stops the scheduler when one is still inside a store call after SGLang's
    bounded join (a queued request's prefetch: stock SGLang never resets then, its flush waits for an empty queue).
    A bump on such a cache frees the stale KV by eviction instead; the publication revokes the prefetches itself."""
    return bool(getattr(getattr(cache, "cache_controller", None), "enable_storage", False))


def free_all_by_reset(cache) -> int:
    """Fast path when no request holds KV and nothing is locked, for a `resettable` cache: drop the whole tree at
    once (what stock `flush_cache` does) and give its slots back in one `free`. Returns tokens freed."""
    values = cache.tree_core.all_values_flatten()
    freed = cache.evictable_size()
    cache.reset()
    if len(values):
        cache.token_to_kv_pool_allocator.free(values)
    return freed


@contextmanager
def batched_frees(allocator):
    """Collect the allocator frees of the block into one `free` (joins an enclosing free group if one is open)."""
    if getattr(allocator, "free_group", None) is not None:
        yield
        return
    allocator.free_group_begin()
    try:
        yield
    finally:
        allocator.free_group_end()


def unlocked_suffix_len(cache, path) -> int:
    """How many nodes at the end of `path` (a `collect_path_info` path, root side first) have no lock holder, read
    without changing any lock count or LRU state.

    A lock on a node also locks every ancestor, so the unlocked nodes of a path are exactly a suffix of it.
    The Python TreeCore exposes each node's lock counts (`node_by_id`), which are read directly. The Rust TreeCore
    has no read-only per-node lock accessor in SGLang 0.5.23 (its `node_by_id` is not implemented, and
    `walk_for_kv_canary(unlocked_only=True)` walks the whole tree), so there one balanced `lock`/`unlock` pair on the
    path's end node measures it. Locking moves exactly the unlocked suffix's device tokens from evictable to
    protected, and the unlock moves them back with the same receipt. Neither core touches LRU stamps on
    lock/unlock (`test_lock_probe_changes_neither_lock_counts_nor_lru_order`).
    """
    if not path:
        return 0
    if isinstance(cache.tree_core, UnifiedTreeCore):
        return _unlocked_suffix_by_lock_refs(cache.tree_core, path)
    before = cache.protected_size()
    probe = cache.lock(path[-1].node_id)
    moved = cache.protected_size() - before
    cache.unlock(probe)
    n, tokens = 0, 0
    for info in reversed(path):
        # a node without device KV (None) or an unexplained remainder ends the suffix: never over-count
        if not info.full_value_len or tokens + info.full_value_len > moved:
            break
        tokens += info.full_value_len
        n += 1
    return n


def _unlocked_suffix_by_lock_refs(core, path) -> int:
    n = 0
    for info in reversed(path):
        if any(cd.lock_ref > 0 for cd in core.node_by_id(info.node_id).component_data):
            break
        n += 1
    return n


def evictable_tail(path, unlocked: int) -> list:
    """The node ids of `path` to evict, deepest first: the end node if it is an unlocked leaf holding device KV, then
    each unlocked parent with device KV that the eviction below it leaves without children. `unlocked` is
    `unlocked_suffix_len(cache, path)`. A node without device KV (HiCache demoted it to host) ends the walk: it is no
    device leaf to evict."""
    victims = []
    for depth, info in enumerate(reversed(path)):
        # the child on the path (depth > 0) is already a victim, so it does not count as a remaining child
        if depth >= unlocked or info.num_children - (depth > 0) or not info.full_value_len:
            break
        victims.append(info.node_id)
    return victims


def free_released_path(cache, node_id) -> int:
    """Evict the now-unlocked stale suffix of the path ending at `node_id`. Returns tokens freed.

    Linear in the path length: one `collect_path_info` query, one lock read (`unlocked_suffix_len`), then one
    `free_stale_leaf` per victim. Every victim is an unlocked leaf when it is evicted, which the Rust TreeCore
    requires (it panics and poisons itself otherwise): a victim that SGLang does not free at once keeps its parent an
    inner node, so the walk stops there and leaves the rest to SGLang's own eviction."""
    if node_id is None or cache.is_root(node_id):
        return 0
    (path,) = cache.tree_core.collect_path_info([node_id])
    if not path or path[-1].num_children:
        return 0
    victims = evictable_tail(path, unlocked_suffix_len(cache, path))
    tracker = {ct: 0 for ct in cache.tree_components}
    with batched_frees(cache.token_to_kv_pool_allocator):
        for victim in victims:
            if not free_stale_leaf(cache, victim, tracker):
                break
    return tracker[ComponentType.FULL]


def free_stale_leaf(cache, node_id, tracker) -> bool:
    """Free one unlocked stale device leaf, never backing it up. Returns False when SGLang kept the node.

    Stale KV has no future reader, so it is dropped, not saved: SGLang's write-back eviction would first back an
    unbacked leaf up to host (it returns that backup as a `BackupKV` and keeps the node until it ran), so under
    write-back such a leaf is dropped with SGLang's own no-backup path (`drop_subtree_no_host`, which frees it and
    nothing else here: the victim has no other child). Write-through deletes an unbacked leaf outright; a backed-up
    one would be demoted, but none is: the bump freed the host copies of the stale nodes crossing requests hold
    (`host_tier.free_stale_host`)."""
    core = cache.tree_core
    if cache.is_write_back and not core.is_backuped(node_id):
        result = core.drop_subtree_no_host(node_id)
        cache._apply_eviction_result(result)
        cache._accumulate_tracker(tracker, result.tracker)
        return result.is_dropped
    return cache._evict_device_leaf(node_id, tracker) is None
