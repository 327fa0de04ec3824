"""HiCache servers sharing one L3 store (SGLang's `file` backend in a folder): E2E tests and the HiCache benchmark.

SGLang names an L3 page file `<page hash><_served-model-name_tp-rank_tp-size>.bin`, and the page hash is a SHA-256
chain over the page's tokens seeded by the request's `extra_key` (`mem_cache.utils.get_storage_hash_str`). Stock
requests carry no `extra_key`, so two servers with different weights and the same served name compute the same file
names (sglang #26792). vradix stamps `extra_key` with the epoch's weight identity (`vradix.identity`), so the chain,
and so every file name, is the weight identity's.

Invariants the helpers rely on:
- L3 writes are asynchronous (host backup, then storage backup, each on a HiCache thread). A reader that starts
  before the writer's files exist misses for the wrong reason, so writers wait for every page file of what they
  served (`wait_stored`) before a reader starts; a file appears only when it is complete (the backend writes to a
  temporary file and renames it).
- `page_files` computes file names with SGLang's own key function, for page size 1 and TP 1 (the servers here).
"""
from __future__ import annotations

import os
from typing import Optional, Sequence

from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.utils import get_storage_hash_str

from vradix import identity as weight_identity
from vradix.testing.harness.reliability import wait_until
from vradix.testing.harness.server import CpuServer

SERVED_NAME = "tiny"
#: the device pool of a HiCache server here unless the caller sets one; the host pool is twice the device pool
#: (`--hicache-ratio 2`)
DEVICE_TOKENS = 4096
HICACHE_ARGS = ["--enable-hierarchical-cache", "--hicache-ratio", "2", "--hicache-storage-backend", "file",
                "--hicache-storage-prefetch-policy", "wait_complete", "--served-model-name", SERVED_NAME]
STORE_ENV = "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"


def hicache_server(model: str, store: str, *, vradix: bool = True, identity: Optional[str] = None,
                   weight_version: Optional[str] = None, env: Optional[dict] = None, extra_args: Sequence[str] = (),
                   **kw) -> CpuServer:
    """A CPU server with L2 (host pool) and L3 (`store`), served as `SERVED_NAME`. `identity` is vradix's weight
    identity mode (`--vradix-weight-identity`; None: the default), `weight_version` the startup label."""
    args = list(HICACHE_ARGS) + list(extra_args)
    if identity is not None:
        args += ["--vradix-weight-identity", identity]
    if weight_version is not None:
        args += ["--weight-version", weight_version]
    kw.setdefault("startup_timeout", 600.0)
    kw.setdefault("max_total_tokens", DEVICE_TOKENS)
    return CpuServer(model, vradix=vradix, extra_args=args, env={STORE_ENV: store, **(env or {})}, **kw)


def tiers(response: dict) -> dict:
    """Where a response's cached prefix came from: tokens from device (L1), host (L2) and storage (L3)."""
    details = response["meta_info"].get("cached_tokens_details") or {}
    return {tier: details.get(tier, 0) for tier in ("device", "host", "storage")}


def current_namespace(server: CpuServer) -> Optional[str]:
    """The `extra_key` a request without a user key gets on `server` now: None on stock SGLang; the namespace of the
    current weight identity on vradix, role-local on a P/D role (valid while this process has not served that identity before, e.g. at
    startup or right after a publication of new weights)."""
    info = server.vradix_info()
    return None if info is None else weight_identity.namespace(info["weight_id"], scope=info.get("l3_scope"))


def page_files(store: str, tokens: Sequence[int], extra_key: Optional[str]) -> list:
    """The L3 files of the pages of `tokens` stored under `extra_key` (page size 1, TP 1)."""
    hashes = get_storage_hash_str(RadixKey(list(tokens), extra_key=extra_key), None, page_size=1)
    return [os.path.join(store, f"{h}_{SERVED_NAME}_0_1.bin") for h in hashes]


def stored_pages(store: str, tokens: Sequence[int], extra_key: Optional[str]) -> int:
    """How many of the pages of `tokens` are in the store under `extra_key`."""
    return sum(os.path.exists(f) for f in page_files(store, tokens, extra_key))


def wait_stored(server: CpuServer, store: str, tokens: Sequence[int], timeout: float = 120.0) -> int:
    """Wait until every page of `tokens`, as `server` keys them now, is in the store; returns the page count."""
    files = page_files(store, tokens, current_namespace(server))
    wait_until(lambda: all(os.path.exists(f) for f in files), timeout, f"{len(files)} L3 pages on {server.url}")
    return len(files)


def store_size(store: str) -> int:
    """Page files in the store."""
    return sum(name.endswith(".bin") for name in os.listdir(store))
