"""HiCache L3 across publications, at the cache level: storage prefetches in flight when a publication re-binds their
request, and the manifests and garbage collection of a `file` store.

Everything below runs on SGLang's real UnifiedRadixCache with its real HiCache controller, host pool, storage threads
and `HiCacheFile` backend on a temporary directory (`vradix.testing.harness.l3_store.file_store_cache`). Requests are
issued their storage prefetch by SGLang's own `Scheduler._prefetch_kvcache`, bound to a scheduler stand-in
(`l3_store.StorageScheduler`), and publications go through `vradix.scheduler.publication.bump_scheduler`, the step
every publication hook runs. Waits block on the controller's own queues (a prefetch's hit, its final ack, a backup's
ack) with a deadline, never on a timer.
"""
from __future__ import annotations

import json
import os
import types
from array import array

import pytest
from sglang.srt.disaggregation.utils import DisaggregationMode
from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixKey

from vradix import identity
from vradix.core import reclaim
from vradix.scheduler import publication
from vradix.l3 import gc, manifest
from vradix.l3.__main__ import main as l3_main
from vradix.pd import layout
from vradix.engine import attach
from vradix.testing.harness.l3_store import (PROMPT, StorageScheduler, backend_hits, file_store_cache,
                                             page_hashes, start_prefetch, store_pages, wait_until_queued)


def poll_twice(cache) -> None:
    """Two scheduler polls of HiCache events: the first sees the acks now queued (a prefetch's final ack releases its
    uncopied or revoked pages into the release queue); the second frees what the first released (SGLang empties the
    release queue up to its length at the start of a poll)."""
    cache.check_hicache_events()
    cache.check_hicache_events()


def host_hit(cache, tokens, extra_key) -> int:
    """Tokens of `tokens` the tree holds in host memory under `extra_key`."""
    key = RadixKey(array("q", tokens), extra_key=extra_key)
    return cache.match_prefix(MatchPrefixParams(key=key)).host_hit_length


def queued_request(fx, state):
    req = fx.make_req(PROMPT + [7, 8, 9, 10])
    state.admit_or_raise(req)
    return req


def running_request(fx, state):
    """A request holding KV: a bump then frees stale nodes one by one instead of resetting the tree."""
    req = fx.make_req(list(range(500, 520)))
    state.admit_or_raise(req)
    fx.admit(req)
    fx.prefill(req)
    return req


def host_free(cache) -> int:
    return cache.cache_controller.mem_pool_host.available_size()


# ---- prefetches across a publication ---------------------------------------------------------------------------------
CORES = pytest.mark.parametrize("tree_core", ["rust", "python"])
HOLDER = pytest.mark.parametrize("holder", [True, False], ids=["kv-held", "idle-reset"])


@CORES
@HOLDER
def test_a_prefetch_in_flight_at_a_publication_is_revoked_and_frees_its_host_pages(tmp_path, tree_core, holder):
    with file_store_cache(tmp_path, tree_core) as fx:
        cache = fx.cache
        state = attach(cache, with_ledger=False)
        old_ns = state.prefix_of_epoch(0)
        store_pages(fx, PROMPT, old_ns)
        reclaim.free_all_by_reset(cache)  # the pages are in L3 only
        cache.write_through_threshold = 1 << 30  # nothing else is backed up: the host pool holds only prefetches
        host_total = host_free(cache)
        q = queued_request(fx, state)
        sched = StorageScheduler(fx, waiting=[q], running=[running_request(fx, state)] if holder else [])
        op = start_prefetch(sched, q)
        assert host_free(cache) == host_total - len(PROMPT)

        publication.bump_scheduler(sched, reason="test publication")
        revoked = op.is_terminated() and not cache.ongoing_prefetch  # before its ack was seen
        poll_twice(cache)  # the prefetch's final ack, then the release of its pages

        assert host_hit(cache, PROMPT, old_ns) == 0, "a prefetch of the old epoch landed after the publication"
        assert host_free(cache) == host_total, "host pages of the prefetch leaked"
        assert cache.cache_controller.prefetch_tokens_occupied == 0
        assert cache.check_prefetch_progress(q.cache_request_handle)
        assert cache.pop_prefetch_loaded_span(q.cache_request_handle) == (0, None), "credited with stale L3 tokens"
        assert revoked and q.cache_request_handle.attempt_id == 1
        assert q.extra_key.startswith(state.prefix_of_epoch(1))


def test_the_landing_guard_discards_a_prefetch_the_publication_did_not_revoke(tmp_path):
    """A prefetch the bump did not see (`Engine.bump` alone, as for a request outside the waiting queue) completes
    after the publication: it is discarded instead of inserted, and its host pages return to the pool."""
    with file_store_cache(tmp_path) as fx:
        cache = fx.cache
        state = attach(cache, with_ledger=False)
        old_ns = state.prefix_of_epoch(0)
        store_pages(fx, PROMPT, old_ns)
        reclaim.free_all_by_reset(cache)
        cache.write_through_threshold = 1 << 30
        host_total = host_free(cache)
        q = queued_request(fx, state)
        holder = running_request(fx, state)
        sched = StorageScheduler(fx, waiting=[q], running=[holder])
        op = start_prefetch(sched, q)

        state.bump(cache, [holder], [q], reason="bump without the scheduler step")
        assert not op.is_terminated() and q.cache_request_handle in cache.ongoing_prefetch
        poll_twice(cache)  # its final ack (SGLang would insert it now), then the release of its pages

        assert host_hit(cache, PROMPT, old_ns) == 0, "a prefetch of the old epoch landed after the publication"
        assert host_free(cache) == host_total, "host pages of the discarded prefetch leaked"
        assert cache.cache_controller.prefetch_tokens_occupied == 0 and not cache.ongoing_prefetch
        assert cache.pop_prefetch_loaded_span(q.cache_request_handle) == (0, None)


@CORES
@HOLDER
def test_a_queued_request_is_looked_up_again_under_the_identity_it_is_rebound_to(tmp_path, tree_core, holder):
    """Declared identities: another engine stored the prompt's pages as weights "B". A request queued under this
    engine's weights (a nonce) has a prefetch of their pages in flight when B is published: it gets B's pages."""
    with file_store_cache(tmp_path, tree_core) as fx:
        cache = fx.cache
        state = attach(cache, with_ledger=False, identity_mode="declared")
        old_ns, b_ns = state.prefix_of_epoch(0), identity.namespace("declared:B")
        store_pages(fx, PROMPT, old_ns)
        store_pages(fx, PROMPT, b_ns)
        reclaim.free_all_by_reset(cache)
        cache.write_through_threshold = 1 << 30
        host_total = host_free(cache)
        q = queued_request(fx, state)
        sched = StorageScheduler(fx, waiting=[q], running=[running_request(fx, state)] if holder else [])
        start_prefetch(sched, q)

        publication.bump_scheduler(sched, reason="update_weights_from_disk", label="B")
        assert state.weight_id == "declared:B" and state.prefix_of_epoch(1) == b_ns
        reissued = cache.ongoing_prefetch.get(q.cache_request_handle)
        assert reissued is not None, "the re-bound request was not looked up under its new identity"
        assert reissued.prefetch_key.extra_key.startswith(b_ns)
        op = reissued.operation
        wait_until_queued(cache.cache_controller.prefetch_hit_queue, lambda ops: op in ops)
        cache.check_hicache_events()
        wait_until_queued(cache.cache_controller.ack_prefetch_queue,
                          lambda acks: any(a.completed_req and a.operation is op for a in acks))
        poll_twice(cache)

        assert cache.check_prefetch_progress(q.cache_request_handle)
        assert cache.pop_prefetch_loaded_span(q.cache_request_handle)[0] == len(PROMPT)
        assert host_hit(cache, PROMPT, b_ns) == len(PROMPT) and host_hit(cache, PROMPT, old_ns) == 0
        assert host_free(cache) == host_total - len(PROMPT)  # exactly B's pages, now in the tree


def test_a_nonce_publication_revokes_without_looking_up_again(tmp_path):
    """A fresh nonce names keys no store holds: the revoked request is not looked up again (no wasted L3 query)."""
    with file_store_cache(tmp_path) as fx:
        cache = fx.cache
        state = attach(cache, with_ledger=False)
        store_pages(fx, PROMPT, state.prefix_of_epoch(0))
        reclaim.free_all_by_reset(cache)
        q = queued_request(fx, state)
        sched = StorageScheduler(fx, waiting=[q])
        start_prefetch(sched, q)
        publication.bump_scheduler(sched, reason="test publication")
        assert state.identities[1].identity.source == "nonce"
        assert not cache.ongoing_prefetch


# ---- P/D: role-local L3 --------------------------------------------------------------------------------------------
def role_scope(role: str) -> str:
    return layout.scope_of(layout.KvLayout(role, tp_size=1, dcp_size=1, page_size=1, kv_dtype="float32"))


def test_each_pd_role_reads_only_its_own_l3_objects(tmp_path):
    """Engines with one declared identity share a `file` store. A prefill role stores a prompt's pages; a second
    prefill role of the same layout finds them through SGLang's own storage prefetch, while a decode role and a
    non-P/D engine find none: a role's scope starts every namespace it stamps, so it seeds the page-hash chain and
    every key differs."""
    ident = identity.declared("run1-step5")
    with file_store_cache(tmp_path) as fx:
        cache = fx.cache
        writer = attach(cache, with_ledger=False, weight_identity=ident, identity_mode="declared",
                        scope=role_scope("prefill"))
        store_pages(fx, PROMPT, writer.prefix_of_epoch(0))
        reclaim.free_all_by_reset(cache)  # the pages are in L3 only
        found = {}
        for name, scope in (("decode", role_scope("decode")), ("non-P/D", None), ("prefill", role_scope("prefill"))):
            reader = attach(cache, with_ledger=False, weight_identity=ident, identity_mode="declared", scope=scope)
            q = queued_request(fx, reader)
            assert identity.weight_id_of(q.extra_key) == ident.weight_id
            found[name] = backend_hits(cache, PROMPT, q.extra_key)
        assert found == {"decode": 0, "non-P/D": 0, "prefill": len(PROMPT)}
        op = start_prefetch(StorageScheduler(fx, waiting=[q]), q)  # the same role: SGLang's own lookup hits
        assert len(op.host_indices) == len(PROMPT)


def test_a_decode_role_leaves_storage_lookups_to_its_pre_allocation_at_a_publication(tmp_path):
    """Another engine stored a prompt as weights "B" in the decode role's namespace. A decode request waiting for its
    pre-allocation when B is published is re-bound to B, so the match at its pre-allocation looks B's pages up (and
    sizes its promise to prefill by what that prefetch takes), but the publication starts no queue-time lookup of
    its own, which would be a second prefetch for one request outside decode's restore accounting."""
    scope = role_scope("decode")
    with file_store_cache(tmp_path) as fx:
        cache = fx.cache
        state = attach(cache, with_ledger=False, identity_mode="declared", scope=scope)
        b_ns = identity.namespace("declared:B", scope=scope)
        store_pages(fx, PROMPT, b_ns)
        reclaim.free_all_by_reset(cache)
        q = queued_request(fx, state)
        sched = StorageScheduler(fx)
        sched.disaggregation_mode = DisaggregationMode.DECODE
        sched.disagg_decode_prealloc_queue = types.SimpleNamespace(
            queue=[types.SimpleNamespace(req=q)], pending_reqs=[], retracted_queue=[])
        publication.bump_scheduler(sched, reason="update_weights_from_disk", label="B")
        assert state.weight_id == "declared:B" and q.extra_key.startswith(b_ns)
        assert backend_hits(cache, PROMPT, q.extra_key) == len(PROMPT)  # what its pre-allocation will find
        assert not cache.ongoing_prefetch


# ---- manifests and garbage collection --------------------------------------------------------------------------------
def files_of(store, hashes) -> set:
    hashes = set(hashes)
    return {n for n in os.listdir(store) if n.endswith(".bin") and n[:64] in hashes}


def test_each_stored_page_is_attributed_to_its_identity_and_gc_deletes_only_dead_ones(tmp_path, capsys):
    store = tmp_path / "store"
    with file_store_cache(store) as fx:
        cache = fx.cache
        state = attach(cache, with_ledger=False)
        a_id, a_ns = state.weight_id, state.prefix_of_epoch(0)
        b_ns = identity.namespace("declared:B")
        store_pages(fx, PROMPT, a_ns)  # this engine's identity
        store_pages(fx, PROMPT[:16] + [1, 2, 3], b_ns)  # another identity's namespace
        store_pages(fx, list(range(300, 310)), None)  # no vradix namespace: never attributed
    a_pages, b_pages = page_hashes(PROMPT, a_ns), page_hashes(PROMPT[:16] + [1, 2, 3], b_ns)
    owners = manifest.read(str(store))
    assert {h for h, ids in owners.items() if ids == {a_id}} == set(a_pages)
    assert {h for h, ids in owners.items() if ids == {"declared:B"}} == set(b_pages)
    a_files, b_files = files_of(store, a_pages), files_of(store, b_pages)
    assert len(a_files) == len(PROMPT) and len(b_files) == 19
    stock_files = {n for n in os.listdir(store) if n.endswith(".bin")} - a_files - b_files
    assert len(stock_files) == 10

    assert l3_main(["gc", "--dir", str(store), "--keep", "declared:B", "--dry-run", "--json"]) == 0
    dry = json.loads(capsys.readouterr().out)
    assert dry["dead"] == {a_id: {"files": 32, "bytes": dry["freed"]["bytes"]}} and dry["freed"]["files"] == 32
    assert files_of(store, a_pages) == a_files  # a dry run deletes nothing

    assert l3_main(["gc", "--dir", str(store), "--keep", "declared:B"]) == 0
    out = capsys.readouterr().out
    assert f"dead  {a_id}: 32 file(s)" in out and "live  declared:B: 19 file(s)" in out
    assert "unattributed (kept): 10 file(s)" in out
    left = {n for n in os.listdir(store) if n.endswith(".bin")}
    assert left == b_files | stock_files  # exactly the dead identity's pages are gone


def fake_store(tmp_path, pages_by_id, unattributed=0, size=100):
    """A store with `size`-byte page files named like HiCacheFile's, attributed by a real ManifestWriter."""
    store = tmp_path / "store"
    store.mkdir()
    writer = manifest.ManifestWriter(str(store))
    n = 0
    for wid, count in pages_by_id.items():
        hashes = [f"{n + i:064x}" for i in range(count)]
        n += count
        writer.record(wid, hashes)
        for h in hashes:
            (store / f"{h}_tiny_0_1.bin").write_bytes(b"x" * size)
    for i in range(unattributed):
        (store / f"{n + i:064x}_tiny_0_1.bin").write_bytes(b"x" * size)
    (store / ".0123.tmp").write_bytes(b"partial")  # a page being written: not a page file
    return store


def test_gc_report_counts_files_and_bytes_per_identity(tmp_path):
    store = fake_store(tmp_path, {"nonce:old1": 3, "nonce:old2": 2, "fp:live": 4}, unattributed=2)
    report = gc.collect(str(store), keep=["fp:live"])
    assert report.as_dict()["dead"] == {"nonce:old1": {"files": 3, "bytes": 300},
                                        "nonce:old2": {"files": 2, "bytes": 200}}
    assert report.as_dict()["live"] == {"fp:live": {"files": 4, "bytes": 400}}
    assert vars(report.freed) == {"files": 5, "bytes": 500} and vars(report.unattributed) == {"files": 2, "bytes": 200}
    assert sorted(os.listdir(store)) == sorted([".0123.tmp", manifest.DIRNAME] + [
        f"{i:064x}_tiny_0_1.bin" for i in range(5, 11)])


def test_gc_refuses_without_a_live_identity_or_with_an_unreachable_server(tmp_path, capsys):
    store = fake_store(tmp_path, {"nonce:old": 2})
    before = sorted(os.listdir(store))
    assert l3_main(["gc", "--dir", str(store)]) == 2
    assert "no live identity" in capsys.readouterr().err
    assert l3_main(["gc", "--dir", str(store), "--keep", "x", "--url", "http://127.0.0.1:9"]) == 2
    assert "refusing to collect" in capsys.readouterr().err
    assert sorted(os.listdir(store)) == before


def test_a_page_attributed_to_a_live_identity_is_kept_whatever_else_claims_it(tmp_path):
    store = fake_store(tmp_path, {"nonce:dead": 2})
    page = f"{0:064x}"
    manifest.ManifestWriter(str(store)).record("fp:live", [page])  # a second engine's manifest
    report = gc.collect(str(store), keep=["fp:live"])
    assert vars(report.freed) == {"files": 1, "bytes": 100}
    assert (store / f"{page}_tiny_0_1.bin").exists()


def test_manifest_lines_are_on_disk_when_recorded_one_file_per_writer_and_torn_lines_ignored(tmp_path):
    first, second = manifest.ManifestWriter(str(tmp_path)), manifest.ManifestWriter(str(tmp_path))  # two engines
    first.record("fp:one", ["a" * 64, "b" * 64])
    assert manifest.read(str(tmp_path)) == {"a" * 64: {"fp:one"}, "b" * 64: {"fp:one"}}  # no buffer to lose
    second.record("declared:two words", ["c" * 64])  # a declared identity may contain spaces
    assert manifest.read(str(tmp_path))["c" * 64] == {"declared:two words"}
    assert first.path != second.path and len(os.listdir(manifest.manifest_dir(str(tmp_path)))) == 2
    with open(first.path, "ab") as f:
        f.write(f"v1\tnonce:torn\t{'e' * 64}".encode())  # a crash mid-line
    assert "e" * 64 not in manifest.read(str(tmp_path))
