"""Stale tokens reused, counted from the responses alone (no engine internals), as a lower bound."""
from __future__ import annotations

from typing import List, Sequence

from .trace import MIXED, PrefixTrie, output_tags, prefill_order, spans_of


class ShadowCache:
    """Counts stale tokens reused, from the responses alone (no engine internals), as a lower bound.

    Every KV position a request computed is a *copy*, tagged with the weight version it was computed under, or MIXED
    when it was computed over context that was itself stale or crossed a publication. A copy is available from the
    earliest server time it could enter the radix tree: for prompt positions the start of the request's first
    forward (forward_entry_time; chunked prefill checkpoints each chunk, so a prefix can be matched before the
    request's prefill finished), for output positions request_finished_ts (inserted at release).

    A request q whose first forward started at server time t under version v (the version in effect at t, from the
    publication log: the scheduler starts no forward between the pause and the continue, so the midpoint of that
    interval separates old from new), and which was served `cached_tokens = c`, reused stale KV at position i < c
    unless some copy of q's prefix [0..i] tagged v was available by t. The count
    never blames a mode for a copy it might legitimately have had, whatever the engine's tree policy (LRU, flush,
    namespace): it is a lower bound on stale reuse, exact when the only matchable copies are stale ones (which is the
    unsafe mode's steady state: a prefix cached once is never recomputed).

    A retracted request keeps the copy of its first prefill and adds one clean copy of its whole sequence per version
    it later generated under (it was re-prefilled under each; benefit of the doubt, which keeps the bound a lower
    bound).
    """

    def __init__(self):
        self.trie = PrefixTrie()

    def stale_positions(self, ids: Sequence[int], cached: int, version: str, at: float) -> int:
        return sum(not self.trie.has(node, version, at) for node in self.trie.path(ids, cached))

    def add(self, ids: Sequence[int], start: int, tags: Sequence[str], at: float) -> None:
        self.trie.add(ids, start, tags, at)


def stale_reuse(records: List, publications: Sequence = (), first_version: str = "") -> dict:
    """Stale tokens reused per request (see ShadowCache), in server prefill order (see `trace.prefill_order`)."""
    cache = ShadowCache()
    total = requests_with_stale = 0
    for r, version in prefill_order(records, publications, first_version):
        m, spans = r.meta, spans_of(r)
        at = m["forward_entry_time"]
        cached = m["cached_tokens"]
        stale = cache.stale_positions(r.input_ids, cached, version, at)
        total += stale
        requests_with_stale += stale > 0
        clean = stale == 0
        cache.add(r.input_ids, cached, [version if clean else MIXED] * (len(r.input_ids) - cached), at)
        if m.get("num_retractions", 0):
            # re-prefilled after each retraction under the version then in effect: one clean copy per version
            seq = r.input_ids + r.output_ids[:-1]
            for v in dict.fromkeys(sp["version"] for sp in spans):
                cache.add(seq, 0, [v] * len(seq), at)
            continue
        tags = output_tags(spans, len(r.output_ids), clean and spans[0]["version"] == version)
        cache.add(r.input_ids + r.output_ids, len(r.input_ids), tags, m.get("request_finished_ts", at))
    return {"stale_tokens_reused": total, "requests_with_stale_reuse": requests_with_stale}
