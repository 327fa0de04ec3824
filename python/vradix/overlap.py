"""Overlap safety: no forward pass may straddle a weight mutation.

With the overlap scheduler, the batch launched in the previous loop iteration is still in flight (its result sits in
`scheduler.result_queue`) when a control request such as `pause_generation` or `update_weights_*` is ingested. Stock
0.5.23 leaves it there across an in_place pause, so the weights can change while it runs, and its results are
processed after the update (labelled with the new version although computed with the old weights).

`drain_inflight_batch` processes every queued result *now*, exactly as the overlap loop would (`process_batch_result`),
then synchronizes the device. To keep the loop's one-pop-per-launched-batch bookkeeping intact, each drained entry is
replaced by a `DRAINED` placeholder whose later processing is a no-op (`skip_drained_result`). The placeholder's batch
lists no request: the scheduler reads the queued batch's requests to leave out of the next decode batch those whose
last token the queued result will commit (`Scheduler._reqs_finishing_inflight`); a drained result commits nothing
more, so a request listed there would be dropped from the running batch with its KV still locked.
"""
from __future__ import annotations

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
        batch.reqs = []  # the queue holds the loop's own snapshot (`batch.copy()`), used only for this result
        queue.append((batch, DRAINED))
    synchronize_device()
    return drained


def synchronize_device() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def skip_drained_result(original, scheduler, batch, result, *args, **kwargs):
    """AROUND `Scheduler.process_batch_result`: a placeholder left by a drain was already processed."""
    if result is DRAINED:
        return None
    return original(scheduler, batch, result, *args, **kwargs)
