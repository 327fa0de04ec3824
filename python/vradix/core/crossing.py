"""The crossing requests of one engine: the live requests that held KV when a bump happened.

A crossing request keeps its own KV to its end, never inserts it into the tree and never lends it; the stale nodes its
tree lock pins are freed when it releases them (`Engine.on_release`). Only requests that hold a tree lock are kept
here: one retracted with a KV backup crosses too (`ReqState.crossed`) but pins no node.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, ValuesView

from vradix import request

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    from vradix.engine import Engine


@dataclass
class CrossingRequests:
    """id(req) -> a live crossing request that holds a tree lock. Keyed by object identity: two live requests may share
    a user-supplied rid. Changes only through its methods: `mark`, `sweep_released` and `release`."""

    held: Dict[int, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.held)

    def __contains__(self, key: int) -> bool:
        return key in self.held

    def values(self) -> ValuesView[Any]:
        return self.held.values()

    def mark(self, engine: "Engine", req: "Req") -> None:
        """`req` holds KV across the bump to `engine`'s current epoch: keep its KV, never insert it, free its stale
        locks at release. Its KV history gets the new epoch from its committed position on
        (`request.record_crossing`)."""
        st = request.require(req)
        request.record_crossing(req, st, engine)
        if st.mark_crossed(req.skip_radix_cache_insert):
            req.skip_radix_cache_insert = True
        if getattr(req, "lock", None) is not None:
            self.held[id(req)] = req

    def sweep_released(self) -> int:
        """Forget crossing requests that no longer hold a tree lock (released without `release_kv_cache`: P/D decode,
        streaming sessions unlock directly); the bump's reclaim frees what they left unlocked. Returns how many."""
        gone = [k for k, r in self.held.items() if getattr(r, "lock", None) is None]
        for k in gone:
            del self.held[k]
        return len(gone)

    def release(self, req: "Req") -> bool:
        """Forget `req` as a crossing request (it released its KV); whether it was one."""
        return self.held.pop(id(req), None) is not None

    def tokens_pinned(self, cache: "UnifiedRadixCache") -> int:
        """Tokens of the distinct stale nodes on the paths the crossing requests lock."""
        nodes = [r.lock.node for r in self.held.values() if getattr(r, "lock", None) is not None]
        nodes = [n for n in nodes if n is not None and not cache.is_root(n)]
        if not nodes:
            return 0
        seen = {}
        for path in cache.tree_core.collect_path_info(nodes):
            for info in path:
                seen[info.node_id] = info.path_end - info.path_start
        return sum(seen.values())
