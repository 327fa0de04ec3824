"""One running `CpuServer` per launch configuration, shared by every test that does not need a fresh process.

    pool = ServerPool()
    with pool.lease(model_a, vradix=False) as s:   # started now, or taken from the pool and put back on model_a
        ...
    with pool.lease_many(2, model_a) as (w1, w2):  # two of one configuration, the missing ones started concurrently
        ...
    pool.close()                                   # at the end of the session

A configuration is every `CpuServer` argument that shapes the process (model path, vradix on/off, extra args, env,
pool sizes, interpreter, launcher, ...); deadlines are not part of it. Invariants:
- a lease hands out a server that no one else holds, serving `model_path` under the label `default` with an empty
  cache, not paused: a server a previous lease used is resumed and reset (`ServerClient.reset`: load `model_path`,
  flush the whole cache). Stock SGLang's idle flush makes it answer as a fresh server does; a vradix server's
  counters (epoch, publications, ...) keep counting, so a test on a pooled server reads them at its start and
  asserts differences;
- a server whose lease ended with an exception, that died, or that fails its reset is stopped, never handed out again
  (the next lease starts a fresh one);
- a server between leases is parked: its process group is stopped (SIGSTOP), so an idle SGLang scheduler, which polls
  its sockets without sleeping, takes no CPU; it continues (SIGCONT) when leased again. At most `max_parked` servers
  are parked, and none while the machine has less than `min_available_gib` of memory available: the least recently
  used is stopped instead;
- `close()` stops every server the pool started.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Callable, Dict, Iterator, List, Tuple

import requests

from vradix.testing.harness.server import CpuServer, start_servers

#: `CpuServer` arguments that bound waits and do not change the process a configuration launches
DEADLINE_ARGS = ("startup_timeout", "timeout")
#: memory a starting tiny-model CPU server takes (its three processes import torch and SGLang)
GIB_PER_START = 2.0
#: the label a leased server serves under (a fresh server's)
FRESH_LABEL = "default"


def configuration(model_path: str, kw: dict) -> Tuple:
    """The key of a launch configuration: `model_path` and the `CpuServer` keyword arguments, deadlines left out."""
    def frozen(value):
        if isinstance(value, dict):
            return tuple(sorted((k, frozen(v)) for k, v in value.items()))
        if isinstance(value, (list, tuple)):
            return tuple(frozen(v) for v in value)
        return value
    return (model_path, frozen({k: v for k, v in kw.items() if k not in DEADLINE_ARGS}))


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


def signal_group(server: CpuServer, sig: int) -> bool:
    """Send `sig` to the server's process group; False when the group is gone."""
    try:
        os.killpg(server.proc.pid, sig)
        return True
    except ProcessLookupError:
        return False


class ServerPool:
    """Thread-safe: leases may run concurrently (an oracle computed beside other starts)."""

    def __init__(self, max_parked: int = 4, min_available_gib: float = 4.0,
                 start: Callable[..., CpuServer] = CpuServer):
        self.max_parked = max_parked
        self.min_available_gib = min_available_gib
        self._start = start
        self._lock = threading.Lock()
        #: parked servers, least recently used first: (configuration, model path, server)
        self._parked: List[Tuple[Tuple, str, CpuServer]] = []
        #: servers started by this pool and not yet stopped (parked or leased)
        self._live: List[CpuServer] = []
        self.starts = self.reuses = 0

    # ---- leases -----------------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def lease(self, model_path: str, **kw) -> Iterator[CpuServer]:
        """One server of the configuration `(model_path, kw)`, on `model_path`, fresh to its user (module docstring)."""
        with self.lease_many(1, model_path, **kw) as (server,):
            yield server

    @contextlib.contextmanager
    def lease_many(self, n: int, model_path: str, **kw) -> Iterator[List[CpuServer]]:
        """`n` distinct servers of one configuration; those the pool has not parked start concurrently."""
        key = configuration(model_path, kw)
        servers = self._reuse(key, model_path, n)
        try:
            if len(servers) < n:
                servers += self._start_fresh(n - len(servers), model_path, kw)
        except BaseException:
            self._park_all(key, model_path, servers)
            raise
        try:
            yield servers
        except BaseException:
            self._discard(servers)  # a failed test may have left any state behind
            raise
        self._park_all(key, model_path, servers)

    def close(self) -> None:
        """Stop every server this pool started."""
        with self._lock:
            live, self._live, self._parked = self._live, [], []
        for server in live:
            signal_group(server, signal.SIGCONT)  # a stopped process handles no SIGTERM
            server.stop()

    # ---- inside -----------------------------------------------------------------------------------------------------
    def _reuse(self, key: Tuple, model_path: str, n: int) -> List[CpuServer]:
        """Up to `n` parked servers of `key`, continued and reset; those that fail it are stopped."""
        with self._lock:
            mine = [entry for entry in self._parked if entry[0] == key][:n]
            for entry in mine:
                self._parked.remove(entry)
        ready = []
        for _, _, server in mine:
            if self._revive(server, model_path):
                ready.append(server)
                self.reuses += 1
            else:
                self._discard([server])
        return ready

    def _revive(self, server: CpuServer, model_path: str) -> bool:
        """Continue a parked server and put it back into a fresh server's state; False when it cannot be."""
        if not signal_group(server, signal.SIGCONT) or server.proc.poll() is not None:
            return False
        try:
            server.post("/continue_generation", timeout=60)  # a test may have left it paused
            server.reset(model_path, FRESH_LABEL, deadline_s=120)
            return server.get("/health_generate", timeout=60).status_code == 200
        except (requests.RequestException, OSError):
            return False

    def _start_fresh(self, n: int, model_path: str, kw: dict) -> List[CpuServer]:
        self._make_room(n)
        started = start_servers(*[lambda: self._start(model_path, **kw)] * n)
        with self._lock:
            self._live += started
            self.starts += n
        return started

    def _park_all(self, key: Tuple, model_path: str, servers: List[CpuServer]) -> None:
        for server in servers:
            if server.proc.poll() is not None or not signal_group(server, signal.SIGSTOP):
                self._discard([server])
                continue
            with self._lock:
                self._parked.append((key, model_path, server))
        self._make_room(0)

    def _make_room(self, starting: int) -> None:
        """Stop the least recently parked servers while more than `max_parked` are parked or memory is short (a start
        of `starting` servers is about to need some)."""
        while True:
            with self._lock:
                over = len(self._parked) > self.max_parked
                short = available_gib() < self.min_available_gib + GIB_PER_START * starting
                if not self._parked or not (over or short):
                    return
                _, _, oldest = self._parked.pop(0)
            self._discard([oldest])

    def _discard(self, servers: List[CpuServer]) -> None:
        for server in servers:
            signal_group(server, signal.SIGCONT)
            server.stop()
            with self._lock:
                if server in self._live:
                    self._live.remove(server)

    def summary(self) -> Dict[str, int]:
        """Starts and reuses so far, and the servers parked now."""
        with self._lock:
            return {"starts": self.starts, "reuses": self.reuses, "parked": len(self._parked)}
