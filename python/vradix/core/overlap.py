"""Overlap safety: no forward pass may straddle a weight mutation.

With the overlap scheduler, the batch launched in the previous loop iteration is still in flight (its result sits in
`scheduler.result_queue`) when a control request such as `pause_generation` or `update_weights_*` is ingested. Stock
0.5.23 leaves it there across an in_place pause, so the weights can change while it runs, and its results are
processed after the update (labelled with the new version although computed with the old weights).

`drain_inflight_batch` processes every queued result *now*, exactly as the overlap loop would (`process_batch_result`),
then synchronizes the device. To keep the loop's one-pop-per-launched-batch bookkeeping intact, each drained entry is
replaced by a `DRAINED` placeholder whose later processing is a no-op (`skip_drained_result`).

The placeholder's batch names no requests. The scheduler reads the queued batch's requests as "their next token is
still in flight" (`Scheduler._reqs_finishing_inflight` drops a request whose queued result will finish it by length
from the next decode batch). After a drain that token is already committed, so a request one token short of its
limit must be decoded once more; were it held back, nothing would ever finish or release it (a hang and a leak,
found by the publication soak).
"""
from __future__ import annotations

import copy

import torch

DRAINED = object()


def drain_inflight_batch(scheduler) -> int:
    """Process queued overlap results and synchronize the device. Returns the number of batches drained."""
    queue = getattr(scheduler, "result_queue", None)
    if not getattr(scheduler, "enable_overlap", False) or not queue:
        return 0
    drained = 0
    for _ in range(len(queue)):
        batch, result = queue.popleft()
        if result is not DRAINED:
            scheduler.process_batch_result(batch, result)
            drained += 1
        queue.append((drained_placeholder(batch), DRAINED))
    synchronize_device()
    return drained


def drained_placeholder(batch):
    """A shallow copy of `batch` with no requests: nothing of it is in flight any more."""
    placeholder = copy.copy(batch)
    placeholder.reqs = []
    return placeholder


def synchronize_device() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
