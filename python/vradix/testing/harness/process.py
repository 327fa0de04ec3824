"""A test process (server, router, gateway) started in its own session, its output in a log file.

Invariant: `stop()` ends the whole process group (SGLang servers fork a scheduler and a detokenizer, smg spawns
workers), SIGTERM first and SIGKILL after `stop_grace` seconds, and is safe to call twice.
"""
from __future__ import annotations

import os
import signal
import subprocess
from typing import IO


class LoggedProcess:
    """Mixin: the subclass sets `self.proc` (a `Popen` with `start_new_session=True`) and `self.log` (its log file)."""

    stop_grace = 10.0
    proc: subprocess.Popen
    log: IO[str]

    def tail(self, n: int = 60) -> str:
        self.log.flush()
        with open(self.log.name) as f:
            return "".join(f.readlines()[-n:])

    def logs(self) -> str:
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=self.stop_grace)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


#: the process title SGLang's scheduler sets on itself (`sglang::scheduler`, a suffix under TP/DP)
SCHEDULER_TITLE = "sglang::scheduler"


def scheduler_processes(root):
    """The scheduler processes among the descendants of `root` (a `psutil.Process`, e.g. a server's launcher): those
    whose title (command line) or name starts with `SCHEDULER_TITLE`. The kernel truncates a name to 15 characters,
    so the name is compared on that prefix. Processes that exit while being read are skipped."""
    import psutil

    found = []
    for child in root.children(recursive=True):
        try:
            title = " ".join(child.cmdline())
            name = child.name()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if title.startswith(SCHEDULER_TITLE) or (len(name) >= 15 and SCHEDULER_TITLE.startswith(name[:15])):
            found.append(child)
    return found


def cpu_seconds(proc) -> float:
    """User plus system CPU time `proc` (a `psutil.Process`) has used so far, all its threads together (children
    excluded)."""
    t = proc.cpu_times()
    return t.user + t.system
