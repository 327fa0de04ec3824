"""Reading a run's trace: which weight version each request was prefilled under, in what order, and which version
each KV position it left behind was computed under. Shared by the stale-reuse count and the ideal-work yardstick.

Times are the server's (meta_info with --enable-metrics, wall clock): `forward_entry_time` is when the request's
first forward was scheduled (it matched the cache just before), `prefill_finished_time` when its prefill's result was
processed (its prompt KV inserted into the tree), `request_finished_ts` when it finished (output KV inserted).
"""
from __future__ import annotations

import bisect
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

MIXED = "<mixed>"


def output_tags(spans: List[dict], n_out: int, clean: bool) -> List[str]:
    """KV tag of output positions 0..n_out-2: output token j's KV is computed by the forward that samples token j+1;
    positions after the first version change are MIXED (new weights over old context)."""
    version_of = {}
    for sp in spans:
        for j in range(sp["start"], sp["end"]):
            version_of[j] = sp["version"]
    first = version_of.get(0)
    tags = []
    for j in range(n_out - 1):
        v = version_of.get(j + 1, first)
        clean = clean and v == first
        tags.append(v if clean else MIXED)
    return tags


def spans_of(record) -> List[dict]:
    """The request's per-token weight-version spans (one span of its final version when the server gave none)."""
    m = record.meta
    return m.get("weight_versions") or [{"version": m["weight_version"], "start": 0, "end": len(record.output_ids)}]


def server_clock_offset(records) -> float:
    """Server wall clock minus client wall clock, bracketed by each call's send/receive times (0 on one host)."""
    hi = min(r.meta["request_received_ts"] - r.sent for r in records)
    lo = max(r.meta.get("response_sent_to_client_ts", r.received) - r.received for r in records)
    return (hi + lo) / 2 if lo <= hi else hi


def version_at(boundaries: List[float], versions: List[str], t: float) -> str:
    """The weight version in effect at server time `t` (boundaries on the server clock, ascending)."""
    return versions[bisect.bisect_right(boundaries, t)]


def version_clock(records, publications: Sequence = (), first_version: str = "") -> Tuple[List[float], List[str]]:
    """(boundaries on the server clock, ascending; versions, one more than boundaries): version i is in effect from
    boundaries[i - 1]. The scheduler starts no forward between pause and continue, so a boundary is the midpoint of
    that interval, shifted from the client clock to the server's."""
    offset = server_clock_offset(records) if records and publications else 0.0
    return [p.boundary + offset for p in publications], [first_version] + [p.version for p in publications]


def prefill_order(records, publications: Sequence = (), first_version: str = "") -> Iterator[Tuple[object, str]]:
    """(record, version it matched the cache under), in server order of first forwards.

    The version is the one in effect when the first forward started (see `version_clock`); without a publication
    log, the version of its first output token.
    """
    boundaries, versions = version_clock(records, publications, first_version)
    for r in sorted(records, key=lambda r: r.meta.get("forward_entry_time", 0.0)):
        at = r.meta["forward_entry_time"]
        yield r, (version_at(boundaries, versions, at) if publications else spans_of(r)[0]["version"])


class Node:
    __slots__ = ("children", "copies")

    def __init__(self):
        self.children: Dict[int, "Node"] = {}
        #: version tag -> [earliest time a copy's computation started, earliest time a copy was in the tree]
        self.copies: Dict[str, List[float]] = {}


class PrefixTrie:
    """KV positions keyed by their whole prefix: node i of a path is the KV of token i given tokens [0..i).

    A node keeps, per version tag, only the earliest start and the earliest tree insertion over its copies: every
    question asked of it is "is there a copy of version v started (or in the tree) by time t"."""

    def __init__(self):
        self.root = Node()

    def path(self, ids: Sequence[int], n: int) -> Iterator[Node]:
        node = self.root
        for tok in ids[:n]:
            node = node.children.setdefault(tok, Node())
            yield node

    def add(self, ids: Sequence[int], start: int, tags: Sequence[str], started: float,
            in_tree: Optional[float] = None) -> None:
        """A copy tagged tags[i - start] at node i, for i in [start, start + len(tags))."""
        in_tree = started if in_tree is None else in_tree
        for i, node in enumerate(self.path(ids, start + len(tags))):
            if i >= start:
                times = node.copies.setdefault(tags[i - start], [started, in_tree])
                times[0], times[1] = min(times[0], started), min(times[1], in_tree)

    def has(self, node: Node, version: str, started_by: float, in_tree_by: Optional[float] = None,
            strictly_before: bool = False) -> bool:
        times = node.copies.get(version)
        if times is None:
            return False
        started_ok = times[0] < started_by if strictly_before else times[0] <= started_by
        return started_ok and (in_tree_by is None or times[1] <= in_tree_by)

    def longest(self, ids: Sequence[int], n: int, version: str, started_by: float,
                in_tree_by: Optional[float] = None, strictly_before: bool = False) -> int:
        """Length of the longest prefix of ids[:n] whose every node holds such a copy (see `has`)."""
        length = 0
        for node in self.path(ids, n):
            if not self.has(node, version, started_by, in_tree_by, strictly_before):
                break
            length += 1
        return length
