"""LoRA hooks (scheduler process): an adapter is identified by its content when it is loaded, and its cached
entries are freed when it is unloaded (`vradix.core.lora`)."""
from __future__ import annotations

import logging

from vradix.scheduler import adapters
from vradix.engine import state_of

logger = logging.getLogger("vradix")


def identify_loaded_adapter(result, scheduler, recv_req, *args, **kwargs):
    """AFTER Scheduler.load_lora_adapter(_from_tensors): a load mints a new lora_id, i.e. a fresh namespace; its
    content identity, which the namespace and the P/D handshake carry beyond this process, is computed from the
    tensors just loaded."""
    state = state_of(scheduler.tree_cache)
    if state is not None and result.success:
        adapter_id = state.lora.on_load(scheduler, recv_req.lora_id)
        logger.info("vradix: adapter %r loaded as lora_id %s, content identity %s: its requests match only KV of "
                    "this content", recv_req.lora_name, recv_req.lora_id, adapter_id)


def free_unloaded_adapter(result, scheduler, recv_req, *args, **kwargs):
    """AFTER Scheduler.unload_lora_adapter: free the entries of the unloaded adapter, and only those
    (`scheduler.adapters.unload_adapter`): no publication, no epoch changes, even inside a bucketed update."""
    if state_of(scheduler.tree_cache) is not None and result.success:
        adapters.unload_adapter(scheduler, recv_req)
