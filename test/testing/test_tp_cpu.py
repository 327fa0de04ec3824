"""The TP CPU aid (`vradix.testing.cpu_aids.tp`) and the harness flags of a TP server: SGLang's real
`init_model_parallel_group` builds a group without PyNccl whatever its caller asks; installing twice wraps once; a
CUDA host is refused; the plugin folder names the aid's entry point; `CpuServer(tp_size=2)` passes the TP recipe."""
import importlib.metadata
import os

import pytest
import torch
import torch.distributed as dist

from vradix.testing.cpu_aids import tp
from vradix.testing.harness.server import with_tp_cpu_aid


@pytest.fixture
def parallel_state(monkeypatch):
    """SGLang's `parallel_state`, its `init_model_parallel_group` restored after the test."""
    from sglang.srt.distributed import parallel_state as ps

    monkeypatch.setattr(ps, "init_model_parallel_group", ps.init_model_parallel_group)
    return ps


@pytest.fixture
def gloo_world(tmp_path):
    """A one-rank gloo world (the CPU engine's backend), torn down after the test."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_every_group_is_built_without_pynccl_and_a_second_apply_wraps_once(parallel_state, gloo_world):
    stock = parallel_state.init_model_parallel_group
    tp.apply()
    wrapped = parallel_state.init_model_parallel_group
    tp.apply()
    assert wrapped is not stock and parallel_state.init_model_parallel_group is wrapped
    assert wrapped.__wrapped__ is stock
    positional = wrapped([[0]], 0, "gloo", True, group_name="vradix_tp_positional")
    keyword = wrapped([[0]], 0, "gloo", use_pynccl=True, group_name="vradix_tp_keyword")
    default = wrapped([[0]], 0, "gloo", group_name="vradix_tp_default")
    assert [g.use_pynccl for g in (positional, keyword, default)] == [False, False, False]
    assert stock([[0]], 0, "gloo", use_pynccl=True, group_name="vradix_tp_stock").use_pynccl  # what the aid changes


def test_a_cuda_host_is_refused_and_nothing_is_wrapped(parallel_state, monkeypatch):
    stock = parallel_state.init_model_parallel_group
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(RuntimeError, match="CUDA host"):
        tp.register()
    assert parallel_state.init_model_parallel_group is stock


def test_the_plugin_folder_names_the_aid_as_an_sglang_plugin():
    (dist_,) = importlib.metadata.distributions(path=[tp.PLUGIN_PATH])
    (entry,) = [e for e in dist_.entry_points if e.group == "sglang.srt.plugins"]
    assert entry.load() is tp.register


def test_a_tp_server_gets_the_flag_the_core_binding_and_the_plugin_path():
    env = {"PYTHONPATH": "elsewhere"}
    args = with_tp_cpu_aid(env, ["--page-size", "1"], 2)
    assert args == ["--page-size", "1", "--tp-size", "2"]
    assert env["SGLANG_CPU_OMP_THREADS_BIND"] == "0|1"
    assert env["PYTHONPATH"].split(os.pathsep) == [tp.PLUGIN_PATH, "elsewhere"]
    chosen = {"SGLANG_CPU_OMP_THREADS_BIND": "2|3"}
    with_tp_cpu_aid(chosen, [], 2)
    assert chosen["SGLANG_CPU_OMP_THREADS_BIND"] == "2|3"  # a binding the caller chose is kept
