"""HiCache L3 hooks (scheduler process): a stale storage prefetch never lands; each page written to a `file` store is
attributed to the weight identity whose KV it holds."""
from __future__ import annotations

from vradix import namespace, prefetch
from vradix.l3 import manifest
from vradix.state import state_of


def discard_stale_prefetch(original, cache, operation, *args, **kwargs):
    """AROUND UnifiedRadixCache._handle_prefetch_result: a completed prefetch keyed by an older epoch's namespace is
    discarded (its host pages freed) instead of inserted (`prefetch.discard`). Host-cache mode only: in buffer mode
    SGLang stages the pages per request instead of inserting them, and the publication's revocation
    (`prefetch.end_queued_attempts`) is what covers it."""
    state = state_of(cache)
    info = cache.ongoing_prefetch.get(operation.handle)
    if (state is None or info is None or cache.buffer_pipeline is not None
            or not prefetch.stale(state, info.prefetch_key.extra_key)):
        return original(cache, operation, *args, **kwargs)
    prefetch.discard(cache, operation)
    return None


def record_storage_backup(cache, node_id, *args, **kwargs):
    """BEFORE UnifiedRadixCache.write_backup_storage: append the node's page keys, under the weight_id of its
    namespace, to this process's manifest in the `file` store (`vradix.l3.manifest`). A node without a vradix
    namespace is not recorded: its pages stay unattributed, and garbage collection never deletes them."""
    state = state_of(cache)
    if state is None or not cache.enable_storage or cache.cache_controller is None:
        return
    writer = manifest.writer_for(cache.cache_controller.storage_backend)
    if writer is None or not cache.tree_core.is_backuped(node_id):
        return
    extra_key, _ = cache.tree_core.prefetch_anchor_info(node_id)
    weight_id = namespace.weight_id_of(extra_key)
    if weight_id is not None:
        hashes = cache.tree_core.get_hash_values(node_id)
        writer.record(weight_id, hashes)
        state.storage_pages_backed_up[weight_id] = state.storage_pages_backed_up.get(weight_id, 0) + len(hashes)
