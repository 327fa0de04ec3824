"""Data-path step 5 (report) — provenance: under which weights each position's KV was computed, per request.

Every request's `request.ReqState` carries `kv_history`, a list of `request.HistoryEntry(start, epoch, label,
weight_id)`, written by the request's record (`vradix.request`):
- `ReqState.bind` starts it at admission and at every re-bind (`Engine.admit`, `Engine.rebind_if_unheld`): a
  request that holds no KV will compute (or match) all of its KV under the epoch it is bound to, so its history is
  one entry from position 0.
- `request.record_crossing` appends one entry each time the request crosses a publication while holding KV:
  positions `[0, committed)` keep the KV they were computed with, positions from `committed` on are computed under
  the new epoch. Several crossings append several entries.

Invariants: start positions are non-decreasing; the first entry starts at 0 and names the epoch of the namespace the
request matched its prefix in (so it is also the provenance of its cached prefix). A retracted request gives back
all its KV and is re-bound before it runs again, which resets the history; one retracted with a KV backup (P/D
decode, `vradix.core.retraction`) keeps its KV, so a crossing while it waits starts at the backup's end.

`kv_weight_versions` turns the history into run-length spans over prompt+output positions (exact per token). For a
crossing request the response also carries `kv_ledger_spans`: what the KV page ledger's `spans` kernel read off the
request's row just before its release — an independent, device-side record at page granularity (with page_size > 1 the
page a crossing happened on reports the later epoch). Both must show the same sequence of epochs.

On a P/D decode role the response also carries `pd_spans` (`pd_spans`): the role that computed each span of the
request's KV and its `weight_id`, recorded when the weight-identity handshake accepted prefill's KV
(`vradix.pd.handshake`).
"""
from __future__ import annotations

from typing import Any, List, Optional

from vradix import labels, request, startup

PROVENANCE_KEY = "vradix_provenance"  # the customized_info key that carries it from scheduler to tokenizer manager


def kv_weight_versions(req) -> List[dict]:
    """Run-length spans `{version, weight_id, epoch, start, end}` over positions `[0, len(prompt) + len(output))`.

    Adjacent entries with the same label and weight identity are merged (a lock-aware flush bumps the epoch but keeps
    the weights); a merged span reports the epoch it started under.
    """
    st = request.of(req)
    history = st.kv_history if st is not None else []
    total = len(req.origin_input_ids) + len(req.output_ids)
    spans: List[dict] = []
    for i, (start, epoch, label, weight_id) in enumerate(history):
        end = history[i + 1].start if i + 1 < len(history) else total
        end = min(end, total)
        if end <= start:
            continue
        if spans and (spans[-1]["version"], spans[-1]["weight_id"]) == (label, weight_id):
            spans[-1]["end"] = end  # the span keeps the epoch it started under
            continue
        spans.append({"version": label, "weight_id": weight_id, "epoch": epoch, "start": start, "end": end})
    return spans


def spans_several_epochs(req) -> bool:
    """Whether the request's KV was computed under more than one epoch (its history has a crossing entry). Not
    `ReqState.crossed`, which says the request is a crossing request now: a crossing request whose KV all lies after
    the bump spans one epoch."""
    st = request.of(req)
    return st is not None and len(st.kv_history) > 1


def prefix_cache(req) -> Optional[dict]:
    """`{cached_tokens, epoch, weight_version, weight_id}` of the prefix KV the request reused (its bind epoch)."""
    st = request.of(req)
    if st is None or not st.kv_history:
        return None
    first = st.kv_history[0]
    return {"cached_tokens": req.cached_tokens, "epoch": first.epoch, "weight_version": first.label,
            "weight_id": first.weight_id}


def pd_spans(req) -> Optional[List[dict]]:
    """On a P/D decode role: which role computed each span of the request's KV, under which `weight_id`:
    `decode_cache` (the prefix decode matched and promised, `[0, decode_prefix_len)`), `prefill` (the rest of the
    prompt, received with the handshake's identity) and `decode` (the positions decode computed, one span per
    identity when the request crossed a publication on decode). Empty spans are left out; None when the request did
    not come through the handshake."""
    st = request.of(req)
    if st is None or st.pd_handoff is None:
        return None
    promised, prefill_id = st.pd_handoff
    return role_spans(promised, prefill_id, len(req.origin_input_ids), len(req.output_ids), st.kv_history)


def role_spans(promised: int, prefill_id: str, prompt: int, generated: int, history) -> List[dict]:
    """`pd_spans` from its inputs. Invariant: the spans are disjoint, ordered and cover `[0, prompt + generated)`;
    decode's positions (from `prompt` on) are split where the provenance history changes identity."""
    total = prompt + generated
    spans = [("decode_cache", 0, promised, history[0].weight_id), ("prefill", promised, prompt, prefill_id)]
    for i, entry in enumerate(history):
        end = history[i + 1].start if i + 1 < len(history) else total
        spans.append(("decode", max(entry.start, prompt), min(max(end, prompt), total), entry.weight_id))
    merged: List[list] = []
    for role, s, e, w in spans:
        if e <= s:
            continue
        if merged and merged[-1][0] == role and merged[-1][3] == w and merged[-1][2] == s:
            merged[-1][2] = e
        else:
            merged.append([role, s, e, w])
    return [{"role": role, "start": s, "end": e, "weight_id": w} for role, s, e, w in merged]


#: upstream SGLang's switch for its `prefill_weight_versions` (after 0.5.23). vradix registers it on an SGLang whose
#: parser lacks it, in every process of the environment (`vradix.startup`) and in the engine's
#: (`hooks.launcher.add_identity_flag`), so an engine launched with it, and miles' trainer-side
#: `--sglang-enable-prefill-weight-versions` check, work; vradix emits the field whether or not it is given
UPSTREAM_FLAG = startup.UPSTREAM_FLAG

#: upstream's version for positions whose weights nobody stamped (its KV-slot table's never-written slots)
UNKNOWN_VERSION = "unknown"


def upstream_version(label):
    """A weight version label as the upstream consumers read it: an integer when the label is a step number
    (`vradix.labels.step_number`: miles reads its per-forward versions as integers), else the label itself."""
    step = labels.step_number(label) if isinstance(label, str) else None
    return label if step is None else step


def computed_kv_len(req) -> int:
    """How many of the request's positions have KV it computed or reused, `[0, n)`: SGLang's committed KV length
    (0 for a request aborted before its prefill). A finished request whose KV record was handed on (a streaming
    session's turn) ran its whole prompt: it has output tokens."""
    total = len(req.origin_input_ids) + len(req.output_ids)
    committed = int(getattr(getattr(req, "kv", None), "kv_committed_len", 0) or 0)
    if committed <= 0 and req.output_ids:
        committed = total - 1
    return min(committed, total)


def prefill_weight_versions(spans: List[dict], prompt: int) -> List[dict]:
    """SGLang's `prefill_weight_versions`: `{version, start, end}` spans over the prompt's KV positions
    `[0, prompt)` (pass the prompt's computed part: a request aborted mid-prefill reports only what it wrote),
    naming the weights that computed each position's KV (exact per token). As upstream: versions are strings (a
    position whose weights no label names is `"unknown"`), spans are contiguous from 0, and adjacent spans always
    differ (one label's spans merge). `spans` cover the request's KV positions (`kv_weight_versions`, or a bounded
    request's ledger spans)."""
    out: List[dict] = []
    for x in spans:
        start, end = x["start"], min(x["end"], prompt)
        if end <= start:
            continue
        version = UNKNOWN_VERSION if x["version"] is None else str(x["version"])
        if out and out[-1]["version"] == version and out[-1]["end"] == start:
            out[-1]["end"] = end
        else:
            out.append({"version": version, "start": start, "end": end})
    return out


def forward_weight_versions(spans: List[dict], computed_from: int, computed_to: int) -> dict:
    """miles' per-request fields, from the weights of the positions this request's forwards computed,
    `[computed_from, computed_to)` (`computed_to` is at most `total - 1`: the last sampled token's KV is never
    computed): `first_prefill_weight_version` (its first forward), `last_forward_weight_version` (its last),
    `min_` / `max_forward_weight_version` (the oldest and newest weights any of its forwards ran under, by
    publication order: equal to a numeric min and max when labels are increasing step numbers). Empty when it
    computed nothing (`computed_to` 0: aborted before its prefill)."""
    if computed_to <= 0:
        return {}
    end = max(computed_to, computed_from + 1)
    ran = [x for x in spans if min(x["end"], end) > max(x["start"], computed_from)]
    if not ran:
        return {}
    oldest = min(ran, key=lambda x: x.get("epoch", 0))
    newest = max(ran, key=lambda x: x.get("epoch", 0))
    return {"first_prefill_weight_version": upstream_version(ran[0]["version"]),
            "min_forward_weight_version": upstream_version(oldest["version"]),
            "max_forward_weight_version": upstream_version(newest["version"]),
            "last_forward_weight_version": upstream_version(ran[-1]["version"])}


def upstream_fields(req, spans: List[dict]) -> dict:
    """The fields upstream SGLang (`prefill_weight_versions`) and miles (the four per-forward versions) return, for
    a request whose KV positions `spans` describe. A request aborted before its prefill gets none of them (upstream
    reports no `prefill_weight_versions` for it: it has no prompt KV)."""
    prompt = len(req.origin_input_ids)
    total = prompt + len(req.output_ids)
    kv_len = computed_kv_len(req)
    if kv_len <= 0:
        return {}
    return {"prefill_weight_versions": prefill_weight_versions(spans, min(prompt, kv_len)),
            **forward_weight_versions(spans, int(getattr(req, "cached_tokens", 0) or 0), min(kv_len, total - 1))}


def response_weight_version_segments(weight_versions: Optional[List[dict]], completion_tokens: int) -> dict:
    """miles' `response_weight_version_segments` and `response_weight_version`, from SGLang's own per-output-token
    `weight_versions` (the weights that sampled each output token): `[[start, end, version], ...]` over the output
    tokens `[0, completion_tokens)`, versions as `upstream_version` (integers for step numbers), no zero-length
    segment and none past the output (miles' per-call parser rules), adjacent segments of one version merged; and
    the label (a string, as SGLang's `weight_version`) that sampled the last output token. Empty when there is no
    output token."""
    segments: List[list] = []
    last = None
    for span in weight_versions or []:
        start, end = int(span["start"]), min(int(span["end"]), completion_tokens)
        if end <= start:
            continue
        version, last = upstream_version(span["version"]), span["version"]
        if segments and segments[-1][2] == version and segments[-1][1] == start:
            segments[-1][1] = end
        else:
            segments.append([start, end, version])
    if not segments:
        return {}
    return {"response_weight_version": None if last is None else str(last),
            "response_weight_version_segments": segments}


def response_provenance(req) -> Optional[dict]:
    """The meta_info fields vradix adds to a finished request's response, or None for an unstamped request."""
    prefix = prefix_cache(req)
    if prefix is None:
        return None
    st = request.require(req)  # a prefix_cache means a stamped request
    out: dict[str, Any] = {"prefix_cache": prefix}
    bounded = st.bounded_report
    if bounded is not None:
        out.update(bounded)  # a bounded request's spans come from the ledger (`vradix.core.staleness`)
        out.update(upstream_fields(req, bounded["kv_weight_versions"]))
        return out
    out.update(upstream_fields(req, kv_weight_versions(req)))
    roles = pd_spans(req)
    if roles is not None:
        out["pd_spans"] = roles
    if spans_several_epochs(req):
        out["kv_weight_versions"] = kv_weight_versions(req)
        ledger_spans = st.ledger_spans
        if ledger_spans:
            # the KV page ledger's independent record (the `spans` kernel, page granularity) as a cross-check
            out["kv_ledger_spans"] = [{"epoch": e, "start": s, "end": t} for e, s, t in ledger_spans]
    return out
