"""LoRA-scoped invalidation: (re)loading adapter X invalidates only X's cached entries.

SGLang 0.5.23 already keys LoRA requests apart: every `load_lora_adapter` mints a fresh `lora_id` (a uuid), which
`Req.__init__` appends to `extra_key`, and vradix keeps it as the *suffix* after its epoch prefix. So after X is
unloaded and loaded again (same name, new weights), X's requests match only KV computed with the new adapter, while
the base model's and other adapters' entries keep being shared. What SGLang leaves behind is the old X entries: no
request can match them any more, yet they hold KV slots until LRU pressure reaches them.

vradix frees them when X is unloaded. It remembers, per `lora_id`, the tree nodes that requests of that adapter
inserted (`remember_adapter_node`, after each insert), and at unload walks each one towards the root freeing the
nodes that are now unlocked leaves (`reclaim.free_released_path`). Every node on such a path is in X's namespace,
because the namespace is part of the first edge's key, so nothing of another adapter or of the base model is touched.
A remembered node that LRU already evicted is skipped (the TreeCores raise KeyError for unknown ids; node ids are not
reused). A base-weight publication still bumps the epoch and invalidates every namespace, adapters included.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from vradix import reclaim
from vradix.state import EpochState

#: the smallest size at which a remembered-node set is pruned (dead ids accumulate as LRU evicts)
PRUNE_AT = 4096


@dataclass
class AdapterNodes:
    """The tree nodes one adapter's requests inserted, some possibly already evicted by LRU.

    Invariant: `len(nodes) <= prune_at` after every insert. A prune keeps the live ids and sets
    `prune_at = max(PRUNE_AT, 2 * live)`, so between two prunes at least `prune_at / 2` ids were added, and each
    prune checks at most `prune_at + 1` ids: O(1) amortised liveness checks per insert, whatever LRU does.
    """

    nodes: set = field(default_factory=set)
    prune_at: int = field(default_factory=lambda: PRUNE_AT)
    #: prune passes so far (observability; the tests bound it)
    prunes: int = 0

    def add(self, cache, node_id) -> None:
        self.nodes.add(node_id)
        if len(self.nodes) > self.prune_at:
            self.prune(cache)

    def prune(self, cache) -> None:
        self.nodes = {n for n in self.nodes if _alive(cache, n)}
        self.prune_at = max(PRUNE_AT, 2 * len(self.nodes))
        self.prunes += 1


def remember_adapter_node(state: EpochState, cache, req) -> None:
    """After an insert by a LoRA request: remember the node its lock now sits on (amortised O(1))."""
    lora_id = getattr(req, "lora_id", None)
    lock = getattr(req, "lock", None)
    if lora_id is None or lock is None or lock.node is None or cache.is_root(lock.node):
        return
    state.adapter_nodes.setdefault(lora_id, AdapterNodes()).add(cache, lock.node)


def free_adapter_entries(state: EpochState, cache, lora_id: Optional[str]) -> int:
    """Free the unlocked cached entries of adapter `lora_id`. Returns tokens freed."""
    entry = state.adapter_nodes.pop(lora_id, None)
    freed = 0
    with reclaim.batched_frees(cache.token_to_kv_pool_allocator):
        for node in sorted(entry.nodes if entry is not None else (), reverse=True):
            if _alive(cache, node):
                freed += reclaim.free_released_path(cache, node)
    state.stale_tokens_freed_total += freed
    return freed


def _alive(cache, node_id) -> bool:
    try:
        cache.tree_core.collect_path_info([node_id])
    except KeyError:
        return False
    return True
