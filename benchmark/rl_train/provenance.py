"""Each sampled token's provenance: the weights that sampled it, and which weights computed the KV its sampling step
read, from the response alone, by the product's consumer API (`vradix.trainer.TokenVersions`, one implementation:
fresh / crossing / stale and the staleness, as a trainer reads them).

Where the positions' weights come from:
  vradix         the response itself (`kv_weight_versions`, `prefix_cache`, `vradix_staleness`; docs/provenance.md);
  stock servers  no per-position record: `stock_view` writes what the shadow of the cache
                 (`benchmark/rl_rollout/shadow_cache.py`) found into the same fields, so the same API reads it: the
                 cached prefix [0, cached_tokens) holds stale positions when the shadow finds some (a lower bound;
                 they are placed one publication before the request's version), and positions after it were
                 computed by the request (under its version, or re-prefilled after a retraction, hence FRESH).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from vradix.trainer import KIND_CODES, TokenVersions

from .grpo import CROSSING, FRESH, STALE

assert (FRESH, CROSSING, STALE) == (KIND_CODES["fresh"], KIND_CODES["crossing"], KIND_CODES["stale"])


@dataclass
class TokenProvenance:
    """Per output token: the sampling version, the class (grpo.FRESH/CROSSING/STALE) and the staleness."""

    versions: List[str]
    classes: List[int]
    staleness: List[int]


def sampler_versions(meta: dict, n_out: int) -> List[str]:
    """The label that sampled each output token, as the server wrote it: SGLang's `weight_versions` spans, or its
    `weight_version` for all (a request that crossed nothing)."""
    spans = meta.get("weight_versions") or [{"version": meta["weight_version"], "start": 0, "end": n_out}]
    out = [spans[0]["version"]] * n_out
    for sp in spans:
        for j in range(sp["start"], min(sp["end"], n_out)):
            out[j] = sp["version"]
    return out


def unlabelled_crossing(meta: dict, publications: Sequence) -> bool:
    """Whether the request crossed a publication its `weight_versions` do not record: its first forward started
    before the publication that loaded the version SGLang says sampled its first token. The publication's
    `boundary` is the midpoint of the interval in which the scheduler starts no forward (pause returned -> continue
    sent), on the client clock, which is the server's for the local servers this loop starts. Seen on a
    --disable-radix-cache server: requests in flight across a publication reported every token under the new
    version, the first ones included, which the old weights sampled. `publications` are
    `rl_rollout.schedule.Publication`s."""
    spans = meta.get("weight_versions") or [{"version": meta.get("weight_version")}]
    for p in publications:
        if p.version == spans[0]["version"]:
            return meta.get("forward_entry_time", p.boundary) < p.boundary
    return False


def stock_view(prompt_len: int, n_out: int, meta: dict, order: Dict[str, int], stale_prefix: int,
               unlabelled: bool = False) -> dict:
    """A stock server's response with the provenance the shadow of the cache supplies, in vradix's own fields
    (`kv_weight_versions` over every position, `prefix_cache`), epochs being the publication indices of `order`.

    The request's version `a` is the one that sampled its first token. Positions: the prompt under `a`, except
    `stale_prefix` positions (found by the shadow in the cached prefix) one publication before `a`; output position
    P + j - 1 under the sampler of token j. A retracted request was re-prefilled under its last sampler's version
    (`retract+flush`), so every position is that version's and it is re-bound there. `unlabelled` (see
    `unlabelled_crossing`): the sampler spans are wrong, the request ran under the version before the one named."""
    samplers = sampler_versions(meta, n_out)
    by_index = {i: v for v, i in order.items()}
    if not samplers:
        return dict(meta)
    total = prompt_len + n_out
    admitted = samplers[0]
    labels: List[str] = [admitted] * prompt_len + [samplers[j] for j in range(1, n_out)] + [samplers[-1]]
    if unlabelled:
        admitted = by_index.get(order[samplers[0]] - 1, f"<before {samplers[0]}>")
        labels = [admitted] * total
    elif stale_prefix:
        older = by_index.get(order[admitted] - 1, f"<before {admitted}>")
        labels[:stale_prefix] = [older] * stale_prefix
    elif meta.get("num_retractions", 0):
        admitted = samplers[-1]
        labels = [admitted] * total
    epoch = {**order, **{v: order[admitted] - 1 for v in labels if v not in order}}
    spans: List[dict] = []
    for i, v in enumerate(labels):
        if spans and spans[-1]["version"] == v:
            spans[-1]["end"] = i + 1
        else:
            spans.append({"version": v, "epoch": epoch[v], "start": i, "end": i + 1})
    return {**meta, "kv_weight_versions": spans,
            "prefix_cache": {"cached_tokens": meta.get("cached_tokens", 0), "epoch": epoch[admitted],
                             "weight_version": admitted}}


def classify(prompt_len: int, n_out: int, meta: dict, order: Dict[str, int],
             stale_prefix: Optional[int] = None, unlabelled: bool = False) -> TokenProvenance:
    """The provenance of a response's output tokens, read by `vradix.trainer.TokenVersions`.

    `order` maps every version label to its publication index (older is smaller). `stale_prefix`: for a stock
    server, the stale positions the shadow cache found in the cached prefix (None on a vradix server, whose
    response says it per position); `unlabelled`: see `stock_view`."""
    if stale_prefix is not None:
        meta = stock_view(prompt_len, n_out, meta, order, stale_prefix, unlabelled)
    tv = TokenVersions.build(meta, prompt_len, n_out, order=order)
    return TokenProvenance(sampler_versions(meta, n_out), [KIND_CODES[k] for k in tv.kind], list(tv.staleness))


def stock_stale_prefixes(records: Sequence) -> Dict[int, int]:
    """{id(record): stale positions in its cached prefix} for a stock server's trace, by the shadow of the cache:
    the walk of `rl_rollout.shadow_cache.stale_reuse`, keeping each request's count, with a copy of every output
    position (see below).

    A request's version is the one that sampled its first token (`prefill_order` without a publication log), not
    the publication clock: a publication pauses between forwards and every prompt here fits one prefill chunk, so
    that is the version its prefill ran under, read from the engine rather than placed by clock offsets (on a loaded
    host the offset estimate can move a boundary by more than the pause interval)."""
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
