"""SGLang's real P/D decode `DecodePreallocQueue` over a `CacheFixture`, for its retraction path at cache level.

`decode_scheduler(fx)` returns a `DecodeSchedulerView`: the fixture's `SchedulerView` plus what the decode queue and
vradix's decode hooks read of a decode scheduler (`disagg_decode_prealloc_queue`, `disagg_decode_transfer_queue`,
`running_batch`, `last_batch`, `tp_worker.is_hybrid_swa`, ...). Its `disagg_decode_prealloc_queue` is SGLang's own
class with the fields its constructor sets for the retraction path (`add(req, is_retracted=True)`,
`retracted_queue`, `resume_retracted_reqs`, `_pre_alloc`); only the KV transfer engine (`kv_manager`, bootstrap,
metadata buffers) is not built: that needs a transfer backend and a peer, and the retraction path never uses it.
Build the fixture with the decode role's config (`DECODE_SERVER_ARGS`), so SGLang's `release_req` takes the backup.
"""
from __future__ import annotations

from types import SimpleNamespace

from vradix.testing.harness.cache_fixture import CacheFixture, SchedulerView

#: the `ServerArgs` fields of a P/D decode role with the decode radix cache, whose retraction backup SGLang resolves to
#: `cpu_tensor` (`kv_cache_builder.resolve_decode_retraction_backup`), given explicitly since no KV pool resolves it
DECODE_SERVER_ARGS = dict(disaggregation_mode="decode", disaggregation_decode_enable_radix_cache=True,
                          disaggregation_decode_retraction_backup="cpu_tensor")


class DecodeSchedulerView(SchedulerView):
    """A `SchedulerView` of a P/D decode scheduler (see the module docstring); the pools and requests are real."""

    def __init__(self, fx: CacheFixture, num_reserved_decode_tokens: int = 0, **queues):
        super().__init__(fx, **queues)
        self.running_batch = SimpleNamespace(reqs=self.running)
        self.last_batch = None
        self.enable_overlap = False
        self.enable_hisparse = False
        self.sliding_window_size = None
        self.tp_worker = SimpleNamespace(is_hybrid_swa=False)
        self.disagg_decode_transfer_queue = SimpleNamespace(queue=[])
        self.disagg_decode_prealloc_queue = prealloc_queue(fx, self, num_reserved_decode_tokens)


def prealloc_queue(fx: CacheFixture, scheduler, num_reserved_decode_tokens: int):
    """SGLang's `DecodePreallocQueue` over the fixture's pools, without its transfer engine."""
    from sglang.srt.disaggregation.decode import DecodePreallocQueue

    q = DecodePreallocQueue.__new__(DecodePreallocQueue)
    q.req_to_token_pool = fx.req_pool
    q.token_to_kv_pool_allocator = fx.allocator
    q.token_to_kv_pool = fx.allocator.get_kvcache()
    q.tree_cache = fx.cache
    q.scheduler = scheduler
    q.transfer_queue = scheduler.disagg_decode_transfer_queue
    q.max_total_num_tokens = fx.total
    q.num_reserved_decode_tokens = num_reserved_decode_tokens
    q.queue, q.retracted_queue, q.pending_reqs = [], [], []
    return q


def decode_scheduler(fx: CacheFixture, **queues) -> DecodeSchedulerView:
    return DecodeSchedulerView(fx, **queues)
