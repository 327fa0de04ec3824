"""Launch SGLang's Ray mode (`--use-ray`: schedulers in `SchedulerActor`s) on a CPU-only machine: test only.

    python -m vradix.testing.harness.ray_cpu <sglang.launch_server arguments, without --use-ray>

What `python -m sglang.launch_server --use-ray` does (`load_plugins()`, `prepare_server_args`, then
`sglang.srt.ray.http_server.launch_server`), after starting a local Ray cluster this launcher sizes for a CPU box:
- one *logical* GPU (`num_gpus=1`): SGLang places each scheduler actor with `num_gpus=1`; Ray only counts it;
- a job-level `worker_process_setup_hook`, `cpu_actor_setup`: the actor's event loop calls
  `torch.cuda.set_device(gpu_id)`, its one CUDA call on the CPU engine; on a machine without CUDA it becomes a no-op.
  vradix replaces the actor's setup hook with its own and runs this one after it, so a test through this launcher also
  shows that chaining works;
- `VRADIX_TEST_RAY_ACTOR_ENV` (JSON) is added to the actors' environment only, not the launcher's (a fault injected
  into the actor alone).
Ray's cluster is this process's child and goes with it.
"""
from __future__ import annotations

import json
import os
import sys

ACTOR_ENV = "VRADIX_TEST_RAY_ACTOR_ENV"
CPU_SETUP_HOOK = "vradix.testing.harness.ray_cpu.cpu_actor_setup"
#: set in a worker once `cpu_actor_setup` ran (tests read it back to see the chained hook ran in the actor)
CPU_SETUP_MARK = "VRADIX_TEST_RAY_CPU_SETUP_RAN"


def cpu_actor_setup() -> None:
    """Job-level setup hook: `torch.cuda.set_device` is a no-op on a machine without CUDA (test only)."""
    import torch

    if torch.cuda.is_available():
        raise RuntimeError("vradix.testing.harness.ray_cpu is for CPU-only test machines")
    torch.cuda.set_device = lambda device: None
    os.environ[CPU_SETUP_MARK] = "1"


def main(argv) -> None:
    import ray

    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=True,
             runtime_env={"worker_process_setup_hook": CPU_SETUP_HOOK,
                          "env_vars": json.loads(os.environ.get(ACTOR_ENV) or "{}")})
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    load_plugins()
    server_args = prepare_server_args(list(argv) + ["--use-ray"])
    server_args.resolve_once()
    try:
        from sglang.srt.ray.http_server import launch_server

        launch_server(server_args)
    finally:
        ray.shutdown()
        kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":
    main(sys.argv[1:])
