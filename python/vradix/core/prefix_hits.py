"""Which cached prefixes admissions reused, counted by vradix itself (SGLang 0.5.23's Rust tree core exposes no
per-node hits): at most `capacity` entries, least recently hit dropped. The inspector's top-N reads it."""
from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Optional

from vradix import request

if TYPE_CHECKING:  # the engine state holds one PrefixHits
    from vradix.core.state import EpochState

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
    only through `record` (an admission's hit, `record_admission`)."""

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


def record_admission(state: EpochState, cache, req) -> None:
    """An admitted request reuses `req.prefix_len` cached tokens ending at `req.last_node`: one hit on that node. A
    streaming-session turn that borrows its slot's record stands on the slot's virtual node, no tree node: no hit."""
    if req.prefix_len <= 0:
        return
    st = request.of(req)
    if st is None or req.last_node is None or _is_virtual_node()(req.last_node) or cache.is_root(req.last_node):
        return
    head = req.origin_input_ids[:min(req.prefix_len, MAX_HEAD_TOKENS)]
    state.prefix_hits.record(req.last_node, st.epoch, req.prefix_len, head)


_virtual_node_test = None


def _is_virtual_node():
    """SGLang's streaming-session virtual-node test, imported on the first hit (this module loads before SGLang's
    session module may be imported) and kept, so each admission pays no import statement."""
    global _virtual_node_test
    if _virtual_node_test is None:
        from sglang.srt.session.streaming_session import is_virtual_node
        _virtual_node_test = is_virtual_node
    return _virtual_node_test
