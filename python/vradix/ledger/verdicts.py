"""Ledger checks launched on the device before a forward and read where SGLang already waits for that forward.

A strict backstop check (and a sampled one) is a gather/compare the device runs in stream order before the batch's
forward. Reading its result at once would make the host wait for everything queued before it: a device
synchronisation per extend batch, which serialises SGLang's overlap scheduler. Nothing needs the verdict before the
forward runs: a violating request's output is discarded after its forward, and nothing it computed reaches the tree
before its result is processed (`process_batch_result`), where SGLang waits for that batch anyway. So each check is
a `Verdict`, launched with its batch and read:

* at the batch's result (`PendingVerdicts.read_through`, BEFORE `Scheduler.process_batch_result`): the verdicts
  of that batch and of every batch launched before it. The verdict was queued before the batch's forward, so by the
  time SGLang waits for that forward's output nothing of the verdict is left to wait for;
* at a chunked request's checkpoint (`read_if_ready`): the one insert SGLang makes before the result is processed
  (the overlap loop stashes a chunk while scheduling the next batch). A verdict the device already reports complete
  is read there (no wait); otherwise the checkpoint is held, nothing inserted, and the next checkpoint or the final
  insert covers it (`hooks.ledger.hold_stash_until_verdict`);
* at a publication (`read_all`), which drains in-flight batches and may synchronise.

Invariant: between a check's launch and its batch's result, the host reads nothing the check computed unless the
device reported it complete (`DeviceValues.ready`). On a ledger in host memory (a CPU engine, `kernels.on_host`) the
check's result is a host list from the start: complete, read without a device.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch


@dataclass
class DeviceValues:
    """A small integer result of a check: a host list (already complete), or a device tensor with, on CUDA, its
    non-blocking copy into pinned host memory and the event recorded after that copy."""

    values: Union[list, torch.Tensor]
    host: Optional[torch.Tensor] = None
    done: Optional["torch.cuda.Event"] = None

    @classmethod
    def launch(cls, values: Union[list, torch.Tensor]) -> "DeviceValues":
        """Start bringing `values` to the host without waiting for them."""
        if isinstance(values, list) or values.device.type != "cuda":
            return cls(values)
        host = torch.empty(values.shape, dtype=values.dtype, device="cpu", pin_memory=True)
        host.copy_(values, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return cls(values, host, done)

    def ready(self) -> bool:
        """Complete without waiting: a host list, or a copy whose event the device reports done. A device tensor
        without an event (the device forms run on CPU, `VRADIX_KERNELS=torch`) is never assumed complete."""
        return isinstance(self.values, list) or (self.done is not None and self.done.query())

    def read(self) -> list:
        """The values on the host. Waits only for what was queued before the check's copy."""
        if isinstance(self.values, list):
            return self.values
        if self.done is not None:
            self.done.synchronize()
            return self.host.tolist()
        return self.values.tolist()


@dataclass
class Verdict:
    """One launched check: its batch (`batch_key`: the batch's `out_cache_loc`, the one field the copy SGLang
    queues for result processing shares with the batch that ran), the requests it is about, its values, and what
    reading them does (`settle`: fail or record the violations, with the values read on the host)."""

    batch_key: object
    reqs: tuple
    values: DeviceValues
    settle: Callable[[list], None]

    def names(self, req) -> bool:
        return any(r is req for r in self.reqs)


class PendingVerdicts:
    """The verdicts launched and not yet read, oldest first (the guard's own record; written only through these
    methods, by `hooks.ledger` and the publication). Each verdict is read exactly once."""

    def __init__(self):
        self._queue: deque[Verdict] = deque()

    def __len__(self) -> int:
        return len(self._queue)

    def launch(self, batch_key, reqs, values: Union[list, torch.Tensor], settle: Callable[[list], None]) -> None:
        self._queue.append(Verdict(batch_key, tuple(reqs), DeviceValues.launch(values), settle))

    def awaits(self, req) -> bool:
        """Whether a verdict about `req` has not been read yet."""
        return any(v.names(req) for v in self._queue)

    def read_through(self, batch_key) -> int:
        """At a batch's result: read that batch's verdict and every one launched before it (results are processed
        in launch order). Nothing when no verdict is that batch's. Returns how many were read."""
        through = next((i for i, v in enumerate(self._queue) if v.batch_key is batch_key), -1)
        for _ in range(through + 1):
            self._read_oldest()
        return through + 1

    def read_if_ready(self, req) -> bool:
        """Read, oldest first, every verdict the device already reports complete, up to the last one about `req`.
        True when none about `req` is left unread."""
        while self._queue and self._queue[0].values.ready() and self.awaits(req):
            self._read_oldest()
        return not self.awaits(req)

    def read_all(self) -> int:
        """At a publication (which drains the device): read every verdict. Returns how many were read."""
        n = len(self._queue)
        while self._queue:
            self._read_oldest()
        return n

    def _read_oldest(self) -> None:
        verdict = self._queue.popleft()
        verdict.settle(verdict.values.read())
