"""A hybrid (FULL + MAMBA) cache with a HiCache host tier (L2) and a `file` L3 store on CPU: the restore half of the
P/D hybrid contract ("Hybrid (Mamba) models over P/D" in docs/pd.md), at cache level.

The cache is SGLang's test-kit FULL + MAMBA `UnifiedRadixCache` (page size 1, real `HybridReqToTokenPool`, Python
TreeCore), with SGLang's own `init_hicache`: the real `HybridCacheController`, KV and Mamba host pools in the
`page_first_direct` layout, copying through the torch stand-ins of `vradix.testing.cpu_aids.page_first`. A decode
request is driven the way decode's HiCache restore drives it (`_try_hicache_queue_load_back`): its state slot comes
with its request row (decode's pre-allocation; the P->D transfer writes the prompt's live state there), then a rematch
with `cow_mamba=False` and `init_load_back` restore the cached prefix (from L3: decode's storage lookup and prefetch
first). States are marked: every element of a slot
holds one value, so a check sees which copy landed where.
"""
import json
from array import array
from contextlib import ExitStack, contextmanager

import pytest
import torch

from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req
from sglang.srt.mem_cache import common
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InitLoadBackParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
from sglang.srt.sampling.sampling_params import SamplingParams

from vradix.engine import attach
from vradix.pd.layout import KvLayout, scope_of
from vradix.testing.harness.cache_fixture import seq
from vradix.testing.harness.reliability import wait_until

CANONICAL, LIVE = 7.0, -3.0  # the cached prefix's state; the state the P->D transfer writes into the request's slot
PREFIX = seq(10, 12)
DECODE_SCOPE = scope_of(KvLayout("decode", 1, 1, 1, "bfloat16", False))
WAIT_S = 60


@contextmanager
def hybrid_cache(monkeypatch, store=None):
    """The kit's FULL + MAMBA cache with SGLang's host tier (write-through, host pools twice the device's) and, with
    `store`, a `file` L3 store there (prefetch policy `wait_complete`, from 1 token on)."""
    from sglang.srt.environ import envs
    from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler
    from sglang.test.kits.unified_radix_cache import fixtures
    from sglang.test.kits.unified_radix_cache.config import CacheConfig

    from vradix.testing.cpu_aids import TEST_HOST_BUDGET_BYTES, page_first

    page_first.apply()
    monkeypatch.setattr(fixtures, "get_device", lambda: "cpu")  # the kit builds on the accelerator it finds
    storage = {} if store is None else dict(
        hicache_storage_backend="file", hicache_storage_prefetch_policy="wait_complete",
        hicache_storage_backend_extra_config=json.dumps({"prefetch_threshold": 1}))
    with ExitStack() as scope:
        if store is not None:  # the kit's recipe: one local rank, the file backend's folder from the environment
            scope.enter_context(get_parallel().override(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1))
            scope.enter_context(envs.SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR.override(str(store)))
        cache, allocator, req_pool = fixtures.build_fixture(CacheConfig(
            components=(ComponentType.FULL, ComponentType.MAMBA), mamba_cache_size=8), tree_core_backend="python")
        args = ServerArgs(model_path="dummy", page_size=1, hicache_io_backend=page_first.IO_BACKEND,
                          hicache_mem_layout=page_first.MEM_LAYOUT, hicache_write_policy="write_through", **storage)
        set_global_server_args_for_scheduler(args)
        with host_memory_budget_scope(TEST_HOST_BUDGET_BYTES):
            cache.init_hicache(args, cache.cache_init_params)
        fixtures.drop_hicache_atexit_pin(cache)
        cache.write_through_threshold = 1 << 30  # backups happen where the test says (as SGLang's kit sets them)
        cache.load_back_threshold = 0
        if store is not None:
            cc = cache.cache_controller  # the kit's sizing: host pool == device pool leaves no prefetch capacity
            cc.prefetch_capacity_limit = max(cc.prefetch_capacity_limit, cc.mem_pool_host.size)
            scope.callback(cc._stop_storage_threads)
        scope.callback(cache.release_host_resources)
        # the requests below are a P/D decode role's: its scope starts every namespace, and restore rules depend on
        # the role
        yield Hybrid(cache, allocator, req_pool, attach(cache, with_ledger=False, scope=DECODE_SCOPE))


@pytest.fixture
def hybrid(monkeypatch):
    with hybrid_cache(monkeypatch) as hx:
        yield hx


@pytest.fixture
def hybrid_l3(monkeypatch, tmp_path):
    with hybrid_cache(monkeypatch, tmp_path) as hx:
        yield hx


class Hybrid:
    """The kit's hybrid cache with its host tier and vradix's epoch state; `totals` are the pools' free slots when
    empty."""

    def __init__(self, cache, allocator, req_pool, state):
        self.cache, self.allocator, self.req_pool, self.state = cache, allocator, req_pool, state
        self.totals = self.figures()

    # ---- figures ----------------------------------------------------------------------------------------------------
    def figures(self) -> dict:
        """Free slots of every pool: device KV and state slots, host KV and host state slots."""
        from sglang.srt.mem_cache.hicache_storage import PoolName

        return {"kv": self.allocator.available_size(), "states": self.req_pool.mamba_allocator.available_size(),
                "host_kv": self.cache.cache_controller.mem_pool_host.anchor_entry.host_pool.available_size(),
                "host_states": self.cache.host_pool_group.get_pool(PoolName.MAMBA).available_size()}

    # ---- recurrent states -----------------------------------------------------------------------------------------
    def write_state(self, slot: int, marker: float) -> None:
        """Every element of state slot `slot`, in every layer and buffer (conv and SSM), becomes `marker`."""
        mc = self.req_pool.mamba_pool.mamba_cache
        mc.temporal[:, slot] = marker
        for conv in mc.conv:
            conv[:, slot] = marker

    def state_is(self, slot: int, marker: float) -> bool:
        mc = self.req_pool.mamba_pool.mamba_cache
        return all(bool((buf[:, slot] == marker).all()) for buf in (mc.temporal, *mc.conv))

    def node_state_slot(self, node):
        value = self.cache.tree_core.get_component_device_value(node, ComponentType.MAMBA)
        return None if value is None else int(value)

    # ---- requests -------------------------------------------------------------------------------------------------
    def request(self, tokens) -> Req:
        """A request stamped in the current epoch, with its row and its own state slot (decode's pre-allocation)."""
        req = Req(rid=f"r{id(tokens)}-{len(tokens)}", origin_input_text="", origin_input_ids=array("q", tokens),
                  sampling_params=SamplingParams(temperature=0, max_new_tokens=4))
        self.state.admit_or_raise(req)
        self.req_pool.alloc([req])
        return req

    def key(self, tokens, req) -> RadixKey:
        return RadixKey(array("q", tokens), extra_key=req.extra_key)

    def cache_prefix_on_host_only(self, tokens, marker: float):
        """A finished request's prompt and state (`marker`) in the tree, backed up to host and evicted from device."""
        from sglang.test.kits.unified_radix_cache.fixtures import write_backup

        owner = self.request(tokens)
        self.write_state(int(owner.kv.mamba_pool_idx), marker)
        node = self.cache.insert(InsertParams(key=self.key(tokens, owner), value=self.allocator.alloc(len(tokens)),
                                              mamba_value=owner.kv.mamba_pool_idx.unsqueeze(0))).last_device_node
        self.req_pool.free(owner)  # the row only: the tree took the state slot
        assert write_backup(self.cache, node, write_back=True) == len(tokens)
        self.cache.writing_check(write_back=True)
        self.cache.evict(EvictParams(num_tokens=len(tokens), mamba_num=1))
        assert self.node_state_slot(node) is None and self.cache.tree_core.is_full_device_evicted(node)
        return node

    def store_to_l3_and_drop_from_host(self, node, tokens) -> None:
        """SGLang's host -> L3 backup of `node` (the `file` backend), then host eviction: the prefix is only in L3."""
        self.cache.write_backup_storage(node)

        def stored():
            self.cache.drain_storage_control_queues()
            return not self.cache.ongoing_backup

        wait_until(stored, WAIT_S, "the L3 backup's ack")
        self.cache.evict_host(len(tokens), ComponentType.FULL)  # a node's host KV goes with its host state
        assert self.figures() == self.totals

    def prefetch_from_l3(self, req, tokens) -> int:
        """Decode's L3 step for a request: the storage lookup, then the prefetch into host, run to completion.
        Returns the storage hit."""
        root, suffix = self.cache.root_node_handle(), array("q", tokens)
        hit = self.cache.query_storage_hit_length(root, suffix, None, None, extra_key=req.extra_key, cache_salt=None)
        if hit:
            handle = req.cache_request_handle
            self.cache.prefetch_from_storage(handle, root, suffix, None, None, extra_key=req.extra_key)

            def landed():
                self.cache.check_hicache_events()
                return self.cache.check_prefetch_progress(handle)

            wait_until(landed, WAIT_S, "the L3 prefetch")
            self.cache.pop_prefetch_loaded_tokens(handle)
        return hit

    def restore(self, req, tokens):
        """Decode's local restore of a promised prefix: rematch without CoW, load back, wait for the copy."""
        match = self.cache.match_prefix(MatchPrefixParams(key=self.key(tokens + [0], req), cow_mamba=False, req=req))
        req.last_node = match.last_device_node
        loaded, node = self.cache.init_load_back(InitLoadBackParams(
            best_match_node=match.best_match_node, host_hit_length=match.host_hit_length, req=req))
        if loaded:
            assert self.cache.ready_to_load_host_cache() != -1
            for ack in list(self.cache.cache_controller.ack_load_queue):
                ack.finish_event.synchronize()
            self.cache.loading_check()
        return match, loaded, node


def hold_for_decode(hybrid, req, node, tokens) -> None:
    """The decode request once restored and transferred: its row holds the restored prefix KV (locked, protected)
    and the transferred KV of the rest of its prompt; it then decodes one token."""
    prefix = hybrid.cache.tree_core.collect_full_device_indices(node, hybrid.cache.root_node_handle())
    rest = hybrid.allocator.alloc(len(tokens) - len(prefix) + 1)
    row = torch.cat([prefix, rest]).to(torch.int32)
    hybrid.req_pool.write((req.kv.req_pool_idx, slice(0, len(row))), row)
    req.output_ids = array("q", [5])
    req.full_untruncated_fill_ids = array("q", [*tokens, 5])
    req.extend_end = req.kv.kv_committed_len = req.kv.kv_allocated_len = len(row)
    req.kv.cache_protected_len = len(prefix)
    req.last_node = node
    req.lock = hybrid.cache.lock(node)


def finish(hybrid, req) -> None:
    req.finished_reason = FINISH_LENGTH(length=0)
    common.release_kv_cache(req, hybrid.cache, checkpoint=True)


def idle_figures(hybrid) -> dict:
    """The pools' free slots once no request is left and a publication has dropped the tree."""
    hybrid.state.bump(hybrid.cache, [], [], reason="idle")
    return hybrid.figures()


def restore_then_transfer(hybrid, req, live):
    out = hybrid.restore(req, PREFIX)
    hybrid.write_state(live, LIVE)
    return out


def transfer_then_restore(hybrid, req, live):
    hybrid.write_state(live, LIVE)
    return hybrid.restore(req, PREFIX)


# SGLang 0.5.23's Mamba load-back spec (`MambaComponent.build_hicache_transfers`, LOAD_BACK) adds a second leg, "Per-
# request mamba CoW", copying the host state into `req.kv.mamba_pool_idx` whenever the request holds a slot. A decode
# request holds one from its pre-allocation: the slot the P->D transfer writes. Decode queues its restore while the
# transfer is in flight and gates the transfer's success on the restore (`HiCacheRestoreGatedKVReceiver`), so a
# restore that runs after the state has landed would copy the prefix's state over the prompt's; on a decode role
# vradix builds the restore without that leg (`hooks.pd.restore_into_node_slots_only`). Both orders must hold.
@pytest.mark.parametrize("arrival", [restore_then_transfer, transfer_then_restore],
                         ids=["restore-then-transfer", "transfer-then-restore"])
def test_a_restored_prefix_state_lands_in_its_node_slot_and_the_live_state_stays(hybrid, arrival):
    """A prefix cached with a known state, backed up to host and evicted from device; a decode request whose own
    slot receives the live state restores it. The canonical state comes back into a slot of the node's own, the live
    state stays in the request's slot, and once the request finishes and the tree is dropped nothing is held."""
    node = hybrid.cache_prefix_on_host_only(PREFIX, CANONICAL)
    req = hybrid.request(PREFIX + [99])
    live = int(req.kv.mamba_pool_idx)
    match, loaded, restored = arrival(hybrid, req, live)
    assert (match.host_hit_length, match.mamba_host_hit_length, loaded, restored) == (len(PREFIX), 1, len(PREFIX), node)
    slot = hybrid.node_state_slot(node)
    assert slot is not None and slot != live and int(req.kv.mamba_pool_idx) == live
    assert hybrid.state_is(slot, CANONICAL), "the node's restored state is not the cached one"
    assert hybrid.state_is(live, LIVE), "the restore wrote over the request's live state"
    hold_for_decode(hybrid, req, node, PREFIX + [99])
    finish(hybrid, req)
    assert hybrid.state_is(slot, CANONICAL)  # the finished request's state went to a node of its own
    assert idle_figures(hybrid) == hybrid.totals


def test_off_the_decode_role_a_restore_still_gives_the_request_its_prefix_state(hybrid):
    """A request that computes its prompt itself (prefill, or an engine without P/D) continues from the restored
    prefix state: there SGLang's per-request copy is what it needs, and the decode-only rule leaves it in place."""
    hybrid.state.scope = None  # an engine without P/D (prefill's scope behaves the same)
    node = hybrid.cache_prefix_on_host_only(PREFIX, CANONICAL)
    req = hybrid.request(PREFIX + [99])
    own = int(req.kv.mamba_pool_idx)
    _, loaded, _ = transfer_then_restore(hybrid, req, own)
    assert loaded == len(PREFIX) and hybrid.state_is(own, CANONICAL)
    assert hybrid.state_is(hybrid.node_state_slot(node), CANONICAL)


def test_a_request_crossing_a_publication_keeps_its_live_state_and_publishes_none_of_it(hybrid):
    """The request restored the prefix's state under the old weights, then a publication: it keeps its live state
    and KV to the end, the old epoch's host and device copies serve no new-epoch request, and at its release it
    inserts nothing (its state slot is freed, not handed to the tree) and nothing leaks."""
    node = hybrid.cache_prefix_on_host_only(PREFIX, CANONICAL)
    tokens = PREFIX + [99]
    req = hybrid.request(tokens)
    live = int(req.kv.mamba_pool_idx)
    restore_then_transfer(hybrid, req, live)
    hold_for_decode(hybrid, req, node, tokens)
    inv = hybrid.state.bump(hybrid.cache, [req], [], reason="test")
    assert inv.crossing_requests == 1

    fresh = hybrid.request(tokens)  # a new-epoch request for the same prompt: no device, host or state hit
    match = hybrid.cache.match_prefix(MatchPrefixParams(key=hybrid.key(tokens, fresh), cow_mamba=False, req=fresh))
    assert (match.device_prefix_len, match.host_hit_length, match.mamba_host_hit_length) == (0, 0, 0)
    hybrid.req_pool.free(fresh)
    hybrid.req_pool.free_mamba_cache(fresh)

    assert hybrid.state_is(live, LIVE) and int(req.kv.mamba_pool_idx) == live  # it decodes on from its own state
    finish(hybrid, req)
    assert req.kv.mamba_pool_idx is None and req.kv.cache_inserted_len == 0, "the crossing request published its state"
    # the stale node it pinned went with its last holder: every pool is back to full
    assert hybrid.figures() == hybrid.totals, "a state or KV slot leaked"
    for key in (req.extra_key, fresh.extra_key):  # neither namespace holds its span or a state for it
        m = hybrid.cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens + [5]), extra_key=key)))
        assert (m.device_prefix_len, m.host_hit_length) == (0, 0)
    assert idle_figures(hybrid) == hybrid.totals


def test_a_prefix_state_restored_from_l3_lands_in_its_node_slot_and_an_old_epoch_one_is_never_found(hybrid_l3):
    """The same restore from L3: the prefix (KV pages and its state) backed up to a `file` store and dropped from
    device and host; a decode request's storage lookup and prefetch bring it to host, and its restore puts the
    canonical state into the node's slot, not over the live one. After a publication, a new-epoch request for the
    same prompt finds nothing in L3 (the old epoch's pages, state included, are under the old namespace's keys)."""
    hx = hybrid_l3
    node = hx.cache_prefix_on_host_only(PREFIX, CANONICAL)
    hx.store_to_l3_and_drop_from_host(node, PREFIX)
    tokens = PREFIX + [99]
    req = hx.request(tokens)
    live = int(req.kv.mamba_pool_idx)
    assert hx.prefetch_from_l3(req, tokens) == len(PREFIX)
    match, loaded, restored = restore_then_transfer(hx, req, live)
    assert (match.host_hit_length, match.mamba_host_hit_length, loaded) == (len(PREFIX), 1, len(PREFIX))
    slot = hx.node_state_slot(restored)
    assert slot is not None and slot != live and hx.state_is(slot, CANONICAL), "the state restored from L3"
    assert hx.state_is(live, LIVE)
    hold_for_decode(hx, req, restored, tokens)
    finish(hx, req)
    assert idle_figures(hx) == hx.totals

    fresh = hx.request(tokens)
    assert hx.prefetch_from_l3(fresh, tokens) == 0, "a new-epoch request found the old epoch's L3 pages"
    hx.req_pool.free(fresh)
    hx.req_pool.free_mamba_cache(fresh)
    assert hx.figures() == hx.totals
