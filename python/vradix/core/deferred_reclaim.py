"""Data-path step 3 (reclaim) — deferred reclaim: a publication marks the old epoch's KV stale in O(1); the stale nodes are freed later.

A lock-aware bump used to free every unlocked stale node at once with SGLang's eviction, a per-node Python walk that
ran while generation was paused (tens of milliseconds per million cached tokens). SGLang 0.5.23's tree cores have no
native call that drops a namespace's subtree while part of it is locked (`root_node_handle` ignores the namespace,
`drop_subtree_no_host` only drops a device leaf whose descendants are host-only), so the bump now only *defers* the
reclaim (`defer`), and the stale nodes are freed afterwards, by the same per-node eviction, in three places:

1. `step`: one bounded slice per scheduler iteration (at most `SLICE_NODES` nodes and about `SLICE_TOKENS` tokens
   freed, `SLICE_VISITS` candidates looked at), before the scheduler picks its next batch. A slice's work does not
   grow with the cache: on the Rust TreeCore it opens SGLang's eviction walk (started natively, no per-leaf Python
   work); on the Python TreeCore, whose walk builds a heap over every evictable leaf at each start, the slices draw
   their candidates from a frontier of stale leaves kept across slices (`_Frontier`) and never open that walk;
2. `reclaim`: eagerly, stale first, whenever SGLang evicts for any reason (an allocation that needs memory): before
   SGLang's own walk, whatever its eviction policy (LRU, LFU, priority, ...), so fresh KV is evicted only once no
   stale KV is left to free;
3. `finish`: to completion when the engine is fully idle, before SGLang's strict idle check and its idle sleep.

With a staleness window (`vradix.core.staleness`) an eviction on demand has a second tier: once no KV older than the
window is left to free, in-window KV of older namespaces goes before any current-epoch KV (`evict_older_in_window`);
only then does SGLang's own eviction run.

Which node is stale: its key names its namespace (`namespace_epoch`), and every node of another namespace than the
current epoch's is stale (with a staleness window, of a namespace older than the window). The eviction order yields
each candidate once per walk, so this costs one key read per candidate looked at, and no insert pays for it.

Invariants:
- Between bumps, every node of an older epoch is locked by a live crossing request, or awaits this reclaim
  (`active`). A stale node is never matched (its namespace is never looked up again), so deferring its free never
  serves stale KV; it only delays giving its pages back.
- Stale KV in the tree is ordinary evictable KV to SGLang: `available + evictable + protected == total` holds at all
  times, and admission/eviction see it as reclaimable.
- Only unlocked leaves are evicted, each once, through SGLang's own device eviction (`reclaim.free_stale_leaf`), so
  no page is freed twice and a locked node is never touched.
- `pending_tokens` is the stale tokens still in the tree unlocked: set to `evictable_size()` at the bump (the new
  namespace is empty, so everything evictable is stale), lowered by every stale free, raised when a crossing request
  releases stale nodes that stay in the tree (`note_release`). The reclaim is complete when it reaches 0, or when a
  walk runs out of candidates without finding a stale one.
- Only caches whose tree holds nothing but full-attention KV and that have no HiCache host tier defer (`supported`);
  the others keep the bulk reclaim at the bump (`reclaim.free_all_unlocked`, `host_tier.free_stale_host`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore

from vradix import settings
from vradix.core.reclaim import batched_frees, free_stale_leaf

if TYPE_CHECKING:  # vradix.engine imports this module (the Engine owns a DeferredReclaim)
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    from vradix.engine import Engine

#: nodes one scheduler iteration frees at most (~20 us each on the Rust TreeCore, plus one allocator free per slice)
#: (VRADIX_RECLAIM_SLICE_NODES, read at import: an unusable value fails the import with `settings.SettingsError`)
SLICE_NODES: int = settings.value("VRADIX_RECLAIM_SLICE_NODES")
#: eviction candidates one iteration looks at at most (fresh ones are skipped: under LFU or priority policies the
#: stale nodes need not come first in SGLang's eviction order)
SLICE_VISITS: int = 2 * SLICE_NODES + 32
#: stale tokens after which a slice stops (it finishes the node it is on: a node is never split): the copy of freed
#: slots a slice hands the allocator grows with tokens, not nodes, and one node can hold a whole long prompt
SLICE_TOKENS: int = 256 * SLICE_NODES


@dataclass
class DeferredReclaim:
    """The engine's deferred-reclaim part: the stale KV a bump left in the tree, how it is reclaimed, and what has
    reclaimed it so far (server info `stale_reclaim`). Changes only through its methods: `defer`, `cancel`,
    `note_release`, `step`, `reclaim` and `finish`. The walks free what `reclaimable` names for the engine they are
    given (its epoch, its staleness window) and count it in the engine's freed tokens."""

    active: bool = False
    pending_tokens: int = 0
    #: stale tokens freed by the per-iteration slices, by eviction on demand, and at idle
    tokens_freed_by_slices: int = 0
    tokens_freed_on_demand: int = 0
    tokens_freed_at_idle: int = 0
    slices: int = 0
    #: the most nodes, candidates and tokens a slice freed / looked at (bounded by SLICE_NODES / SLICE_VISITS /
    #: SLICE_TOKENS plus the last node's tokens)
    max_slice_nodes: int = 0
    max_slice_visits: int = 0
    max_slice_tokens: int = 0
    completed: int = 0
    #: the Python TreeCore slices' candidates, kept across slices (not reported)
    frontier: "_Frontier" = field(default_factory=lambda: _Frontier(), repr=False, compare=False)

    def as_dict(self) -> dict[str, Any]:
        return {"active": self.active, "pending_tokens": self.pending_tokens,
                "tokens_freed_by_slices": self.tokens_freed_by_slices,
                "tokens_freed_on_demand": self.tokens_freed_on_demand,
                "tokens_freed_at_idle": self.tokens_freed_at_idle, "slices": self.slices,
                "max_slice_nodes": self.max_slice_nodes, "max_slice_visits": self.max_slice_visits,
                "max_slice_tokens": self.max_slice_tokens,
                "completed": self.completed, "slice_nodes": SLICE_NODES, "slice_tokens": SLICE_TOKENS}

    def defer(self, cache: UnifiedRadixCache) -> int:
        """At a bump: everything evictable is now stale (the new namespace is empty). O(1). Returns the pending
        tokens."""
        self.active = True
        self.pending_tokens = cache.evictable_size()
        self.frontier.clear()
        return self.pending_tokens

    def cancel(self) -> None:
        """The whole tree was dropped (reset): nothing is pending any more."""
        self.active, self.pending_tokens = False, 0
        self.frontier.clear()

    def note_release(self, evictable_before: int, evictable_after: int) -> None:
        """A crossing request released its lock while reclaim is pending: stale nodes it unlocked that the
        release-time reclaim could not free (they still have unlocked stale children) are now pending too. A crossing
        request locks only stale nodes and never inserts, so the change in evictable tokens is exactly the change in
        stale ones."""
        if self.active:
            self.pending_tokens = max(0, self.pending_tokens + evictable_after - evictable_before)

    def step(self, engine: Engine, cache: UnifiedRadixCache) -> int:
        """One bounded slice (a scheduler iteration). Returns stale tokens freed."""
        if not self.active:
            return 0
        freed, nodes, visits = self._walk(engine, cache, max_nodes=SLICE_NODES, max_visits=SLICE_VISITS,
                                          need_tokens=SLICE_TOKENS,
                                          from_frontier=isinstance(cache.tree_core, UnifiedTreeCore))
        self.slices += 1
        self.max_slice_nodes = max(self.max_slice_nodes, nodes)
        self.max_slice_visits = max(self.max_slice_visits, visits)
        self.max_slice_tokens = max(self.max_slice_tokens, freed)
        self.tokens_freed_by_slices += freed
        return freed

    def reclaim(self, engine: Engine, cache: UnifiedRadixCache, need_tokens: int) -> int:
        """Eviction on demand: free up to `need_tokens` stale tokens before SGLang evicts anything. Returns tokens
        freed."""
        if not self.active or need_tokens <= 0:
            return 0
        freed, _, _ = self._walk(engine, cache, need_tokens=need_tokens)
        self.tokens_freed_on_demand += freed
        return freed

    def finish(self, engine: Engine, cache: UnifiedRadixCache) -> int:
        """Reclaim everything still pending (the engine is idle: nothing waits for this thread). Returns tokens
        freed."""
        if not self.active:
            return 0
        freed, _, _ = self._walk(engine, cache)
        self.tokens_freed_at_idle += freed
        return freed

    def _walk(self, engine: Engine, cache: UnifiedRadixCache, *, max_nodes: Optional[int] = None,
              max_visits: Optional[int] = None, need_tokens: Optional[int] = None,
              from_frontier: bool = False) -> tuple[int, int, int]:
        """Free reclaimable leaves until a bound is reached, nothing stale is pending, or the candidates run out (then
        the reclaim is complete). Candidates come from SGLang's device eviction order, or, with `from_frontier`
        (Python TreeCore slices), from the frontier kept across slices. Returns (tokens freed, nodes freed,
        candidates visited)."""
        budget = self.pending_tokens if need_tokens is None else min(self.pending_tokens, need_tokens)

        def is_victim(node_id: int) -> bool:
            return reclaimable(engine, cache, node_id)

        if from_frontier:
            freed, nodes, visits, exhausted = _free_frontier_leaves(cache, self.frontier, is_victim,
                                                                    max_tokens=budget, max_nodes=max_nodes,
                                                                    max_visits=max_visits)
        else:
            freed, nodes, visits, exhausted = _free_leaves(cache, is_victim, max_tokens=budget, max_nodes=max_nodes,
                                                           max_visits=max_visits)
        engine.freed.count(freed)
        self.pending_tokens = max(0, self.pending_tokens - freed)
        if self.pending_tokens == 0 or exhausted:
            self.pending_tokens = 0
            self.active = False
            self.completed += 1
        return freed, nodes, visits


class _Frontier:
    """The Python TreeCore slices' walk over the tree, kept across slices, so that a slice costs O(its budget) instead
    of the O(evictable leaves) heap SGLang's Python eviction walk builds at every start.

    A depth-first walk from the root, in each node's child order (insertion order: the same on every TP rank, so
    every rank frees the same nodes in the same slices): a node taken is freed when it is an evictable device leaf,
    else its children join (one C-level list extend); a node the reclaim may not free (`reclaimable` false: a
    current-epoch or in-window namespace) is not descended into. A freed leaf's parent joins again when the free made
    it a leaf, so one pass reaches every unlocked stale node, bottom up.

    Invariants: it holds tree nodes (SGLang's `UnifiedTreeNode`), each checked when taken, against the core's own
    evictable device-leaf set and `reclaimable`, so a node freed, locked or fresh since it joined is skipped or
    descended into, never freed. When a pass ends while stale tokens are pending (stale nodes unlocked since), a new
    pass starts at the root; a pass that freed nothing means nothing stale is left to free."""

    def __init__(self) -> None:
        self.nodes: list[Any] = []
        self.seeded = False
        self.freed_since_seed = False
        #: passes started since the last bump
        self.seeds = 0

    def clear(self) -> None:
        self.nodes, self.seeded, self.freed_since_seed, self.seeds = [], False, False, 0

    def take(self, root: Any) -> tuple[Any, bool]:
        """The next node (None when there is none), and whether the candidates ran out for good."""
        if not self.nodes:
            if self.seeded and not self.freed_since_seed:
                return None, True
            self.nodes, self.seeded, self.freed_since_seed = [root], True, False
            self.seeds += 1
        return self.nodes.pop(), False

    def descend(self, node: Any) -> None:
        """`node` is not a leaf: its children join, the first child taken first."""
        self.nodes.extend(reversed(node.children.values()))

    def note_freed(self, parent: Any, leaves: set[Any]) -> None:
        """A node was freed: its parent joins when the free made it an evictable leaf."""
        self.freed_since_seed = True
        if parent is not None and parent in leaves:
            self.nodes.append(parent)


def supported(cache: UnifiedRadixCache) -> bool:
    """Whether the stale KV of `cache` can be reclaimed after the bump: full-attention KV only, no HiCache host tier,
    no external cache linker (their stale host copies are freed at the bump, `host_tier`)."""
    return (tuple(cache.tree_components) == (ComponentType.FULL,)
            and getattr(cache, "cache_controller", None) is None
            and getattr(cache, "linker", None) is None
            and getattr(cache, "buffer_pipeline", None) is None)


def reclaimable(state: Engine, cache: UnifiedRadixCache, node_id: int) -> bool:
    """Whether the deferred reclaim may free `node_id`: its key names another namespace than the current epoch's (or
    none vradix knows); with a staleness window (`vradix.core.staleness`), a namespace older than the window."""
    epoch = namespace_epoch(state, cache, node_id)
    if state.staleness.window == 0:
        return epoch != state.epoch
    return epoch is None or epoch < state.window_floor


def namespace_epoch(state: Engine, cache: UnifiedRadixCache, node_id: int) -> Optional[int]:
    """The epoch of the namespace `node_id`'s key names (None: no namespace vradix knows)."""
    extra_key, _ = cache.tree_core.prefetch_anchor_info(node_id)
    return state.epoch_of(extra_key)


def evict_older_in_window(state: Engine, cache: UnifiedRadixCache, need_tokens: int) -> int:
    """The second eviction tier (window above 0, under memory pressure, after the deferred reclaim and before
    SGLang's own eviction): free up to `need_tokens` of KV in namespaces older than the current epoch but still in the
    window, in SGLang's device eviction order. Returns tokens freed, also counted in
    `state.staleness.tokens_evicted_in_window`.

    Invariants: only unlocked leaves SGLang's eviction walk yields are freed, each once, through SGLang's own device
    eviction (`reclaim.free_stale_leaf`), so `available + evictable + protected == total` holds after it; a
    current-epoch node, or one whose key names no known namespace, is never freed here (SGLang's own eviction
    decides about those). Cost: at most one pass of SGLang's eviction order, only while an older epoch is in the
    window."""
    if need_tokens <= 0 or state.window_floor >= state.epoch:
        return 0

    def older_in_window(node_id: int) -> bool:
        epoch = namespace_epoch(state, cache, node_id)
        return epoch is not None and epoch < state.epoch

    freed, _, _, _ = _free_leaves(cache, older_in_window, max_tokens=need_tokens)
    state.staleness.count_evicted_in_window(freed)
    return freed


def _free_frontier_leaves(cache: UnifiedRadixCache, frontier: _Frontier, is_victim: Callable[[int], bool], *,
                          max_tokens: int, max_nodes: Optional[int] = None,
                          max_visits: Optional[int] = None) -> tuple[int, int, int, bool]:
    """`_free_leaves` over `frontier` instead of SGLang's eviction walk (Python TreeCore): no walk is opened, so no
    per-leaf heap is built; a node is freed when `is_victim` and the core's evictable device-leaf set (unlocked, no
    device child) both say so. Same returns."""
    leaves = cache.tree_core.evictable_device_leaves
    root = cache.tree_core.root_node
    tracker = {ct: 0 for ct in cache.tree_components}
    nodes = visits = 0
    exhausted = False
    with batched_frees(cache.token_to_kv_pool_allocator):
        while tracker[ComponentType.FULL] < max_tokens:
            if (max_nodes is not None and nodes >= max_nodes) or (max_visits is not None and visits >= max_visits):
                break
            node, exhausted = frontier.take(root)
            if node is None:
                break
            visits += 1
            if node is not root and (node.component_data[ComponentType.FULL].value is None or not is_victim(node.id)):
                continue  # freed since it joined (no KV on the device, no node), or fresh: nor anything below it
            if node not in leaves:
                frontier.descend(node)
                continue
            parent = node.parent
            if free_stale_leaf(cache, node.id, tracker):
                nodes += 1
                frontier.note_freed(parent, leaves)
    return tracker[ComponentType.FULL], nodes, visits, exhausted


def _free_leaves(cache: UnifiedRadixCache, is_victim: Callable[[int], bool], *, max_tokens: int,
                 max_nodes: Optional[int] = None, max_visits: Optional[int] = None) -> tuple[int, int, int, bool]:
    """Walk SGLang's device eviction order once, freeing only the leaves `is_victim` names (a freed leaf's parent
    joins the walk when it becomes a leaf), until `max_tokens` are freed, a bound is reached, or the candidates run
    out. Returns (tokens freed, nodes freed, candidates visited, whether the candidates ran out)."""
    core = cache.tree_core
    tracker = {ct: 0 for ct in cache.tree_components}
    nodes = visits = 0
    exhausted = False
    with batched_frees(cache.token_to_kv_pool_allocator):
        core.evict_device_start(ComponentType.FULL, cache.evictable_size() + 1)
        try:
            while tracker[ComponentType.FULL] < max_tokens:
                if (max_nodes is not None and nodes >= max_nodes) or (max_visits is not None and visits >= max_visits):
                    break
                node_id, _ = cache._evict_device_next_node(ComponentType.FULL, tracker)
                if node_id is None:
                    exhausted = True
                    break
                visits += 1
                if is_victim(node_id) and free_stale_leaf(cache, node_id, tracker):
                    nodes += 1
        finally:
            core.evict_device_end(ComponentType.FULL)
    return tracker[ComponentType.FULL], nodes, visits, exhausted


def free_leaves_where(cache: UnifiedRadixCache, is_victim: Callable[[int], bool]) -> int:
    """Free every unlocked leaf `is_victim` names, and each parent that becomes one, in one pass of SGLang's device
    eviction order (the LoRA unload, `vradix.core.lora`). Returns tokens freed."""
    freed, _, _, _ = _free_leaves(cache, is_victim, max_tokens=cache.evictable_size())
    return freed
