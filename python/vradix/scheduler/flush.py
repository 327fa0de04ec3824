"""A flush of the cache by itself, on an engine vradix versions (`scheduler.publication.VersionedEngine.flush`): no
publication, the weights and their label stay. `/flush_cache` with no publication open is one of two operations:

- an idle engine (`reset_idle`): SGLang's own flush resets the whole cache; nothing was locked, so the epoch stays
  and the reset is recorded (`Engine.record_reset`, with the multimodal embeddings it drops);
- with KV holders (`by_itself`): instead of SGLang's refusal, a lock-aware epoch bump that is no publication
  (`bump`, `is_publication` False: same weights, same identity), after which the staleness window ages out
  (`Engine.age_out_on_flush`).

A flush SGLang runs inside an open publication is that publication's (`scheduler.publication.Publication.flush`).
These functions take the engine object, whose `bump`, `is_idle` and `export_metrics` they call.
"""
from __future__ import annotations

from vradix.core import host_tier, mm_embeddings


def by_itself(engine, sglang_flush) -> bool:
    """A flush with no publication open: an idle reset (`reset_idle`), or a lock-aware bump that is no publication.
    Returns whether the cache was flushed (a lock-aware flush always is)."""
    if engine.is_idle():
        return reset_idle(engine, sglang_flush)
    engine.bump("lock-aware flush", is_publication=False)
    engine.state.age_out_on_flush(engine.scheduler.tree_cache)
    return True


def reset_idle(engine, sglang_flush) -> bool:
    """SGLang's own flush of an idle engine (`sglang_flush`), recorded as a reset (`Engine.record_reset`): the tokens
    it freed, on the device and in the host tier, and the multimodal embeddings dropped, as every flush does.
    Returns whether the cache was flushed."""
    cache = engine.scheduler.tree_cache
    cached = cache.evictable_size() + cache.protected_size()
    with host_tier.counting_freed(cache) as host:
        ok = sglang_flush()
    if ok:
        engine.state.record_reset("flush (idle reset)", cached, host.tokens, mm_embeddings.clear_all())
        engine.export_metrics()
    return ok
