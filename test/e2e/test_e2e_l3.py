"""L3 garbage collection on a real HiCache CPU server with a `file` store.

A 600-token prompt is served on weights A, B is published (`/update_weights_from_disk`), the prompt is served again,
then `python -m vradix.l3 gc --dir STORE --url SERVER` runs. Oracles, independent of the manifests: the prompt's page
files under each identity are computed from SGLang's own key derivation (`get_storage_hash_str` seeded with the
namespace), and every page file present when the publication returned was written under A.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from array import array

import pytest
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.utils import get_storage_hash_str

from vradix import identity
from vradix.l3 import manifest
from vradix.testing.harness.server import CpuServer

PROMPT = [(i * 37 + 11) % 480 + 16 for i in range(600)]
L3_ARGS = ["--enable-hierarchical-cache", "--hicache-ratio", "2", "--hicache-storage-backend", "file",
           "--hicache-storage-prefetch-policy", "wait_complete"]
DEADLINE_S = 120


def pages(store) -> set:
    return {n for n in os.listdir(store) if n.endswith(".bin")}


def prompt_files(store, weight_id) -> set:
    """The page files of PROMPT under `weight_id`'s namespace (page size 1), whether or not they exist yet."""
    keys = get_storage_hash_str(RadixKey(array("q", PROMPT), extra_key=identity.namespace(weight_id)), None,
                                page_size=1)
    suffixes = {n[64:] for n in pages(store)}
    assert len(suffixes) == 1, f"one model/rank suffix expected, got {suffixes}"
    (suffix,) = suffixes
    return {k + suffix for k in keys}


def wait_until(what, cond) -> None:
    """Poll `cond` (a storage write finishing in the server's backup thread) up to DEADLINE_S."""
    deadline = time.monotonic() + DEADLINE_S
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def storage_tokens(out) -> int:
    return (out["meta_info"].get("cached_tokens_details") or {}).get("storage", 0)


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_gc_deletes_exactly_the_old_identitys_pages_and_the_new_identity_still_hits_storage(models, tmp_path):
    store = tmp_path / "l3"
    with CpuServer(models[0], extra_args=L3_ARGS, env={"SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": str(store)},
                   max_total_tokens=4096) as s:
        s.generate(PROMPT, max_new_tokens=4)
        old_id = s.vradix_info()["weight_id"]
        wait_until("the prompt's pages under A", lambda: prompt_files(store, old_id) <= pages(store))

        r = s.post("/update_weights_from_disk", {"model_path": models[1]}).json()
        assert r["success"], r
        written_under_a = pages(store)
        new_id = s.vradix_info()["weight_id"]
        assert new_id != old_id

        on_b = s.generate(PROMPT, max_new_tokens=4)
        assert storage_tokens(on_b) == 0  # nothing of B's is stored yet, and A's pages are not B's
        wait_until("the prompt's pages under B", lambda: prompt_files(store, new_id) <= pages(store))
        before = pages(store)

        gc = subprocess.run([sys.executable, "-m", "vradix.l3", "gc", "--dir", str(store), "--url", s.url, "--json"],
                            capture_output=True, text=True, timeout=120)
        assert gc.returncode == 0, gc.stderr
        report = json.loads(gc.stdout)
        deleted = before - pages(store)

        assert deleted == written_under_a | prompt_files(store, old_id), "gc must delete exactly A's pages"
        assert prompt_files(store, new_id) <= pages(store)
        assert report["live_ids"] == [new_id] and list(report["dead"]) == [old_id]
        assert report["dead"][old_id]["files"] == len(deleted) == report["freed"]["files"]
        assert report["live"][new_id]["files"] >= len(PROMPT)
        assert any(n.endswith(".tsv") for n in os.listdir(manifest.manifest_dir(str(store))))

        # the tree forgets the prompt (idle: SGLang's own reset, same namespace); B's pages come back from L3
        wait_until("an idle engine", lambda: s.vradix_info()["pool"]["idle"])
        assert s.post("/flush_cache").status_code == 200
        assert s.vradix_info()["weight_id"] == new_id
        again = s.generate(PROMPT, max_new_tokens=4)
        assert storage_tokens(again) >= len(PROMPT) - 1, again["meta_info"]
        assert again["output_ids"] == on_b["output_ids"]
