"""The KV page ledger with HiCache, on SGLang's real UnifiedRadixCache (Rust and Python tree cores, page sizes 1 and
16), its real HybridCacheController, host pool and L3 `file` backend on CPU (`vradix.testing.cpu_aids`).

HiCache steps come from SGLang's test kit (`sglang.test.kits.unified_radix_cache`: `_init_hicache`,
`_finish_pending_loads`, `_fill_full_kv`/`_snapshot_full_kv`, and the storage mixins `_flush_l3_backups` and
`_run_prefetch_to_completion`, which poll SGLang's storage threads against a deadline). Two steps go through SGLang's
own entry points instead of the kit's: a node is backed up by `UnifiedRadixCache.backup_node_for_write_back` (the
write-back eviction's backup; the kit's `_backup_node` needs the kit's inspection TreeCores, whose Rust build the
wheel does not ship), and loaded back by `init_load_back`, the PrefillAdder's entry point that the guard wraps (the
kit's `_load_back_node` calls `load_back`, below it).

Checked: a page's epoch travels with its copy device -> host -> device and storage -> host -> device; the strict
guard verifies a loaded prefix and reuses it; a copy of other weights is never loaded for a request (it is
recomputed), whether it reached the request through a lost namespace or through a corrupted page.
"""
import unittest
from array import array

import pytest
import torch
from sglang.srt.mem_cache import common
from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle, EvictParams, InitLoadBackParams
from sglang.test.kits.unified_radix_cache.config import CacheConfig
from sglang.test.kits.unified_radix_cache.storage import UnifiedRadixCacheStorageFixtures

from vradix import identity
from vradix.ledger import guard, host as host_ledger
from vradix.hooks.startup import ledger_blind_spots
from vradix.kernels import FREE
from vradix.ledger.device import ledger_of
from vradix.engine import attach
from vradix.testing import cpu_aids
from vradix.testing.harness.cache_fixture import build_cache

CONFIGS = [("rust", 1), ("rust", 16), ("python", 1), ("python", 16)]
P = list(range(10, 74))  # a 64-token prompt prefix: 4 pages of 16


class Kit(UnifiedRadixCacheStorageFixtures, unittest.TestCase):
    """SGLang's test-kit steps, bound to one pytest test (`doCleanups` runs the kit's cleanups)."""

    def runTest(self):
        pass


def hicache_env(core, ps, weight_identity=None, **init_kwargs):
    """A vradix-versioned cache with HiCache (host pool twice the device pool) and both ledgers."""
    kit = Kit()
    kit.cfg = CacheConfig(page_size=ps)
    fx = build_cache(core, ps, kv_tokens=512)
    state = attach(fx.cache, weight_identity=weight_identity)
    with cpu_aids.kit_hicache_on_cpu():
        kit._init_hicache(fx.cache, **init_kwargs)
    assert host_ledger.unobservable_host_pool(fx.cache) is None
    host = host_ledger.attach(fx.cache, state.ledger)
    assert host.kernels is state.ledger.kernels  # resolved once, for both ledgers of the device
    return kit, fx, state, host


@pytest.fixture
def make_env(request):
    """`hicache_env`, with the kit's cleanups (host pool, storage threads) run when the test ends."""
    def make(*args, **kwargs):
        env = hicache_env(*args, **kwargs)
        request.addfinalizer(env[0].doCleanups)
        return env
    return make


@pytest.fixture(params=CONFIGS, ids=[f"{c}-ps{p}" for c, p in CONFIGS])
def env(request, make_env):
    return make_env(*request.param)


def cached_prompt(fx, state, tokens):
    """Serve `tokens` + one more token once, under the current epoch, and return the tree node of `tokens`."""
    req = fx.make_req(tokens + [1])
    state.admit_or_raise(req)
    fx.admit(req)
    fx.prefill(req)
    fx.finish(req)
    return fx.cache.match_prefix(common.MatchPrefixParams(
        key=common.RadixKey(array("q", tokens), extra_key=req.extra_key))).last_device_node


def demote(fx, node):
    """Back `node` up to the host pool, then evict its device copy (HiCache's demotion); returns its host slots."""
    cache = fx.cache
    assert cache.backup_node_for_write_back(node)
    cache.evict(EvictParams(num_tokens=fx.total))
    assert cache.tree_core.is_full_device_evicted(node)
    return host_ledger.host_copies_to_load(cache, node)


def admit_with_load_back(fx, state, tokens):
    """The scheduler's admission of a request for `tokens`: match (strict guard), then the PrefillAdder's load-back
    of its host hit (guarded). Returns (request, FULL tokens loaded)."""
    req = fx.make_req(tokens)
    state.admit_or_raise(req)
    common.match_kv_cache(req, fx.cache, req.origin_input_ids, max_prefix_len=len(tokens) - 1)
    assert req.prefix_len == 0 and req.host_hit_length == len(P)
    loaded, req.last_node = fx.cache.init_load_back(InitLoadBackParams(
        best_match_node=req.best_match_node, host_hit_length=req.host_hit_length, req=req))
    return req, loaded


def epochs_of(ledger, slots):
    return set(ledger.page_epoch[slots.to(torch.int64) // ledger.page_size].tolist())


def test_load_back_carries_the_epoch_of_the_host_copy_and_the_strict_guard_verifies_it(env):
    kit, fx, state, host = env
    cache, ledger = fx.cache, state.ledger
    node = cached_prompt(fx, state, P)
    written = cache.tree_core.collect_full_device_indices(node, cache.root_node_handle(state.prefix_of_epoch(0)))
    kit._fill_full_kv(fx.allocator, written, marker=3.0)
    expected_kv = kit._snapshot_full_kv(fx.allocator, written)
    host_slots = demote(fx, node)
    assert epochs_of(host, host_slots) == {0}, "the backup did not carry the device pages' epoch to host"
    assert epochs_of(ledger, written) == {FREE}

    req, loaded = admit_with_load_back(fx, state, P + [2])
    assert loaded == len(P) and state.guard.stats.violations_caught == 0
    assert state.guard.stats.prefixes_verified == 1  # the host copies it loads, checked before loading
    kit._finish_pending_loads(cache)
    slots = cache.tree_core.collect_full_device_indices(node, cache.root_node_handle(state.prefix_of_epoch(0)))
    assert epochs_of(ledger, slots) == {0}, "load-back wrote device KV the ledger does not know"
    assert all(torch.equal(a, b) for a, b in zip(kit._snapshot_full_kv(fx.allocator, slots), expected_kv))

    # a request reusing the loaded pages passes the strict guard's backstop at its forward ...
    again = fx.make_req(P + [3])
    state.admit_or_raise(again)
    assert fx.admit(again) == len(P)
    fx.prefill(again)
    assert state.guard.stats.prefixes_verified == 2 and state.guard.stats.violations_caught == 0
    assert again.discard_output_reason is None
    fx.finish(again)
    # ... and the same pages are not accepted for a request of the next epoch
    assert guard.matched_prefix_violations(ledger, slots, expected_epoch=1).count == len(P)


def test_a_host_copy_of_an_older_epoch_is_not_loaded_for_a_newer_request(env, monkeypatch):
    kit, fx, state, host = env
    # Test-only fault: requests lose their epoch namespace, so only the ledger keeps a new request off the old copy.
    # (VRADIX_FAULT_NO_NAMESPACE, read by the engine when it is attached)
    monkeypatch.setattr(state, "fault_no_namespace", True)
    node = cached_prompt(fx, state, P)
    host_slots = demote(fx, node)
    assert epochs_of(host, host_slots) == {0}
    state.advance(identity.nonce(), None, is_publication=True)  # new weights: epoch 1 (no reclaim tested here)

    req, loaded = admit_with_load_back(fx, state, P + [2])
    assert loaded == 0, "a host copy written under epoch 0 was loaded for an epoch-1 request"
    assert state.guard.stats.violations_caught == 1 and "instead of loading" in state.guard.stats.last_violation
    assert req.skip_radix_cache_insert
    assert not fx.cache.cache_controller.load_queue and fx.cache.tree_core.is_full_device_evicted(node)


def test_a_corrupted_page_is_still_caught_after_a_round_trip_through_host(env):
    kit, fx, state, host = env
    node = cached_prompt(fx, state, P)
    cache = fx.cache
    written = cache.tree_core.collect_full_device_indices(node, cache.root_node_handle(state.prefix_of_epoch(0)))
    state.ledger.page_epoch[int(written[40]) // fx.page_size] = 7  # this page says: written by other weights
    demote(fx, node)

    req, loaded = admit_with_load_back(fx, state, P + [2])
    assert loaded == 0 and state.guard.stats.violations_caught == 1
    assert f"first at position {40 - 40 % fx.page_size}" in state.guard.stats.last_violation


@pytest.mark.parametrize("ps", [1, 16])
def test_pages_prefetched_from_storage_carry_their_key_epoch_through_load_back(ps, make_env, tmp_path):
    """L3 (`file` backend): a producer engine stores a prefix; a fresh consumer engine with the same weight identity
    (a restart) prefetches it into its host pool (which stamps the pages with the epoch that serves their key's
    namespace), loads it back, and verifies it."""
    init = dict(storage_backend="file", storage_dir=str(tmp_path), prefetch_threshold=1,
                weight_identity=identity.declared("run-1/step-5"))
    kit, producer, pstate, _ = make_env("rust", ps, **init)
    node = cached_prompt(producer, pstate, P)
    assert producer.cache.backup_node_for_write_back(node)
    producer.cache.write_backup_storage(node)
    kit._flush_l3_backups(producer.cache)

    kit, fx, state, host = make_env("rust", ps, **init)
    cache = fx.cache
    handle = CacheRequestHandle("prefetch", 0)
    cache.prefetch_from_storage(handle, cache.root_node_handle(), array("q", P), extra_key=state.prefix_of_epoch(0))
    kit._run_prefetch_to_completion(cache, handle)
    req, loaded = admit_with_load_back(fx, state, P + [2])
    assert loaded == len(P) and state.guard.stats.prefixes_verified == 1
    assert state.guard.stats.violations_caught == 0
    kit._finish_pending_loads(cache)
    slots = cache.tree_core.collect_full_device_indices(req.last_node, cache.root_node_handle(req.extra_key))
    assert len(slots) == len(P) and epochs_of(state.ledger, slots) == {0}
    assert ledger_of(host_ledger.kv_host_pool(cache)) is host


def test_freed_host_copies_are_free_in_the_host_ledger(env):
    kit, fx, state, host = env
    host_slots = demote(fx, cached_prompt(fx, state, P))
    assert epochs_of(host, host_slots) == {0}
    assert fx.cache.evict_host(len(P)) >= len(P)  # SGLang drops the host-only copy
    assert epochs_of(host, host_slots) == {FREE}
    host_slots = demote(fx, cached_prompt(fx, state, [t + 1000 for t in P]))
    assert epochs_of(host, host_slots) == {0}
    fx.cache.reset()  # clears the host pool too
    assert bool((host.page_epoch == FREE).all())


def test_hicache_keeps_the_ledger_on_and_external_kv_stores_turn_it_off(make_env):
    kit, fx, state, host = make_env("rust", 1)
    scheduler = fx.scheduler_view()
    scheduler.enable_hierarchical_cache = True
    assert ledger_blind_spots(scheduler) == []
    scheduler.enable_unified_cache_external_linker = scheduler.enable_lmcache = True
    assert ledger_blind_spots(scheduler) == ["the external cache linker", "LMCache"]
