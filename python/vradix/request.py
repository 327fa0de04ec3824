"""vradix's per-request state: one `ReqState` attached to each SGLang `Req` at admission (`req._vradix`).

Invariants:
- a request carries a `ReqState` from the moment `admission.stamp` accepts it until it is gone; nothing else of
  vradix's is stored on the `Req`;
- `epoch` is the epoch whose namespace the request matches and inserts in (`req.extra_key` is built from it and
  `user_key`);
- `kv_history` is the provenance of the request's KV (see `vradix.core.provenance`): its first entry starts at position 0
  and names `epoch` at the last bind;
- `crossed` is True while the request holds KV across a bump; then `skip_insert_before` is what
  `req.skip_radix_cache_insert` was before vradix forced it on;
A request that reaches a prefix match without a `ReqState` was never admitted by vradix: `require` raises
`UnstampedRequestError` rather than guessing an epoch (fail closed).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

#: (start position, epoch, label, weight_id) — KV from `start` on was computed under `epoch`'s weights, published as
#: `label`, with global identity `weight_id`
HistoryEntry = Tuple[int, int, Optional[str], str]


class UnstampedRequestError(RuntimeError):
    """A request reached the radix cache without being bound to an epoch: vradix refuses to guess its namespace."""


@dataclass
class ReqState:
    user_key: Optional[str]
    epoch: int
    kv_history: List[HistoryEntry] = field(default_factory=list)
    crossed: bool = False
    #: a LoRA request's adapter content identity (`vradix.core.lora`), None for the base model: its namespace carries it,
    #: and on P/D it is compared along with the weight_id
    adapter: Optional[str] = None
    skip_insert_before: bool = False
    #: the KV page ledger's spans of a crossing request's row, read just before its release
    ledger_spans: Optional[list] = None
    #: on a P/D decode role, once the handshake accepted prefill's KV: (decode_prefix_len, prefill's weight_id)
    pd_handoff: Optional[Tuple[int, str]] = None
    #: on a P/D decode role, from the commit that stamped the received KV in the ledger until the request's first
    #: prebuilt batch checks its whole prompt KV once (`hooks.ledger.backstop_prebuilt_batch`)
    pd_first_read_pending: bool = False
    #: while the request holds a retraction backup: the ledger epoch of each backed-up position (`vradix.core.retraction`)
    backup_epochs: Optional[object] = None
    #: on a P/D decode role, once a publication revoked the request's unfulfilled prefix promise: the 503 reason it
    #: fails with (`vradix.pd.revocation`), whichever SGLang path then fails it
    revoked: Optional[str] = None
    #: bounded staleness (`vradix.core.staleness`): how many epochs old the KV this request reuses may be (0: exact,
    #: `epoch` is then always the epoch it is computed under)
    max_staleness: int = 0
    #: a bounded request's admission epoch, the epoch whose weights compute it (`epoch` is the namespace it matched,
    #: at most `max_staleness` older); None for an exact request
    admitted_epoch: Optional[int] = None
    #: a bounded request's response fields, fixed when it released its KV (`vradix.core.staleness.report_at_release`)
    bounded_report: Optional[dict] = None


def of(req) -> Optional[ReqState]:
    """The request's vradix state, or None when vradix never admitted it."""
    return getattr(req, "_vradix", None)


def require(req) -> ReqState:
    """The request's vradix state; raises `UnstampedRequestError` when it has none."""
    st = of(req)
    if st is None:
        raise UnstampedRequestError(
            f"vradix: request {getattr(req, 'rid', '?')!r} reached the radix cache without an epoch binding "
            "(it bypassed admission); refusing to match it against a versioned cache")
    return st


def attach(req, user_key: Optional[str], epoch: int) -> ReqState:
    st = ReqState(user_key=user_key, epoch=epoch)
    req._vradix = st
    return st
