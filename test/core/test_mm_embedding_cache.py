"""A publication, and a flush, invalidate SGLang's multimodal embedding cache (`mm_schedule.embedding_cache`).

SGLang's real `MultiModalStaticCache` is installed the way `Scheduler.__init__` installs it
(`mm_schedule.init_mm_embedding_cache`) and filled with real `EmbeddingResult`s; every publication path and both
flush paths then run through the real vradix hook bodies and SGLang's real (hooked) `Scheduler.flush_cache` /
`record_weight_version_after_update`, on the scheduler stand-in of `vradix.testing.harness.engine` (a real UnifiedRadixCache
with a request holding KV). The E2E counterpart, on a real multimodal CPU server, is `test_e2e_multimodal.py`.
"""
import pytest
import torch
from sglang.srt.managers import mm_schedule
from sglang.srt.mem_cache.multimodal_cache import EmbeddingResult

from vradix.hooks import publication
from vradix.testing.harness.engine import Engine, disk_request, end_bucketed, open_bucketed, succeeding_update

ITEMS = 3


@pytest.fixture
def mm_cache(monkeypatch):
    """SGLang's embedding cache of this process, as the scheduler builds it, holding one entry per image item."""
    monkeypatch.setattr(mm_schedule, "embedding_cache", None)
    mm_schedule.init_mm_embedding_cache(1 << 20)
    cache = mm_schedule.embedding_cache
    for item_hash in range(ITEMS):
        assert cache.set(item_hash, EmbeddingResult(embedding=torch.full((4, 8), float(item_hash))))
    assert len(cache) == ITEMS and cache.get_single(0) is not None
    return cache


@pytest.fixture
def engine():
    return Engine(multimodal=True)


def publish_from_disk(engine):
    publication.publish_update_from_disk(succeeding_update(engine), engine.updater, disk_request("B1"))


def publish_bucketed(engine):
    open_bucketed(engine)
    end_bucketed(engine)


def publish_version_label(engine):
    engine.scheduler.record_weight_version_change("B1")


@pytest.mark.parametrize("publish", [publish_from_disk, publish_bucketed, publish_version_label])
def test_a_publication_clears_the_multimodal_embedding_cache(engine, mm_cache, publish):
    pubs = engine.state.publications
    publish(engine)
    assert engine.state.publications == pubs + 1
    assert len(mm_cache) == 0 and mm_cache.current_size == 0 and mm_cache.get_single(0) is None
    assert engine.state.last_publication.mm_embeddings_cleared == ITEMS
    assert engine.state.last_publication.as_dict()["mm_embeddings_cleared"] == ITEMS


def test_a_bucketed_update_clears_once_at_its_end_not_per_bucket(engine, mm_cache):
    open_bucketed(engine)
    assert len(mm_cache) == ITEMS  # generation is held for the bucketed update: nothing reuses an entry before its end
    end_bucketed(engine)
    assert len(mm_cache) == 0 and engine.state.last_publication.mm_embeddings_cleared == ITEMS


def test_a_lock_aware_flush_clears_the_multimodal_embedding_cache(engine, mm_cache):
    """A request holds KV, so `/flush_cache` is vradix's lock-aware bump (not a publication)."""
    epoch, pubs, flushes = engine.counters()
    assert engine.scheduler.flush_cache()
    assert engine.counters() == (epoch + 1, pubs, flushes + 1)
    assert len(mm_cache) == 0 and engine.state.last.mm_embeddings_cleared == ITEMS


def stock_reset(engine):
    """What SGLang's own `Scheduler.flush_cache` resets when idle (tree and pools; not the embedding cache)."""
    def original(scheduler, *args, **kwargs):
        engine.fx.cache.reset()
        engine.fx.req_pool.clear()
        engine.fx.allocator.clear()
        return True
    return original


def test_an_idle_flush_clears_the_multimodal_embedding_cache(engine, mm_cache):
    """No request holds KV: `/flush_cache` is SGLang's full reset, which by itself keeps the embedding cache."""
    (req,) = engine.scheduler.running
    engine.fx.finish(req)
    engine.scheduler.running.clear()
    epoch = engine.state.epoch
    assert publication.lock_aware_flush(stock_reset(engine), engine.scheduler)
    assert engine.state.epoch == epoch and engine.state.last.reason == "flush (idle reset)"
    assert len(mm_cache) == 0 and engine.state.last.mm_embeddings_cleared == ITEMS


def test_an_empty_or_absent_cache_counts_zero(engine, monkeypatch):
    monkeypatch.setattr(mm_schedule, "embedding_cache", None)  # a scheduler that never built one
    publish_from_disk(engine)
    assert engine.state.last_publication.mm_embeddings_cleared == 0
