"""Bounded staleness (opt-in): a request may reuse prefix KV computed up to K epochs ago, and is told exactly which.

Exact reuse stays the default: the server window `VRADIX_MAX_STALENESS` (flag `--vradix-max-staleness`) is 0 unless
set, and a request with bound 0 takes exactly today's path. A request names its bound in
`sampling_params.custom_params["vradix_max_staleness"]` (`PARAM`), which SGLang forwards to the scheduler from
`/generate`, `/v1/completions` and `/v1/chat/completions` (`custom_params`); a request that names none gets the
server window. A bound above the window is refused (HTTP 400 from the launcher, `check_request`).

How a bounded request matches (`StalenessRecord.choose_namespace`, before every match of a request that holds no
KV): at admission epoch e with bound K it probes the namespaces of epochs e-K .. e and adopts one. The longest match
wins; the current epoch wins every tie, and among older epochs the newer one wins a tie. It then matches *and inserts*
in that namespace. So:
- a namespace's epoch n is the oldest weights any KV in it depends on: KV a bounded request computes on top of
  epoch-n KV lands in namespace n, never in the current one, so no exact request (which only ever sees the current
  namespace) and no request whose window does not reach n can match it;
- it ages out with epoch n: at the bump that makes n older than the window, namespace n becomes stale and the deferred
  reclaim frees it (`deferred_reclaim`, window mode);
- the strict guard lets a bounded request read pages written under epochs n .. current (`guard.allowed_epochs`);
- its response reports the KV page ledger's spans (exact per token: a match is page aligned) with each epoch's label
  and weight_id, and its staleness e - (oldest epoch it read) (`StalenessRecord.report_at_release`).

Where it does not apply (refused when the window is above 0: at startup per server, `check_server`, `check_ledger`
and `check_cache`, and per request as a 400): P/D roles, HiCache host/L3 tiers, LoRA, streaming sessions (a slot
would lend a bounded turn's record to the next turn whatever its bound), engines where the KV page ledger is off
(speculative decoding, the external cache linker: the spans are read from the ledger), and trees with hybrid
(Mamba/SWA) components; the deferred reclaim that ages epochs out is full-attention only.

Epochs count every bump: a lock-aware flush is one too (it keeps the weights, but it is an invalidation asked for).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence

from sglang.srt.managers.utils import is_health_check_generate_req

from vradix import identity, request, settings

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    from vradix.engine import Engine

#: the `custom_params` key a request names its bound with
PARAM = "vradix_max_staleness"
ENV = "VRADIX_MAX_STALENESS"
FLAG = "--vradix-max-staleness"


class StalenessError(ValueError):
    """A staleness bound vradix cannot honour (a ValueError: SGLang's HTTP layer answers it with HTTP 400)."""


def server_window() -> int:
    """The server's window K (0: exact reuse only). Raises `settings.SettingsError` for an unusable value."""
    return settings.value(ENV)


def requested_bound(custom_params, window: int) -> int:
    """The bound a request asks for: `custom_params[PARAM]` when present, else the server window. Raises
    StalenessError for a value that is not an integer from 0 to `window`."""
    if not isinstance(custom_params, dict) or PARAM not in custom_params:
        return window
    k = custom_params[PARAM]
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise StalenessError(f"vradix: custom_params.{PARAM}={k!r} must be a non-negative integer")
    if k > window:
        raise StalenessError(f"vradix: custom_params.{PARAM}={k} exceeds this server's window ({FLAG} {window}); "
                             "older KV is not kept")
    return k


def custom_params_of(req) -> Optional[dict]:
    sp = getattr(req, "sampling_params", None)
    return getattr(sp, "custom_params", None)


def check_request(obj, window: int) -> None:
    """Launcher-side check of one `GenerateReqInput` element: raises StalenessError (HTTP 400) for a bad bound."""
    sp = obj.sampling_params
    if isinstance(sp, dict):
        requested_bound(sp.get("custom_params"), window)


#: server flags under which a window above 0 is refused: (ServerArgs field, flag, why)
REFUSED_WITH = (
    ("disaggregation_mode", "--disaggregation-mode", "a P/D role hands KV to another engine, which would have to "
     "honour the bound; the handshake accepts only KV of its own weights"),
    ("enable_hierarchical_cache", "--enable-hierarchical-cache", "HiCache host and L3 copies are reclaimed in bulk at "
     "each publication; an older epoch's copies would not be kept"),
    ("enable_lora", "--enable-lora", "adapter-scoped invalidation frees an adapter's KV across every namespace"),
    # the KV page ledger is off on these engines (`hooks.startup.ledger_blind_spots`), and a bounded response's
    # spans and staleness are read from it
    ("speculative_algorithm", "--speculative-algorithm", "draft KV is written outside the forwards the KV page "
     "ledger stamps, so the ledger is off and a bounded response could not say which weights computed its KV"),
    ("enable_unified_cache_external_linker", "--enable-unified-cache-external-linker", "the linker loads device KV "
     "outside the forwards the KV page ledger stamps, so the ledger is off and a bounded response could not say "
     "which weights computed its KV"),
    ("enable_streaming_session", "--enable-streaming-session", "a session slot keeps the record of a bounded turn "
     "(KV of an older epoch's namespace) and lends it to the session's next turn whatever that turn's bound"),
)


def check_server(server_args, window: int) -> None:
    """At startup: a window above 0 with a flag it does not support stops the launch with StalenessError naming it."""
    if window <= 0:
        return
    for attr, flag, why in REFUSED_WITH:
        value = getattr(server_args, attr, None)
        if value and value != "null":
            raise StalenessError(f"vradix: {FLAG} {window} is not supported with {flag}: {why}. "
                                 f"Start without {FLAG} (exact reuse), or without {flag}.")


def check_ledger(window: int, blind_spots) -> None:
    """At scheduler start: a window above 0 needs the KV page ledger, which a bounded response's spans and staleness
    are read from (`report_at_release`); `blind_spots` names the paths that keep it off (empty: it is on)."""
    if window > 0 and blind_spots:
        raise StalenessError(f"vradix: {FLAG} {window} needs the KV page ledger, which is off on this engine "
                             f"(KV also arrives via {', '.join(blind_spots)}), so a bounded response could not say "
                             f"which weights computed its KV. Start without {FLAG} (exact reuse), or without "
                             f"{', '.join(blind_spots)}.")


def check_cache(cache, window: int, can_age_out: bool) -> None:
    """At scheduler start: a window above 0 needs a tree that ages epochs out after a bump (`can_age_out`:
    `deferred_reclaim.supported`)."""
    if window > 0 and not can_age_out:
        raise StalenessError(f"vradix: {FLAG} {window} needs a full-attention radix cache without a HiCache tier; "
                             f"this model's tree holds {[str(c) for c in cache.tree_components]} components")


@dataclass
class StalenessRecord:
    """The engine's bounded-staleness part: the window, how a bounded request picks its namespace, and what bounded
    requests reused (server info `bounded_staleness`). `window` is set at attach; then the record changes only
    through its methods: `age_out` (a flush, `Engine.age_out_on_flush`), `count_evicted_in_window`
    (`deferred_reclaim.evict_older_in_window`) and `report_at_release`, when a bounded request releases its KV.
    `choose_namespace` changes the request, not the record."""

    window: int = 0
    #: the oldest epoch a flush left reusable (`Engine.age_out_on_flush`): a flush ages the whole window out
    floor: int = 0
    bounded_requests: int = 0
    #: staleness (epochs) -> prompt tokens bounded requests read from KV that old
    stale_tokens_by_staleness: Dict[int, int] = field(default_factory=dict)
    #: tokens of in-window older namespaces evicted under memory pressure before current-epoch KV (written only by
    #: `deferred_reclaim.evict_older_in_window`)
    tokens_evicted_in_window: int = 0

    def age_out(self, floor: int) -> None:
        """A flush: nothing older than epoch `floor` stays reusable."""
        self.floor = floor

    def count_evicted_in_window(self, tokens: int) -> None:
        self.tokens_evicted_in_window += tokens

    def floor_at(self, epoch: int) -> int:
        """The oldest epoch whose KV is kept while `epoch` is current: epoch - window (0 with no window: only the
        current one matters), and never one before the last flush (`floor`; at most `epoch`)."""
        return min(epoch, max(0, epoch - self.window, self.floor))

    def candidates(self, engine: "Engine", bound: int) -> List[int]:
        """The epochs a request admitted now with `bound` may match, newest first (current first)."""
        lo = max(self.floor_at(engine.epoch), engine.epoch - bound)
        return [e for e in range(engine.epoch, lo - 1, -1) if e in engine.identities]

    def choose_namespace(self, engine: "Engine", cache: "UnifiedRadixCache", req: "Req",
                         token_ids: Optional[Sequence[int]] = None) -> int:
        """Before a bounded request (holding no KV) matches: adopt the namespace of the window epoch with the longest
        match (`pick`), bind the request to it and to the current epoch as its admission epoch. Returns the epoch."""
        st = request.require(req)
        if token_ids is None:
            token_ids = req.origin_input_ids + req.output_ids
        epochs = self.candidates(engine, st.max_staleness)
        if len(epochs) == 1:
            chosen = epochs[0]
        else:
            lengths = {e: probe_length(cache, req, token_ids,
                                       identity.stamped(engine.prefix_of_epoch(e), st.user_key, st.adapter))
                       for e in epochs}
            chosen = pick(lengths, engine.epoch)
        st.adopt(request.HistoryEntry(0, chosen, engine.label_of(chosen),
                                      engine.identities[chosen].identity.weight_id), admitted_epoch=engine.epoch)
        req.extra_key = identity.stamped(engine.prefix_of_epoch(chosen), st.user_key, st.adapter)
        return chosen

    def report_at_release(self, engine: "Engine", req: "Req") -> None:
        """When a bounded request releases its KV (its ledger spans were just read, `ReqState.ledger_spans`): count
        the stale prefix tokens it read, by staleness, and keep what its response adds (`ReqState.bounded_report`):
        `kv_weight_versions` from the ledger (per span: epoch, label, weight_id) and `vradix_staleness`
        {max_staleness, admitted_epoch, namespace_epoch, staleness, stale_tokens}."""
        st = request.of(req)
        if st is None or not is_bounded(st) or st.admitted_epoch is None:
            return
        spans = st.ledger_spans or []
        read = stale_reads(spans, st.admitted_epoch)
        self.bounded_requests += 1
        for k, n in read.items():
            self.stale_tokens_by_staleness[k] = self.stale_tokens_by_staleness.get(k, 0) + n
        total = len(req.origin_input_ids) + len(req.output_ids)
        oldest = min([s[0] for s in spans], default=st.admitted_epoch)
        st.keep_bounded_report({
            "kv_weight_versions": spans_with_identity(engine, spans, total),
            "vradix_staleness": {"max_staleness": st.max_staleness, "admitted_epoch": st.admitted_epoch,
                                 "namespace_epoch": st.epoch, "staleness": max(0, st.admitted_epoch - oldest),
                                 "stale_tokens": sum(read.values())}})

    @property
    def stale_tokens_total(self) -> int:
        return sum(self.stale_tokens_by_staleness.values())

    def as_dict(self) -> dict:
        return {"window": self.window, "bounded_requests": self.bounded_requests,
                "stale_tokens_reused_total": self.stale_tokens_total,
                "stale_tokens_reused_by_staleness": {str(k): v for k, v in
                                                     sorted(self.stale_tokens_by_staleness.items())},
                "tokens_evicted_in_window": self.tokens_evicted_in_window}


def bind_bound(st: request.ReqState, req, window: int) -> None:
    """At admission: fix the request's bound. SGLang's health probe (`/health`, `/health_generate`, sent every few
    seconds by a gateway) runs exact: it is no rollout, and counting it would make the bounded-request counter count
    probes. Raises StalenessError for a bad bound."""
    if is_health_check_generate_req(req):
        st.bind_bound(0)
        return
    st.bind_bound(requested_bound(custom_params_of(req), window))


def is_bounded(st: Optional[request.ReqState]) -> bool:
    return st is not None and st.max_staleness > 0


def pick(lengths: Dict[int, int], current: int) -> int:
    """The namespace epoch to adopt from {epoch: match length}: the longest match; the current epoch wins any tie,
    and among older epochs the newer one wins a tie."""
    return max(lengths, key=lambda e: (lengths[e], e == current, e))


def probe_length(cache, req, token_ids, key_for) -> int:
    """Device prefix length `req` would match under extra_key `key_for` (the tree walk only, as SGLang's
    `touch_prefix`: no session shortcut, no load-back)."""
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.common import _req_radix_key

    saved = req.extra_key
    req.extra_key = key_for
    try:
        key = _req_radix_key(cache, req, token_ids, None)
    finally:
        req.extra_key = saved
    result = cache.tree_core.match_prefix(MatchPrefixParams(key=key))
    cache._apply_cache_actions(result.cache_actions)
    return int(result.device_prefix_len)


def spans_with_identity(state, ledger_spans, total: int) -> List[dict]:
    """The ledger's `(epoch, start, end)` spans as `{version, weight_id, epoch, start, end}`; the last span is
    extended to `total` (the positions computed after the last forward wrote KV were computed by its weights)."""
    out = []
    for i, (epoch, start, end) in enumerate(ledger_spans):
        if i == len(ledger_spans) - 1:
            end = max(end, total)
        ident = state.identities.get(epoch)
        out.append({"version": state.label_of(epoch), "weight_id": ident.identity.weight_id if ident else None,
                    "epoch": epoch, "start": start, "end": end})
    return out


def stale_reads(ledger_spans, admitted: int) -> Dict[int, int]:
    """staleness -> positions of the request's row written that many epochs before `admitted`: the cached prefix it
    read (everything it computes itself is written under `admitted` or later)."""
    out: Dict[int, int] = {}
    for epoch, start, end in ledger_spans:
        if end > start and epoch < admitted:
            out[admitted - epoch] = out.get(admitted - epoch, 0) + end - start
    return out
