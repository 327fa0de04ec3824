"""Counts the host-device synchronisations of a serving process, split by whose code asked for them (the GPU serving
check, `benchmark/gpu_check/gpu_serve_check.py`). Measurement only.

A server started with `VRADIX_GPU_SYNC_PROBE=<folder>` (and the GPU aid's plugin on its path) turns on
`torch.cuda.set_sync_debug_mode("warn")` in each of its processes that loads SGLang's plugins: torch then warns
at every synchronising CUDA call (`.item()`, `.tolist()`, a blocking copy to the host, ...). The probe takes each such
warning (all of them: the filter is set to "always"), walks the Python stack that raised it, and counts it as
vradix's when a frame of vradix's product code (not `vradix.testing`) is on it, else as the engine's own. Each
process writes its counts and top call sites to `<folder>/sync-<pid>.json`, at most every `FLUSH_S` seconds from the
warning's thread and every `FLUSH_S` from a timer thread (so the last events of a run reach the file); `written_at`
says when. `read` sums the processes' files.
"""
from __future__ import annotations

import collections
import json
import os
import threading
import time
import traceback
import warnings
from typing import Optional

#: the environment variable naming the folder the counts go to
ENV = "VRADIX_GPU_SYNC_PROBE"
#: what torch's sync debug warning says
SYNC_WARNING = "called a synchronizing CUDA operation"
FLUSH_S = 0.2
TOP_SITES = 12


def owner(frames) -> str:
    """'vradix' when a frame of vradix's product code asked (a `vradix/` file outside `vradix/testing/`), else
    'engine'."""
    for f in frames:
        path = f.filename.replace(os.sep, "/")
        if "/vradix/" in path and "/vradix/testing/" not in path:
            return "vradix"
    return "engine"


def site(frames) -> str:
    """The innermost frame of vradix or SGLang code, as `path-from-the-package:line`."""
    for f in reversed(frames):
        path = f.filename.replace(os.sep, "/")
        for pkg in ("/vradix/", "/sglang/"):
            if pkg in path and "/vradix/testing/" not in path:
                return f"{pkg.strip('/')}/{path.split(pkg, 1)[1]}:{f.lineno}"
    return "other"


class SyncProbe:
    """One process's counter (see the module docstring)."""

    def __init__(self, folder: str):
        self.path = os.path.join(folder, f"sync-{os.getpid()}.json")
        self.counts: collections.Counter = collections.Counter()
        self.sites: collections.Counter = collections.Counter()
        self.mode_error: Optional[str] = None
        self.lock = threading.Lock()
        self.flushed = 0.0

    def install(self) -> None:
        """Turn on torch's sync debug mode ("warn") and route its warnings here."""
        import torch

        try:
            torch.cuda.set_sync_debug_mode("warn")
        except Exception as e:  # a machine without CUDA: nothing synchronises; say so in the file
            self.mode_error = f"{type(e).__name__}: {e}"
        warnings.filterwarnings("always", message=f".*{SYNC_WARNING}.*")
        shown = warnings.showwarning

        def showwarning(message, category, filename, lineno, file=None, line=None):
            if SYNC_WARNING not in str(message):
                return shown(message, category, filename, lineno, file, line)
            self.record(traceback.extract_stack()[:-1])

        warnings.showwarning = showwarning
        threading.Thread(target=self._flush_loop, daemon=True, name="vradix-sync-probe").start()
        self.flush()

    def record(self, frames) -> None:
        with self.lock:
            self.counts[owner(frames)] += 1
            self.sites[site(frames)] += 1
        if time.monotonic() - self.flushed > FLUSH_S:
            self.flush()

    def flush(self) -> None:
        with self.lock:
            body = {"pid": os.getpid(), "written_at": time.time(), "mode_error": self.mode_error,
                    "vradix": self.counts["vradix"], "engine": self.counts["engine"],
                    "sites": dict(self.sites.most_common(TOP_SITES))}
            self.flushed = time.monotonic()
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(body, f)
        os.replace(tmp, self.path)

    def _flush_loop(self) -> None:
        while True:
            time.sleep(FLUSH_S)
            self.flush()


def install_from_env() -> Optional[SyncProbe]:
    """Install a probe writing into the folder `$VRADIX_GPU_SYNC_PROBE`, if set."""
    folder = os.environ.get(ENV)
    if not folder:
        return None
    probe = SyncProbe(folder)
    probe.install()
    return probe


def read(folder: str, after: float, timeout: float = 10.0) -> dict:
    """The counts of every process that wrote into `folder`, summed, once each wrote later than `after` (a
    `time.time()`), polling until `timeout`; raises TimeoutError otherwise. `processes` lists each one's file."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        bodies = []
        for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            if name.startswith("sync-") and name.endswith(".json"):
                try:
                    with open(os.path.join(folder, name)) as f:
                        bodies.append(json.load(f))
                except (OSError, ValueError):
                    bodies = []
                    break
        if bodies and all(b["written_at"] > after for b in bodies):
            sites: collections.Counter = collections.Counter()
            for b in bodies:
                sites.update(b["sites"])
            return {"vradix": sum(b["vradix"] for b in bodies), "engine": sum(b["engine"] for b in bodies),
                    "sites": dict(sites.most_common(TOP_SITES)), "processes": bodies,
                    "mode_errors": sorted({b["mode_error"] for b in bodies if b["mode_error"]})}
        time.sleep(FLUSH_S / 2)
    raise TimeoutError(f"no sync probe counts written into {folder} after {after}")
