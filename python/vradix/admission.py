"""Step 1 — admission: bind every request to the engine's current epoch.

Invariants:
- After `stamp`, `req.extra_key == namespace(req epoch) + user key` and the request can only match KV of that epoch.
- A request that holds no KV (no row, no tree lock) is re-bound to the current epoch before any match
  (`rebind_if_unheld`): a request queued across a publication is prefilled under the new weights' namespace.
- A request that holds KV is never re-bound: its row points at slots of its own epoch (it is a crossing request).
"""
from __future__ import annotations

import os

from vradix import namespace, provenance
from vradix.state import EpochState


def stamp(state: EpochState, req) -> None:
    """Bind a newly admitted request to the current epoch. Raises ReservedNamespaceError on a forged key."""
    user_key = req.extra_key
    namespace.check_user_key(user_key)
    namespace.check_user_key(getattr(req, "cache_salt", None))
    req._vradix_user_key = user_key
    _bind(state, req)


def is_stamped(req) -> bool:
    return hasattr(req, "_vradix_user_key")


def holds_kv(req) -> bool:
    """Whether the request owns a KV row or a tree lock (then its namespace must not change)."""
    return req.kv.holds_kv or getattr(req, "lock", None) is not None


def rebind_if_unheld(state: EpochState, req) -> bool:
    """Re-bind a stamped request that holds no KV to the current epoch; True if it changed epoch."""
    if not is_stamped(req) or req._vradix_epoch == state.epoch or holds_kv(req):
        return False
    _bind(state, req)
    return True


def _bind(state: EpochState, req) -> None:
    req._vradix_epoch = state.epoch
    if os.environ.get("VRADIX_FAULT_NO_NAMESPACE") == "1":
        return  # test-only fault: the namespace is lost, so only the KV page ledger's guard stands between
    req.extra_key = namespace.stamped(state.epoch, req._vradix_user_key)
    provenance.record_bind(req, state.epoch, state.label)
