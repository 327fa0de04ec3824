"""The yardstick: the prompt work of an ideal correct engine with an unbounded cache, on the same run's trace, and
where the measured engine's extra work went.

The ideal engine prefills the same requests in the same order (server order of first forwards), each under the
weight version it was actually prefilled under (`trace.prefill_order`), and computes only the tokens beyond the
longest prefix some earlier request already computed, or started computing, under that same version. Crossing
requests count as the engine computed them: a request's prompt KV carries the version it matched under, its output
KV that version until the first version change and MIXED after it (never reusable); a retracted request is also
re-prefilled, under each later version it generated under, and the ideal engine is charged for that re-prefill too
(beyond what is already computed under that version; `ideal_reprefill_tokens`). Output KV is reusable once the
request finished (`request_finished_ts`). At least one prompt token is always computed (SGLang matches at most
len - 1 tokens). No correct engine computes less on this trace: for every mode but the unsafe `in_place`,
measured work >= ideal.

For each request the measured engine computed `len - cached_tokens`; the ideal engine `len - L`. When cached < L the
difference is *missed* reuse, split by the state of the KV it could have reused when the request was scheduled
(its `forward_entry_time` t):
  - computed earlier: the prefix was in the tree by t (the copy's prefill_finished_time, or for output KV its
    request_finished_ts, <= t). The engine had it and did not match it (freed, evicted, or never inserted).
  - in flight: a request whose first forward started by t was still computing it (prefill not finished by t),
    split further into *same batch* (it started in the very forward that scheduled this request, so both were
    scheduled off the same tree) and *earlier batch* (scheduled before, e.g. the overlap scheduler's previous batch
    whose results were not processed yet).
Missed tokens are also counted *cold* when the request was scheduled before any prefill under its version had
finished (right after a publication, or at the start): what re-warming hot prefixes at a publication can recover.
A chunked prefill's chunks are inserted before its prefill finishes, so a prefix from a long chunked prompt can be
labelled in flight while a chunk of it was already in the tree; prompts below --chunked-prefill-size are exact.
"""
from __future__ import annotations

from typing import List, Sequence

from .trace import PrefixTrie, output_tags, prefill_order, spans_of, version_clock

#: keys `ideal_work` returns, in report order
IDEAL_KEYS = ("ideal_prompt_tokens", "ideal_reprefill_tokens", "missed_tokens", "missed_requests",
              "missed_earlier_tokens", "missed_earlier_requests",
              "missed_in_flight_tokens", "missed_in_flight_requests",
              "missed_same_batch_tokens", "missed_cold_tokens", "cached_beyond_ideal_tokens")


def ideal_work(records: List, publications: Sequence = (), first_version: str = "") -> dict:
    """Ideal prompt work of the trace and the missed-reuse breakdown (see the module docstring)."""
    trie = PrefixTrie()
    out = dict.fromkeys(IDEAL_KEYS, 0)
    warm_from = first_prefill_done(records, publications, first_version)
    for at, _, r, version, seq in prefill_events(records, publications, first_version):
        if seq is not None:   # a retracted request re-prefilled under `version`
            reusable = trie.longest(seq, len(seq) - 1, version, started_by=at)
            out["ideal_prompt_tokens"] += len(seq) - reusable
            out["ideal_reprefill_tokens"] += len(seq) - reusable
            trie.add(seq, 0, [version] * len(seq), at, r.meta.get("request_finished_ts", at))
            continue
        ids, cached = r.input_ids, r.meta["cached_tokens"]
        reusable = trie.longest(ids, len(ids) - 1, version, started_by=at)                 # the ideal engine's match
        in_tree = trie.longest(ids, reusable, version, started_by=at, in_tree_by=at)
        started_before = trie.longest(ids, reusable, version, started_by=at, strictly_before=True)
        out["ideal_prompt_tokens"] += len(ids) - reusable
        out["cached_beyond_ideal_tokens"] += max(0, cached - reusable)
        missed = max(0, reusable - cached)
        earlier = max(0, in_tree - cached)
        in_flight = missed - earlier
        out["missed_tokens"] += missed
        out["missed_requests"] += missed > 0
        out["missed_earlier_tokens"] += earlier
        out["missed_earlier_requests"] += earlier > 0
        out["missed_in_flight_tokens"] += in_flight
        out["missed_in_flight_requests"] += in_flight > 0
        earlier_batch = max(0, started_before - max(cached, in_tree))
        out["missed_same_batch_tokens"] += in_flight - earlier_batch
        out["missed_cold_tokens"] += missed if at < warm_from[version] else 0
        add_computed(trie, r, version, at)
    return out


def first_prefill_done(records, publications: Sequence, first_version: str) -> dict:
    """version -> the earliest server time a prefill under it finished: before that, the version is *cold* (nothing
    computed under it is in the tree yet; right after a publication, or at the start of the run)."""
    done = {}
    for r, version in prefill_order(records, publications, first_version):
        t = r.meta.get("prefill_finished_time", r.meta["forward_entry_time"])
        done[version] = min(done.get(version, t), t)
    return done


def prefill_events(records, publications: Sequence, first_version: str) -> List[tuple]:
    """(server time, tie-break, record, version, re-prefilled sequence or None), in time order.

    Every request's first prefill at its first forward; for a retracted request also one re-prefill per later
    version it generated under, of its prompt and the output it had by then, at the start of that version (the
    earliest it can have run; the same time a whole batch of them is re-prefilled, so their shared prefix is charged
    once, as in any order)."""
    boundaries, versions = version_clock(records, publications, first_version)
    start_of = dict(zip(versions[1:], boundaries))
    events = []
    for i, (r, version) in enumerate(prefill_order(records, publications, first_version)):
        at = r.meta["forward_entry_time"]
        events.append((at, i, r, version, None))
        if r.meta.get("num_retractions", 0):
            for sp in spans_of(r):
                if sp["version"] != version:
                    events.append((max(at, start_of.get(sp["version"], at)), i, r, sp["version"],
                                   r.input_ids + r.output_ids[:sp["start"]]))
    return sorted(events, key=lambda e: e[:2])


def add_computed(trie: PrefixTrie, r, version: str, t: float) -> None:
    """The KV a request's first prefill and its decode left behind, as the engine computed it (see the module
    docstring); a retracted request's re-prefills add theirs as separate events."""
    m, spans = r.meta, spans_of(r)
    prefilled = m.get("prefill_finished_time", t)
    finished = m.get("request_finished_ts", prefilled)
    trie.add(r.input_ids, 0, [version] * len(r.input_ids), t, prefilled)
    if m.get("num_retractions", 0):
        # decoded under its last version over context re-prefilled under it: clean once it finished
        seq = r.input_ids + r.output_ids[:-1]
        trie.add(seq, 0, [spans[-1]["version"]] * len(seq), finished)
        return
    tags = output_tags(spans, len(r.output_ids), spans[0]["version"] == version)
    trie.add(r.input_ids + r.output_ids, len(r.input_ids), tags, finished)
