"""Data-path step 5 (report) — the cache inspector's snapshot: what the versioned radix cache holds, per epoch and label, read-only.

`snapshot` runs on the scheduler thread between batches (where the tree is consistent) and builds a bounded, plain-JSON
view of one engine's cache:
- `epochs`: per epoch (with its label and weight_id): cached device tokens, nodes where known, and for an older epoch
  the stale tokens and nodes pinned by crossing requests, and which requests pin them;
- `stale`: pinned tokens, unlocked stale tokens awaiting the deferred reclaim, the crossing requests (first `limit`);
- `host` / `storage`: the HiCache host pool (tokens per epoch from the host ledger) and the L3 pages this process
  backed up per weight_id, when HiCache is on;
- `window`: with a staleness window, the epochs it keeps, their tokens per namespace where a census has them, and
  what bounded requests reused (`window_view`);
- `top_prefixes`: the cached prefixes requests reused most, by hits, with epoch, label, lock count and last access,
  paginated by `limit` / `offset`.

Where the figures come from (identical on the Rust and the Python TreeCore):
- per-epoch tokens need no tree walk. By the reclaim invariant (docs/design.md) every node of an older epoch is
  locked by a crossing request or awaits the deferred reclaim, so the older epochs hold exactly the crossing
  requests' paths (read with one `collect_path_info`) plus `deferred.pending_tokens`, and the current epoch holds
  the rest of `evictable + protected`;
- hits and last access: SGLang's Rust TreeCore exposes no per-node hit count, last-access stamp or lock count in
  0.5.23 (only its test-only inspection build does), so vradix counts them itself: every admitted request that
  reuses a cached prefix is one hit on the node its match ended at (`PrefixHits.record`, from the admission hook);
- lock count: the live requests whose locked path contains the node (between batches the only device locks are
  request locks), from one `collect_path_info` over the holders' lock nodes;
- nodes of the current epoch: only the Python TreeCore can be walked; there a walk of at most `census_budget` nodes
  counts nodes and tokens per namespace (`census`, keyed by the epoch as a string, "None" for a foreign namespace), and the Python core's own `hit_count`, `lock_ref` and logical
  `last_access_time` are reported beside vradix's figures (`core`). On the Rust core those are None.

Invariants: nothing here changes the tree, its LRU order or any lock count (no match, no lock/unlock probe, no
touch); the work is bounded by the number of crossing and live requests, `limit + offset` prefixes and the census
budget, never by the cached size. `PrefixHits` holds at most `PrefixHits.capacity` entries.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Optional

from vradix.core import host_tier
from vradix.engine import MAX_HEAD_TOKENS, PrefixHit

if TYPE_CHECKING:
    from vradix.engine import Engine

#: bounds on one snapshot's output
MAX_LIMIT = 200
MAX_OFFSET = 10_000
DEFAULT_CENSUS_BUDGET = 4096


class QueryError(ValueError):
    """A snapshot query out of bounds (the HTTP endpoint answers 400)."""


@dataclass(frozen=True)
class Query:
    limit: int = 20
    offset: int = 0
    head: int = 0
    census_budget: int = DEFAULT_CENSUS_BUDGET

    @classmethod
    def parse(cls, params: dict) -> "Query":
        """From query parameters (strings or ints); raises QueryError on a bad or out-of-bounds value."""
        bounds = {"limit": (0, MAX_LIMIT), "offset": (0, MAX_OFFSET), "head": (0, MAX_HEAD_TOKENS),
                  "census_budget": (0, 1 << 20)}
        values = {}
        for name, (lo, hi) in bounds.items():
            if name not in params:
                continue
            try:
                values[name] = int(params[name])
            except (TypeError, ValueError):
                raise QueryError(f"{name} must be an integer, got {params[name]!r}") from None
            if not lo <= values[name] <= hi:
                raise QueryError(f"{name} must be in [{lo}, {hi}], got {values[name]}")
        unknown = set(params) - set(bounds)
        if unknown:
            raise QueryError(f"unknown parameter(s): {', '.join(sorted(unknown))}")
        return cls(**values)


def snapshot(state: Engine, cache, live_reqs: Iterable, query: Query = Query()) -> dict:
    """The inspector's view of `cache` (see the module docstring). `live_reqs`: the requests that may hold a lock."""
    t0 = time.perf_counter()
    holders = [r for r in live_reqs if getattr(r, "lock", None) is not None and r.lock.node is not None
               and not cache.is_root(r.lock.node)]
    crossing = [r for r in state.crossing.values() if getattr(r, "lock", None) is not None]
    stale = stale_view(state, cache, crossing, query.limit)
    evictable, protected = cache.evictable_size(), cache.protected_size()
    cached = evictable + protected
    census_view = census(state, cache, query.census_budget)
    epochs = epoch_rows(state, cached, stale, census_view, query.limit)
    view = {
        "active": True,
        "tree_core": state.tree_core,
        "page_size": cache.page_size,
        "epoch": state.epoch,
        "label": state.label,
        "weight_id": state.weight_id,
        "cached_tokens": cached,
        "evictable_tokens": evictable,
        "protected_tokens": protected,
        "epochs": epochs,
        "stale": {k: v for k, v in stale.items() if not k.startswith("_")},
        "host": host_view(state, cache),
        "storage": storage_view(state, cache),
        "top_prefixes": top_prefixes(state, cache, holders, query),
        "census": census_view,
        "window": window_view(state, census_view),
    }
    view["snapshot_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
    return view


def stale_view(state: Engine, cache, crossing: list, limit: int) -> dict:
    """The older epochs' KV: pinned by crossing requests (tokens and nodes per epoch, each request's share), and
    unlocked, awaiting the deferred reclaim."""
    paths = cache.tree_core.collect_path_info([r.lock.node for r in crossing]) if crossing else ()
    per_epoch: dict = {}
    reqs = []
    for req, path in zip(crossing, paths):
        epoch = state.epoch_of(req.extra_key)
        nodes = per_epoch.setdefault(epoch, {"nodes": {}, "requests": []})
        for info in path:
            nodes["nodes"][info.node_id] = info.path_end - info.path_start
        nodes["requests"].append(req.rid)
        reqs.append({"rid": req.rid, "epoch": epoch, "pinned_tokens": path[-1].path_end if path else 0})
    pinned = sum(sum(e["nodes"].values()) for e in per_epoch.values())
    return {
        "pinned_tokens": pinned,
        "awaiting_reclaim_tokens": state.deferred.pending_tokens if state.deferred.active else 0,
        "crossing_requests": len(crossing),
        "crossing": reqs[:limit],
        "_per_epoch": per_epoch,
    }


def epoch_rows(state: Engine, cached: int, stale: dict, census_view: Optional[dict], limit: int) -> list:
    """One row per epoch that holds KV in the tree, current first (`pinned_by`: the first `limit` rids)."""
    per_epoch = stale["_per_epoch"]
    exact_census = census_view if census_view is not None and not census_view["truncated"] else None
    current_tokens = cached - stale["pinned_tokens"] - stale["awaiting_reclaim_tokens"]
    rows = [{
        **epoch_names(state, state.epoch),
        "current": True,
        "cached_tokens": current_tokens,
        "includes_in_window_older": state.staleness.window > 0,
        "nodes": exact_census["epochs"].get(str(state.epoch), {}).get("nodes", 0) if exact_census else None,
        "pinned_tokens": 0,
        "crossing_requests": 0,
        "pinned_by": [],
    }]
    for epoch in sorted((e for e in per_epoch if e is not None), reverse=True):
        pinned = per_epoch[epoch]
        tokens = sum(pinned["nodes"].values())
        rows.append({
            **epoch_names(state, epoch),
            "current": False,
            "cached_tokens": tokens,
            "nodes": len(pinned["nodes"]),
            "pinned_tokens": tokens,
            "crossing_requests": len(pinned["requests"]),
            "pinned_by": pinned["requests"][:limit],
        })
    return rows


def window_view(state: Engine, census_view: Optional[dict]) -> Optional[dict]:
    """With a staleness window (`vradix.core.staleness`; None without one): the epochs whose namespaces are kept, and
    the tokens per namespace when a complete census has them. Older in-window namespaces hold unlocked KV, so the
    walk-free split above cannot separate them from the current epoch: the current row's `cached_tokens` then
    includes them (`includes_in_window_older`), and only the Python core's census splits them. Until the deferred
    reclaim's walk after a bump completes, `stale.awaiting_reclaim_tokens` is an upper bound (a bump cannot tell, in
    O(1), which evictable KV is in the window)."""

    if state.staleness.window == 0:
        return None
    floor = state.window_floor
    complete = census_view if census_view is not None and not census_view["truncated"] else None
    return {"window": state.staleness.window, "floor": floor,
            "epochs": [e for e in range(state.epoch, floor - 1, -1) if e in state.identities],
            "tokens_by_namespace": {k: v["tokens"] for k, v in complete["epochs"].items()} if complete else None,
            **state.staleness.as_dict()}


def epoch_names(state: Engine, epoch: Optional[int]) -> dict:
    ident = state.identities.get(epoch) if epoch is not None else None
    return {"epoch": epoch, "label": state.label_of(epoch),
            "weight_id": ident.identity.weight_id if ident is not None else None}


def top_prefixes(state: Engine, cache, holders: list, query: Query) -> dict:
    """The tracked prefixes still in the tree, most hits first (ties: most recent), `query.offset` on, at most
    `query.limit`. Each one's tokens come from its node's path now (a later split keeps the node's end)."""
    ranked = sorted(state.prefix_hits.entries.values(), key=lambda h: (-h.hits, -h.last_hit, h.node_id))
    items: list[tuple[Any, Any]] = []
    seen_live, next_offset = 0, None
    for hit in ranked:
        path = path_of(cache, hit.node_id)
        if path is None:
            continue
        if seen_live >= query.offset:
            if len(items) == query.limit:
                next_offset = seen_live
                break
            items.append((hit, path))
        seen_live += 1
    locks = lock_counts(cache, holders, {h.node_id for h, _ in items})
    return {
        "limit": query.limit,
        "offset": query.offset,
        "next_offset": next_offset,
        "tracked": len(state.prefix_hits.entries),
        "items": [prefix_row(state, cache, hit, path, locks.get(hit.node_id, 0), query.head) for hit, path in items],
    }


def path_of(cache, node_id: int):
    """The node's root-to-node path, or None when the node has left the tree."""
    try:
        (path,) = cache.tree_core.collect_path_info([node_id])
    except KeyError:
        return None
    return path or None


def lock_counts(cache, holders: list, wanted: set) -> dict:
    """node id -> how many live requests lock it (a request's lock covers every node of its path)."""
    if not wanted or not holders:
        return {}
    counts: dict = {}
    for path in cache.tree_core.collect_path_info([r.lock.node for r in holders]):
        for info in path:
            if info.node_id in wanted:
                counts[info.node_id] = counts.get(info.node_id, 0) + 1
    return counts


def prefix_row(state: Engine, cache, hit: PrefixHit, path, locks: int, head: int) -> dict:
    end = path[-1]
    row = {
        "node": hit.node_id,
        **epoch_names(state, hit.epoch),
        "stale": hit.epoch != state.epoch,
        "tokens": end.path_end,
        "path_nodes": len(path),
        "on_device": end.full_value_len is not None,
        "hits": hit.hits,
        "last_access": round(hit.last_hit, 3),
        "lock_count": locks,
        "core": core_fields(cache, hit.node_id),
    }
    if head:
        row["head_tokens"] = list(hit.head[:head])
    return row


def core_fields(cache, node_id: int) -> Optional[dict]:
    """SGLang's own per-node figures where the TreeCore exposes them (the Python core), read without a touch."""
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
    from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore

    core = cache.tree_core
    if not isinstance(core, UnifiedTreeCore):
        return None
    node = core.node_by_id(node_id)
    # plain Python numbers: SGLang's logical clock may be a numpy scalar, which msgpack cannot carry
    return {"hit_count": int(node.hit_count), "lock_ref": int(node.component_data[ComponentType.FULL].lock_ref),
            "last_access_time": float(node.last_access_time)}


def census(state: Engine, cache, budget: int) -> Optional[dict]:
    """Nodes and tokens per epoch namespace, from a walk of at most `budget` nodes (Python TreeCore only; None on a
    core that cannot be walked). `truncated` says the walk stopped at the budget."""
    from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore

    core = cache.tree_core
    if not isinstance(core, UnifiedTreeCore) or budget <= 0:
        return None
    per_epoch: dict = {}
    stack = list(core.root_node.children.values())
    visited = 0
    while stack and visited < budget:
        node = stack.pop()
        visited += 1
        row = per_epoch.setdefault(str(state.epoch_of(node.key.extra_key)), {"nodes": 0, "tokens": 0})
        row["nodes"] += 1
        row["tokens"] += len(node.key)
        stack.extend(node.children.values())
    return {"budget": budget, "visited": visited, "truncated": bool(stack), "epochs": per_epoch}


def host_view(state: Engine, cache) -> Optional[dict]:
    """The HiCache host pool's terms, and its pages per epoch from the host ledger (None without a host tier)."""
    figures = host_tier.pool_figures(cache)
    if figures is None:
        return None
    figures = dict(figures)
    figures["tokens_by_epoch"] = host_tokens_by_epoch(cache)
    return figures


def host_tokens_by_epoch(cache) -> Optional[dict]:
    from vradix.ledger import host as host_ledger
    from vradix.kernels import FREE
    from vradix.ledger.device import ledger_of

    host = ledger_of(host_ledger.kv_host_pool(cache))
    if host is None:
        return None
    epochs = host.page_epoch[host.page_epoch != FREE]
    values, counts = epochs.unique(return_counts=True)
    return {str(e): n * host.page_size for e, n in zip(values.tolist(), counts.tolist())}


def storage_view(state: Engine, cache) -> Optional[dict]:
    """The L3 storage tier (None without one): its backend and the pages this process backed up per weight_id."""
    if not getattr(cache, "enable_storage", False) or cache.cache_controller is None:
        return None
    backend = cache.cache_controller.storage_backend
    return {"backend": type(getattr(backend, "_backend", backend)).__name__,
            "pages_backed_up_by_weight_id": dict(state.storage.pages_backed_up)}
