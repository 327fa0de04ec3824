"""The cache-level steady loop: GRPO-shaped plain requests through SGLang's real `UnifiedRadixCache`, with the
scheduler's per-request and per-batch steps (`benchmark/cache/bench_publication.py` times it against stock;
`test/test_engine.py` counts what vradix adds to it)."""
from __future__ import annotations

from typing import Optional, Sequence

from vradix.testing.harness.cache_fixture import CacheFixture

#: requests per group: one prompt, the last two tokens differing (a GRPO group)
GROUP = 8
#: when fewer KV slots than this are free, the loop evicts `EVICT_TOKENS` of cached KV at once (as a scheduler under
#: memory pressure does), so a loop longer than the pool holds keeps running
LOW_WATER = 4096
EVICT_TOKENS = 1 << 16


def prompts(n: int, first: int = 0, base: int = 2) -> list[list[int]]:
    """`n` prompts of 514 tokens, groups of `GROUP` sharing their first 512 (token ids from `base` on)."""
    return [[base + ((first + i) // GROUP * 131 + j) % 30000 for j in range(512)] + [(first + i) % GROUP + 7, first + i]
            for i in range(n)]


def make_room(fx: CacheFixture) -> None:
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams
    if fx.allocator.available_size() < LOW_WATER:
        fx.cache.evict(EvictParams(num_tokens=EVICT_TOKENS))


def serve(fx: CacheFixture, prompt_ids: Sequence[Sequence[int]], versioned: Optional[bool] = None) -> None:
    """Serve `prompt_ids` group by group: each group's requests are queued (vradix: `hooks.serving.admit`); its first
    request is admitted in a prefill pass of its own (matched, locked, given a row), prefilled in an extend batch
    (the per-batch hooks: the backstop's check, the ledger stamp, the verdict at the result), checkpointed and
    finished (released and inserted); then the others, which reuse its prompt (prefill dedup held them back), in one
    pass and one batch. `versioned` (default: whether vradix is attached to the cache) runs the queueing hook."""
    from vradix.hooks.serving import admit

    view = fx.scheduler_view()
    if versioned is None:
        versioned = getattr(fx.cache, "_vradix", None) is not None
    for g in range(0, len(prompt_ids), GROUP):
        make_room(fx)
        group = [fx.make_req(list(toks)) for toks in prompt_ids[g:g + GROUP]]
        if versioned:
            for r in group:
                admit(view, r)
        for batch in (group[:1], group[1:]):
            fx.admit_group(batch)
            fx.prefill_group(batch)
            for r in batch:
                fx.finish(r)
