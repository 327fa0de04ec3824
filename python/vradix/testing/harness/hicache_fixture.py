"""HiCache's host tier (L2) on a real SGLang 0.5.23 `UnifiedRadixCache` on CPU, for tests and benchmarks.

`build_hicache(...)` is `cache_fixture.build_cache` plus `init_host_tier`, which makes the call a server makes for
`--enable-hierarchical-cache`, SGLang's own `UnifiedRadixCache.init_hicache`: the real host pool,
`HybridCacheController` and L2 transfer engine, with a server's defaults (write-through on a node's first insert,
load-backs under 10 tokens recomputed). It selects the copy path the CPU aids provide (`direct` I/O, `layer_first`
host layout, `vradix.testing.cpu_aids.apply()`); SGLang's test kit (`_init_hicache`, usable on CPU inside
`cpu_aids.kit_hicache_on_cpu()`) sets test thresholds instead. `init_host_tier` works on any cache that keeps its
`cache_init_params`, e.g. one from the kit's `fixtures.build_fixture`.

`HiCacheFixture` is a `CacheFixture` that drives requests the way the scheduler does with a host tier:
- `admit` loads a match's host hit back (`init_load_back`, as `PrefillAdder` does) and starts the H->D copy (as the
  forward does through `ready_to_load_host_cache`; on CPU the copy is synchronous, so the KV is there on return);
- `process_acks` is the scheduler's per-step `check_hicache_events` (write-through and load-back acks);
- KV content: the pools are float32, so `stamp` writes an integer code into each slot's first K element, and real
  backups and load-backs carry it between device and host (`device_codes`, `host_codes`): checks see what the copies
  did, not only what the tree claims;
- host figures: `host_used_slots` (SGLang's per-slot allocation flags) and `host_idle_leaks`.
`versioned(fx)` then starts vradix on it as a HiCache engine does (epoch state, KV page ledger and host ledger).
Not exercised on CPU: the CUDA copy kernels, pinned-memory DMA, and copy/forward overlap (copies are synchronous).
"""
from __future__ import annotations

import atexit
from typing import Callable, Optional, Sequence

import torch

from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

from vradix.core import host_tier
from vradix.testing import cpu_aids
from vradix.testing.harness.cache_fixture import CacheFixture, build_cache


TEST_HOST_BUDGET_BYTES = cpu_aids.TEST_HOST_BUDGET_BYTES


def init_host_tier(cache, *, write_policy: str = "write_through", host_ratio: float = 2.0) -> None:
    """Attach SGLang's HiCache host tier to `cache` (which must carry `cache_init_params`) with the CPU copy path.
    `write_policy` is `--hicache-write-policy`; `host_ratio` is `--hicache-ratio` (host pool size over device)."""
    cpu_aids.apply()  # also books each host pool against the aids' test budget, not the machine's free memory
    server_args = ServerArgs(model_path="dummy", page_size=cache.page_size, hicache_io_backend="direct",
                             hicache_mem_layout="layer_first", hicache_write_policy=write_policy,
                             hicache_ratio=host_ratio)
    set_global_server_args_for_scheduler(server_args)
    cache.init_hicache(server_args, cache.cache_init_params)
    atexit.unregister(cache.shutdown)  # init_hicache registers it; a test cache must not outlive its test


class HiCacheFixture(CacheFixture):
    """A `CacheFixture` whose cache has a HiCache host tier (see the module docstring)."""

    #: when set, the 'forward pass' of `prefill`/`decode` writes `kv_code(req, position)` into each slot it computes
    kv_code: Optional[Callable[[object, int], int]] = None

    @property
    def host_pool(self):
        """The KV host pool (the anchor entry of SGLang's `HostPoolGroup`)."""
        return self.cache.cache_controller.mem_pool_host.anchor_entry.host_pool

    # ---- the scheduler's host-tier steps --------------------------------------------------------------------------
    def load_host_hit(self, req) -> None:
        """PrefillAdder's `init_load_back` for a match with a host hit, then the forward's start of the H->D copy."""
        if req.host_hit_length <= 0:
            return
        loaded, req.last_node = self.cache.init_load_back(InitLoadBackParams(
            best_match_node=req.best_match_node, host_hit_length=req.host_hit_length, req=req))
        req.prefix_len += loaded
        self.cache.ready_to_load_host_cache()

    def process_acks(self) -> None:
        """The scheduler's per-step poll of HiCache completions (write-through and load-back acks)."""
        self.cache.check_hicache_events()

    # ---- KV content codes -------------------------------------------------------------------------------------------
    def _forward_writes(self, batch) -> None:
        super()._forward_writes(batch)
        if self.kv_code is not None:
            req, locs = batch.reqs[0], batch.out_cache_loc
            start = req.extend_end  # the forward writes positions [extend_end, extend_end + len(locs))
            self.stamp(locs.tolist(), [self.kv_code(req, start + i) for i in range(len(locs))])

    def stamp(self, slots: Sequence[int], codes: Sequence[int]) -> None:
        """Write `codes[i]` into device slot `slots[i]` (the 'forward pass' computing that KV)."""
        k = self.allocator.get_kvcache().k_buffer[0]
        k[torch.as_tensor(list(slots), dtype=torch.long), 0, 0] = torch.as_tensor(list(codes), dtype=k.dtype)

    def device_codes(self, slots: Sequence[int]) -> list[int]:
        k = self.allocator.get_kvcache().k_buffer[0]
        return [int(c) for c in k[torch.as_tensor(list(slots), dtype=torch.long), 0, 0].tolist()]

    def host_used_slots(self) -> list[int]:
        """Host slots the host pool counts as allocated (its per-slot double-free flags)."""
        return self.host_pool.slot_used.nonzero().flatten().tolist()

    def host_codes(self) -> dict[int, int]:
        """host slot -> code, for every allocated host slot a backup has copied into (a backup still queued in the
        controller holds its host slots before its copy runs)."""
        queued = {h for op in self.cache.cache_controller.write_queue for h in op.host_indices.tolist()}
        used = [h for h in self.host_used_slots() if h not in queued]
        k = self.host_pool.kv_buffer[0, 0]  # layer_first: [k|v, layer, slot, head, dim]
        return dict(zip(used, (int(c) for c in k[torch.as_tensor(used, dtype=torch.long), 0, 0].tolist())))

    # ---- host-pool accounting -----------------------------------------------------------------------------------------
    def host_figures(self) -> dict:
        figures = host_tier.pool_figures(self.cache)
        assert figures is not None, "the fixture's cache has a host tier"
        return figures

    def host_idle_leaks(self) -> list[str]:
        """`vradix.core.host_tier.idle_leaks`: for an idle engine whose tree holds nothing (once every request finished,
        and after a bump)."""
        return host_tier.idle_leaks(self.cache)


def versioned(fx: HiCacheFixture, **attach_kwargs):
    """vradix's engine start on `fx`'s cache, as `hooks.startup.attach_to_scheduler` does it for a HiCache engine:
    the epoch state with the KV page ledger on the allocator, and the host ledger on the host pool. Returns the
    `Engine`."""
    from vradix.ledger import host as host_ledger
    from vradix.engine import attach

    state = attach(fx.cache, **attach_kwargs)
    assert state.ledger is not None, "a HiCache fixture is versioned with the KV page ledger on"
    host_ledger.attach(fx.cache, state.ledger)
    return state


def build_hicache(tree_core: str = "rust", page_size: int = 1, kv_tokens: int = 256, *,
                  write_policy: str = "write_through", host_ratio: float = 2.0, max_reqs: int = 16,
                  max_context_len: int = 512) -> HiCacheFixture:
    """A FULL-attention UnifiedRadixCache with the named TreeCore and a HiCache host tier, float32 KV (for `stamp`)."""
    fx = build_cache(tree_core, page_size, kv_tokens=kv_tokens, max_reqs=max_reqs, max_context_len=max_context_len,
                     dtype=torch.float32, fixture_class=HiCacheFixture)
    assert isinstance(fx, HiCacheFixture)
    init_host_tier(fx.cache, write_policy=write_policy, host_ratio=host_ratio)
    return fx
