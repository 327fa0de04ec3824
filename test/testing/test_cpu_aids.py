"""The CPU aids' host-pool budget: a HiCache test server or cache starts whatever memory the rest of the suite holds.

SGLang sizes a host pool against the machine's available memory less 10 GiB kept back for a GPU server; on a
24 GiB test machine with a few parked servers that is negative, and a tiny-model pool of kilobytes failed to start
("Not enough host memory available ... only have -1.73 GB free"). The aid books every host pool against
`TEST_HOST_BUDGET_BYTES` instead."""
from __future__ import annotations

import types

import atexit

import psutil
import pytest
import torch
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

from vradix.testing import cpu_aids
from vradix.testing.harness.cache_fixture import build_cache
from vradix.testing.harness.hicache_fixture import HiCacheFixture


@pytest.fixture
def loaded_machine(monkeypatch):
    """psutil reports 1 GiB available (less than SGLang's 10 GiB reserve), as on a CI machine running the suite."""
    real = psutil.virtual_memory()
    loaded = types.SimpleNamespace(**{**real._asdict(), "available": 1 << 30})
    monkeypatch.setattr(psutil, "virtual_memory", lambda: loaded)
    return loaded


def server_host_tier(core: str) -> HiCacheFixture:
    """A cache given its host tier by the call a server makes (`init_hicache`, no budget scope around it), with the
    aids applied as the server plugin applies them."""
    cpu_aids.apply()
    fx = build_cache(core, 1, kv_tokens=64, max_reqs=8, dtype=torch.float32, fixture_class=HiCacheFixture)
    args = ServerArgs(model_path="dummy", page_size=1, hicache_io_backend="direct", hicache_mem_layout="layer_first",
                      hicache_ratio=2.0)
    set_global_server_args_for_scheduler(args)
    fx.cache.init_hicache(args, fx.cache.cache_init_params)
    atexit.unregister(fx.cache.shutdown)
    return fx


@pytest.mark.parametrize("core", ["rust", "python"])
def test_a_host_pool_starts_when_the_machine_has_less_free_memory_than_sglang_keeps_back(loaded_machine, core):
    pool = server_host_tier(core).host_pool
    assert pool.size >= 64 and pool.size * pool.size_per_token <= cpu_aids.TEST_HOST_BUDGET_BYTES
    assert not pool.pin_memory


def test_a_host_pool_larger_than_the_test_budget_is_still_refused(loaded_machine, monkeypatch):
    monkeypatch.setattr(cpu_aids, "TEST_HOST_BUDGET_BYTES", 1024)
    with pytest.raises(ValueError, match="Not enough host memory"):
        server_host_tier("rust")
