"""Step 3 — reclaim: free stale KV, lock-aware.

Three entry points, all against SGLang's real tree cache API (identical on the Rust and Python TreeCores):
- `free_all_unlocked(cache)`: at a bump the new namespace is still empty, so every evictable node is stale. One
  `evict(evictable_size)` call frees them all (cascading up to locked paths) inside one allocator free group, i.e. one
  batched `free` of the slot tensors.
- `free_all_by_reset(cache)`: the same result when no request holds KV at all (nothing can be locked), at the cost
  of a stock flush: drop the tree and free all its slots in one call.
- `free_released_path(cache, node)`: when a crossing request releases its lock on a stale node, walk its path from
  the node towards the root and evict each node that is now an unlocked leaf. Stops at the first node another holder
  still locks or that still has children.

Invariant maintained between bumps: every node of an older epoch is locked by a live crossing request. Nothing of an
old epoch is ever inserted (crossing requests skip insertion), so a stale node can only lose locks, and the moment it
loses its last one it is freed here, not left to LRU.

Safety: the Rust TreeCore panics (and poisons itself) if asked to evict a locked or inner node, so each victim is
checked first with `is_unlocked_leaf`, which uses only public lock/unlock accounting.
"""
from __future__ import annotations

from contextlib import contextmanager

from sglang.srt.mem_cache.base_prefix_cache import EvictParams
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType


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


def free_all_by_reset(cache) -> int:
    """Fast path when no request holds KV and nothing is locked: drop the whole tree at once (what stock
    `flush_cache` does) and give its slots back in one `free`. Returns tokens freed."""
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


def is_unlocked_leaf(cache, node_id) -> bool:
    """True iff `node_id` has no children and no lock holder.

    A lock on a node also locks all its ancestors, so locking an already-locked node moves no tokens from evictable
    to protected, while locking an unlocked one moves at least its own tokens. The probe lock is released at once.
    """
    (info,) = cache.tree_core.collect_path_info([node_id])
    if not info or info[-1].num_children:
        return False
    before = cache.protected_size()
    probe = cache.lock(node_id)
    moved = cache.protected_size() - before
    cache.unlock(probe)
    return moved > 0


def free_released_path(cache, node_id) -> int:
    """Evict the now-unlocked stale suffix of the path ending at `node_id`. Returns tokens freed."""
    if node_id is None or cache.is_root(node_id):
        return 0
    (path,) = cache.tree_core.collect_path_info([node_id])
    tracker = {ct: 0 for ct in cache.tree_components}
    with batched_frees(cache.token_to_kv_pool_allocator):
        for info in reversed(path):
            if not is_unlocked_leaf(cache, info.node_id):
                break
            cache._evict_device_leaf(info.node_id, tracker)
    return tracker[ComponentType.FULL]


def stale_tokens_pinned(cache, holder_nodes) -> int:
    """Tokens of the distinct stale nodes on the paths of the given lock nodes."""
    nodes = [n for n in holder_nodes if n is not None and not cache.is_root(n)]
    if not nodes:
        return 0
    seen = {}
    for path in cache.tree_core.collect_path_info(nodes):
        for info in path:
            seen[info.node_id] = info.path_end - info.path_start
    return sum(seen.values())
