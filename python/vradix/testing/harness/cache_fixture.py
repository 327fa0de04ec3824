"""A real SGLang 0.5.23 `UnifiedRadixCache` on CPU, with real pools and allocators (tests and benchmarks).

Nothing here is mocked: the cache, its TreeCore (production Rust or Python), `ReqToTokenPool`, `MHATokenToKVPool` and
the token/paged allocators are SGLang's own classes, built the way `kv_cache_builder` builds them for a FULL-attention
model. `make_req` / `admit` / `prefill` / `finish` drive requests through the same `mem_cache.common` functions the
scheduler calls (`match_kv_cache`, `lock`, `checkpoint_kv_cache`, `release_kv_cache`).
"""
from __future__ import annotations

import itertools
from array import array
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch

from sglang.srt.disaggregation.utils import DisaggregationMode
from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.mem_cache import common
from sglang.srt.mem_cache.allocator import (BaseTokenToKVPoolAllocator, PagedTokenToKVPoolAllocator,
                                            TokenToKVPoolAllocator)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler



def seq(start: int, n: int) -> list:
    """`n` consecutive token ids from `start` (distinct prompts for cache-level tests)."""
    return [start + i for i in range(n)]

@dataclass
class CacheFixture:
    """One tree cache with its pools; `total` is the allocator's capacity in tokens."""

    cache: UnifiedRadixCache
    allocator: BaseTokenToKVPoolAllocator
    req_pool: ReqToTokenPool
    page_size: int
    total: int
    _rids: itertools.count = field(default_factory=itertools.count)
    #: the overlap loop's order: a forward's result is processed only when the test says so (`process_result`),
    #: after the next batch is scheduled; by default each result is processed right after its forward
    overlap: bool = False
    _results: list = field(default_factory=list)

    @property
    def tree_core_name(self) -> str:
        return type(self.cache.tree_core).__name__

    # ---- accounting -------------------------------------------------------------------------------------------
    def accounting(self) -> tuple[int, int, int]:
        """(available, evictable, protected) in tokens, the terms of SGLang's idle memory check."""
        return self.allocator.available_size(), self.cache.evictable_size(), self.cache.protected_size()

    def idle_invariant_holds(self) -> bool:
        """SGLang's strict idle check: available + evictable + protected == total (no request holds KV)."""
        a, e, p = self.accounting()
        return a + e + p == self.total

    def busy_invariant_holds(self, live: Sequence[Req]) -> bool:
        """With live requests: available + evictable + protected + request-owned (unpublished) == total."""
        owned = sum(self._page_ceil(r.owned_kv_len()) - r.kv.cache_protected_len for r in live if r.kv.holds_kv)
        a, e, p = self.accounting()
        return a + e + p + owned == self.total

    # ---- request driving (the scheduler's calls, in its order) ------------------------------------------------
    def make_req(self, tokens: Sequence[int], extra_key: Optional[str] = None, lora_id: Optional[str] = None) -> Req:
        req = Req(
            rid=f"r{next(self._rids)}",
            origin_input_text="",
            origin_input_ids=array("q", tokens),
            sampling_params=SamplingParams(temperature=0, max_new_tokens=1 << 20),
            extra_key=extra_key,
            lora_id=lora_id,
        )
        req.full_untruncated_fill_ids = array("q", tokens)
        return req

    def admit(self, req: Req) -> int:
        """Match the prefix, lock it and give the request a row (PrefillAdder + prepare_for_extend), in a prefill pass
        of its own. Returns hit len."""
        self._admit_one(req)
        self._admitted(req)
        return req.prefix_len

    def _admit_one(self, req: Req) -> None:
        # like the scheduler, always recompute at least the last prompt token
        common.match_kv_cache(req, self.cache, req.origin_input_ids, max_prefix_len=len(req.origin_input_ids) - 1)
        # a streaming session's turn borrows its slot's record: row, KV and tree lock come with it
        lent = req.kv.holds_kv
        self.load_host_hit(req)
        if not lent:
            req.kv.cache_protected_len = req.prefix_len
        req.lock = self.cache.lock(req.last_node)
        self.req_pool.alloc([req])
        if req.prefix_len and not lent:
            prefix = self.cache.tree_core.collect_full_device_indices(req.last_node, self.cache.root_node_handle())
            self.req_pool.write((req.kv.req_pool_idx, slice(0, req.prefix_len)), prefix.to(torch.int32))
        req.extend_end = req.prefix_len
        self.cache.maybe_hand_to_session(req)  # as alloc_for_extend: a session's first turn hands it its record

    def _admitted(self, req: Req) -> None:
        """The admission point: the end of a one-request prefill pass (`hooks.serving.prefill_pass` counts the prefix
        hits of the requests a pass admitted; `admit_group` announces a pass of several)."""
        self.end_prefill_pass([req])

    def end_prefill_pass(self, reqs: Sequence[Req]) -> None:
        """What `hooks.serving.prefill_pass` does after a pass that admitted `reqs`: count their prefix hits."""
        engine = getattr(self.cache, "_vradix", None)
        if engine is not None:
            engine.count_prefix_hits(reqs)

    def admit_group(self, reqs: Sequence[Req]) -> None:
        """One prefill pass admitting `reqs` (each matched, locked and given a row, as `admit`), then its hits."""
        for req in reqs:
            self._admit_one(req)
        self.end_prefill_pass(reqs)

    def load_host_hit(self, req: Req) -> None:
        """What the scheduler does with a match's host hit (none without a HiCache host tier)."""

    def running(self, state, tokens: Sequence[int]) -> Req:
        """A request stamped in `state`'s current epoch, admitted and prefilled: it holds its KV as a running one."""
        req = self.make_req(tokens)
        state.admit_or_raise(req)
        self.admit(req)
        self.prefill(req)
        return req

    def prefill(self, req: Req, upto: Optional[int] = None, checkpoint: bool = True) -> None:
        """Allocate and 'compute' KV for tokens [extend_end, upto), then checkpoint it into the tree like the
        scheduler does after every prefill chunk of an unfinished request."""
        self._extend(req, upto, checkpoint, ForwardMode.EXTEND)

    def _extend(self, req: Req, upto: Optional[int], checkpoint: bool, mode: "ForwardMode") -> None:
        tokens = req.origin_input_ids + req.output_ids
        upto = len(tokens) if upto is None else upto
        n = upto - req.extend_end
        if n > 0:
            row = self.req_pool.req_to_token[req.kv.req_pool_idx]
            locs = self._alloc(req.extend_end, n, row)
            self.req_pool.write((req.kv.req_pool_idx, slice(req.extend_end, upto)), locs.to(torch.int32))
            self._forward_writes(ForwardWrite(out_cache_loc=locs, forward_mode=mode, reqs=[req],
                                              prefix_lens=[req.extend_end]))
            req.kv.kv_committed_len = upto
            req.kv.kv_allocated_len = upto
            req.extend_end = upto
        req.full_untruncated_fill_ids = array("q", tokens[:upto])
        if checkpoint:
            common.checkpoint_kv_cache(req, self.cache)

    def prefill_group(self, reqs: Sequence[Req]) -> None:
        """One extend batch computing the rest of every prompt of `reqs` (page size 1), then each request's
        checkpoint, as the scheduler runs a prefill batch of several requests."""
        assert self.page_size == 1, "prefill_group: page size 1 only"
        locs, prefix_lens = [], []
        for req in reqs:
            tokens = req.origin_input_ids + req.output_ids
            n = len(tokens) - req.extend_end
            loc = self._alloc(req.extend_end, n)
            self.req_pool.write((req.kv.req_pool_idx, slice(req.extend_end, len(tokens))), loc.to(torch.int32))
            locs.append(loc)
            prefix_lens.append(req.extend_end)
        self._forward_writes(ForwardWrite(out_cache_loc=torch.cat(locs), forward_mode=ForwardMode.EXTEND,
                                          reqs=list(reqs), prefix_lens=prefix_lens))
        for req in reqs:
            upto = len(req.origin_input_ids) + len(req.output_ids)
            req.kv.kv_committed_len = req.kv.kv_allocated_len = req.extend_end = upto
            req.full_untruncated_fill_ids = array("q", req.origin_input_ids + req.output_ids)
            common.checkpoint_kv_cache(req, self.cache)

    def decode(self, req: Req, token: int) -> None:
        req.output_ids.append(token)
        self._extend(req, len(req.origin_input_ids) + len(req.output_ids), False, ForwardMode.DECODE)

    def finish(self, req: Req) -> None:
        """The request finished: released and inserted — or, when its forward ran on KV it must not use
        (`req.discard_output_reason`, set before the forward), finished with that reason and released without an
        insert, as SGLang's prefill result processing does (`process_batch_result_prefill`)."""
        if req.discard_output_reason is not None:
            req.to_finish = req.discard_output_reason
            req.update_finish_state(0)
            common.release_kv_cache(req, self.cache, checkpoint=False)
            return
        req.finished_reason = FINISH_LENGTH(length=0)
        common.release_kv_cache(req, self.cache, checkpoint=True)

    def retract(self, req: Req) -> None:
        common.release_kv_cache(req, self.cache, checkpoint=False)
        req.reset_for_retract()

    def _forward_writes(self, batch: "ForwardWrite") -> None:
        """The forward pass of a batch, announced through the real `Scheduler.run_batch` BEFORE hooks
        (`hooks.serving.before_forward`: the backstop's check, then the ledger stamp), then its result, through the
        `Scheduler.process_batch_result` BEFORE hook that reads the backstop's verdict (the normal loop's order: each
        result is processed before the next batch is scheduled)."""
        from vradix.hooks.serving import before_forward
        if getattr(self.cache, "_vradix", None) is not None:  # stock (vradix off): SGLang has no such hook
            before_forward(self.scheduler_view(), batch)
        self._results.append(batch)
        if not self.overlap:
            self.process_result()

    def process_result(self) -> None:
        """Process the oldest forward's result: SGLang's `process_batch_result` BEFORE hook (the backstop's verdict
        is read there)."""
        from vradix.hooks.serving import at_result
        batch = self._results.pop(0)
        if getattr(self.cache, "_vradix", None) is not None:
            at_result(self.scheduler_view(), batch)

    def stash_chunk(self, req: Req) -> None:
        """The overlap loop's checkpoint of a chunked request: SGLang's real `Scheduler.stash_chunked_request`, with
        the hooks vradix installed on it."""
        from sglang.srt.managers.scheduler import Scheduler
        Scheduler.stash_chunked_request(self.scheduler_view(chunked=req), req)

    def scheduler_view(self, **queues) -> "SchedulerView":
        """A `SchedulerView` over this fixture (see its docstring); `queues` sets its request lists."""
        return SchedulerView(self, **queues)

    def _page_ceil(self, n: int) -> int:
        return -(-n // self.page_size) * self.page_size

    def _alloc(self, start: int, n: int, row: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Slots for positions [start, start+n). Paged: continue the request's last page, then whole new pages."""
        if self.page_size == 1:
            locs = self.allocator.alloc(n)
            assert locs is not None, "pool exhausted"
            return locs
        out: list[torch.Tensor] = []
        pos = start
        while pos < start + n:
            if pos % self.page_size:
                assert out or row is not None, "a mid-page start needs the request's row"
                prev = int(out[-1][-1]) if out or row is None else int(row[pos - 1])
                take = min(self.page_size - pos % self.page_size, start + n - pos)
                out.append(torch.arange(prev + 1, prev + 1 + take, dtype=torch.int64))
            else:
                page = self.allocator.alloc(self.page_size)
                assert page is not None, "pool exhausted"
                take = min(self.page_size, start + n - pos)
                out.append(page[:take].to(torch.int64))
            pos += take
        return torch.cat(out)


@dataclass
class ForwardWrite:
    """Stand-in for a `ScheduleBatch` as `Scheduler.run_batch`'s hooks read it: `out_cache_loc` (the ledger stamp);
    `forward_mode`, `reqs`, `prefix_lens` and `decoding_reqs` (the strict guard's backstop)."""

    out_cache_loc: torch.Tensor
    forward_mode: ForwardMode = ForwardMode.EXTEND
    reqs: list = field(default_factory=list)
    prefix_lens: list = field(default_factory=list)
    decoding_reqs: Optional[list] = None


class SchedulerView:
    """Stand-in for SGLang's `Scheduler` over a `CacheFixture`, for hooks that take the scheduler (a real Scheduler
    needs a model runner and cannot be built on CPU without one). It exposes only what vradix's scheduler hooks read:
    `tree_cache`, `req_to_token_pool`, `waiting_queue`, `collect_inflight_reqs()`, `chunked_req`, `_engine_paused`,
    `is_fully_idle()`. The cache, pools and requests behind it are all real. Under `VRADIX_CENSUS` (the suite) the
    escape watch attaches itself at its first bump, so every bump through it runs the watch's request check."""

    def __init__(self, fx: CacheFixture, waiting=(), running=(), chunked=None, paused: bool = False):
        self.tree_cache = fx.cache
        self.req_to_token_pool = fx.req_pool
        self.waiting_queue = list(waiting)
        self.running = list(running)
        self.chunked_req = chunked
        self._engine_paused = paused
        self.disaggregation_mode = DisaggregationMode.NULL

    def collect_inflight_reqs(self) -> list:
        return list(self.running)

    def is_fully_idle(self, ignore_waiting: bool = False) -> bool:
        """SGLang's rule: no running or chunked request, and (unless ignored) no waiting one."""
        return not self.running and self.chunked_req is None and (ignore_waiting or not self.waiting_queue)


def build_cache(tree_core: str = "rust", page_size: int = 1, kv_tokens: int = 4096, max_reqs: int = 64,
                max_context_len: int = 2048, dtype: torch.dtype = torch.bfloat16,
                fixture_class: type = CacheFixture, eviction_policy: str = "lru", **server_args) -> CacheFixture:
    """Build the FULL-attention UnifiedRadixCache SGLang builds by default, on CPU, with the named TreeCore. Its
    `CacheInitParams` stay on it as `cache.cache_init_params` (as in SGLang's test kit), for `init_hicache`.
    `server_args` are further `ServerArgs` fields for the process-wide config SGLang's functions read (e.g. a P/D
    decode role: `disaggregation_mode="decode"`)."""
    set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", page_size=page_size, **server_args))
    req_pool = ReqToTokenPool(size=max_reqs, max_context_len=max_context_len, device="cpu", enable_memory_saver=False)
    kv = MHATokenToKVPool(size=kv_tokens, page_size=page_size, dtype=dtype, head_num=1, head_dim=8,
                          layer_num=1, device="cpu", enable_memory_saver=False)
    if page_size == 1:
        alloc = TokenToKVPoolAllocator(size=kv_tokens, dtype=dtype, device="cpu", kvcache=kv, need_sort=False)
    else:
        alloc = PagedTokenToKVPoolAllocator(size=kv_tokens, page_size=page_size, dtype=dtype, device="cpu",
                                            kvcache=kv, need_sort=False)
    params = CacheInitParams(disable=False, req_to_token_pool=req_pool, token_to_kv_pool_allocator=alloc,
                             page_size=page_size, tree_components=(ComponentType.FULL,), tree_core_backend=tree_core,
                             eviction_policy=eviction_policy)
    cache = UnifiedRadixCache(params)
    cache.cache_init_params = params  # what SGLang's test kit reads to initialize HiCache on it (`_init_hicache`)
    return fixture_class(cache=cache, allocator=alloc, req_pool=req_pool, page_size=page_size,
                         total=alloc.available_size())
