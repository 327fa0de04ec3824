"""Each sampled token's provenance: the weights that sampled it, and which weights computed the KV its sampling step
read, from the response alone.

Output token j of a request with a P-token prompt is sampled by the forward over position P + j - 1, which reads the
KV of positions [0, P + j - 1) and computes its own position under the sampling weights s_j (SGLang's
`weight_versions`, spans over output tokens). The token is
  FRESH     when every position it read was computed under s_j;
  STALE     when a position it read was computed under weights older than the request's admission version a = s_0
            (KV that was already stale when the request matched it: reused stale);
  CROSSING  otherwise (it read KV the request itself computed under a, before a publication it crossed).
Its staleness is the number of publications between the oldest weights it read and s_j.

Where the positions' weights come from:
  vradix         `meta_info.kv_weight_versions` (spans over prompt + output positions; absent when every position
                 is the admission version's, docs/provenance.md);
  stock servers  no per-position record: the cached prefix [0, cached_tokens) is stale when the shadow of the cache
                 (`benchmark/rl_rollout/shadow_cache.py`) finds stale positions in it (a lower bound), and positions
                 after it were computed by the request (under a, or re-prefilled after a retraction, hence FRESH).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from .grpo import CROSSING, FRESH, STALE


@dataclass
class TokenProvenance:
    """Per output token: the sampling version, the class (grpo.FRESH/CROSSING/STALE) and the staleness."""

    versions: List[str]
    classes: List[int]
    staleness: List[int]


def sampler_versions(meta: dict, n_out: int) -> List[str]:
    """The version that sampled each output token: SGLang's `weight_versions` spans, or its `weight_version` for all
    (a request that crossed nothing)."""
    spans = meta.get("weight_versions") or [{"version": meta["weight_version"], "start": 0, "end": n_out}]
    out = [spans[0]["version"]] * n_out
    for sp in spans:
        for j in range(sp["start"], min(sp["end"], n_out)):
            out[j] = sp["version"]
    return out


def position_versions(meta: dict, n_positions: int, default: str) -> List[str]:
    """The version that computed each KV position, from `kv_weight_versions` (vradix); `default` where none."""
    out = [default] * n_positions
    for sp in meta.get("kv_weight_versions") or []:
        for i in range(sp["start"], min(sp["end"], n_positions)):
            out[i] = sp["version"]
    return out


def unlabelled_crossing(meta: dict, publications: Sequence) -> bool:
    """Whether the request crossed a publication its `weight_versions` do not record: its first forward started
    before the publication that loaded the version SGLang says sampled its first token. The publication's
    `boundary` is the midpoint of the window in which the scheduler starts no forward (pause returned -> continue
    sent), on the client clock, which is the server's for the local servers this loop starts. Seen on a
    --disable-radix-cache server: requests in flight across a publication reported every token under the new
    version, the first ones included, which the old weights sampled. `publications` are
    `rl_rollout.schedule.Publication`s."""
    spans = meta.get("weight_versions") or [{"version": meta.get("weight_version")}]
    for p in publications:
        if p.version == spans[0]["version"]:
            return meta.get("forward_entry_time", p.boundary) < p.boundary
    return False


def classify(prompt_len: int, n_out: int, meta: dict, order: Dict[str, int],
             stale_prefix: Optional[int] = None, unlabelled: bool = False) -> TokenProvenance:
    """The provenance of a response's output tokens.

    `order` maps every version label to its publication index (older is smaller). `stale_prefix`: for a stock
    server, the stale positions the shadow cache found in the cached prefix (None on a vradix server, whose
    `kv_weight_versions` say it per position). `unlabelled` (see `unlabelled_crossing`): the sampler spans are
    wrong, so every token is CROSSING (its reference is the version SGLang named)."""
    samplers = sampler_versions(meta, n_out)
    if not samplers:
        return TokenProvenance([], [], [])
    if unlabelled:
        return TokenProvenance(samplers, [CROSSING] * n_out, [1] * n_out)
    admitted = samplers[0]
    retracted = meta.get("num_retractions", 0) > 0
    if stale_prefix is None:
        positions = position_versions(meta, prompt_len + n_out, admitted)
    else:
        positions = None
    versions, classes, staleness = [], [], []
    oldest_seen = None          # the oldest version among positions [0, P + j - 1), kept incrementally
    seen_upto = 0
    for j, s in enumerate(samplers):
        versions.append(s)
        if positions is not None:
            end = prompt_len + j - 1
            for i in range(seen_upto, max(end, 0)):
                if oldest_seen is None or order[positions[i]] < order[oldest_seen]:
                    oldest_seen = positions[i]
            seen_upto = max(seen_upto, end)
            oldest = oldest_seen if oldest_seen is not None else s
            if order[oldest] < order[admitted]:
                classes.append(STALE)
            elif oldest != s:
                classes.append(CROSSING)
            else:
                classes.append(FRESH)
            staleness.append(order[s] - order[oldest])
        else:
            if stale_prefix:
                classes.append(STALE)
                staleness.append(max(1, order[s] - order[admitted] + 1))
            elif s != admitted and not retracted:
                classes.append(CROSSING)
                staleness.append(order[s] - order[admitted])
            else:
                classes.append(FRESH)
                staleness.append(0)
    return TokenProvenance(versions, classes, staleness)


def stock_stale_prefixes(records: Sequence) -> Dict[int, int]:
    """{id(record): stale positions in its cached prefix} for a stock server's trace, by the shadow of the cache:
    the walk of `rl_rollout.shadow_cache.stale_reuse`, keeping each request's count, with a copy of every output
    position (see below).

    A request's version is the one that sampled its first token (`prefill_order` without a publication log), not
    the publication clock: a publication pauses between forwards and every prompt here fits one prefill chunk, so
    that is the version its prefill ran under, read from the engine rather than placed by clock offsets (on a loaded
    host the offset estimate can move a boundary by more than the pause window)."""
    from rl_rollout.shadow_cache import ShadowCache
    from rl_rollout.trace import MIXED, output_tags, prefill_order, spans_of

    cache, out = ShadowCache(), {}
    for r, version in prefill_order(records):
        m, spans = r.meta, spans_of(r)
        at, cached = m["forward_entry_time"], m["cached_tokens"]
        stale = cache.stale_positions(r.input_ids, cached, version, at)
        out[id(r)] = stale
        clean = stale == 0
        cache.add(r.input_ids, cached, [version if clean else MIXED] * (len(r.input_ids) - cached), at)
        if m.get("num_retractions", 0):
            seq = r.input_ids + r.output_ids   # every output position, as below
            for v in dict.fromkeys(sp["version"] for sp in spans):
                cache.add(seq, 0, [v] * len(seq), at)
            continue
        # one tag more than `output_tags` gives (and the whole sequence for a retracted request, above): a request
        # that stopped on EOS leaves the KV of every output position in the tree, its last one included (the next
        # turn's cached_tokens reach prompt + output). The extra copy takes the first version's tag unless the
        # request crossed, so the count stays a lower bound
        tags = output_tags(spans, len(r.output_ids) + 1, clean and spans[0]["version"] == version)
        cache.add(r.input_ids + r.output_ids, len(r.input_ids), tags, m.get("request_finished_ts", at))
    return out
