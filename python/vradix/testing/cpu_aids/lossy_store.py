"""A HiCache L3 `file` store that can lose pages at read time: a test-only CPU aid, never for serving.

`LossyHiCacheFile` is SGLang's `HiCacheFile` (same folder, same file names, same metadata cache), loaded through
SGLang's own extension point for storage backends:

    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config '{"backend_name": "lossy_file",
        "module_path": "vradix.testing.cpu_aids.lossy_store", "class_name": "LossyHiCacheFile", ...HiCacheFile's own keys}'

(`backend_args` builds these flags). SGLang hands the whole extra config to the backend, so `HiCacheFile`'s keys
(`enable_metadata_cache`, `metadata_ttl`, ...) work as with `file`, and every `vradix.testing.harness.hicache_store` helper
reads the same store.

The switch is a marker file in the store folder, `LOSE_ON_READ` (`lose_on_read(store, files)` writes it,
`stop_losing(store)` removes it). While it exists, a read of a page the marker names (one file name a line; an empty
marker names every page) first deletes that page's file, so the read finds it gone, as `HiCacheFile` finds any
missing page: `get` answers None and drops the page from the metadata cache. The existence query is untouched: it
still reports the page. That is a page lost between decode's promise (its storage hit query) and its restore (the
prefetch's read), deterministically, with no race to hit.
"""
from __future__ import annotations

import json
import os
from typing import List, Optional, Sequence

from sglang.srt.mem_cache.hicache_storage import HiCacheFile, HiCacheStorageConfig

#: the marker file, in the store folder (not a `.bin`, so the store's page counts and scans skip it)
LOSE_ON_READ = "lose-on-read"


class LossyHiCacheFile(HiCacheFile):
    """`HiCacheFile` whose reads lose the pages the store's `LOSE_ON_READ` marker names (see the module)."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None):
        # the dynamic factory passes its keyword arguments as a second positional: not HiCacheFile's `file_path`
        super().__init__(storage_config)

    def get(self, key, target_location, target_sizes=None):
        path = os.path.join(self.file_path, f"{self._get_suffixed_key(key)}.bin")
        if self._lost_on_read(os.path.basename(path)):
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
        return super().get(key, target_location, target_sizes)

    def _lost_on_read(self, name: str) -> bool:
        try:
            with open(os.path.join(self.file_path, LOSE_ON_READ)) as f:
                names = f.read().split()
        except FileNotFoundError:
            return False
        return not names or name in names


def backend_args(**extra_config) -> List[str]:
    """The server flags that load `LossyHiCacheFile`, with `extra_config` (HiCacheFile's own keys) passed through."""
    config = {"backend_name": "lossy_file", "module_path": __name__, "class_name": LossyHiCacheFile.__name__,
              **extra_config}
    return ["--hicache-storage-backend", "dynamic", "--hicache-storage-backend-extra-config", json.dumps(config)]


def lose_on_read(store: str, files: Sequence[str] = ()) -> None:
    """From now on, reading any of `files` (paths or names of page files in `store`; none: every page) loses it."""
    path = os.path.join(store, LOSE_ON_READ)
    with open(path + ".tmp", "w") as f:
        f.write("".join(os.path.basename(p) + "\n" for p in files))
    os.replace(path + ".tmp", path)  # a reader sees the whole list or no marker


def stop_losing(store: str) -> None:
    """Reads find pages again (what was lost stays lost)."""
    try:
        os.remove(os.path.join(store, LOSE_ON_READ))
    except FileNotFoundError:
        pass
