"""Streaming sessions (`--enable-streaming-session`): a session slot's KV record is never lent across a publication.

SGLang 0.5.23 keeps a streaming session's KV in a slot of the cache (`UnifiedRadixCache.session`, a
`StreamingSession`): the record (row + pages) and a tree lock on the first turn's published prompt. Every turn borrows
the record: `StreamingSession.try_match_prefix` runs before the tree match and hands the turn the slot's whole
committed length as its prefix, whatever the turn's `extra_key`. So the epoch namespace alone does not version it.

Invariant kept here: a slot's record is lent only to a turn of the epoch that wrote all of it. At a bump
(`SessionSlots.settle_at_bump`, called by `Engine.invalidate` before it marks crossing requests):
- a queued turn that only borrowed the record in a scheduling pass's match (it has computed nothing of its own) gives
  it back (`Req.detach_kv`), so it holds nothing and the bump re-binds it: it is prefilled under the new weights;
- a slot whose record no running turn borrows is released now, through SGLang's own `release_session` (row, pages,
  tree lock freed, nothing leaked), before the bump decides how to reclaim, so the tree reset shortcut never drops a
  slot it does not free;
- a slot a running turn borrows stays with that turn, which crosses the publication like any KV holder (it keeps its
  KV, never inserts it); the slot is remembered as stale (`Engine.sessions.stale_slots`) and released at the
  session's next lend (`Engine.release_stale_slot`, which `SessionSlots.take_stale` hands the slot), wherever its
  record came back from (finish or retract), so no later turn reuses it.
A turn that finds no slot takes SGLang's normal path: a tree match in its own namespace, then a full prefill of its
history; its first row allocation makes the session a new slot, written under the current epoch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Iterable, Optional

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache


def slots_of(cache: "UnifiedRadixCache") -> dict:
    """The cache's streaming-session slots by session id (empty for a cache without streaming sessions)."""
    return getattr(getattr(cache, "session", None), "slots", None) or {}


@dataclass
class SessionSlots:
    """The engine's streaming-session part: the slots a bump left stale, and how a bump settles the slots. Changes
    only through its methods: `settle_at_bump` and `take_stale`."""

    #: session id -> the streaming-session slot a turn was running on at the last bump (its record mixes epochs):
    #: released before it could be lent again
    stale_slots: Dict[str, Any] = field(default_factory=dict)
    #: streaming-session slots released because a publication made their record stale
    slots_released: int = 0

    def settle_at_bump(self, cache: "UnifiedRadixCache", live: Iterable["Req"], queued: Iterable["Req"]) -> int:
        """At a bump, before crossing requests are marked: detach queued borrowers, release every slot no other live
        request borrows (`live` includes `queued`), remember the borrowed ones as stale. Returns how many slots were
        released."""
        slots = slots_of(cache)
        if not slots:
            self.stale_slots.clear()
            return 0
        session = cache.session
        for req in queued:
            if session.borrowed_slot(req) is not None:
                req.detach_kv()
        borrowed = {id(slot) for slot in map(session.borrowed_slot, live) if slot is not None}
        self.stale_slots = {sid: slot for sid, slot in slots.items() if id(slot) in borrowed}
        idle = [sid for sid in slots if sid not in self.stale_slots]
        for sid in idle:
            cache.release_session(sid)
        self.slots_released += len(idle)
        return len(idle)

    def take_stale(self, cache: "UnifiedRadixCache", req: "Req") -> Optional[Any]:
        """Before SGLang lends a slot's record to `req`: the slot to release now (a crossing turn wrote it, and it is
        not that turn's own), counted as released and forgotten; None when there is none. A stale slot SGLang already
        released (the session closed, or a turn aborted) is forgotten."""
        sid = getattr(getattr(req, "session", None), "session_id", None)
        if sid is None:
            return None
        if sid not in self.stale_slots:
            return None
        stale: Any = self.stale_slots[sid]  # a `SessionSlot` of SGLang
        its_own = stale.kv is req.kv  # read first: the identity check below narrows `stale` to Optional for mypy
        if slots_of(cache).get(sid) is not stale:
            del self.stale_slots[sid]
            return None
        if its_own:
            return None  # the crossing turn itself: it keeps its own KV until it releases it
        del self.stale_slots[sid]
        self.slots_released += 1
        return stale
