"""Data-path step 1 (admission): bind every request to the engine's current epoch.

Invariants:
- After `admit`, the request carries a `request.ReqState`, `req.extra_key == namespace(its epoch) + adapter tag +
  user key`, and the request can only match KV of that epoch (and, for a LoRA request, of that adapter content:
  the tag names `ReqState.adapter`, fixed at admission as the request's `lora_id` is).
- A request that holds no KV (no row, no tree lock) is re-bound to the current epoch before any match
  (`rebind_if_unheld`): a request queued across a publication is prefilled under the new weights' namespace.
- A request that holds KV is never re-bound: its row points at slots of its own epoch (it is a crossing request).
  Nor is a request whose KV lives in a P/D decode retraction backup (`vradix.core.retraction`): it resumes from that KV.
- A request that reaches a match without a `ReqState` is refused (`request.UnstampedRequestError`).
- A bounded request (`vradix.core.staleness`) holding no KV adopts, before every match, the namespace of one epoch of
  its window (`choose_for_match`); with bound 0 nothing here differs from an exact request.
"""
from __future__ import annotations

from vradix import identity, request
from vradix.core import lora, staleness
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from vradix.engine import Engine


def admit(state: Engine, req) -> None:
    """Bind a newly admitted request to the current epoch. Raises ReservedNamespaceError on a forged key and
    `staleness.StalenessError` on a bound above the server window."""
    user_key = req.extra_key
    if user_key:
        identity.check_user_key(user_key)
    salt = getattr(req, "cache_salt", None)
    if salt:
        identity.check_user_key(salt)
    st = request.attach(req, user_key, request.bind_entry(state))
    lora_id = getattr(req, "lora_id", None)
    if lora_id is not None:
        st.set_adapter(lora.adapter_identity_of(state, lora_id))
    _bind(state, req, st)
    staleness.bind_bound(st, req, state.staleness.window)


def admit_refused(state: Engine, req) -> None:
    """Bind a request whose user key was refused (it is being aborted) to the current epoch without that key. A LoRA
    request keeps its adapter tag: SGLang still prefills it (with the adapter) before the abort lands, so its KV must
    stay out of the base model's namespace."""
    req.extra_key = None
    st = request.attach(req, None, request.bind_entry(state))
    st.set_adapter(lora.adapter_identity_of(state, getattr(req, "lora_id", None)))
    _bind(state, req, st)


def rebind_if_unheld(state: Engine, req) -> bool:
    """Re-bind a request that holds no KV, on the device or in a retraction backup, to the current epoch; True if it
    changed epoch. Raises `UnstampedRequestError` for a request vradix never admitted."""
    st = request.require(req)
    if st.epoch == state.epoch or request.holds_own_kv(req):
        return False
    _bind(state, req, st)
    return True


def prepare_for_match(state: Engine, cache, req, token_ids=None) -> None:
    """Before every match: `rebind_if_unheld`, then `choose_for_match`. An exact request already bound to the
    current epoch (every request between publications) returns after one attribute read and two compares."""
    st = request.require(req)
    if st.epoch == state.epoch and st.max_staleness == 0:
        return
    rebind_if_unheld(state, req)
    choose_for_match(state, cache, req, token_ids)


def choose_for_match(state: Engine, cache, req, token_ids=None) -> None:
    """Before a match: a bounded request that holds no KV adopts one window epoch's namespace
    (`staleness.choose_namespace`); its provenance then starts with that epoch."""
    st = request.require(req)
    if not staleness.is_bounded(st) or request.holds_own_kv(req):
        return
    staleness.choose_namespace(state, cache, req, token_ids)


def _bind(state: Engine, req, st: request.ReqState) -> None:
    request.record_bind(st, state)
    if state.fault_no_namespace:
        return  # test-only fault: the namespace is lost, so only the KV page ledger's guard stands between
    req.extra_key = identity.stamped(state.current_prefix, st.user_key, st.adapter)
