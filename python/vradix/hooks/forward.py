"""Forward hooks (scheduler process): the KV page ledger records the epoch of every page a forward writes."""
from __future__ import annotations

from vradix.state import state_of


def stamp_forward_batch(scheduler, batch, *args, **kwargs):
    """BEFORE Scheduler.run_batch: the pages this forward writes are written under the current epoch's weights
    (publications drain in-flight batches first, so no forward straddles a weight change)."""
    state = state_of(scheduler.tree_cache)
    if state is not None and state.ledger is not None and batch is not None:
        state.ledger.stamp_written(getattr(batch, "out_cache_loc", None), state.epoch)
