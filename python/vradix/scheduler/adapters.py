"""A LoRA adapter unloaded (`hooks.lora.free_unloaded_adapter`): no publication, no epoch changes; the entries its
requests inserted (every node whose key carries its adapter tag), and only those, are freed (`core.lora`), even inside a
bucketed update."""
from __future__ import annotations

import logging

from vradix.engine import state_of_scheduler
from vradix.scheduler.publication import export_metrics

logger = logging.getLogger("vradix")


def unload_adapter(scheduler, recv_req) -> int:
    """Free the unloaded adapter's entries (`recv_req.lora_id`) on a versioned engine and forget its identity.
    Returns the tokens freed."""
    state = state_of_scheduler(scheduler)
    assert state is not None, "an adapter unload reached an engine vradix does not version"
    freed = state.lora.on_unload(scheduler.tree_cache, recv_req.lora_id)  # found by its identity's tag
    state.freed.count(freed)
    logger.info("vradix: adapter %r (lora_id %s) unloaded: freed %d of its cached tokens; other namespaces untouched",
                recv_req.lora_name, recv_req.lora_id, freed)
    export_metrics(scheduler)
    return freed
