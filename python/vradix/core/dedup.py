"""Compute each uncached prefix once per weight version: a request whose uncached prefix another request is already
computing waits for that KV instead of computing it again.

Why: after a publication every prefix misses (the new namespace is empty), and the requests admitted together after
`continue_generation` usually share one (a system prompt, a GRPO group's question, an agent's history). SGLang does
not stop them from computing it side by side: `lpm`'s in-batch check only sorts such requests last in the waiting
queue, and the prefill adder still admits them into the same batch; with the overlap scheduler the next batch is
scheduled before the previous one's KV is inserted, so it misses too. Each copy is the same work under the same
weights, i.e. waste a correct engine does not need (the RL rollout benchmark measures it against the ideal).

What: per prefill pass (`Pass`), the prefixes being computed are those of
- the prefill batches launched but not yet processed (the overlap scheduler's `result_queue`): their KV enters the
  tree when their results are processed;
- the request continuing a chunked prefill;
- the requests this pass has already admitted.
A candidate whose prefix shares at least `threshold` tokens beyond what it already has cached (device + host hit) with
one of them is held back for this pass (`PrefillAdder.add_one_req` answers CONTINUE without admitting it, which is
how SGLang's own loop skips a request). At its next pass it matches that KV in the tree.

Invariants:
- only prefixes that will be inserted count: a request that skips insertion (a crossing request, one the guard
  barred) never holds another back, so nobody waits for KV that never arrives;
- namespaces separate: keys carry `extra_key` (vradix's epoch namespace) and `cache_salt`, so a request never waits
  for KV of another weight version, LoRA adapter or salt;
- progress: a pass with nothing in flight and nothing admitted holds nobody back, and whatever a request waits for is
  in a batch that is already launched or admitted in the same pass;
- a held-back request holds nothing: nothing is locked or allocated before `add_one_req`. Hybrid (Mamba) caches are
  left alone, because there the match stages recurrent-state metadata that a skipped request would have to undo.

`VRADIX_PREFILL_DEDUP=off` turns it off (default `on`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

from vradix import settings


def enabled_from_env() -> bool:
    """Whether VRADIX_PREFILL_DEDUP turns it on. Raises `settings.SettingsError` for an unusable value."""
    return settings.value("VRADIX_PREFILL_DEDUP") == "on"


@dataclass
class DedupStats:
    #: admissions held back because another request was computing the same uncached prefix
    deferred: int = 0
    #: uncached prefix tokens those admissions would have computed a second time (as matched at deferral)
    deferred_shared_tokens: int = 0

    def as_dict(self, enabled: bool) -> dict:
        return {"enabled": enabled, "deferred": self.deferred, "deferred_shared_tokens": self.deferred_shared_tokens}


@dataclass
class Pass:
    """The prefixes being computed during one prefill scheduling pass, in a simulated radix tree."""

    threshold: int
    pending: RadixCache = field(default_factory=RadixCache.create_simulated)

    def add(self, req) -> None:
        if will_insert(req):
            ids = prefix_ids(req)
            self.pending.insert(InsertParams(key=key_of(req, ids), value=torch.empty(len(ids), dtype=torch.bool)))

    def shared_uncached(self, req) -> int:
        """Tokens of `req`'s prefix beyond its cached part that a pending request is computing."""
        ids = prefix_ids(req)
        shared = self.pending.match_prefix(MatchPrefixParams(key=key_of(req, ids))).device_prefix_len
        return max(0, shared - cached_len(req))


def prefix_ids(req) -> list:
    return req.origin_input_ids + req.output_ids


def key_of(req, ids) -> RadixKey:
    return RadixKey(token_ids=ids, extra_key=req.extra_key, cache_salt=req.cache_salt)


def cached_len(req) -> int:
    return req.prefix_len + req.host_hit_length


def will_insert(req) -> bool:
    return not req.skip_radix_cache_insert


def begin_pass(scheduler, threshold: int) -> Pass:
    """The pass's pending prefixes: launched, unprocessed prefill batches and the continuing chunked request."""
    p = Pass(threshold=threshold)
    for batch, _result in getattr(scheduler, "result_queue", ()) or ():
        if batch.forward_mode.is_extend():
            for req in batch.reqs:
                p.add(req)
    if scheduler.chunked_req is not None:
        p.add(scheduler.chunked_req)
    return p


def should_hold_back(p: Pass, req, stats: DedupStats) -> bool:
    """Whether `req` should wait for a pending request's KV; counts it when so."""
    shared = p.shared_uncached(req)
    if shared < p.threshold:
        return False
    stats.deferred += 1
    stats.deferred_shared_tokens += shared
    return True


def applies_to(tree_cache) -> bool:
    return not getattr(tree_cache, "disable", False) and not tree_cache.supports_mamba()


