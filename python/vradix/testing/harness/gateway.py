"""Start and stop a real SGLang model gateway (`smg`, `--enable-rl`) in front of test servers (tests, recipes).

`Gateway(worker_urls)` runs `python -m smg.launch_router --worker-urls ... --enable-rl` on free loopback ports (its
metrics listener too: smg binds 0.0.0.0:29000 by default), waits with a deadline until its RL control plane lists
every worker as serving, and always kills its process group.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from typing import Sequence

import requests

from vradix.client import SERVING_HEALTH
from vradix.testing.harness.process import LoggedProcess
from vradix.testing.harness.server import free_port


class Gateway(LoggedProcess):
    def __init__(self, worker_urls: Sequence[str], startup_timeout: float = 60.0):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="smg-", suffix=".log", delete=False)
        cmd = [sys.executable, "-m", "smg.launch_router", "--host", "127.0.0.1", "--port", str(self.port),
               "--enable-rl", "--policy", "round_robin",
               "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
        if worker_urls:
            cmd += ["--worker-urls", *worker_urls]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_ready(len(worker_urls), startup_timeout)

    def workers(self) -> list:
        return requests.get(self.url + "/v1/rl/workers", timeout=10).json().get("workers") or []

    def _wait_ready(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"smg exited with {self.proc.returncode}:\n{self.logs()[-3000:]}")
            try:
                if sum(w.get("health") in SERVING_HEALTH for w in self.workers()) == n:
                    return
            except (requests.RequestException, ValueError):
                pass
            time.sleep(0.3)
        self.stop()
        raise TimeoutError(f"smg did not list {n} serving worker(s) in {timeout}s:\n{self.logs()[-3000:]}")
