"""Which cached prefixes admissions reused, counted by vradix itself (SGLang 0.5.23's Rust tree core exposes no
per-node hits): at most `capacity` entries, least recently hit dropped. The inspector's top-N reads it."""
from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional

from vradix import request

if TYPE_CHECKING:
    pass

#: tokens of a prefix's head kept per entry
MAX_HEAD_TOKENS = 16


@dataclass
class PrefixHit:
    """What vradix saw of one cached prefix: the node a match ended at, under which epoch, how often it was reused."""

    node_id: int
    epoch: int
    tokens: int
    hits: int = 0
    last_hit: float = 0.0
    head: tuple = ()


@dataclass
class PrefixHits:
    """node id -> PrefixHit for the most recently reused prefixes (at most `capacity`, least recently hit dropped).
    Node ids are never reused by either TreeCore, so an entry whose node is gone is only skipped at read time. Changes
    only through `record` and `record_admitted` (the hits of a prefill pass, `Engine.count_prefix_hits`)."""

    capacity: int = 4096
    entries: "OrderedDict[int, PrefixHit]" = field(default_factory=OrderedDict)

    def record(self, node_id: int, epoch: int, tokens: int, head: Iterable[int], now: Optional[float] = None) -> None:
        hit = self.entries.get(node_id)
        if hit is None:
            hit = self.entries[node_id] = PrefixHit(node_id, epoch, tokens, head=tuple(head)[:MAX_HEAD_TOKENS])
            if len(self.entries) > self.capacity:
                self.entries.popitem(last=False)
        else:
            self.entries.move_to_end(node_id)
        hit.hits += 1
        hit.tokens = max(hit.tokens, tokens)
        hit.last_hit = time.time() if now is None else now

    def record_admitted(self, reqs: Iterable, continuing: Any, virtual: Optional[Callable[[Any], bool]]) -> None:
        """The requests a prefill pass admitted (`reqs`, less the `continuing` chunk of an earlier admission): one hit
        for each that reuses cached KV (`req.prefix_len > 0`, ending at `req.last_node`), in one pass with no call per
        request; a request vradix never bound, or one standing on a virtual node (`virtual`: a streaming-session
        slot's, no tree node), is no hit."""
        now = None
        entries = self.entries
        for req in reqs:
            tokens = req.prefix_len
            if tokens <= 0 or req is continuing:
                continue
            st = getattr(req, request.ATTR, None)
            node_id = req.last_node
            if st is None or node_id is None or (virtual is not None and virtual(node_id)):
                continue
            hit = entries.get(node_id)
            if hit is None:
                hit = entries[node_id] = PrefixHit(node_id, st.bound.epoch, tokens,
                                                   head=tuple(req.origin_input_ids[:min(tokens, MAX_HEAD_TOKENS)]))
                if len(entries) > self.capacity:
                    entries.popitem(last=False)
            else:
                entries.move_to_end(node_id)
            hit.hits += 1
            if tokens > hit.tokens:
                hit.tokens = tokens
            hit.last_hit = now = now or time.time()



def virtual_node_test() -> Callable[[Any], bool]:
    """SGLang's streaming-session virtual-node test (imported when an engine is attached: this module loads before
    SGLang's session module may be imported)."""
    from sglang.srt.session.streaming_session import is_virtual_node
    return is_virtual_node
