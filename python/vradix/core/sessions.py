"""Streaming sessions (`--enable-streaming-session`): a session slot's KV record is never lent across a publication.

SGLang 0.5.23 keeps a streaming session's KV in a slot of the cache (`UnifiedRadixCache.session`, a
`StreamingSession`): the record (row + pages) and a tree lock on the first turn's published prompt. Every turn borrows
the record: `StreamingSession.try_match_prefix` runs before the tree match and hands the turn the slot's whole
committed length as its prefix, whatever the turn's `extra_key`. So the epoch namespace alone does not version it.

Invariant kept here: a slot's record is lent only to a turn of the epoch that wrote all of it. At a bump
(`settle_at_bump`, called by `epochs.bump` before it marks crossing requests):
- a queued turn that only borrowed the record in a scheduling pass's match (it has computed nothing of its own) gives
  it back (`Req.detach_kv`), so it holds nothing and the bump re-binds it: it is prefilled under the new weights;
- a slot whose record no running turn borrows is released now, through SGLang's own `release_session` (row, pages,
  tree lock freed, nothing leaked), before the bump decides how to reclaim, so the tree reset shortcut never drops a
  slot it does not free;
- a slot a running turn borrows stays with that turn, which crosses the publication like any KV holder (it keeps its
  KV, never inserts it); the slot is remembered as stale (`Engine.sessions.stale_slots`) and released at the
  session's next lend (`release_before_lend`), wherever its record came back from (finish or retract), so no later
  turn reuses it.
A turn that finds no slot takes SGLang's normal path: a tree match in its own namespace, then a full prefill of its
history; its first row allocation makes the session a new slot, written under the current epoch.
"""
from __future__ import annotations

from typing import Any, Iterable

from vradix.core import reclaim, deferred_reclaim
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from vradix.engine import Engine


def slots_of(cache) -> dict:
    """The cache's streaming-session slots by session id (empty for a cache without streaming sessions)."""
    return getattr(getattr(cache, "session", None), "slots", None) or {}


def settle_at_bump(state: Engine, cache, live: Iterable, queued: Iterable) -> int:
    """At a bump, before crossing requests are marked: detach queued borrowers, release every slot no other live
    request borrows (`live` includes `queued`), remember the borrowed ones as stale. Returns how many slots were
    released."""
    slots = slots_of(cache)
    if not slots:
        state.sessions.forget_all()
        return 0
    session = cache.session
    for req in queued:
        if session.borrowed_slot(req) is not None:
            req.detach_kv()
    borrowed = {id(slot) for slot in map(session.borrowed_slot, live) if slot is not None}
    stale = {sid: slot for sid, slot in slots.items() if id(slot) in borrowed}
    idle = [sid for sid in slots if sid not in stale]
    for sid in idle:
        cache.release_session(sid)
    state.sessions.settle(stale, len(idle))
    return len(idle)


def release_before_lend(state: Engine, cache, req) -> bool:
    """Before SGLang lends a slot's record to `req`: release the slot when a crossing turn wrote it (stale), and free
    the stale tree path its lock kept. Returns True when a slot was released."""
    sid = getattr(getattr(req, "session", None), "session_id", None)
    if sid is None:
        return False
    stale: Any = state.sessions.stale_slots.get(sid)  # a `SessionSlot` of SGLang, or None
    if stale is None:
        return False
    current = slots_of(cache).get(sid)
    if current is None or current is not stale:
        state.sessions.forget(sid)  # SGLang already released it (the session closed, or a turn aborted)
        return False
    if stale.kv is req.kv:
        return False  # the crossing turn itself: it keeps its own KV until it releases it
    state.sessions.forget(sid)
    node = stale.lock.node if stale.lock is not None else None
    evictable_before = cache.evictable_size()
    cache.release_session(sid)
    freed = reclaim.free_released_path(cache, node)
    state.freed.count_at_release(freed)
    deferred_reclaim.note_release(state, evictable_before, cache.evictable_size())
    state.sessions.count_released()
    return True
