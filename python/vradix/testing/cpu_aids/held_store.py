"""A HiCache L3 `file` store whose storage hit queries can be held: a test-only CPU aid, never for serving.

`HeldHiCacheFile` is SGLang's `HiCacheFile` (same folder, same file names), loaded through SGLang's own extension
point for storage backends (`backend_args`, as `lossy_store`). While the store folder holds the marker file `HOLD`
(`hold(store)`), every existence query (`batch_exists`, `batch_exists_v2`: the first step of a storage prefetch, run
on HiCache's prefetch thread) waits until the marker is gone (`release(store)`), and marks that it is waiting
(`HELD`, `wait_held`). A prefetch is then in flight for as long as the test wants, while the scheduler keeps
running: a publication meets it queued, deterministically.
"""
from __future__ import annotations

import json
import os
from typing import List, Optional

from sglang.srt.mem_cache.hicache_storage import HiCacheFile, HiCacheStorageConfig

from vradix.testing.harness.reliability import wait_until

HOLD, HELD = "hold", "held"
#: the longest a held query waits (then it answers as if released)
HOLD_S = 300.0


class HeldHiCacheFile(HiCacheFile):
    """`HiCacheFile` whose existence queries wait while the store's `HOLD` marker exists (see the module)."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None):
        super().__init__(storage_config)  # the factory's kwargs come second: not HiCacheFile's `file_path`

    def _wait_while_held(self) -> None:
        if os.path.exists(os.path.join(self.file_path, HOLD)):
            open(os.path.join(self.file_path, HELD), "w").close()
            wait_until(lambda: not os.path.exists(os.path.join(self.file_path, HOLD)), HOLD_S, "the store's release")

    def batch_exists(self, *args, **kwargs):
        self._wait_while_held()
        return super().batch_exists(*args, **kwargs)

    def batch_exists_v2(self, *args, **kwargs):
        self._wait_while_held()
        return super().batch_exists_v2(*args, **kwargs)


def backend_args() -> List[str]:
    """The server flags that load `HeldHiCacheFile`."""
    config = {"backend_name": "held_file", "module_path": __name__, "class_name": HeldHiCacheFile.__name__}
    return ["--hicache-storage-backend", "dynamic", "--hicache-storage-backend-extra-config", json.dumps(config)]


def hold(store: str) -> None:
    """From now on, storage hit queries on `store` wait (until `release`)."""
    open(os.path.join(store, HOLD), "w").close()


def wait_held(store: str, timeout: float = 120.0) -> None:
    """Until a query is waiting on the hold."""
    wait_until(lambda: os.path.exists(os.path.join(store, HELD)), timeout, "a held storage query")


def release(store: str) -> None:
    for name in (HOLD, HELD):
        try:
            os.remove(os.path.join(store, name))
        except FileNotFoundError:
            pass
