"""HiCache hooks (scheduler process): KV page epochs travel with HiCache's copies (see `vradix.ledger.host`)."""
from __future__ import annotations

from vradix.ledger import host as host_ledger
from vradix.ledger.device import ledger_of
from vradix.engine import state_of


def carry_epochs_to_host(host_slots, controller, device_indices, *args, **kwargs):
    """AFTER HybridCacheController.write: the backup just queued copies `device_indices` into `host_slots` (None
    when the host pool had no room and nothing was queued)."""
    device, host = host_ledger.ledgers_of(controller)
    if host_slots is not None and device is not None and host is not None:
        host_ledger.carry(device.page_epoch, device_indices, host.page_epoch, host_slots, host.page_size)


def carry_epochs_to_device(device_slots, controller, host_indices, *args, **kwargs):
    """AFTER HybridCacheController.load: the load-back just queued copies `host_indices` into `device_slots` (None
    when it could not be queued)."""
    device, host = host_ledger.ledgers_of(controller)
    if device_slots is not None and device is not None and host is not None:
        host_ledger.carry(host.page_epoch, host_indices, device.page_epoch, device_slots, device.page_size)


def stamp_prefetched_pages(cache, operation, *args, **kwargs):
    """BEFORE UnifiedRadixCache._handle_prefetch_result: the host slots this prefetch filled from storage (its
    `completed_tokens` first ones) hold KV stored under its key's namespace, so they get the epoch that serves that
    namespace here. The slots are inserted into the tree or freed right after, so every path out of the handler sees
    them stamped or `FREE`."""
    state = state_of(cache)
    host = ledger_of(host_ledger.kv_host_pool(cache))
    info = cache.ongoing_prefetch.get(operation.handle)
    if state is None or host is None or info is None:
        return
    host.stamp_fetched(info.host_indices[: operation.completed_tokens], state.epoch_of(info.prefetch_key.extra_key))
