"""The divergence reuse of older KV causes, measured, not assumed: for the tokens a rollout sampled, the log-probs
the serving engine returned against the log-probs an exact engine on the request's own weights gives the same tokens.

The exact engine is the same server after the run, reset to each version's checkpoint (`ServerClient.reset`: load
and flush, idle), with exact requests (bound 0: on a bounded server a reset is a publication bump, and its window
keeps the older namespaces for bounded requests), scoring `prompt + output` from `logprob_start_len = len(prompt) - 1` (teacher forcing: the output
tokens' log-probs given the exact prefix). Only requests that ran under one version from their first forward to their
last token are scored (and not those whose output the server does not take back as the same input ids:
`unscored_requests`) (a request that crossed a publication decoded under two weights: no single exact reference).
|delta log-prob| per token, mean and p99, over every scored token and over the tokens of requests whose response
says they read KV older than their admission epoch (`vradix_staleness.staleness > 0`, bounded modes only).
On a mode that never reuses older KV the numbers are the scoring's numerical floor (prefill vs decode kernels).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from .trace import spans_of, version_at, version_clock


def single_version(records, publications, first_version) -> List[Tuple[object, str]]:
    """(record, its version) for every record that ran under one version and returned its output log-probs."""
    boundaries, versions = version_clock(records, publications, first_version)
    out = []
    for r in records:
        spans = spans_of(r)
        if len(spans) != 1 or not r.meta.get("output_token_logprobs"):
            continue
        v = spans[0]["version"]
        if publications and version_at(boundaries, versions, r.meta["forward_entry_time"]) != v:
            continue
        out.append((r, v))
    return out


def checkpoint_of_version(publications, first_version: str, weights: Sequence[str]) -> Dict[str, str]:
    """Version label -> the checkpoint the schedule loaded for it (publication i loads weights[i % len])."""
    out = {first_version: weights[0]}
    for p in publications:
        out[p.version] = weights[p.index % len(weights)]
    return out


def exact_logprobs(server, r) -> Optional[List[float]]:
    """The log-probs of r's output tokens given its prompt, on the server's current (exact, flushed) weights; None
    when the server does not take r's output back as the same input ids (the tiny models can sample an id their
    input path maps to another, so no teacher-forced reference exists for that request)."""
    n = len(r.input_ids)
    # exact: bound 0, so a bounded server's kept older namespaces cannot serve the reference (the reset before the
    # scoring is a publication bump, and a window keeps what it left behind)
    sampling = {"temperature": 0, "max_new_tokens": 1, "custom_params": {"vradix_max_staleness": 0}}
    # SGLang gives the first token of the scored range no log-prob: start one token early and drop it
    payload = {"input_ids": r.input_ids + r.output_ids, "sampling_params": sampling, "return_logprob": True,
               "logprob_start_len": n - 1}
    response = server.post("/generate", payload)
    if response.status_code != 200:
        raise RuntimeError(f"scoring {r.task} turn {r.turn} failed ({response.status_code}): {response.text[:300]}")
    meta = response.json()["meta_info"]
    scored = meta["input_token_logprobs"][1:len(r.output_ids) + 1]
    if [tok for _, tok, *_ in scored] != r.output_ids or any(lp is None for lp, *_ in scored):
        return None
    return [lp for lp, *_ in scored]


def rollout_logprobs(r) -> List[float]:
    return [lp for lp, *_ in r.meta["output_token_logprobs"]]


def read_older_kv(r) -> bool:
    return (r.meta.get("vradix_staleness") or {}).get("staleness", 0) > 0


def measure(server, raw: dict, weights: Sequence[str], label: str) -> dict:
    """Score every single-version record of `raw` on an exact server per checkpoint; the divergence columns."""
    from .report import percentile

    pubs, first = raw["publications"], raw["first_version"]
    ckpt = checkpoint_of_version(pubs, first, weights)
    by_ckpt: Dict[str, list] = {}
    for r, v in single_version(raw["records"], pubs, first):
        by_ckpt.setdefault(ckpt[v], []).append(r)
    every, older, unscored = [], [], 0
    for i, (path, recs) in enumerate(by_ckpt.items()):
        server.reset(path, f"{label}-exact{i}")
        for r in recs:
            exact = exact_logprobs(server, r)
            if exact is None:
                unscored += 1
                continue
            deltas = [abs(a - b) for a, b in zip(rollout_logprobs(r), exact)]
            every += deltas
            if read_older_kv(r):
                older += deltas
    def stats(xs):
        return (round(sum(xs) / len(xs), 6) if xs else 0.0), round(percentile(xs, 0.99), 6)
    (m, p), (om, op) = stats(every), stats(older)
    return {"scored_tokens": len(every), "unscored_requests": unscored, "logprob_delta_mean": m, "logprob_delta_p99": p,
            "older_kv_scored_tokens": len(older), "older_kv_logprob_delta_mean": om,
            "older_kv_logprob_delta_p99": op}


def stale_by_staleness(records) -> Dict[str, int]:
    """Prompt tokens bounded requests read from older KV, by staleness, from the responses (`vradix_staleness`)."""
    out: Dict[str, int] = {}
    for r in records:
        st = r.meta.get("vradix_staleness") or {}
        if st.get("staleness", 0) > 0:
            out[str(st["staleness"])] = out.get(str(st["staleness"]), 0) + st["stale_tokens"]
    return dict(sorted(out.items()))
