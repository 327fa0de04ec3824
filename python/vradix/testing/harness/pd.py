"""A real prefill/decode (P/D) pair on the CPU engine, fronted by the real P/D router: tests and demo only.

    with PdPair(model_path, vradix=True) as pd:
        pd.generate(input_ids, 6)            # through the router (smg or sglang-router, P/D mode)
        pd.prefill / pd.decode               # the two `CpuServer`s, for direct calls (publication, server info)
        pd.publish_in_place(model_b, "B")    # pause both roles in place, update both, continue both

What it starts (each process bounded by a deadline and always killed, process group and all):
- prefill: `CpuServer` with `--disaggregation-mode prefill --disaggregation-transfer-backend mooncake_tcp
  --disaggregation-bootstrap-port B --disable-overlap-schedule` (the early-send path records a CUDA event);
- decode: `CpuServer` with `--disaggregation-mode decode --disaggregation-transfer-backend mooncake_tcp` and, unless
  `decode_radix=False`, `--disaggregation-decode-enable-radix-cache`;
- both load the mooncake CPU aid (`vradix.testing.cpu_aids.mooncake`) as a plugin; the KV really moves, over TCP;
- for a Mamba2 hybrid (NemotronH) each role's `CpuServer` also loads the hybrid CPU aids and their flags; the
  recurrent state moves with the KV (mooncake's `state` buffers);
- the router: `python -m smg.launch_router` (or `sglang_router.launch_router`) `--pd-disaggregation --prefill URL B
  --decode URL`, every listener (its metrics one included) bound to 127.0.0.1.

Every port (the servers' HTTP ports, prefill's bootstrap port, the router's HTTP and metrics ports) is chosen before
its process binds it, so another process can take it first: that part is then started afresh on new ports, within its
start deadline (`CpuServer`'s `launch_ports`, `Router`).

The `fake` transfer backend moves no KV and is never used. What the pair needs beyond the project's venv is named by
`missing_requirements()` (tests skip with that reason): the PyPI wheel `mooncake-transfer-engine-non-cuda`, the Debian
library `libibverbs1`, and a router (`smg` or `sglang-router`).

Router facts the tests rely on (SGLang reference notes, router section): it sends the same `/generate` body to both
roles with `bootstrap_host`, `bootstrap_port` and a random `bootstrap_room` added; `extra_key` and `rid` reach both;
custom headers do not. Control calls (`/update_weights_from_disk`, pause/continue) go to each role directly.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from typing import List, Optional, Sequence

import requests

from vradix.testing.cpu_aids import mooncake as mooncake_aid
from vradix.testing.harness.http import ServerClient
from vradix.testing.harness.process import LoggedProcess
from vradix.testing.harness.server import CpuServer, free_port, start_servers

TRANSFER_FLAGS = ["--disaggregation-transfer-backend", "mooncake_tcp"]
BOOTSTRAP_FLAG = "--disaggregation-bootstrap-port"
#: the prompt of the P/D E2E tests (600 tokens: long enough that prefill sends KV over several pages)
PROMPT = [(i * 7) % 480 + 20 for i in range(600)]
#: routers that speak SGLang's P/D protocol, in order of preference: (module, launch module)
ROUTERS = (("smg", "smg.launch_router"), ("sglang_router", "sglang_router.launch_router"))


def missing_requirements() -> List[str]:
    """What this machine lacks to run a real P/D pair (empty when nothing is missing), each named by its package."""
    missing = []
    if importlib.util.find_spec("mooncake") is None:
        missing.append("PyPI mooncake-transfer-engine-non-cuda (import mooncake)")
    try:
        ctypes.CDLL("libibverbs.so.1")
    except OSError:
        missing.append("Debian libibverbs1 (libibverbs.so.1)")
    if router_module() is None:
        missing.append("PyPI smg (or sglang-router)")
    return missing


def router_module() -> Optional[str]:
    """The launch module of the first installed P/D router, or None."""
    for package, launcher in ROUTERS:
        if importlib.util.find_spec(package) is not None:
            return launcher
    return None


def free_bootstrap_port() -> int:
    """A port for the prefill role's bootstrap server (`free_port`; its own name so a test can hand out a taken one)."""
    return free_port()


def with_pd_cpu_aid(env: dict) -> dict:
    """`env` (the overrides a `CpuServer` applies over this process's environment) with the mooncake CPU aid's
    plugin folder first on PYTHONPATH."""
    path = env.get("PYTHONPATH", os.environ.get("PYTHONPATH"))
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in (mooncake_aid.PLUGIN_PATH, path) if p)}


#: what the router logs, and then exits, when its HTTP or metrics listener's port was taken
ROUTER_BIND_LOST = "Address already in use"


class RouterLostPort(RuntimeError):
    """The router exited because another process held a port it chose (the caller starts it on new ports)."""


class Router(LoggedProcess, ServerClient):
    """The real P/D router in front of one prefill and one decode server, on loopback only.

    Its two ports (HTTP and metrics) are chosen before it binds them; a start that lost one to another process is
    started afresh on new ports, within `startup_timeout`."""

    def __init__(self, prefill_url: str, bootstrap_port: int, decode_url: str, *, startup_timeout: float = 180.0,
                 timeout: float = 120.0):
        launcher = router_module()
        if launcher is None:
            raise RuntimeError("no P/D router installed (pip install smg)")
        super().__init__("http://127.0.0.1", timeout)  # the port is chosen at launch
        deadline = time.monotonic() + startup_timeout
        while True:
            self._launch(launcher, prefill_url, bootstrap_port, decode_url)
            try:
                return self._wait_ready(deadline, startup_timeout)
            except RouterLostPort:
                if time.monotonic() >= deadline:
                    raise

    def _launch(self, launcher: str, prefill_url: str, bootstrap_port: int, decode_url: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="router-", suffix=".log", delete=False)
        cmd = [sys.executable, "-m", launcher, "--host", "127.0.0.1", "--port", str(self.port),
               "--pd-disaggregation", "--prefill", prefill_url, str(bootstrap_port), "--decode", decode_url,
               "--policy", "round_robin",
               # the metrics listener binds 0.0.0.0:29000 by default: keep it on loopback, on a free port
               "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def _wait_ready(self, deadline: float, timeout: float) -> None:
        """Until the router routes: smg's `/readiness` answers 200 once both workers are registered and healthy (its
        `/health` is up before that); a router without `/readiness` is probed with `/health_generate`. Raises
        `RouterLostPort` when it exited for a taken port."""
        probe = "/readiness"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if ROUTER_BIND_LOST in self.logs():
                    raise RouterLostPort(f"router lost a port:\n{self.tail(5)}")
                raise RuntimeError(f"router exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                status = requests.get(self.url + probe, timeout=30).status_code
                if status == 200:
                    return
                if status == 404:
                    probe = "/health_generate"
            except requests.RequestException:
                pass
            time.sleep(0.3)
        self.stop()
        raise TimeoutError(f"router not ready in {timeout}s:\n{self.tail()}")


class RoutedPair(ServerClient):
    """A prefill server, a decode server and the router in front of them (`self.prefill`, `self.decode`,
    `self.router`, any of them None while starting): stopped together, router first."""

    prefill: Optional[CpuServer] = None
    decode: Optional[CpuServer] = None
    router: Optional[Router] = None

    def roles(self) -> tuple[CpuServer, CpuServer]:
        """(prefill, decode) of a started pair."""
        assert self.prefill is not None and self.decode is not None, "the pair has not started"
        return self.prefill, self.decode

    def stop(self) -> None:
        for part in (self.router, self.decode, self.prefill):
            if part is not None:
                part.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class PdPair(RoutedPair):
    """A prefill and a decode `CpuServer` on `model_path` with real KV transfer, and the router in front of them.

    `ServerClient` calls on the pair itself (`generate`, `post`) go through the router. `prefill_tp`/`decode_tp`:
    each role's tensor-parallel ranks (`CpuServer`'s `tp_size`). Both servers start concurrently; if either fails,
    everything already started is stopped before the error propagates."""

    def __init__(self, model_path: str, *, vradix: bool = True, decode_radix: bool = True,
                 prefill_args: Sequence[str] = (), decode_args: Sequence[str] = (), env: Optional[dict] = None,
                 startup_timeout: float = 600.0, timeout: float = 300.0, prefill_tp: int = 1, decode_tp: int = 1):
        self.prefill: Optional[CpuServer] = None
        self.decode: Optional[CpuServer] = None
        self.router: Optional[Router] = None
        server_env = with_pd_cpu_aid(dict(env or {}))
        # no identity flag: vradix's default (`auto`) proves each role's identity from its weights, as a stock P/D
        # launch with vradix installed does
        prefill_flags = ["--disaggregation-mode", "prefill", *TRANSFER_FLAGS, "--disable-overlap-schedule",
                         *prefill_args]
        decode_flags = ["--disaggregation-mode", "decode", *TRANSFER_FLAGS,
                        *(["--disaggregation-decode-enable-radix-cache"] if decode_radix else []), *decode_args]

        def start(flags, tp_size, **ports):
            return CpuServer(model_path, vradix=vradix, extra_args=flags, env=server_env, tp_size=tp_size,
                             startup_timeout=startup_timeout, timeout=timeout, **ports)

        # prefill binds the bootstrap port after start-up: chosen per launch, so a lost one is chosen again
        bootstrap = {BOOTSTRAP_FLAG: free_bootstrap_port}
        started = start_servers(lambda: start(prefill_flags, prefill_tp, launch_ports=bootstrap),
                                lambda: start(decode_flags, decode_tp))
        self.prefill, self.decode = started
        self.bootstrap_port = self.prefill.launch_ports[BOOTSTRAP_FLAG]
        try:
            self.router = Router(self.prefill.url, self.bootstrap_port, self.decode.url, timeout=timeout)
        except BaseException:
            self.stop()
            raise
        super().__init__(self.router.url, timeout)

    def bootstrap(self) -> dict:
        """The bootstrap fields the router adds to a request, for a request sent to both roles directly."""
        import random
        return {"bootstrap_host": "127.0.0.1", "bootstrap_port": self.bootstrap_port,
                "bootstrap_room": random.getrandbits(63)}

    def publish_in_place(self, model_path: str, version: str) -> None:
        """The RL publication on a P/D pair: pause both roles in place, update both (no flush), continue both."""
        self.pause("in_place")
        self.update_and_resume(model_path, version)

    def pause(self, mode: str = "in_place") -> None:
        """Pause both roles directly, prefill first (the first half of `publish_in_place`; the router forwards no
        control call)."""
        for server in self.roles():
            server.pause(mode)

    def resume(self) -> None:
        for server in self.roles():
            server.resume()

    def update_and_resume(self, model_path: str, version: str) -> None:
        """The rest of `publish_in_place` on a paused pair: update both roles (no flush), then continue both."""
        for server in self.roles():
            server.update_weights(model_path, version)
        self.resume()
