"""HiCache L3 hooks (scheduler process): a stale storage prefetch never lands; each page written to a `file` store is
attributed to the weight identity whose KV it holds, including the pages a P/D decode role offloads
(`--disaggregation-decode-enable-offload-kvcache`), and a request that crossed a publication offloads none of its KV."""
from __future__ import annotations

from vradix import identity, request
from vradix.l3 import prefetch
from vradix.l3 import manifest
from vradix.engine import state_of


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
    weight_id = identity.weight_id_of(extra_key)
    if weight_id is not None:
        record_pages(state, writer, weight_id, cache.tree_core.get_hash_values(node_id))


def never_offload_crossing_kv(original, manager, req, *args, **kwargs):
    """AROUND DecodeKVCacheOffloadManager.offload_kv_cache (P/D decode with
    `--disaggregation-decode-enable-offload-kvcache`, every decode step and at the finish): a request that crossed a
    publication offloads nothing more. Its KV from the crossing on was computed under the new weights, while the
    offload keys every page by the request's namespace, its old identity: an L3 read under that identity would load
    mixed KV. Returns False, SGLang's answer for a step with nothing to offload; at the finish SGLang then releases the
    request's row itself (`finalize_release_on_finish`), inserting nothing. The chunks it offloaded before the crossing
    were computed under the old weights only, and keep their key."""
    st = request.of(req)
    if state_of(manager.tree_cache) is not None and st is not None and st.crossed:
        return False
    return original(manager, req, *args, **kwargs)


def record_decode_offload(manager, req, host_indices, incremental_tokens, start_time, prior_hash, *args, **kwargs):
    """BEFORE DecodeKVCacheOffloadManager._trigger_backup (a decode offload's device-to-host copy finished; the body
    then queues the pages' L3 write): append the pages' keys, the hash chain the body computes from the same tokens and
    prior hash, under the weight_id of the request's namespace, to this process's manifest in the `file` store."""
    state = state_of(manager.tree_cache)
    backend = getattr(manager.cache_controller, "storage_backend", None)
    weight_id = identity.weight_id_of(req.extra_key)
    writer = manifest.writer_for(backend) if state is not None and backend is not None else None
    if writer is not None and weight_id is not None:
        record_pages(state, writer, weight_id, manager._compute_prefix_hash(req, incremental_tokens, prior_hash))


def record_pages(state, writer, weight_id: str, hashes) -> None:
    """Attribute `hashes` to `weight_id` in the manifest (appended before this returns) and count them."""
    hashes = list(hashes)
    writer.record(weight_id, hashes)
    state.storage.count_backed_up(weight_id, len(hashes))
