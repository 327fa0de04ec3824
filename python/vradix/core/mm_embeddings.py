"""Multimodal embedding cache invalidation: a publication must not reuse image/video/audio embeddings computed by the
old weights.

SGLang 0.5.23 caches the encoder output of every multimodal item in one `MultiModalStaticCache`, the module global
`sglang.srt.managers.mm_schedule.embedding_cache`. `kv_cache_builder.build_kv_cache` creates it during
`Scheduler.__init__`, and the model runner's `general_mm_embed_routine` reads and fills it during the forward pass,
both in the scheduler process and on its thread (one cache per TP/PP/DP rank process). Its key is the item's content
hash only, so neither `flush_cache` nor a weight update touches it: after a publication the old vision tower's
embeddings would be fed to the new language model.

`clear_all()` empties it. vradix calls it on every epoch bump (`scheduler.publication.bump_scheduler`: every
publication, once, and every lock-aware flush) and on the idle flush (`scheduler.flush.reset_idle`), from
the scheduler thread of each rank, which every rank reaches through the same control message. Between two batches
nothing on that thread holds a cache entry, so clearing there is race-free; entries are rebuilt on the next miss with
the current weights.

Invariant: after a bump, every embedding the cache can return was computed after that bump, i.e. with the weights of
the current epoch (weights change on the scheduler thread, after the in-flight overlap batch was drained, so no
forward pass runs between the weight change and its bump).

Not covered here: the preprocessing cache of the tokenizer manager (`multimodal.cache.preprocess_cache`) holds
processor outputs (pixel values), which do not depend on the weights; the encoder server of encoder disaggregation
(`disaggregation/encoder/server.py`) is a separate process with its own caches and has no weight-update path.
"""
from __future__ import annotations

from typing import Optional


def embedding_cache():
    """SGLang's multimodal embedding cache in this process, or None before the scheduler built it."""
    from sglang.srt.managers import mm_schedule
    return mm_schedule.embedding_cache


def clear_all() -> int:
    """Drop every cached multimodal embedding of this process. Returns how many entries were dropped."""
    cache = embedding_cache()
    if cache is None:
        return 0
    dropped = len(cache)
    cache.clear()
    return dropped


def stats() -> Optional[dict]:
    """Entries and bytes held now (the `mm_embedding_cache` block of server info), or None without a cache."""
    cache = embedding_cache()
    if cache is None:
        return None
    return {"entries": len(cache), "bytes": cache.current_size, "max_bytes": cache.max_size}
