"""The test-only L3 aid `vradix.testing.cpu_aids.lossy_store`, built by SGLang's own storage factory (`dynamic`), in a
folder: it is `HiCacheFile` (same files, extra config passed through) until the store's marker names a page, and then
its existence query still reports that page while its read finds it gone."""
import json
import os

import pytest
import torch

from vradix.testing.cpu_aids import lossy_store
from vradix.testing.harness.hicache_store import STORE_ENV

pytestmark = pytest.mark.timeout(60)


def page(value: float) -> torch.Tensor:
    return torch.full((16,), value, dtype=torch.float32)


@pytest.fixture
def backend(tmp_path, monkeypatch):
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    monkeypatch.delenv(STORE_ENV, raising=False)
    flags = lossy_store.backend_args(enable_metadata_cache=True, metadata_ttl=3600, file_storage_path=str(tmp_path))
    config = HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                                  is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=False,
                                  model_name="tiny", extra_config=json.loads(flags[-1]))
    assert flags[:2] == ["--hicache-storage-backend", "dynamic"]
    return StorageBackendFactory.create_backend("dynamic", config, None)


def test_it_is_the_file_store_until_the_marker_names_a_page(backend, tmp_path):
    assert backend.file_path == str(tmp_path) and backend.metadata_cache is not None  # the extra config reached it
    assert backend.set("k1", page(1.0)) and backend.set("k2", page(2.0))
    assert sorted(os.listdir(tmp_path)) == ["k1_tiny_0_1.bin", "k2_tiny_0_1.bin"]  # HiCacheFile's own file names
    assert torch.equal(backend.get("k1", page(0.0)), page(1.0))


def test_a_named_page_is_reported_then_lost_at_its_read(backend, tmp_path):
    for key in ("k1", "k2"):
        backend.set(key, page(1.0))
    lossy_store.lose_on_read(str(tmp_path), [str(tmp_path / "k2_tiny_0_1.bin")])
    assert backend.batch_exists_v2(["k1", "k2"]).kv_hit_pages == 2  # the promise: both pages are there
    assert backend.get("k1", page(0.0)) is not None  # a page the marker does not name reads as before
    assert backend.get("k2", page(0.0)) is None  # the restore: the page is gone
    assert not (tmp_path / "k2_tiny_0_1.bin").exists()
    assert backend.batch_exists_v2(["k1", "k2"]).kv_hit_pages == 1  # and is no longer reported
    lossy_store.stop_losing(str(tmp_path))
    assert backend.get("k1", page(0.0)) is not None and not (tmp_path / lossy_store.LOSE_ON_READ).exists()


def test_an_empty_marker_loses_every_page(backend, tmp_path):
    backend.set("k1", page(1.0))
    lossy_store.lose_on_read(str(tmp_path))
    assert backend.exists("k1") and backend.get("k1", page(0.0)) is None
