"""Start and stop a real SGLang CPU server on a tiny model (tests, demo, benchmarks).

`CpuServer` launches `python -m sglang.launch_server --device cpu ...` with the flags and environment from the CPU
recipe, on a free loopback port, waits for `/health_generate` with a deadline, and always kills the process group.
Its HTTP calls (`post`, `generate`, `server_info`, `vradix_info`, the publication calls) are `ServerClient`'s.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Optional, Sequence

import requests

from vradix.testing import cpu_aids, gpu_aids
from vradix.testing.cpu_aids import hybrid as hybrid_aids
from vradix.testing.cpu_aids import tp as tp_aid
from vradix.testing.harness.http import ServerClient
from vradix.testing.harness.process import LoggedProcess

#: the flags of every test server, whatever its device
COMMON_FLAGS = ["--grammar-backend", "none", "--skip-tokenizer-init", "--host", "127.0.0.1", "--sleep-on-idle"]
CPU_FLAGS = [
    "--device", "cpu", "--attention-backend", "torch_native", "--sampling-backend", "pytorch",
    "--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled", *COMMON_FLAGS,
]
#: the flags of a server on a CUDA machine without sgl_kernel or FlashInfer (`vradix.testing.gpu_aids`)
GPU_AID_FLAGS = [*gpu_aids.GPU_FLAGS, *COMMON_FLAGS]


#: SGLang's crash diagnostics at a stop (on by default), off in test servers unless the caller's environment sets them
CRASH_DIAGNOSTICS_ENV = ("SGLANG_PYSPY_DUMP_BEFORE_CRASH", "SGLANG_CUDA_COREDUMP_BEFORE_CRASH")


#: what a server logs when a port it binds was taken, followed by the address (asyncio's bind error: uvicorn's HTTP
#: listener, and the P/D bootstrap server, which logs it and keeps the process up without its listener)
BIND_RACE_LOST = "error while attempting to bind on address"
START_ATTEMPTS = 3


def free_port() -> int:
    """A free loopback port below the kernel's ephemeral range.

    The server binds its HTTP port only after model load, seconds later; an ephemeral port (what `bind(0)` returns)
    can be taken in that interval by any outgoing connection on the machine. SGLang picks its own late-bound ports the
    same way (`get_free_port_below_ephemeral`)."""
    from sglang.srt.utils.network import get_free_port_below_ephemeral

    return get_free_port_below_ephemeral()


def with_hicache_cpu_aids(env: dict, extra_args: list) -> list:
    """A HiCache server on the CPU engine needs vradix's CPU aids (`vradix.testing.cpu_aids`): put their plugin on
    the server's PYTHONPATH and select the copy path they provide, unless the caller chose a layout itself."""
    env["PYTHONPATH"] = os.pathsep.join(p for p in (cpu_aids.PLUGIN_PATH, env.get("PYTHONPATH")) if p)
    if "--hicache-io-backend" not in extra_args:
        extra_args = extra_args + cpu_aids.HICACHE_CPU_FLAGS
    return extra_args


def is_hybrid_model(model_path: str) -> bool:
    """Whether the checkpoint is a Mamba2 hybrid the hybrid CPU aids serve (NemotronH, e.g.
    `vradix.testing.models.hybrid`)."""
    try:
        with open(os.path.join(model_path, "config.json")) as f:
            return json.load(f).get("model_type") == "nemotron_h"
    except (OSError, ValueError):
        return False


def with_hybrid_cpu_aids(env: dict, extra_args: list) -> list:
    """A Mamba2 hybrid on the CPU engine needs vradix's hybrid CPU aids (`vradix.testing.cpu_aids.hybrid`): put their
    plugin on the server's PYTHONPATH and add the flags the CPU engine allows for a hybrid, unless the caller chose a
    flag itself."""
    env["PYTHONPATH"] = os.pathsep.join(p for p in (hybrid_aids.PLUGIN_PATH, env.get("PYTHONPATH")) if p)
    for flag, *value in hybrid_aids.HYBRID_CPU_FLAGS:
        if flag not in extra_args:
            extra_args = extra_args + [flag, *value]
    return extra_args


def with_tp_cpu_aid(env: dict, extra_args: list, tp_size: int) -> list:
    """A server with `tp_size` > 1 ranks on the CPU engine needs vradix's TP CPU aid (`vradix.testing.cpu_aids.tp`):
    put its plugin on the server's PYTHONPATH, bind rank i to core i unless the environment binds them already, and
    pass `--tp-size`."""
    env["PYTHONPATH"] = os.pathsep.join(p for p in (tp_aid.PLUGIN_PATH, env.get("PYTHONPATH")) if p)
    for name, value in tp_aid.tp_cpu_env(tp_size).items():
        env.setdefault(name, value)
    return extra_args + ["--tp-size", str(tp_size)]


class ServerDied(RuntimeError):
    pass


#: memory a starting tiny-model CPU server takes (its three processes import torch and SGLang)
GIB_PER_START = 2.0
#: memory a launch leaves free beside its own start; and how long it waits for that much at most
START_HEADROOM_GIB = 2.0
START_MEMORY_WAIT_S = 120.0


def available_gib() -> float:
    """MemAvailable of this machine in GiB (inf where /proc/meminfo is not there)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / (1 << 20)
    except OSError:
        pass
    return float("inf")


def wait_for_memory(gib: float, limit: float = START_MEMORY_WAIT_S, poll: float = 0.5) -> float:
    """Block until the machine has `gib` GiB available, or `limit` seconds passed (then go on: a start that may be
    short of memory beats a suite that waits forever). Returns the seconds waited. With two test workers, a start
    waits for the other worker's servers to stop rather than push the machine into its OOM killer."""
    t0 = time.monotonic()
    while available_gib() < gib and time.monotonic() - t0 < limit:
        time.sleep(poll)
    return time.monotonic() - t0


class CpuServer(LoggedProcess, ServerClient):
    stop_grace = 20.0  # a scheduler mid-batch on a loaded CPU takes a while to finish it
    #: server processes launched by this test process so far (start-up dominates a CPU suite's time)
    launches = 0
    #: what reads a stopped server's log for a failure a test must see (each returns one line, or None): test/conftest.py
    #: adds the escape watch's reader (`vradix_census.watch.failure_in`) when the suite runs that test mode
    log_checks: List[Callable[[str], Optional[str]]] = []
    #: what the log checks found in the logs of the servers stopped so far, one line each: test/conftest.py fails the
    #: test during which one is added
    log_failures: List[str] = []

    def __init__(self, model_path: str, *, vradix: bool = True, extra_args: Sequence[str] = (),
                 env: Optional[dict] = None, max_total_tokens: int = 8192, chunked_prefill_size: int = 1024,
                 startup_timeout: float = 600.0, skip_tokenizer_init: bool = True, timeout: float = 300.0,
                 python: Optional[str] = None, launcher: str = "sglang.launch_server",
                 hybrid: Optional[bool] = None, launch_ports: Optional[Dict[str, Callable[[], int]]] = None,
                 tp_size: int = 1, device: str = "cpu"):
        """`python`: the interpreter that runs the server (default: this one), e.g. another environment's.
        `launcher`: the module run with `python -m` (`vradix.testing.harness.ray_cpu` for SGLang's Ray mode on CPU).
        `hybrid`: load the hybrid (Mamba2) CPU aids and their flags; default: when the model is a hybrid.
        `launch_ports`: {flag: chooser} for further ports the server binds (the P/D bootstrap port): each launch
        passes `flag chooser()`, and a launch that lost one of them starts afresh on new ones, as for the HTTP port
        (`self.launch_ports` holds the values of the launch that came up).
        `tp_size`: tensor-parallel ranks (> 1 loads the TP CPU aid, `with_tp_cpu_aid`).
        `device`: "cpu" (SGLang's CPU engine, the CPU aids) or "cuda" (the GPU aid's route on a machine without
        sgl_kernel or FlashInfer, `vradix.testing.gpu_aids`: its flags, environment and refusal plugin)."""
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device is 'cpu' or 'cuda', not {device!r}")
        super().__init__("http://127.0.0.1", timeout)  # the port is chosen at launch
        self.python = python or sys.executable
        self.launcher = launcher
        e = dict(os.environ)
        e.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
        if device == "cpu":
            e["SGLANG_USE_CPU_ENGINE"] = "1"
        else:
            e.pop("SGLANG_USE_CPU_ENGINE", None)
        # SGLang's launcher answers every SIGTERM as a crash: it sleeps 5 s "to let GPU activity settle", then dumps
        # py-spy stacks. A CPU test server has no GPU activity, and its stop would wait for both.
        for name in CRASH_DIAGNOSTICS_ENV:
            e.setdefault(name, "0")
        e.pop("VRADIX_DISABLE", None)
        e.pop("TRITON_INTERPRET", None)  # a test process's Triton interpreter is not a server setting
        if not vradix:
            e["VRADIX_DISABLE"] = "1"
        e.update(env or {})
        if device == "cuda":
            e = gpu_aids.server_env(e)
        extra_args = list(extra_args)
        if "--enable-hierarchical-cache" in extra_args:
            extra_args = with_hicache_cpu_aids(e, extra_args)
        if hybrid if hybrid is not None else is_hybrid_model(model_path):
            extra_args = with_hybrid_cpu_aids(e, extra_args)
        if tp_size > 1:
            extra_args = with_tp_cpu_aid(e, extra_args, tp_size)
        args = ["--max-total-tokens", str(max_total_tokens), "--chunked-prefill-size", str(chunked_prefill_size),
                "--context-length", "4096", "--max-running-requests", "32",
                *(f for f in (CPU_FLAGS if device == "cpu" else GPU_AID_FLAGS)
                  if skip_tokenizer_init or f != "--skip-tokenizer-init"), *extra_args]
        deadline = time.monotonic() + startup_timeout  # one start deadline, whatever the attempts
        for attempt in range(1, START_ATTEMPTS + 1):
            self._launch(model_path, args, e, launch_ports or {})
            if self._wait_ready(deadline, startup_timeout):
                return
            self.stop()  # another process took a port between our probe and the server's bind: start afresh
        raise ServerDied(f"server lost a port it chose at each of {START_ATTEMPTS} launches:\n{self.tail()}")

    def _launch(self, model_path: str, args: list, env: dict, launch_ports: Dict[str, Callable[[], int]]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.launch_ports = {flag: choose() for flag, choose in launch_ports.items()}
        self.log = tempfile.NamedTemporaryFile("w+", prefix="sglang-", suffix=".log", delete=False)
        cmd = [self.python, "-m", self.launcher, "--model-path", model_path, "--port", str(self.port), *args,
               *(str(x) for item in self.launch_ports.items() for x in item)]
        wait_for_memory(GIB_PER_START + START_HEADROOM_GIB)
        CpuServer.launches += 1
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def _wait_ready(self, deadline: float, timeout: float) -> bool:
        """True once `/health_generate` answers; False when the server lost a port it binds to another process (the
        caller retries on new ports): the HTTP port (it never answers), or another listener such as the P/D bootstrap
        server (it answers, without that listener). Raises when the server dies or misses the deadline."""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerDied(f"server exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                healthy = requests.get(self.url + "/health_generate", timeout=5).status_code == 200
            except requests.RequestException:
                healthy = False
            if self.lost_a_port():
                return False
            if healthy:
                return True
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"server not ready in {timeout}s:\n{self.tail()}")

    def stop(self) -> None:
        """Stop the server (`LoggedProcess.stop`), then add what the log checks (`CpuServer.log_checks`) find in its
        log to `CpuServer.log_failures` (once per server)."""
        super().stop()
        if getattr(self, "log_read", False):
            return
        self.log_read = True
        logs = self.logs()
        CpuServer.log_failures.extend(f for f in (check(logs) for check in CpuServer.log_checks) if f is not None)

    def lost_a_port(self) -> bool:
        """Whether the log says a port this launch chose was held by another process when the server bound it."""
        logs = self.logs()
        return any(f"{BIND_RACE_LOST} ('127.0.0.1', {port})" in logs
                   for port in (self.port, *self.launch_ports.values()))


def start_servers(*factories: Callable[[], CpuServer]) -> List[CpuServer]:
    """Run each factory (a server start) concurrently, since start-up dominates on CPU. All start, or none is left
    running: when one fails, the others are stopped and its error is raised."""
    with concurrent.futures.ThreadPoolExecutor(len(factories)) as pool:
        futures = [pool.submit(f) for f in factories]
        concurrent.futures.wait(futures)
    started = [f.result() for f in futures if f.exception() is None]
    errors = [e for e in (f.exception() for f in futures) if e is not None]
    if errors:
        for s in started:
            s.stop()
        raise errors[0]
    return started


@contextlib.contextmanager
def servers(*factories: Callable[[], CpuServer]) -> Iterator[List[CpuServer]]:
    """`start_servers` as a context: every server is stopped on exit."""
    started = start_servers(*factories)
    try:
        yield started
    finally:
        for s in started:
            s.stop()


def stock_server(model_path: str, pool=None, **server_kw) -> ContextManager[CpuServer]:
    """A stock server (VRADIX_DISABLE=1) on `model_path` as a context: leased from `pool` (a
    `vradix.testing.harness.pool.ServerPool`, which hands it out reset, as a fresh one answers) or started afresh."""
    return pool.lease(model_path, vradix=False, **server_kw) if pool is not None else \
        CpuServer(model_path, vradix=False, **server_kw)


def fresh_stock_outputs(weights: Dict[str, str], compute: Callable[[CpuServer], Any], pool=None,
                        **server_kw) -> Dict[str, Any]:
    """`{name: compute(server)}` as a fresh stock server on each checkpoint of `weights` ({name: path}, in order)
    would answer: the oracle of the E2E tests. One process serves them all (start-up dominates on CPU), from `pool`
    when given (`stock_server`): it serves the first checkpoint, and loads each next one with an idle flush, which
    resets stock SGLang's whole cache."""
    names = list(weights)
    out = {}
    with stock_server(weights[names[0]], pool, **server_kw) as s:
        for name in names:
            if name != names[0]:
                s.reset(weights[name], name)  # succeeds only once the cache is flushed
            out[name] = compute(s)
    return out
