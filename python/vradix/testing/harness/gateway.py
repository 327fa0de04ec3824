"""Start and stop a real SGLang model gateway (`smg`, `--enable-rl`) in front of test servers (tests, recipes).

`Gateway(worker_urls)` runs `python -m smg.launch_router --worker-urls ... --enable-rl` on free loopback ports (its
metrics listener too: smg binds 0.0.0.0:29000 by default), waits with a deadline until its RL control plane lists
every worker as serving, and always kills its process group. A port taken between its choice and smg's bind is
chosen again.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from typing import Sequence

import requests

from vradix.client import SERVING_HEALTH
from vradix.testing.harness.pd import ROUTER_BIND_LOST
from vradix.testing.harness.process import LoggedProcess
from vradix.testing.harness.server import free_port


class Gateway(LoggedProcess):
    """Its two ports (HTTP and metrics) are chosen before smg binds them; a start that lost one to another process
    (smg exits with the bind error) is started afresh on new ports, within `startup_timeout`."""

    def __init__(self, worker_urls: Sequence[str], startup_timeout: float = 60.0):
        deadline = time.monotonic() + startup_timeout
        while True:
            self._launch(worker_urls)
            try:
                return self._wait_ready(len(worker_urls), deadline, startup_timeout)
            except GatewayLostPort:
                if time.monotonic() >= deadline:
                    raise

    def _launch(self, worker_urls: Sequence[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="smg-", suffix=".log", delete=False)
        cmd = [sys.executable, "-m", "smg.launch_router", "--host", "127.0.0.1", "--port", str(self.port),
               "--enable-rl", "--policy", "round_robin",
               "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
        if worker_urls:
            cmd += ["--worker-urls", *worker_urls]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def workers(self) -> list:
        return requests.get(self.url + "/v1/rl/workers", timeout=10).json().get("workers") or []

    def _wait_ready(self, n: int, deadline: float, timeout: float) -> None:
        """Until the RL control plane lists `n` serving workers. Raises `GatewayLostPort` when smg exited for a
        taken port."""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if ROUTER_BIND_LOST in self.logs():
                    raise GatewayLostPort(f"smg lost a port:\n{self.logs()[-1000:]}")
                raise RuntimeError(f"smg exited with {self.proc.returncode}:\n{self.logs()[-3000:]}")
            try:
                if sum(w.get("health") in SERVING_HEALTH for w in self.workers()) == n:
                    return
            except (requests.RequestException, ValueError):
                pass
            time.sleep(0.3)
        self.stop()
        raise TimeoutError(f"smg did not list {n} serving worker(s) in {timeout}s:\n{self.logs()[-3000:]}")


class GatewayLostPort(RuntimeError):
    """smg exited because another process held a port it chose (the caller starts it on new ports)."""
