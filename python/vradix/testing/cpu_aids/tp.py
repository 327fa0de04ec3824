"""CPU aid for tensor parallelism (`--tp-size 2`) on SGLang's CPU engine: test and demo only, never a product path.

SGLang 0.5.23's `parallel_state.init_model_parallel_group` turns PyNccl on for every group unless the platform is an
out-of-tree one without it, and `PyNcclCommunicator` then fails on the CPU engine ("Expected a cuda device, but got:
cpu"). This aid wraps that one function so every group is built with `use_pynccl=False`; with it off, the groups'
all-reduce and all-gather fall back to `torch.distributed` over gloo. Nothing in the model, the scheduler, the
groups' other communicators or vradix is replaced. The rest of the TP recipe is a setting: one core per rank,
`SGLANG_CPU_OMP_THREADS_BIND='0|1'` (`tp_cpu_env`), without which SGLang asserts that the rank count is at most
the NUMA node count.

What a CPU run therefore does not exercise: NCCL (PyNccl) collectives, the custom all-reduce, symmetric-memory and
MSCCL++ paths, SGLang's CPU `shm_allreduce` (it needs the real `sgl_kernel`, which the shim does not provide), CUDA
graphs across ranks, PP > 1, and multi-node TP (both ranks share one host and talk over loopback gloo).

Servers load this aid as the `sglang.srt.plugins` entry point `vradix_tp_cpu_aids` from the folder `tp_plugin/`
(`PLUGIN_PATH`), which `vradix.testing.harness.server.CpuServer(tp_size=2)` puts on PYTHONPATH. SGLang loads general
plugins at the top of `run_scheduler_process`, in every scheduler process it spawns (one per TP rank), before the
model runner builds the groups, so each rank builds its groups through the wrapper. `apply()` refuses to run where
CUDA is available.
"""
from __future__ import annotations

import os

import torch

from vradix.testing import cpu_aids

#: the folder to put on PYTHONPATH so a TP server process loads this aid as a plugin
PLUGIN_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tp_plugin")


def tp_cpu_env(tp_size: int) -> dict:
    """The environment a CPU server with `tp_size` ranks needs: rank i's OpenMP threads bound to core i (`'0|1'` for
    two ranks), since SGLang otherwise binds one NUMA node per rank and asserts there are enough."""
    return {"SGLANG_CPU_OMP_THREADS_BIND": "|".join(str(rank) for rank in range(tp_size))}


def without_pynccl(init_group):
    """`init_group` (SGLang's `init_model_parallel_group`) with `use_pynccl=False` forced, whatever the caller
    passed; marked so a second `apply()` does not wrap it again."""
    return cpu_aids.forcing_argument(init_group, "use_pynccl", False)


def apply() -> None:
    """Build every model-parallel group without PyNccl in this process (idempotent). Raises RuntimeError on a
    machine with CUDA, where PyNccl is the real path."""
    if torch.cuda.is_available():
        raise RuntimeError("vradix CPU aids are for CPU-only test machines; refusing to turn PyNccl off on a CUDA host")
    from sglang.srt.distributed import parallel_state

    if not getattr(parallel_state.init_model_parallel_group, "_vradix_cpu_aid", False):
        parallel_state.init_model_parallel_group = without_pynccl(parallel_state.init_model_parallel_group)


def register() -> None:
    """`sglang.srt.plugins` entry point of the `vradix_tp_cpu_aids` test plugin."""
    apply()
