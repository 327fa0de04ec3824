"""vradix's per-request state: one `ReqState` attached to each SGLang `Req` at admission (`req._vradix`).

Invariants:
- a request carries a `ReqState` from the moment `Engine.admit` accepts it until it is gone; nothing else of
  vradix's is stored on the `Req`;
- `epoch` is the epoch whose namespace the request matches and inserts in (`req.extra_key` is built from it and
  `user_key`);
- `kv_history` is the provenance of the request's KV (`ReqState.bind` at every bind, `record_crossing` write it;
  `vradix.core.provenance` reports it): its first entry starts at position 0 and is the last bind's (`bound`,
  which `epoch` is read from) unless a crossing before any position was computed replaced it; both are derived
  from `bound` and `crossings`, never stored twice;
- `crossed` is True while the request holds KV across a bump; then `skip_insert_before` is what
  `req.skip_radix_cache_insert` was before vradix forced it on;
A request that reaches a prefix match without a `ReqState` was never admitted by vradix: `require` raises
`UnstampedRequestError` rather than guessing an epoch (fail closed).

What a request holds (`holds_kv`, `holds_backup`, `retracted_with_backup`, `holds_own_kv`, `backed_up_len`) is
read from SGLang's `Req` only, never from vradix's record: a publication decides from it which requests cross it and
which are re-bound.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, NamedTuple, Optional, Tuple


class HistoryEntry(NamedTuple):
    """KV from position `start` on was computed under epoch `epoch`'s weights, published as `label`, with global
    identity `weight_id`."""

    start: int
    epoch: int
    label: Optional[str]
    weight_id: str


#: the one attribute vradix sets on an SGLang `Req`: its `ReqState`
ATTR = "_vradix"


class UnstampedRequestError(RuntimeError):
    """A request reached the radix cache without being bound to an epoch: vradix refuses to guess its namespace."""


@dataclass(slots=True)
class ReqState:
    """Changes only through its own methods: `bind`, `adopt` and `set_adapter` (admission), `cross`, `mark_crossed`
    and `end_crossing` (the bump and the release), `bind_bound` (`vradix.core.staleness`), `keep_ledger_spans` and
    `keep_bounded_report` (the release), `hand_off`, `await_first_read`, `take_first_read`, `keep_backup_epochs`,
    `forget_backup_epochs` and `revoke` (P/D decode). `epoch` and `kv_history` are derived from what the last bind
    recorded (`bound`) and the crossings since (`crossings`), so they cannot disagree."""

    user_key: Optional[str]
    #: what the last bind recorded: the request matches and inserts in `bound.epoch`'s namespace, and its KV from
    #: position 0 on is computed (or matched) under that epoch's weights
    bound: HistoryEntry
    #: one entry per bump the request crossed while holding KV: the epoch computing its KV from `start` on
    crossings: List[HistoryEntry] = field(default_factory=list)
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
    #: a bounded request's response fields, fixed when it released its KV (`StalenessRecord.report_at_release`)
    bounded_report: Optional[dict] = None

    @property
    def epoch(self) -> int:
        """The epoch whose namespace the request matches and inserts in (its last bind's)."""
        return self.bound.epoch

    @property
    def kv_history(self) -> List[HistoryEntry]:
        """The provenance of the request's KV (`vradix.core.provenance`): the bind, then each crossing; a crossing
        at or before the start of the entry it follows replaces that entry (nothing was computed under it), keeping
        its start."""
        history = [self.bound]
        for entry in self.crossings:
            if history[-1].start >= entry.start:
                history[-1] = HistoryEntry(history[-1].start, entry.epoch, entry.label, entry.weight_id)
            else:
                history.append(entry)
        return history

    def bind(self, entry: HistoryEntry) -> None:
        """Bind the request (holding no KV) to `entry`'s epoch: all its KV will be computed or matched under it; a
        re-bound request has received no P/D KV yet."""
        self.bound, self.crossings, self.pd_handoff = entry, [], None

    def adopt(self, entry: HistoryEntry, admitted_epoch: int) -> None:
        """A bounded request (holding no KV) adopts `entry`'s namespace, admitted at `admitted_epoch`."""
        self.bound, self.crossings, self.admitted_epoch = entry, [], admitted_epoch

    def cross(self, entry: HistoryEntry) -> None:
        """The request holds KV across a bump: KV from `entry.start` on is computed under `entry`'s weights."""
        self.crossings.append(entry)

    def mark_crossed(self, skip_insert: bool) -> bool:
        """The request holds KV across a bump and never inserts it; the first time, keep `skip_insert` (its insert
        flag before vradix forced it on) and return True."""
        if self.crossed:
            return False
        self.crossed, self.skip_insert_before = True, skip_insert
        return True

    def end_crossing(self) -> None:
        """A retracted crossing request gave back all its KV: it may insert again once re-bound."""
        self.crossed = False

    def bind_bound(self, max_staleness: int) -> None:
        self.max_staleness = max_staleness

    def keep_ledger_spans(self, spans: Optional[list]) -> None:
        self.ledger_spans = spans

    def keep_bounded_report(self, report: dict) -> None:
        self.bounded_report = report

    def hand_off(self, decode_prefix_len: int, prefill_weight_id: str) -> None:
        self.pd_handoff = (decode_prefix_len, prefill_weight_id)

    def await_first_read(self) -> None:
        self.pd_first_read_pending = True

    def take_first_read(self) -> bool:
        """Whether the first read of received KV is still pending; it is not any more."""
        pending, self.pd_first_read_pending = self.pd_first_read_pending, False
        return pending

    def keep_backup_epochs(self, epochs: object) -> None:
        self.backup_epochs = epochs

    def forget_backup_epochs(self) -> None:
        self.backup_epochs = None

    def revoke(self, reason: str) -> None:
        self.revoked = reason

    def set_adapter(self, adapter: Optional[str]) -> None:
        self.adapter = adapter


def of(req) -> Optional[ReqState]:
    """The request's vradix state, or None when vradix never admitted it."""
    return getattr(req, ATTR, None)


def require(req) -> ReqState:
    """The request's vradix state; raises `UnstampedRequestError` when it has none."""
    st = of(req)
    if st is None:
        raise UnstampedRequestError(
            f"vradix: request {getattr(req, 'rid', '?')!r} reached the radix cache without an epoch binding "
            "(it bypassed admission); refusing to match it against a versioned cache")
    return st


def attach(req, user_key: Optional[str], bound: HistoryEntry) -> ReqState:
    st = ReqState(user_key, bound)
    setattr(req, ATTR, st)
    return st


def holds_kv(req) -> bool:
    """Whether the request owns a KV row or a tree lock (then its namespace must not change)."""
    return req.kv.holds_kv or getattr(req, "lock", None) is not None


def holds_backup(req) -> bool:
    """Whether the request holds a retraction backup (taken by `backup_kv_cache`, cleared by the restore or by
    `discard_kv_cache_backup`; `vradix.core.retraction`). Inside `release_req` it is the only mark of a retraction:
    `reset_for_retract` (which sets `is_retracted`) runs after the release."""
    return getattr(getattr(req, "kv", None), "retraction_backup", None) is not None


def retracted_with_backup(req) -> bool:
    """Whether the request waits for `resume_retracted_reqs` with its KV in a backup (`retracted_queue`; SGLang
    clears `is_retracted` when it resumes it)."""
    return bool(getattr(req, "is_retracted", False)) and holds_backup(req)


def backed_up_len(req) -> int:
    """How many positions the backup holds: `Req.offload_kv_cache` copies `[0, seqlen - 1)` (the last output token's
    KV is not computed yet), and `resume_retracted_reqs` restores exactly that many (`_pre_alloc_fill_len`)."""
    return len(req.origin_input_ids) + max(len(req.output_ids) - 1, 0)


def holds_own_kv(req) -> bool:
    """Whether the request holds KV of its own: a row or a tree lock on the device (`holds_kv`), or a retraction
    backup it will resume from (`retracted_with_backup`). Such a request is never re-bound: its KV was computed under
    its bound epoch."""
    return holds_kv(req) or retracted_with_backup(req)


def record_crossing(req, st: ReqState, state) -> None:
    """The request holds KV across a bump to `state.epoch`: KV computed from now on is computed under its weights.
    Positions `[0, committed)` keep the KV they were computed with; a request retracted with a backup keeps its
    backed-up positions (a retraction reset both lengths to 0)."""
    committed = max(req.kv.kv_committed_len, getattr(req, "prefix_len", 0) or 0)
    if retracted_with_backup(req):
        committed = max(committed, backed_up_len(req))
    # an entry no position was computed under since it started is replaced (`ReqState.kv_history`)
    st.cross(HistoryEntry(committed, state.epoch, state.label, state.weight_id))
