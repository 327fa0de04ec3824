"""Which weight identity wrote which page of a HiCache `file` store: append-only manifests beside the pages.

Layout: `<store>/.vradix-l3/manifest-<host>-<pid>-<random>.tsv`, one file per writing process (each TP rank of each
engine has its own, so writers sharing a store never interleave), one line per backed-up tree node:

    v1 <TAB> <weight_id> <TAB> <page hash> <SPACE> <page hash> ... <NEWLINE>

SGLang's `HiCacheFile` stores a page as `<hash>[.<pool>]<model/rank suffix>.bin`. The hash chain is seeded with the
node's `extra_key`, which starts with its namespace, built from the weight_id (`vradix.identity`): a page hash
belongs to exactly one identity.

Invariants:
- a line is appended before SGLang queues the backup of the pages it names, or is never written: a page without a
  complete line is unattributed, and garbage collection never deletes an unattributed page;
- a line is on disk once `record` returns (one `write` on an `O_APPEND` descriptor, no user-space buffer): SGLang
  stops its scheduler processes with SIGKILL, so a buffered line would die with the process and leave its pages
  unattributed for good;
- a weight_id contains no tab or newline (`vradix.identity`), so lines parse unambiguously; a torn last line (a crash
  mid-write) has no newline and is ignored.
Cost: one append of about 65 bytes per page, per backed-up node, on the scheduler thread; SGLang's backup of that
node then writes one file per page.
"""
from __future__ import annotations

import os
import secrets
import socket
from collections import defaultdict
from typing import Dict, Iterable, Optional, Set

DIRNAME = ".vradix-l3"
VERSION = "v1"

#: realpath of a store -> this process's writer for it
_writers: Dict[str, "ManifestWriter"] = {}


def manifest_dir(store_dir: str) -> str:
    return os.path.join(store_dir, DIRNAME)


class ManifestWriter:
    """This process's manifest in one store (see the module docstring). Used from the scheduler thread only."""

    def __init__(self, store_dir: str):
        os.makedirs(manifest_dir(store_dir), exist_ok=True)
        name = f"manifest-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}.tsv"
        self.path = os.path.join(manifest_dir(store_dir), name)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def record(self, weight_id: str, hashes: Iterable[str]) -> None:
        """Attribute the pages `hashes` to `weight_id` (appended before this returns)."""
        hashes = list(hashes)
        if not hashes:
            return
        data = memoryview(f"{VERSION}\t{weight_id}\t{' '.join(hashes)}\n".encode())
        while data:
            data = data[os.write(self._fd, data):]

    def close(self) -> None:
        os.close(self._fd)


def file_store_dir(backend) -> Optional[str]:
    """The directory of a HiCache `file` backend (SGLang's `HiCacheFile`, possibly behind its test fault injector),
    or None for any other backend."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheFile

    backend = getattr(backend, "_backend", backend)
    return backend.file_path if isinstance(backend, HiCacheFile) else None


def writer_for(backend) -> Optional[ManifestWriter]:
    """This process's writer for the store behind `backend`, or None when it is not a `file` store. Resolved once per
    backend object (the hook runs at every backup)."""
    if not hasattr(backend, "_vradix_manifest"):
        store = file_store_dir(backend)
        writer = None
        if store is not None:
            key = os.path.realpath(store)
            if key not in _writers:
                _writers[key] = ManifestWriter(store)
            writer = _writers[key]
        backend._vradix_manifest = writer
    return backend._vradix_manifest


def read(store_dir: str) -> Dict[str, Set[str]]:
    """page hash -> the weight_ids the store's manifests attribute it to (complete lines only)."""
    owners: Dict[str, Set[str]] = defaultdict(set)
    directory = manifest_dir(store_dir)
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return {}
    for name in names:
        if not name.endswith(".tsv"):
            continue
        with open(os.path.join(directory, name), "rb") as f:
            for raw in f:
                parts = raw.decode("utf-8", "replace").split("\t")
                if not raw.endswith(b"\n") or len(parts) != 3 or parts[0] != VERSION:
                    continue
                for page in parts[2].split():
                    owners[page].add(parts[1])
    return dict(owners)
