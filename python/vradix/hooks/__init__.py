"""Every hook vradix installs, in one table, in data-path order (`HOOKS`). Importing this module imports SGLang and
every vradix step; `vradix.plugin.register()` does so only inside its fail-closed install."""
from __future__ import annotations

from vradix.hooks import (admission, control, hicache, inspector, launcher, ledger, lora, pd, pd_launcher,
                          prefill, publication, ray_actor, reclaim, reconfigure, report, server_info, serving, startup,
                          storage, tokenizer_worker)

_SCHED = "sglang.srt.managers.scheduler.Scheduler"
_UPDATER = "sglang.srt.managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager"
_COMMON = "sglang.srt.mem_cache.common"
_TOKEN_ALLOC = "sglang.srt.mem_cache.allocator.token.TokenToKVPoolAllocator"
_PAGED_ALLOC = "sglang.srt.mem_cache.allocator.paged.PagedTokenToKVPoolAllocator"
_OUT = "sglang.srt.managers.scheduler_components.output_streamer"
_TM = "sglang.srt.managers.tokenizer_manager.TokenizerManager"
_TCM = "sglang.srt.managers.tokenizer_control_mixin.TokenizerControlMixin"
_URC = "sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache"
_HICACHE_CTRL = "sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller.HybridCacheController"
_HOST_POOL = "sglang.srt.mem_cache.pool_host.base.HostKVCache"
_DECODE_OFFLOAD = "sglang.srt.disaggregation.decode_kvcache_offload_manager.DecodeKVCacheOffloadManager"

#: modules whose hooks are installed when the module is first imported: each imports an optional dependency (Ray),
#: or model code that only a multimodal server can import (the EPD encoder server: its imports bind `sgl_kernel` CPU
#: ops at import time, which the CPU engine of a text model does not register)
DEFERRED_MODULES = ("sglang.srt.ray.scheduler_actor", "sglang.srt.disaggregation.encoder.server")

#: (target, hook type, hook) — the complete list of places vradix attaches, in data-path order.
HOOKS = [
    # server flags (launcher process): --vradix-weight-identity, --vradix-max-staleness
    ("sglang.srt.server_args.ServerArgs.add_cli_args", "AFTER", launcher.add_identity_flag),
    # a staleness bound above the server window, and on a decode role a request without bootstrap fields, are
    # refused per request (HTTP 400)
    (f"{_TM}._validate_one_request", "BEFORE", launcher.check_generate_request),
    ("sglang.srt.server_args.prepare_server_args", "AROUND", launcher.export_identity_flag),
    # the closed world: a flag that turns on a path vradix cannot version does not start (docs/coverage.md)
    ("sglang.srt.server_args.ServerArgs.check_server_args", "AFTER", launcher.refuse_unversioned_paths_at_startup),
    # P/D: a role whose L3 restore must finish (decode with L3, DCP) starts only with prefetch policy wait_complete,
    # and only with an identity mode both roles compute equally (not nonce)
    ("sglang.srt.server_args.ServerArgs.check_server_args", "AFTER", pd_launcher.refuse_unsafe_restore_policy_at_startup),
    ("sglang.srt.server_args.ServerArgs.check_server_args", "AFTER", pd_launcher.refuse_unmatchable_identity_at_startup),
    # EPD: encoder-disaggregated image embeddings (the encoder's caches, the global store keyed emb_{hash}) carry no
    # weight identity and no publication reaches them: --encoder-only / --language-only / --enable-mm-global-cache
    # are refused with the closed world's flags above; an encoder-only launch, which never runs check_server_args,
    # stops before its encoder is built
    ("sglang.srt.disaggregation.encoder.server.MMEncoder.__init__", "BEFORE", startup.refuse_encoder_server),
    # engine start; under Ray, each scheduler actor loads vradix before it builds its Scheduler
    ("sglang.srt.ray.scheduler_actor.SchedulerActor.options", "AROUND", ray_actor.load_vradix_in_scheduler_actor),
    # weight identity: the checkpoint tensors the engine starts with are recorded (fingerprint mode), so its identity
    # is proven from what was published, whatever the TP layout; update calls record theirs (publication, below)
    ("sglang.srt.model_loader.loader.DefaultModelLoader.load_weights_only", "AROUND", startup.tap_startup_load),
    # the launch rules again where the engine starts (the launcher's copies above run only where SGLang's argument
    # check runs): a scheduler vradix cannot version is not built
    (f"{_SCHED}.__init__", "BEFORE", startup.refuse_unversioned_launch),
    # multi-tokenizer workers (--tokenizer-worker-num > 1, Engine.attach_tokenizer_worker) never call load_plugins():
    # each loads vradix before it builds its TokenizerWorker (the app its HTTP workers import, and the launch data
    # every worker reads), or stops before it serves
    ("sglang.srt.entrypoints.http_server._setup_and_run_http_server", "BEFORE",
     tokenizer_worker.name_vradix_worker_app),
    ("sglang.srt.managers.multi_tokenizer_mixin.write_data_for_multi_tokenizer", "AROUND",
     tokenizer_worker.load_vradix_where_launch_data_is_read),
    (f"{_SCHED}.__init__", "AFTER", startup.attach_to_scheduler),
    # 1. admission: every request is bound to the current epoch where SGLang queues it (before its first match and
    # before HiCache's storage prefetch reads its key), and a request holding no KV is re-bound before every match,
    # where a streaming-session slot a publication left stale is also released before it is lent (hooks.serving:
    # the per-request and per-batch hooks, each one call into the engine)
    (f"{_SCHED}._add_request_to_queue", "BEFORE", serving.admit),
    (f"{_COMMON}.match_kv_cache", "BEFORE", serving.before_match),
    (f"{_URC}.init_load_back", "AROUND", admission.verify_load_back),
    # prefill scheduling: a request waits for an uncached prefix another request is already computing; the requests
    # a pass admits count their prefix hits (the cache inspector)
    (f"{_SCHED}._get_new_batch_prefill_raw", "AROUND", serving.prefill_pass),
    ("sglang.srt.managers.schedule_policy.PrefillAdder.add_one_req", "AROUND", prefill.hold_back_duplicate_prefill),
    # forward: the strict guard's backstop fails a request whose cached KV (from the tree, a lent session record, a
    # restored backup, a load-back) was not written under its epoch; the KV page ledger records which epoch wrote
    # each page, and which pages are free. One hook per batch: the backstop's check first, then the stamp (a forward
    # that continues a partly filled page must not re-stamp that page before its cached positions are checked)
    (f"{_SCHED}.run_batch", "BEFORE", serving.before_forward),
    # the backstop's verdict is launched on the device and read where SGLang waits for the batch's output (no device
    # sync added to an iteration); the one insert before that point, the overlap loop's chunk checkpoint, reads a
    # complete verdict or is held until the next checkpoint
    (f"{_SCHED}.process_batch_result", "BEFORE", serving.at_result),
    (f"{_SCHED}.stash_chunked_request", "AROUND", ledger.hold_stash_until_verdict),
    (f"{_TOKEN_ALLOC}.free", "BEFORE", ledger.on_free_slots),
    (f"{_PAGED_ALLOC}.free", "BEFORE", ledger.on_free_slots),
    (f"{_PAGED_ALLOC}.free_page_ids", "BEFORE", ledger.on_free_pages),
    (f"{_TOKEN_ALLOC}.clear", "AFTER", ledger.on_clear),
    (f"{_PAGED_ALLOC}.clear", "AFTER", ledger.on_clear),
    # HiCache: a page's epoch travels with its copies (device <-> host pool, L3 storage -> host pool)
    (f"{_HICACHE_CTRL}.write", "AFTER", hicache.carry_epochs_to_host),
    (f"{_HICACHE_CTRL}.load", "AFTER", hicache.carry_epochs_to_device),
    (f"{_URC}._handle_prefetch_result", "BEFORE", hicache.stamp_prefetched_pages),
    (f"{_HOST_POOL}.free", "BEFORE", ledger.on_free_slots),
    (f"{_HOST_POOL}.clear", "AFTER", ledger.on_clear),
    # 2. publication: every way the weights (or their label) change bumps the epoch once
    (f"{_UPDATER}.update_weights_from_disk", "AROUND", publication.publish_update_from_disk),
    (f"{_UPDATER}.update_weights_from_distributed", "AROUND", publication.publish_update_from_distributed),
    (f"{_UPDATER}.update_weights_from_tensor", "AROUND", publication.publish_update_from_tensor),
    (f"{_UPDATER}.update_weights_from_ipc", "AROUND", publication.publish_update_from_ipc),
    # IPC (checkpoint-engine): a post-load step that failed (SGLang only logs it) fails the runner's update, so it
    # is not published
    ("sglang.srt.model_executor.model_runner_components.weight_updater.WeightUpdater.update_weights_from_ipc",
     "AROUND", publication.fail_ipc_update_on_post_hook_failure),
    (f"{_UPDATER}.record_weight_version_after_update", "AROUND", publication.publish_after_version_record),
    (f"{_UPDATER}.begin_weight_update", "AROUND", publication.open_bucketed_update),
    (f"{_UPDATER}.end_weight_update", "AROUND", publication.publish_on_bucketed_update_end),
    (f"{_SCHED}.record_weight_version_change", "AROUND", publication.publish_on_version_change),
    # a flush (/flush_cache, an update's flush_cache=true) with KV holders bumps lock-aware instead of being refused;
    # inside a publication it is part of that publication, never a second bump
    (f"{_SCHED}.flush_cache", "AROUND", publication.lock_aware_flush),
    # control requests that write the weights outside every update_weights_* call are publications too
    (f"{_UPDATER}.check_weights", "AROUND", publication.publish_weights_checker_reset),
    (f"{_UPDATER}.resume_memory_occupation", "AROUND", publication.publish_weights_resumed_without_backup),
    # control requests that would change what responses are computed from without a publication are refused:
    # resuming generation inside an open bucketed update (here, and in the launcher, below), relaxing
    # speculative acceptance at runtime (launcher), an RPC to a state-changing scheduler method
    (f"{_SCHED}.continue_generation", "AROUND", control.refuse_continue_inside_bucketed_update),
    # a request reaching a scheduler whose bucketed update holds generation itself (the launcher's hold absent) is
    # refused; so is a decode request without bootstrap fields (below), whatever frontend sent it: one hook per generate
    # request
    (f"{_SCHED}.handle_generate_request", "AROUND", serving.accept_generate),
    (f"{_SCHED}.handle_embedding_request", "AROUND", control.refuse_requests_inside_held_bucketed_update),
    (f"{_SCHED}.handle_rpc_request", "AROUND", control.refuse_state_changing_rpc),
    # a bucketed update holds generation (in place) from its begin to its end (launcher process; the scheduler
    # holds it itself when this copy did not, and refuses requests meanwhile: above)
    (f"{_TCM}.begin_weight_update", "AROUND", launcher.hold_generation_for_bucketed_update),
    (f"{_TCM}.end_weight_update", "AROUND", launcher.release_generation_after_bucketed_update),
    (f"{_TM}.continue_generation", "BEFORE", launcher.refuse_continue_inside_bucketed_update),
    ("sglang.srt.managers.multi_tokenizer_mixin.TokenizerWorker.continue_generation", "BEFORE",
     launcher.refuse_continue_inside_bucketed_update),
    (f"{_TCM}.set_internal_state", "BEFORE", launcher.refuse_relaxed_speculative_acceptance),
    # bad input: an invalid publication request is refused in the launcher before anything changes
    (f"{_TCM}.update_weight_version", "BEFORE", launcher.reject_bad_version_label),
    (f"{_TCM}.update_weight_version", "AROUND", launcher.refuse_reused_declared_label),
    (f"{_TM}.update_weights_from_disk", "AROUND", launcher.reject_bad_update_request),
    # bad input on a P/D decode role: a request without bootstrap fields is refused before it reaches the scheduler
    # (`launcher.check_generate_request`, above), and again where the decode scheduler receives it
    # (`serving.accept_generate`, above)
    (f"{_TCM}.attach_hicache_storage", "AROUND", pd_launcher.refuse_unsafe_restore_policy_at_attach),
    # P/D handshake: prefill's KV carries its weight identity to decode, which refuses KV of other weights
    ("sglang.srt.disaggregation.utils.MetadataBuffers.set_buf", "AFTER", pd.send_prefill_identity),
    ("sglang.srt.disaggregation.decode.DecodeTransferQueue._commit_transfer_to_req", "AROUND",
     pd.check_prefill_identity),
    # P/D decode retraction: a backup restored into new device pages (no forward) keeps the epochs it was written in
    ("sglang.srt.managers.schedule_batch.Req.offload_kv_cache", "BEFORE", pd.keep_epochs_of_cpu_backup),
    ("sglang.srt.managers.schedule_batch.Req.load_kv_cache", "AFTER", pd.stamp_restored_cpu_backup),
    (f"{_URC}.backup_kv_cache", "BEFORE", pd.keep_epochs_of_host_backup),
    (f"{_URC}.restore_kv_cache", "AFTER", pd.stamp_restored_host_backup),
    # P/D decode: the prebuilt batch a transferred request enters through is where its KV (decode's prefix and what
    # prefill sent, stamped at the commit above) is first read: the backstop checks it there, once per request
    ("sglang.srt.disaggregation.decode.SchedulerDisaggregationDecodeMixin._verify_kv_checksums", "AFTER",
     ledger.backstop_prebuilt_batch),
    # a decode request whose prefix promise a publication revoked fails with the revocation's 503 (the revocation
    # itself runs in the bump: publication.bump_scheduler); a restore that came up short of its promise, with a 503
    # naming the lost pages
    ("sglang.srt.disaggregation.utils.prepare_abort", "AROUND", pd.answer_decode_failures_with_their_cause),
    # hybrid P/D decode: a restore puts a prefix's cached recurrent state in its node's slot, never over the live
    # state prefill sent into the request's slot
    (f"{_URC}._load_back_transfers", "AROUND", pd.restore_into_node_slots_only),
    # overlap safety: nothing in flight while weights change
    (f"{_SCHED}.pause_generation", "BEFORE", publication.drain_before_in_place_pause),
    (f"{_SCHED}.process_batch_result", "AROUND", publication.skip_drained_result),
    # HiCache L3: a storage prefetch of an older epoch never lands (the publication revokes the queued ones); each
    # page written to a `file` store is attributed to its weight identity, for garbage collection
    (f"{_URC}._handle_prefetch_result", "AROUND", storage.discard_stale_prefetch),
    (f"{_URC}.write_backup_storage", "BEFORE", storage.record_storage_backup),
    # P/D decode KV offload to L3 (--disaggregation-decode-enable-offload-kvcache): a request that crossed a
    # publication offloads none of its (mixed) KV; each page decode offloads is attributed to its weight identity
    (f"{_DECODE_OFFLOAD}.offload_kv_cache", "AROUND", storage.never_offload_crossing_kv),
    (f"{_DECODE_OFFLOAD}._trigger_backup", "BEFORE", storage.record_decode_offload),
    # 3. reclaim: stale KV a crossing request unlocks, at its release; the stale KV a bump deferred (every node of
    # another namespace than the current epoch's): stale first on every eviction, a bounded slice per scheduler
    # iteration, the rest at idle
    (f"{_COMMON}.release_kv_cache", "AROUND", serving.release),
    (f"{_URC}._evict", "AROUND", reclaim.reclaim_stale_first),
    (f"{_SCHED}.get_next_batch_to_run", "BEFORE", reclaim.reclaim_slice),
    (f"{_SCHED}.on_idle", "BEFORE", reclaim.finish_reclaim_when_idle),
    # 4. report
    ("sglang.srt.managers.scheduler_components.flush_wrapper.SchedulerFlushWrapper.handle", "AFTER",
     server_info.report_flush),
    ("sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController.get_internal_state",
     "AFTER", server_info.report_server_info),
    # the cache inspector: GET /vradix/cache asks the scheduler over the internal-state channel (registered after the
    # AFTER hook above, so it wraps it and an inspector query skips SGLang's server-args dump)
    ("sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController.get_internal_state",
     "AROUND", inspector.answer_cache_inspection),
    # 5. provenance: scheduler -> customized_info -> tokenizer manager meta_info -> OpenAI metadata
    (f"{_OUT}._GenerationStreamAccumulator.accept", "AROUND", server_info.attach_provenance),
    (f"{_TM}.update_request_meta_info", "AROUND", report.provenance_to_meta_info),
    ("sglang.srt.utils.weight_versions.build_endpoint_weight_version_metadata", "AFTER",
     report.provenance_to_openai_metadata),
    # the /flush_cache HTTP body says what the invalidation did (launcher process)
    ("sglang.srt.managers.tokenizer_control_mixin.TokenizerControlMixin.flush_cache", "AROUND",
     report.remember_flush_message),
    ("sglang.srt.entrypoints.http_server.launch_server", "BEFORE", report.add_flush_report_middleware),
    ("sglang.srt.entrypoints.http_server.launch_server", "BEFORE", report.add_cache_inspector_endpoint),
    # 6. LoRA: an adapter is identified by its content at load (its requests' namespaces and P/D handshake carry
    # that identity beyond the process), and its entries (the nodes whose key carries its tag) are freed when it is
    # unloaded
    (f"{_SCHED}.load_lora_adapter", "AFTER", lora.identify_loaded_adapter),
    (f"{_SCHED}.load_lora_adapter_from_tensors", "AFTER", lora.identify_loaded_adapter),
    (f"{_SCHED}.unload_lora_adapter", "AFTER", lora.free_unloaded_adapter),
    # 7. runtime reconfiguration (the runtime census, docs/census/runtime.md): a control request that changes the
    # configuration is checked like a launch where the scheduler receives it (refused: nothing changed), and what
    # startup derived is derived again
    (f"{_SCHED}.attach_hicache_storage_wrapped", "AROUND", reconfigure.recheck_storage_attach),
    (f"{_SCHED}.detach_hicache_storage_wrapped", "AROUND", reconfigure.rederive_after_storage_detach),
    ("sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController.set_internal_state",
     "AROUND", reconfigure.recheck_internal_state),
]
