"""The publisher: a publication every K completed requests and/or every T seconds, and the gate that holds new
requests while one is due."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence

from vradix.testing.harness.http import ServerClient

from .modes import Mode


@dataclass
class Publication:
    index: int
    version: str
    trigger: str
    in_flight: int
    pause_s: float = 0.0      # pause sent -> continue returned
    update_s: float = 0.0
    flush_s: float = 0.0
    #: client wall-clock time between "pause returned" and "continue sent": the scheduler starts no forward in
    #: between, so a forward that started before it ran under the old weights and one after it under the new
    boundary: float = 0.0


class Schedule:
    """Gate + publisher. A publication is due every K completions (never after the last one) or every T seconds.

    Invariant: a request submitted after a publication became due is submitted after its `continue_generation`
    returned, so every mode sees the same split of requests into 'in flight across publication p' and 'admitted
    after it' up to the requests already in flight.
    """

    def __init__(self, server: ServerClient, mode: Mode, weights: Sequence[str], total: int, every_k: int,
                 every_s: float, version_prefix: str):
        self.server, self.mode, self.weights = server, mode, list(weights)
        self.total, self.every_k, self.every_s = total, every_k, every_s
        self.version_prefix = version_prefix
        self.cv = threading.Condition()
        self.completed = 0
        self.in_flight = 0
        self.due: Optional[str] = None
        #: K-boundaries reached while a publication was already due or running: each still owes one publication
        self.overdue: List[str] = []
        self.finished = False
        self.error: Optional[BaseException] = None
        self.publications: List[Publication] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def version(self, index: int) -> str:
        return f"{self.version_prefix}-v{index}"

    def start(self):
        self._last = time.monotonic()
        self._thread.start()
        return self

    # called by rollout workers
    def before_submit(self) -> None:
        with self.cv:
            while self.due is not None and self.error is None:
                self.cv.wait()
            if self.error is not None:
                raise RuntimeError("publication failed") from self.error
            self.in_flight += 1

    def after_complete(self) -> None:
        with self.cv:
            self.in_flight -= 1
            self.completed += 1
            if self.every_k and self.completed % self.every_k == 0 and self.completed < self.total:
                reason = f"{self.completed} completed"
                if self.due is None:
                    self.due = reason
                else:
                    self.overdue.append(reason)
            self.cv.notify_all()

    def stop(self) -> None:
        with self.cv:
            self.finished = True
            self.cv.notify_all()
        self._thread.join(timeout=600)
        if self.error is not None:
            raise RuntimeError("publication failed") from self.error

    # the publisher thread
    def _run(self) -> None:
        while True:
            with self.cv:
                while self.due is None and not self.finished:
                    timeout = None
                    if self.every_s:
                        timeout = max(0.0, self._last + self.every_s - time.monotonic())
                        if timeout == 0.0:
                            self.due = f"{self.every_s}s elapsed"
                            break
                    self.cv.wait(timeout)
                if self.due is None:
                    return
                pub = Publication(len(self.publications) + 1, self.version(len(self.publications) + 1),
                                  self.due, self.in_flight)
            try:
                self._publish(pub)
            except BaseException as e:  # surfaced to the workers and to stop()
                with self.cv:
                    self.error = e
                    self.cv.notify_all()
                return
            with self.cv:
                self.publications.append(pub)
                self.due = self.overdue.pop(0) if self.overdue else None
                self._last = time.monotonic()
                self.cv.notify_all()

    def _publish(self, pub: Publication) -> None:
        s, path = self.server, self.weights[pub.index % len(self.weights)]
        t0 = time.perf_counter()
        s.pause(self.mode.pause_mode)
        t1 = time.perf_counter()
        s.update_weights(path, pub.version, flush=False)
        t2 = time.perf_counter()
        if self.mode.flush:
            s.flush_cache()  # must succeed: a refused flush aborts the run rather than being counted
        t3 = time.perf_counter()
        pub.boundary = time.time() - (t3 - t1) / 2
        s.resume()
        t4 = time.perf_counter()
        pub.update_s, pub.flush_s, pub.pause_s = t2 - t1, t3 - t2, t4 - t0
