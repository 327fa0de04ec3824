"""A HiCache cache with a `file` L3 store, at the cache level: storage prefetches as the scheduler issues them, and
page writes through SGLang's write-through to host and L3.

`file_store_cache` is SGLang's real UnifiedRadixCache with its real HiCache controller, host pool, storage threads
and `HiCacheFile` backend in a folder (the recipe of SGLang's test kit, `_init_hicache(storage_backend="file")`, with
the CPU copy path: `direct` I/O, `layer_first` layout, `vradix.testing.cpu_aids`). `StorageScheduler` issues a
request's storage prefetch by SGLang's own `Scheduler._prefetch_kvcache`. Waits block on the controller's own queues
(a prefetch's hit, its final ack, a backup's ack) with a deadline, never on a timer.
"""
from __future__ import annotations

import json
from array import array
from contextlib import contextmanager

from sglang.srt.environ import envs
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.mem_cache.base_prefix_cache import InsertParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
from sglang.srt.mem_cache.utils import get_storage_hash_str
from sglang.srt.runtime_context import get_parallel
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler
from sglang.test.kits.unified_radix_cache.fixtures import drop_hicache_atexit_pin

from vradix.testing import cpu_aids
from vradix.testing.harness.cache_fixture import SchedulerView, build_cache

#: a prompt of 32 tokens, one page each (page size 1)
PROMPT = list(range(100, 132))
#: seconds a wait on the HiCache controller's queues may take
WAIT_S = 60


#: the L3 settings of `file_store_cache`, as `AttachHiCacheStorageReqInput` fields (a runtime attach names the same)
STORAGE_FIELDS = {"hicache_storage_backend": "file", "hicache_storage_prefetch_policy": "wait_complete",
                  "hicache_storage_backend_extra_config_json": json.dumps({"prefetch_threshold": 4})}


@contextmanager
def file_store_cache(store, tree_core: str = "rust", kv_tokens: int = 256, with_storage: bool = True,
                     **server_args):
    """A real UnifiedRadixCache with a host tier (twice the device pool) and a `file` L3 store at `store`, prefetch
    policy `wait_complete`, prefetches from 4 tokens on (`STORAGE_FIELDS`). Without `with_storage` the cache starts
    with the host tier only, as an engine launched without `--hicache-storage-backend`, and the store is attached at
    runtime (`RuntimeStorageScheduler.attach`). `server_args` are further `ServerArgs` fields of the engine's
    configuration (e.g. `enable_streaming_session=True`)."""
    cpu_aids.apply()
    with get_parallel().override(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1), \
            envs.SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR.override(str(store)):
        fx = build_cache(tree_core, 1, kv_tokens=kv_tokens)
        storage = ({"hicache_storage_backend": "file", "hicache_storage_prefetch_policy": "wait_complete",
                    "hicache_storage_backend_extra_config": STORAGE_FIELDS["hicache_storage_backend_extra_config_json"]}
                   if with_storage else {})
        args = ServerArgs(model_path="dummy", page_size=1, hicache_ratio=2, hicache_io_backend="direct",
                          hicache_mem_layout="layer_first", hicache_write_policy="write_through",
                          **storage, **server_args)
        set_global_server_args_for_scheduler(args)
        fx.cache.init_hicache(args, CacheInitParams(
            disable=False, req_to_token_pool=fx.req_pool, token_to_kv_pool_allocator=fx.allocator, page_size=1,
            tree_components=(ComponentType.FULL,), tree_core_backend=tree_core))
        drop_hicache_atexit_pin(fx.cache)
        try:
            yield fx
        finally:
            fx.cache.cache_controller._stop_storage_threads()
            fx.cache.release_host_resources()


class StorageScheduler(SchedulerView):
    """The fixture's scheduler view, plus what `bump_scheduler` and SGLang's `Scheduler._prefetch_kvcache` read."""

    enable_hicache_storage, enable_lmcache, hisparse_coordinator = True, False, None
    _prefetch_kvcache = Scheduler._prefetch_kvcache


class RuntimeStorageScheduler(StorageScheduler):
    """A scheduler view of an engine launched with a host tier and no L3 store: SGLang's own scheduler-side attach
    and detach handlers (`Scheduler.attach_hicache_storage_wrapped`, `detach_hicache_storage_wrapped`, with every
    hook installed on them) attach and detach the store at runtime, as `PUT`/`DELETE /hicache/storage-backend` do."""

    enable_hierarchical_cache = True

    def __init__(self, fx, **kw):
        super().__init__(fx, **kw)
        self.enable_hicache_storage = False

    def attach(self, **fields):
        """`PUT /hicache/storage-backend` as the scheduler receives it (`STORAGE_FIELDS`, overridden by `fields`)."""
        from sglang.srt.managers.io_struct import AttachHiCacheStorageReqInput

        return Scheduler.attach_hicache_storage_wrapped(self, AttachHiCacheStorageReqInput(
            **{**STORAGE_FIELDS, **fields}))

    def detach(self):
        """`DELETE /hicache/storage-backend` as the scheduler receives it."""
        from sglang.srt.managers.io_struct import DetachHiCacheStorageReqInput

        return Scheduler.detach_hicache_storage_wrapped(self, DetachHiCacheStorageReqInput())


def wait_until_queued(q, pred) -> None:
    """Block until `pred(items of q)` holds; re-checked at every put (a `queue.Queue`'s own condition)."""
    with q.not_empty:
        assert q.not_empty.wait_for(lambda: pred(list(q.queue)), WAIT_S), "HiCache controller did not answer"


def store_pages(fx, tokens, extra_key) -> None:
    """Put `tokens`' KV under `extra_key` into the tree and through SGLang's write-through to host and L3."""
    cache = fx.cache
    cache.insert(InsertParams(key=RadixKey(array("q", tokens), extra_key=extra_key),
                              value=fx.allocator.alloc(len(tokens))))
    cache.writing_check(write_back=True)  # host copies done; each ack queues its node's L3 backup
    wait_until_queued(cache.cache_controller.ack_backup_queue, lambda acks: len(acks) >= len(cache.ongoing_backup))
    cache.check_hicache_events()
    assert not cache.ongoing_backup


def start_prefetch(sched, req):
    """SGLang's queue-time storage lookup for `req`, run until its pages are copied to host: the final ack is queued
    for the scheduler's next poll, so the prefetch completes, from the scheduler's view, after whatever comes next."""
    cache = sched.tree_cache
    sched._prefetch_kvcache(req)
    op = cache.ongoing_prefetch[req.cache_request_handle].operation
    wait_until_queued(cache.cache_controller.prefetch_hit_queue, lambda ops: op in ops)
    cache.check_hicache_events()  # the hit is allocated host pages and the copy starts
    assert op.host_indices is not None, "the prefetch found no L3 hit"
    wait_until_queued(cache.cache_controller.ack_prefetch_queue,
                      lambda acks: any(a.completed_req and a.operation is op for a in acks))
    return op


def backend_hits(cache, tokens, extra_key) -> int:
    """Pages of `tokens` under `extra_key` the L3 backend holds."""
    return cache.cache_controller.storage_backend.batch_exists(page_hashes(tokens, extra_key))


def page_hashes(tokens, extra_key) -> list:
    """The L3 page keys SGLang derives for `tokens` under `extra_key` (page size 1), computed independently."""
    return get_storage_hash_str(RadixKey(array("q", tokens), extra_key=extra_key), None, page_size=1)
