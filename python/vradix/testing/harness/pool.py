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
  its sockets without sleeping, takes no CPU; it continues (SIGCONT) when leased again. At most `max_parked` used
  servers are parked, and none while the machine has less than `min_available_gib` of memory available: the least
  recently parked is stopped instead;
- `prestart(...)` starts the servers of several configurations concurrently and parks them unused; a lease takes an
  unused server first, as it started (no reset); `lease(..., once=True)` takes only an unused one and stops it at
  the end (a configuration one test alone uses);
- `close()` stops every server the pool started.

`stopped_while_unused` applies the same parking to servers a module-scoped fixture holds outside the pool.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import os
import signal
import threading
from typing import Callable, Dict, Iterator, List, Tuple

import requests

from vradix.testing.harness.server import GIB_PER_START, CpuServer, available_gib, start_servers

#: `CpuServer` arguments that bound waits and do not change the process a configuration launches
DEADLINE_ARGS = ("startup_timeout", "timeout")
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


def signal_group(server: CpuServer, sig: int) -> bool:
    """Send `sig` to the server's process group; False when the group is gone."""
    try:
        os.killpg(server.proc.pid, sig)
        return True
    except ProcessLookupError:
        return False


def processes_of(*servers) -> List:
    """The `LoggedProcess`es behind servers: a `CpuServer` itself, the router and both roles of a P/D pair."""
    out = []
    for server in servers:
        if hasattr(server, "proc"):
            out.append(server)
        else:
            out += [part for part in (server.router, server.decode, server.prefill) if part is not None]
    return out


#: {fixture name: processes} of the module-scoped servers that a test not requesting the fixture finds stopped
HELD: Dict[str, List] = {}


@contextlib.contextmanager
def stopped_while_unused(request, *servers, fixture: str = ""):
    """In a module-scoped pytest fixture (`request`) that holds `servers`: every test that does not request the
    fixture runs with their process groups stopped (SIGSTOP; conftest calls `run_held_servers_for` before each
    test), so an idle SGLang scheduler, which polls its sockets without sleeping, takes no core from the servers under
    test; a test that requests it finds them continued. `fixture`: the name of the fixture whose tests run them
    (default: the one holding them), for servers that start together in one fixture and are handed out by several.
    Exit this before stopping the servers (a stopped process acts on no SIGTERM until continued)."""
    name = fixture or request.fixturename
    HELD[name] = processes_of(*servers)
    try:
        yield
    finally:
        for process in HELD.pop(name):
            signal_group(process, signal.SIGCONT)


def run_held_servers_for(fixturenames) -> None:
    """Continue the held servers of the fixtures in `fixturenames`, stop every other held server."""
    for name, processes in HELD.items():
        sig = signal.SIGCONT if name in fixturenames else signal.SIGSTOP
        for process in processes:
            signal_group(process, sig)


@dataclasses.dataclass
class Parked:
    key: Tuple
    model_path: str
    server: CpuServer
    #: whether a lease used it since it started (a pre-started server is handed out as it started, without a reset)
    used: bool


class ServerPool:
    """Thread-safe: leases may run concurrently (an oracle computed beside other starts)."""

    def __init__(self, max_parked: int = 4, min_available_gib: float = 4.0,
                 start: Callable[..., CpuServer] = CpuServer):
        self.max_parked = max_parked
        self.min_available_gib = min_available_gib
        self._start = start
        self._lock = threading.Lock()
        #: parked servers, least recently parked first
        self._parked: List[Parked] = []
        #: servers started by this pool and not yet stopped (parked or leased)
        self._live: List[CpuServer] = []
        self.starts = self.reuses = 0

    # ---- leases -----------------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def lease(self, model_path: str, *, once: bool = False, **kw) -> Iterator[CpuServer]:
        """One server of the configuration `(model_path, kw)`, on `model_path`, fresh to its user (module docstring).
        `once`: a server no lease used before (pre-started or started now), stopped when the lease ends: for a
        configuration one test alone uses."""
        with self.lease_many(1, model_path, once=once, **kw) as (server,):
            yield server

    @contextlib.contextmanager
    def lease_many(self, n: int, model_path: str, *, once: bool = False, **kw) -> Iterator[List[CpuServer]]:
        """`n` distinct servers of one configuration; those the pool has not parked start concurrently."""
        key = configuration(model_path, kw)
        servers = self._reuse(key, model_path, n, unused_only=once)
        try:
            if len(servers) < n:
                servers += self._start_fresh([(model_path, kw)] * (n - len(servers)))
        except BaseException:
            self._park_all(key, model_path, servers, used=True)
            raise
        try:
            yield servers
        except BaseException:
            self._discard(servers)  # a failed test may have left any state behind
            raise
        if once:
            self._discard(servers)
        else:
            self._park_all(key, model_path, servers, used=True)

    def prestart(self, *configurations: Tuple[str, dict], at_once: int = 3) -> None:
        """Start a server of each `(model_path, kw)` now, `at_once` at a time, and park it unused: the later tests of a
        module that each need their own configuration then find theirs started (start-up dominates on CPU, and two
        starts overlap well on two cores). All start, or the error of the first that failed is raised."""
        for i in range(0, len(configurations), at_once):
            wave = list(configurations[i:i + at_once])
            for (model_path, kw), server in zip(wave, self._start_fresh(wave)):
                self._park_all(configuration(model_path, kw), model_path, [server], used=False)

    def close(self) -> None:
        """Stop every server this pool started, all at once (each stop may wait out a grace period)."""
        with self._lock:
            live, self._live, self._parked = self._live, [], []
        for server in live:
            signal_group(server, signal.SIGCONT)  # a stopped process acts on no SIGTERM until continued
        if live:
            with concurrent.futures.ThreadPoolExecutor(len(live)) as pool:
                list(pool.map(lambda server: server.stop(), live))

    def summary(self) -> Dict[str, int]:
        """Starts and reuses so far, and the servers parked now."""
        with self._lock:
            return {"starts": self.starts, "reuses": self.reuses, "parked": len(self._parked)}

    # ---- inside -----------------------------------------------------------------------------------------------------
    def _reuse(self, key: Tuple, model_path: str, n: int, unused_only: bool) -> List[CpuServer]:
        """Up to `n` parked servers of `key` (unused ones first), continued and, once used, reset; those that fail it
        are stopped."""
        with self._lock:
            mine = sorted((p for p in self._parked if p.key == key and not (unused_only and p.used)),
                          key=lambda p: p.used)[:n]
            for p in mine:
                self._parked.remove(p)
        ready = []
        for p in mine:
            if self._revive(p, model_path):
                ready.append(p.server)
                self.reuses += p.used
            else:
                self._discard([p.server])
        return ready

    def _revive(self, p: Parked, model_path: str) -> bool:
        """Continue a parked server and, if a lease used it, put it back into a fresh server's state; False when it
        cannot be."""
        server = p.server
        if not signal_group(server, signal.SIGCONT) or server.proc.poll() is not None:
            return False
        try:
            if p.used:
                server.post("/continue_generation", timeout=60)  # a test may have left it paused
                server.reset(model_path, FRESH_LABEL, deadline_s=120)
            return server.get("/health_generate", timeout=60).status_code == 200
        except (requests.RequestException, OSError):
            return False

    def _start_fresh(self, configurations: List[Tuple[str, dict]]) -> List[CpuServer]:
        self._make_room(len(configurations))
        started = start_servers(*[functools.partial(self._start, model_path, **kw)
                                  for model_path, kw in configurations])
        with self._lock:
            self._live += started
            self.starts += len(started)
        return started

    def _park_all(self, key: Tuple, model_path: str, servers: List[CpuServer], used: bool) -> None:
        for server in servers:
            if server.proc.poll() is not None or not signal_group(server, signal.SIGSTOP):
                self._discard([server])
                continue
            with self._lock:
                self._parked.append(Parked(key, model_path, server, used))
        self._make_room(0)

    def _make_room(self, starting: int) -> None:
        """Stop parked servers, the least recently parked used ones first, while more than `max_parked` used ones are
        parked or memory is short (a start of `starting` servers is about to need some). A pre-started server still
        waits for its test, so it goes only for memory, last."""
        while True:
            with self._lock:
                used = [p for p in self._parked if p.used]
                short = available_gib() < self.min_available_gib + GIB_PER_START * starting
                if len(used) > self.max_parked:
                    victim = used[0]
                elif short and self._parked:
                    victim = (used or self._parked)[0]
                else:
                    return
                self._parked.remove(victim)
            self._discard([victim.server])

    def _discard(self, servers: List[CpuServer]) -> None:
        for server in servers:
            signal_group(server, signal.SIGCONT)
            server.stop()
            with self._lock:
                if server in self._live:
                    self._live.remove(server)
