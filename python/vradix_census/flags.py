"""The flag census: every `ServerArgs` field of SGLang 0.5.23, classified, and the combination matrix of the flags
that keep KV, weights or weight-derived state.

`enumerate_flags()` reads the live class (`ServerArgs.__struct_fields__`); `FLAGS` classifies each field by name
(`irrelevant`, `versioned` or `refused`, `vradix_census.CLASSES`). Fields that share one reason are
built by `_same`, but every field has its own row, and every field that can keep KV, weights or weight-derived state
has a reason of its own. A field whose refusal depends on its value or on another flag is classified by what vradix
does with the value that turns the path on.

The combination matrix of the `versioned` and `refused` fields is `census.matrix` (block `flag-matrix`).
"""
from __future__ import annotations

from typing import Dict, Tuple

from vradix_census import Entry, launch_rule

# ---- tests the entries name (each exists; checked by the generic census test) --------------------------------------
REFUSED_AT_LAUNCH = "test_coverage.py::test_a_refused_flag_stops_the_launch"
RADIX = ("test_e2e_server.py::test_vradix_publication_never_reuses_stale_prefix",
         "test_cache_level.py::test_crossing_request_keeps_its_kv_and_frees_stale_path_at_release")
RADIX_OFF = ("test_e2e_server.py::test_disable_radix_cache_versions_only_the_weight_derived_caches",
             "test_e2e_streaming_session.py::"
             "test_without_a_radix_cache_stock_lends_old_weights_session_kv_and_vradix_refuses_the_pair")
NAMESPACE = ("test_cache_level.py::test_stale_prefix_misses_after_bump_and_is_cached_again",)
CHUNKED = ("test_cache_level.py::test_chunked_prefill_crossing_a_bump_never_inserts",
           "test_e2e_server.py::test_chunked_prefill_crossing_a_publication")
OVERLAP = ("test_e2e_server.py::test_overlap_batch_in_flight_at_pause_is_labelled_with_its_weights",)
HICACHE = ("test_hicache_l2.py::test_stale_host_copies_are_unmatchable_and_freed_at_a_publication",
           "test_e2e_hicache.py::test_in_place_publication_misses_device_host_and_storage")
HICACHE_L3 = ("test_e2e_hicache.py::test_vradix_restart_on_new_weights_never_reads_the_old_weights_pages",
              "test_l3.py::test_the_landing_guard_discards_a_prefetch_the_publication_did_not_revoke")
ONE_IDENTITY = ("test_e2e_identity.py::"
                "test_every_rank_of_a_default_mode_dp2_engine_reports_one_weight_id_and_publish_verifies_them")
BUFFER_ONLY = ("test_l3.py::test_a_prefetch_in_flight_at_a_publication_is_revoked_and_frees_its_host_pages",
               "test_e2e_buffer_only.py::test_a_publication_with_a_buffer_only_prefetch_in_flight_equals_a_fresh_server_on_the_new_weights")
LINKER = ("test_coverage.py::test_storage_keys_of_two_weight_identities_never_collide",)
SESSIONS = ("test_e2e_streaming_session.py::test_streaming_session_turn_after_publication_is_computed_under_the_new_weights",
            "test_streaming_sessions.py::test_turn_after_publication_never_borrows_the_old_slot_record",
            "test_streaming_sessions.py::test_turn_running_across_a_publication_keeps_its_kv_and_its_slot_is_never_lent_again")
LORA = ("test_hooks.py::test_adapter_load_insert_and_unload_hooks",
        "test_cache_level.py::test_user_extra_key_and_lora_isolation_unchanged")
LORA_PATHS = ("test_lora_identity.py::test_a_retrained_adapter_at_the_same_path_never_reads_the_old_adapters_l3_pages",
              "test_lora_identity.py::test_the_adapter_tag_is_the_adapters_content_and_no_user_key_can_forge_it")
PD = ("test_e2e_pd.py::test_skew_with_decode_updated_first_fails_the_request_and_caches_nothing",
      "test_e2e_pd.py::test_skew_with_prefill_updated_first_fails_the_request_and_caches_nothing",
      "test_pd_ledger.py::test_a_received_transfer_is_stamped_at_commit_and_passes_its_first_prebuilt_check")
PD_PROMISES = ("test_e2e_pd.py::test_a_decode_publication_revokes_a_promise_prefill_has_not_fulfilled",)
PD_OFFLOAD = ("test_pd_decode_offload.py::test_a_request_that_crossed_a_publication_offloads_none_of_its_mixed_kv",
              "test_pd_decode_offload.py::test_every_page_decode_offloads_is_in_the_manifest_under_its_identity")
PD_RETRACTION = ("test_pd_retraction.py::test_a_request_retracted_before_a_publication_resumes_crossing_and_never_inserts",
                 "test_pd_retraction.py::test_a_host_pool_backup_survives_the_publication_and_restores_the_requests_own_kv")
PD_HOST_STAGED = ("test_pd_retraction.py::test_a_host_staged_request_is_rebound_like_any_request_that_holds_nothing",)
EPD = ("test_weight_derived.py::test_epd_flags_do_not_start",)
MM = ("test_e2e_multimodal.py::test_a_publication_recomputes_image_embeddings",
      "test_mm_embedding_cache.py::test_a_publication_clears_the_multimodal_embedding_cache")
TP = ("test_e2e_tp.py::test_in_place_publication_with_a_request_in_flight_bumps_each_rank_once",
      "test_e2e_tp.py::test_detection_only_reports_a_stale_read_on_both_ranks_and_they_stay_in_step",
      "test_e2e_tp.py::test_publish_verifies_every_rank_of_a_default_mode_engine")
MULTI_RANK = ("test_backstop.py::test_one_gather_per_batch_and_detection_only_with_more_than_one_rank",)
IDENTITY = ("test_published.py::test_every_layout_proves_the_identity_one_rank_does",
            "test_publication_hooks.py::test_weights_changed_where_no_tap_saw_them_get_the_fingerprint_of_the_loaded_shards")
GPU_DERIVED = ("test_weight_derived.py::test_a_copy_no_update_rebuilds_refuses_every_update_path_before_loading",
               "test_weight_derived.py::test_a_bucket_after_a_post_load_copy_that_graphs_keep_is_refused_and_loads_nothing")
SGLANG_GUARDED = ("test_publication_hooks.py::test_load_format_refused_before_loading_does_not_bump",
                  "test_weight_derived.py::test_a_bucketed_update_a_p2p_write_would_leave_stale_is_refused_at_begin")
HYBRID = ("test_hybrid_cpu.py::test_vradix_hybrid_server_matches_hf_hits_prefixes_and_never_reuses_stale_state",
          "test_hybrid_cpu.py::test_a_publication_frees_the_stale_recurrent_states_of_a_hybrid_tree")
STALENESS = ("test_staleness.py::test_bounded_request_reuses_the_window_and_exact_requests_never_see_its_kv",
             "test_staleness.py::test_a_request_never_reuses_kv_older_than_its_own_bound")
WINDOW_REFUSED = ("test_staleness.py::test_a_window_is_refused_at_startup_with_the_paths_it_does_not_support",)
WINDOW_LEDGER = ("test_staleness.py::test_a_window_is_refused_where_the_kv_page_ledger_is_off",)
WINDOW_SESSION = ("test_streaming_sessions.py::"
                  "test_a_window_refuses_streaming_sessions_because_an_exact_turn_would_borrow_a_bounded_turns_record",)
WINDOW_RADIX_OFF = ("test_staleness.py::test_a_window_without_a_radix_cache_reuses_nothing",)
WINDOW_HYBRID = ("test_staleness.py::test_a_window_is_refused_at_engine_start_on_a_tree_it_cannot_age_out",)
L3_SESSION = ("test_e2e_streaming_session.py::"
              "test_with_an_l3_backend_stock_stops_at_a_sessions_second_turn_and_vradix_refuses_the_pair",)
PD_RADIX_OFF = ("test_pd_rules.py::test_a_decode_role_without_a_radix_cache_would_commit_kv_of_any_weights_so_it_does_not_start",)
RETRACTION = ("test_cache_level.py::test_retracted_crossing_request_reprefills_under_new_epoch",)


def enumerate_flags() -> list:
    """Every field of SGLang's live `ServerArgs` (its CLI flags are these names with dashes)."""
    from sglang.srt.server_args import ServerArgs

    return list(ServerArgs.__struct_fields__)


def _same(names: str, class_: str, why: str, tests: Tuple[str, ...] = ()) -> Dict[str, Entry]:
    """One entry per field of the space-separated `names`, all with the same classification."""
    return {name: Entry(class_, why, tuple(tests)) for name in names.split()}


def _refused(flag: str, why: str, alternative: str, tests=(REFUSED_AT_LAUNCH,)) -> Entry:
    """A field refused at launch: the serving rule that refuses its flag (`launch_rule`) must exist."""
    if REFUSED_AT_LAUNCH in tests or tests == EPD:
        launch_rule(flag.split()[0])
    return Entry("refused", f"{flag}: {why}", tuple(tests), alternative)


# ---- irrelevant groups: no cached or weight-derived state, by what they configure ----------------------------------
_OPS = _same(
    "log_level log_level_http log_requests log_requests_level log_requests_format log_requests_target "
    "uvicorn_access_log_exclude_prefixes crash_dump_folder show_time_cost enable_metrics smg_http_sidecar_port "
    "enable_mfu_metrics enable_metrics_for_all_schedulers load_snapshot_publish_interval "
    "tokenizer_metrics_custom_labels_header tokenizer_metrics_allowed_custom_labels extra_metric_labels "
    "bucket_time_to_first_token bucket_inter_token_latency bucket_e2e_request_latency prompt_tokens_buckets "
    "generation_tokens_buckets gc_warning_threshold_secs decode_log_interval enable_request_time_stats_logging "
    "load_publish_endpoint enable_forward_pass_metrics forward_pass_metrics_worker_id forward_pass_metrics_ipc_name "
    "enable_trace trace_modules otlp_traces_endpoint otlp_service_name export_metrics_to_file "
    "export_metrics_to_file_dir stat_loggers debug_tensor_dump_output_folder debug_tensor_dump_layers "
    "debug_tensor_dump_input_file msprobe_dump_config kv_canary kv_canary_real_data kv_canary_sweep_interval "
    "watchdog_timeout soft_watchdog_timeout custom_sigquit_handler gc_threshold spec_trace_dir",
    "irrelevant", "logging, metrics, tracing, debug dumps or watchdogs: they observe the engine (a KV canary checks "
    "pages, a dump writes activations to disk) and nothing a later response is computed from reads what they keep")
_NETWORK = _same(
    "host port fastapi_root_path grpc_port grpc_worker_threads grpc_response_timeout_secs "
    "sidecar sidecar_args skip_server_warmup warmups enable_http2 http2_max_concurrent_streams "
    "http2_initial_connection_window_size ssl_keyfile ssl_certfile ssl_ca_certs ssl_keyfile_password "
    "enable_ssl_refresh api_key admin_api_key enable_http_worker_reuseport nccl_port dist_timeout dist_init_addr "
    "gated_launch_port nnodes node_rank disaggregation_transfer_backend disaggregation_bootstrap_port "
    "disaggregation_ib_device mooncake_ib_device engine_info_bootstrap_port enable_p2p_check pre_warm_nccl "
    "base_gpu_id gpu_id_step numa_node use_ray",
    "irrelevant", "addresses, ports, transports, credentials and process placement: how the engine is reached "
    "and wired, not what it caches (a P/D transfer's content is checked by the handshake whatever its transport)")
_TEXT = _same(
    "tokenizer_path tokenizer_mode tokenizer_backend detokenizer_worker_num skip_tokenizer_init "
    "served_model_name chat_template trust_request_chat_template hf_chat_template_name completion_template "
    "file_storage_path return_input_ids return_output_ids reasoning_parser default_chat_template_kwargs "
    "strip_thinking_cache enable_strict_thinking tool_call_parser tool_server sampling_defaults "
    "preferred_sampling_params allow_auto_truncate stream_interval batch_notify_size "
    "stream_response_default_include_usage incremental_streaming_output constrained_json_whitespace_pattern "
    "constrained_json_disable_any_whitespace constrained_json_max_whitespace_cnt enable_dynamic_batch_tokenizer "
    "dynamic_batch_tokenizer_batch_size dynamic_batch_tokenizer_batch_timeout enable_tokenizer_batch_encode "
    "disable_tokenizer_batch_decode asr_max_buffer_seconds asr_max_concurrent_sessions enable_cache_report "
    "enable_response_store disable_outlines_disk_cache grammar_backend enable_custom_logit_processor "
    "sampling_mask_max_tokens enable_watermark watermark_config watermark_key watermark_key_b "
    "watermark_context_window watermark_mixing_probability watermark_max_probability watermark_default_enabled "
    "watermark_enforce_all enable_deterministic_inference rl_on_policy_target random_seed mlx_enable_sampling",
    "irrelevant", "text in and out (tokenizers, templates, parsers, streaming, grammars, sampling rules): derived "
    "from the tokenizer and the request, not from the weights; the grammar cache is the tokenizer's "
    "(docs/paths.md row tokenizer-grammar); the response store keeps responses, which carry their own labels")
_SCHEDULING = _same(
    "mem_fraction_static max_running_requests max_queued_requests max_total_tokens prefill_decode_interval "
    "prefill_decode_interval_min_bs enable_dynamic_chunking max_prefill_tokens prefill_max_requests schedule_policy "
    "enable_priority_scheduling disable_priority_preemption default_priority_value abort_on_priority_when_disabled "
    "schedule_low_priority_values_first priority_scheduling_preemption_threshold retraction_policy "
    "schedule_conservativeness num_continuous_decode_steps scheduler_recv_interval enable_mixed_chunk "
    "enable_prefill_delayer prefill_delayer_max_delay_passes prefill_delayer_token_usage_low_watermark "
    "prefill_delayer_forward_passes_buckets prefill_delayer_wait_seconds_buckets prefill_delayer_queue_min_ratio "
    "prefill_delayer_max_delay_ms min_free_slots_delay sleep_on_idle enable_two_batch_overlap "
    "enable_single_batch_overlap tbo_token_distribution_threshold num_reserved_decode_tokens "
    "disaggregation_decode_extra_slots disaggregation_decode_polling_interval optimistic_prefill_attempts "
    "disaggregation_decode_allocation_policy disaggregation_enable_kv_checksum load_balance_method",
    "irrelevant", "how much memory, how many requests, in what order and when: which request runs or is retracted "
    "next, never which KV it may match (every match is namespaced, and a retracted request re-binds: "
    "docs/paths.md rows queued-rebind, retract-unified)")
_SIZES = _same(
    "c128_page_size swa_full_tokens_ratio _swa_full_tokens_ratio_explicitly_set disable_hybrid_swa_memory "
    "swa_prefix_tails max_mamba_cache_size mamba_full_memory_ratio mamba_ssm_dtype mamba_max_states_per_path "
    "enable_mamba_cache_stochastic_rounding mamba_cache_philox_rounds mamba_track_interval "
    "enable_int8_mamba_checkpoint int8_mamba_ckpt_size enable_page_major_kv_layout enable_unified_memory "
    "hicache_ratio hicache_size hicache_host_memory_fraction hicache_write_policy hicache_io_backend "
    "hicache_mem_layout hicache_storage_prefetch_policy hicache_storage_backend_extra_config "
    "hicache_storage_prefetch_retry_poll_interval hicache_storage_prefetch_retry_max_attempts "
    "unified_cache_external_linker_backend unified_cache_external_linker_config enable_linker_mla_dedup "
    "radix_eviction_policy radix_eviction_policy_config _radix_eviction_policy_explicitly_set hisparse_config "
    "qsa_indexer_dtype ",
    "irrelevant", "sizes, dtypes, layouts, IO paths and eviction order of caches other flags turn on (the radix "
    "tree, hybrid state slots, the HiCache tiers, the external linker): what is kept and who may match it is the "
    "turning-on flag's row; a host pool layout whose pages cannot carry epochs turns the KV page ledger off "
    "(`hooks.startup.ledger_blind_spots`, the matrix's ledger-off column)")
_KERNELS = _same(
    "enable_fp32_lm_head enable_tf32_matmul attention_backend decode_attention_backend enable_lean_attention "
    "prefill_attention_backend sampling_backend fp8_gemm_runner_backend fp4_gemm_runner_backend bf16_gemm_backend "
    "dsa_prefill_backend dsv4_prefill_backend dsa_decode_backend dsa_paged_mqa_logits_backend dsa_topk_backend "
    "disable_flashinfer_autotune flashinfer_autotune_skip_ops mamba_backend enable_layerwise_nvtx_marker "
    "enable_nccl_nvls enable_symm_mem triton_attention_reduce_in_fp32 triton_attention_num_kv_splits "
    "triton_attention_split_tile_size flashinfer_mla_disable_ragged enable_fused_qk_norm_rope "
    "enable_precise_embedding_interpolation enable_fused_moe_sum_all_reduce enable_deepseek_v4_fp4_indexer "
    "disable_custom_all_reduce enable_mscclpp enable_torch_symm_mem enable_scattered_sconv boundary_reduction "
    "enable_quant_communications enable_flashinfer_allreduce_fusion enforce_disable_flashinfer_allreduce_fusion "
    "flashinfer_allreduce_fusion_backend enable_aiter_allreduce_fusion disable_aiter_allreduce_fusion_in_prefill "
    "disable_aiter_allreduce_fusion_in_decode moe_a2a_backend enable_w4a4_mxfp4_megamoe deepep_v2_mode "
    "moe_runner_backend flashinfer_mxfp4_moe_precision deepep_mode fuseep_mode deepep_dispatcher_output_dtype "
    "deepep_config flashinfer_a2a_dispatch_type disable_flashinfer_cutlass_moe_fp4_allgather "
    "disable_shared_experts_fusion enforce_shared_experts_fusion linear_attn_backend linear_attn_decode_backend "
    "linear_attn_prefill_backend linear_attn_verify_backend mm_attention_backend enable_mis "
    "prefill_kv_cache_dequant_dtype dsv4_attn_backend enable_amd_monokernel dsa_triton_union "
    "enable_dsa_fused_indexer enable_encoder_swa_bounded_replay enable_decoder_swa_bounded_replay "
    "enable_torch_compile_debug_mode torch_compile_max_bs "
    "enable_profile_cuda_graph enable_cudagraph_gc debug_cuda_graph",
    "irrelevant", "which kernels compute a forward and how they communicate: each forward reads the weights the "
    "model holds now; a weight copy a backend builds after loading is the post-load step every update reruns, and "
    "the copies an update would leave stale are refused at update per model family (docs/paths.md row "
    "gpu-derived, which reads them off the live modules whatever flag selected them)")
_PARALLEL = _same(
    "attn_dp_size attn_cp_size moe_dp_size dwdp_size pp_max_micro_batch_size pp_async_batch_depth enable_prefill_cp "
    "cp_strategy enable_dsa_cache_layer_split enable_cp_decode_attn_tp enable_kv_cache_sharding "
    "enable_dp_attention_local_control_broadcast enable_dp_lm_head enable_tp_lm_head_all_to_all "
    "enable_attn_tp_input_scattered enable_shared_experts_attn_tp shared_experts_tp_size enable_dense_mlp_attn_tp "
    "enable_layernorm_sp disable_attn_tp_gather ep_size moe_dense_tp_size enable_cp_tp_group_sharing "
    "enable_megamoe_for_layernorm_sp dcp_comm_backend ep_dispatch_algorithm "
    "init_expert_location eplb_algorithm eplb_rebalance_num_iterations eplb_rebalance_layers_per_chunk "
    "eplb_min_rebalancing_utilization_threshold expert_distribution_recorder_mode "
    "expert_distribution_recorder_buffer_size expert_balancedness_report_mode enable_waterfill",
    "irrelevant", "how one model is split over ranks and how experts are placed: every rank that keeps a tree runs "
    "its own scheduler, attached and bumped by the same broadcast control requests (docs/paths.md rows tp-ranks, "
    "dp-attention); expert rebalancing moves the experts the model holds now, not a copy of older ones")
_MM_INPUT = _same(
    "enable_broadcast_mm_inputs_process mm_enable_dp_encoder mm_process_config mm_processor_worker_num "
    "mm_io_worker_num allowed_media_domains media_url_max_file_size_mb mm_preprocess_cache_size_mb "
    "trust_mm_content_hashes limit_mm_data_per_request image_processor_backend disable_fast_image_processor "
    "mm_feature_transport",
    "irrelevant", "multimodal input processing (fetching, decoding, resizing, content hashes and the "
    "preprocessing cache of pixel tensors): derived from the media and the processor, not the weights; the "
    "embeddings computed from them are the `enable_multimodal` row")
_LORA_TUNING = _same(
    "enable_lora_overlap_loading max_lora_rank lora_target_modules max_loaded_loras max_loras_per_batch "
    "lora_eviction_policy lora_backend max_lora_chunk_size experts_shared_outer_loras lora_use_virtual_experts "
    "lora_strict_loading lora_drain_wait_threshold",
    "irrelevant", "LoRA pool sizes, kernels and loading rules: an adapter's KV is namespaced by its loaded "
    "content, whatever slot of the pool it sits in (row `enable_lora`)")
_MODEL_CONFIG = _same(
    "trust_remote_code context_length is_embedding revision model_impl model_config_parser json_model_override_args "
    "dtype quantization model_loader_extra_config weight_loader_disable_mmap weight_loader_prefetch_checkpoints "
    "weight_loader_prefetch_num_threads weight_loader_drop_cache_after_load download_dir model_checksum "
    "delete_ckpt_after_loading decrypted_config_file decrypted_draft_config_file startup_weight_load_mode "
    "checkpoint_engine_wait_weights_before_ready modelopt_checkpoint_save_path modelopt_export_path "
    "speculative_draft_model_revision device",
    "irrelevant", "what the model is and how its startup checkpoint is read: fixed for the engine's life; every "
    "publication loads into this same model through its `load_weights`, where the weight identity is proven "
    "(row `model_path`)")
_SPEC_TUNING = _same(
    "speculative_num_steps speculative_eagle_topk speculative_num_draft_tokens speculative_dflash_block_size "
    "speculative_dspark_block_size speculative_dspark_sps_table_path speculative_dspark_confidence_sts_path "
    "speculative_dspark_align_verify_tokens_to_graph_tier speculative_use_rejection_sampling speculative_token_map "
    "speculative_attention_mode speculative_draft_attention_backend speculative_dsa_topk_backend "
    "speculative_draft_kv_cache_dtype speculative_draft_window_size speculative_moe_runner_backend "
    "speculative_moe_a2a_backend speculative_enable_w4a4_mxfp4_megamoe speculative_draft_model_quantization "
    "_speculative_draft_quantization_explicitly_set enable_multi_layer_eagle speculative_adaptive "
    "speculative_adaptive_config speculative_ngram_min_bfs_breadth speculative_ngram_max_bfs_breadth "
    "speculative_ngram_match_type speculative_ngram_max_trie_depth speculative_ngram_capacity "
    "speculative_ngram_external_corpus_path speculative_ngram_external_sam_budget "
    "speculative_ngram_external_corpus_max_tokens speculative_domino_candidate_pool_size "
    "speculative_boundary_reduction speculative_use_block_verification speculative_draft_sink_size "
    "speculative_draft_load_format decoupled_spec_bind_endpoint "
    "decoupled_spec_connect_endpoints decoupled_spec_rank decoupled_spec_role",
    "irrelevant", "how draft tokens are proposed (draft model, its weights and adapter, n-gram corpus, a decoupled "
    "draft engine, step counts): proposals only; verification by the target at the default thresholds is "
    "lossless, so a draft that a publication did not reach cannot change an output (relaxed thresholds are "
    "refused: `speculative_accept_threshold_*`); the draft KV itself is the `speculative_algorithm` row")
_ONLY_WITH_REFUSED = _same(
    "lmcache_config_file flexkv_config_file mm_global_cache_backend encoder_transfer_backend encoder_urls "
    "encoder_bootstrap_port encoder_register_urls enable_adaptive_dispatch_to_encoder enable_prefix_mm_cache "
    "ep_join_rank_offset elastic_ep_initial_size max_ep_size ep_join_mode elastic_ep_scale_timeout "
    "enable_elastic_expert_backup dllm_algorithm_config dllm_fdfo",
    "irrelevant", "configures a path whose turning-on flag is refused (LMCache, FlexKV, the EPD encoder and its "
    "global store, elastic EP, diffusion-LLM serving): read only where that flag is set, which does not start")
_OUTPUTS = _same(
    "enable_return_hidden_states return_hidden_states_mode enable_return_aux_hidden_states aux_hidden_state_capture "
    "return_aux_hidden_state_layer_ids forward_hooks",
    "irrelevant", "activations returned with, or observed during, the forward that computes them (hidden states, "
    "aux hidden states, user forward hooks): nothing is kept for a later request")
_PDMUX = _same(
    "enable_pdmux pdmux_config_path sm_group_num",
    "irrelevant", "prefill and decode multiplexed on one engine's SMs: one scheduler and one tree, versioned as any "
    "non-P/D engine")
_OFFLOAD_TUNING = _same(
    "offload_num_in_group offload_prefetch_step ple_offload_backend ple_offload_dir",
    "irrelevant", "where and when offloaded weights are kept and prefetched (rows `cpu_offload_gb`, `offload_mode`, "
    "`ple_offload_embedding`): the weights themselves, not a copy of older ones")
_KT = _same(
    "kt_method kt_cpuinfer kt_threadpool_count kt_num_gpu_experts kt_max_deferred_experts_per_token",
    "irrelevant", "KTransformers tuning, read only with `--kt-weight-path`, which is refused")

# ---- fields that keep KV, weights or weight-derived state: a row each -----------------------------------------------
_OWN: Dict[str, Entry] = {
    "model_path": Entry("versioned", "the weights: every publication's identity is proven from what reaches "
                        "`load_weights` (startup included), and every epoch's namespace carries it "
                        "(docs/paths.md row weight-identity)", IDENTITY),
    "load_format": Entry("versioned", "how the startup checkpoint is read; weights written outside `load_weights` "
                         "get the fingerprint of the loaded shards, and a `direct` tensor update of a model with "
                         "post-load derivations is refused at update (rows weight-identity, mla-derived)",
                         IDENTITY + ("test_weight_derived.py::test_a_direct_tensor_update_of_an_mla_model_is_refused_before_loading",)),
    "custom_weight_loader": Entry("versioned", "update loaders that may bypass `load_weights`: weights changed where "
                                  "no tap saw them get the fingerprint of the loaded shards (row weight-identity)",
                                  IDENTITY),
    "remote_instance_weight_loader_seed_instance_ip": Entry(
        "versioned", "startup weights sent by a seed instance instead of read from files: the startup identity is "
        "the fingerprint of what was loaded (row weight-identity)", IDENTITY),
    "remote_instance_weight_loader_seed_instance_service_port": Entry(
        "versioned", "as remote_instance_weight_loader_seed_instance_ip (the seed's port)", IDENTITY),
    "remote_instance_weight_loader_send_weights_group_ports": Entry(
        "versioned", "as remote_instance_weight_loader_seed_instance_ip (the transfer group's ports)", IDENTITY),
    "remote_instance_weight_loader_backend": Entry(
        "versioned", "as remote_instance_weight_loader_seed_instance_ip (the transfer backend)", IDENTITY),
    "remote_instance_weight_loader_start_seed_via_transfer_engine": Entry(
        "versioned", "as remote_instance_weight_loader_seed_instance_ip (seeding over the transfer engine)", IDENTITY),
    "modelexpress_config": Entry("versioned", "startup weights fetched from a ModelExpress server instead of files: "
                                 "the startup identity is the fingerprint of what was loaded", IDENTITY),
    "modelopt_quant": Entry("versioned", "ModelOpt quantization applied while loading: a publication loads through "
                            "the same `load_weights` and post-load steps, where the identity is proven; derived "
                            "copies an update would leave stale are refused at update (row gpu-derived)",
                            IDENTITY + GPU_DERIVED[:1]),
    "modelopt_checkpoint_restore_path": Entry("versioned", "as modelopt_quant (a saved quantization state restored "
                                              "at startup)", IDENTITY + GPU_DERIVED[:1]),
    "quantize_and_serve": Entry("versioned", "as modelopt_quant (quantize at startup, then serve)",
                                IDENTITY + GPU_DERIVED[:1]),
    "rl_quant_profile": Entry("versioned", "an RL quantization profile the loader applies to every load, startup "
                              "and updates alike: the identity is proven from the tensors that reach "
                              "`load_weights`", IDENTITY),
    "quantization_param_path": Entry("versioned", "static KV scales read from a JSON file into the KV scale "
                                     "parameters; their cached copies an update would leave stale are refused at "
                                     "update (rows cuda-graphs, gpu-derived)", GPU_DERIVED),
    "kv_cache_dtype": Entry("versioned", "FP8/FP4 KV: the KV scale parameters are weight-derived (post-load writes "
                            "them in place, AITER's cached copy is refused at update: row gpu-derived); the KV "
                            "itself is namespaced like any KV", GPU_DERIVED + RADIX[:1]),
    "weight_version": Entry("versioned", "the label a publication carries: a new label is a publication (an epoch), "
                            "and a declared identity is read from it (`--vradix-weight-identity declared`)",
                            ("test_e2e_server.py::test_lock_aware_flush_and_update_weight_version",)),
    "weight_cache_mode": Entry("versioned", "a weight cache daemon holds the weights: SGLang refuses weight updates "
                               "in this mode itself, and vradix publishes only a successful update (row "
                               "sglang-guarded)", SGLANG_GUARDED),
    "weight_cache_socket": Entry("versioned", "as weight_cache_mode (the daemon's socket)", SGLANG_GUARDED),
    "weight_cache_timeout": Entry("versioned", "as weight_cache_mode (the daemon's readiness timeout)",
                                  SGLANG_GUARDED),
    "enable_paged_experts": Entry("versioned", "experts paged in from host memory: SGLang refuses weight updates "
                                  "with paged experts, and vradix publishes only a successful update (row "
                                  "sglang-guarded)", SGLANG_GUARDED),
    "paged_experts_num_resident": Entry("versioned", "as enable_paged_experts (resident experts)", SGLANG_GUARDED),
    "enable_nvidia_megakernel": Entry("versioned", "a kernel plugin that keeps its own weight layout: SGLang refuses "
                                      "weight updates with kernel plugins (row sglang-guarded)", SGLANG_GUARDED),
    "cuda_graph_config": Entry("versioned", "captured CUDA graphs keep pointers to weight tensors: post-load copies "
                               "into existing tensors are read by the graphs, copies rebound to new tensors are "
                               "refused at update while graphs are captured (rows cuda-graphs, gpu-derived)",
                               GPU_DERIVED),
    "offload_group_size": _refused("--offload-mode sharded_gpu/meta (with --offload-group-size)",
                                   "the real weights stay outside the parameters, and an update writes a meta tensor",
                                   "--offload-mode cpu or shm_cpu"),
    "offload_mode": _refused("--offload-mode sharded_gpu/meta", "the real weights stay outside the parameters, and "
                             "an update writes a meta tensor; `cpu` and `shm_cpu` are written in place (not refused)",
                             "--offload-mode cpu or shm_cpu"),
    "dcp_size": Entry("versioned", "decode context parallelism: DCP's replicated `w_kc_qrep` is a weight-derived copy "
                      "refused at update while graphs are captured (row gpu-derived); KV shards stay namespaced",
                      GPU_DERIVED),
    "dcp_replicate_q_proj": Entry("versioned", "the replicated Q projection is a weight-derived copy, refused at "
                                  "update when an update would leave it stale (row gpu-derived)", GPU_DERIVED),
    "tp_size": Entry("versioned", "one tree, KV pool and ledger per rank; every rank bumps once per publication and "
                     "all derive one weight identity (row tp-ranks)", TP),
    "pp_size": _refused("--pp-size above 1", "the overlap drain does not reach the pipeline's micro-batches in "
                        "flight, so tokens of micro-batches launched before a publication would be labelled with the "
                        "new weights (row loop-pp)", "--pp-size 1 (tensor or data parallelism)",
                        (REFUSED_AT_LAUNCH, "test_scheduler_refusals.py::"
                                            "test_pipeline_parallelism_is_refused_at_launch_and_at_engine_start")),
    "dp_size": Entry("versioned", "each data-parallel replica's scheduler keeps its own tree, attached and bumped "
                     "like any (row dp-attention); a publication reaches every replica, and every replica reports "
                     "the engine's one weight identity", TP + (ONE_IDENTITY,)),
    "tokenizer_worker_num": Entry("versioned", "above 1, SGLang's HTTP workers are processes that never load "
                                  "plugins: each loads vradix before it serves, or stops (docs/processes.md)",
                                  ("test_tokenizer_workers.py::test_every_tokenizer_worker_installs_vradix",
                                   "test_tokenizer_workers.py::"
                                   "test_a_bucketed_update_through_the_workers_holds_generation_between_buckets")),
    "enable_dp_attention": Entry("versioned", "per-rank trees, each attached; no cross-rank reuse (row "
                                 "dp-attention)", TP),
    "disable_radix_cache": Entry("versioned", "no prefix tree: vradix runs treeless and versions the weight-derived "
                                 "caches only; with --enable-streaming-session the slot would still lend KV across a "
                                 "publication, so that pair is refused at launch (rows radix-off, "
                                 "radix-off-streaming-session)", RADIX_OFF),
    "chunked_prefill_size": Entry("versioned", "a chunked request's earlier chunks are inserted between chunks; a "
                                  "request crossing a publication never inserts (row chunked-prefill)", CHUNKED),
    "page_size": Entry("versioned", "page-aligned matches and one ledger epoch per page; the cache-level tests run "
                       "page sizes 1 and 16 (docs/coverage.md: what the backstop cannot see)",
                       RADIX[1:] + STALENESS[:1]),
    "disable_overlap_schedule": Entry("versioned", "with overlap on (the default) vradix drains the result queue "
                                      "before an in_place pause, so a batch in flight is labelled with its weights "
                                      "(row overlap-drain)", OVERLAP),
    "enable_session_radix_cache": Entry("versioned", "session pins on tree nodes: turns still match through the "
                                        "namespaced tree (row session-radix)", NAMESPACE),
    "smg_grpc_mode": _refused("--smg-grpc-mode", "the SMG gRPC server replaces the HTTP server and the "
                              "TokenizerManager, so no launcher-side vradix check runs (row smg-grpc)",
                              "the HTTP server (with --grpc-port for SGLang's native gRPC server)"),
    "grpc_mode": _refused("--grpc-mode", "the deprecated name of --smg-grpc-mode (row smg-grpc)",
                          "the HTTP server (with --grpc-port for SGLang's native gRPC server)"),
    "radix_cache_backend": _refused("--radix-cache-backend", "a third-party prefix cache is not SGLang's "
                                    "UnifiedRadixCache, whose namespaces vradix versions",
                                    "the default radix cache (leave --radix-cache-backend unset)"),
    "enable_hierarchical_cache": Entry("versioned", "HiCache host copies carry their node's namespace and page "
                                       "epochs; stale ones are freed at the bump (row hicache-l2)", HICACHE),
    "hicache_host_memory_mode": Entry("versioned", "`buffer_only` stages storage pages through host buffers: its "
                                      "keys carry the namespace, queued lookups are revoked at a publication, and "
                                      "the ledger is off (row hicache-buffer-only)", BUFFER_ONLY),
    "hicache_storage_backend": Entry("versioned", "L3 page keys are seeded from the namespaced `extra_key`, so "
                                     "weights never share keys; prefetches are revoked at a publication (row "
                                     "hicache-l3)", HICACHE_L3),
    "enable_unified_cache_external_linker": Entry(
        "versioned", "the external linker's page keys are seeded by the request's namespaced `extra_key`; the ledger "
        "is off on such an engine (rows external-linker, and a window is refused: bounded-staleness)",
        LINKER + WINDOW_LEDGER),
    "enable_hisparse": Entry("irrelevant", "DSv4 hisparse request windows are per request, and SGLang forces "
                             "--disable-radix-cache with it (row hisparse)"),
    "enable_lmcache": _refused("--enable-lmcache", "LMCache salts its keys inside the external package and loads "
                               "device KV outside the ledger", "HiCache with an L3 storage backend"),
    "enable_flexkv": _refused("--enable-flexkv", "FlexKV's cache has no tree core to namespace and keys without "
                              "weight identity", "HiCache with an L3 storage backend"),
    "enable_multimodal": Entry("versioned", "the multimodal embedding cache is cleared at every publication and "
                               "lock-aware flush, radix cache on or off (rows mm-embeddings, mm-embeddings-radix-off)",
                               MM),
    "enable_mm_global_cache": _refused("--enable-mm-global-cache", "a global embedding store keyed by content hash "
                                       "only, shared across processes", "the per-process embedding cache", EPD),
    "encoder_only": _refused("--encoder-only", "an EPD encoder's embedding cache no publication reaches",
                             "a unified multimodal engine", EPD),
    "language_only": _refused("--language-only", "a language server fed embeddings by an encoder no publication "
                              "reaches", "a unified multimodal engine", EPD),
    "language_model_only": Entry("irrelevant", "a multimodal checkpoint served without its vision tower: no "
                                 "embeddings are computed or cached (SGLang refuses it with the EPD and "
                                 "multimodal-cache flags)"),
    "enable_lora": Entry("versioned", "adapter KV is namespaced by the adapter's loaded content and freed when it is "
                         "unloaded (row lora); a window is refused with it", LORA),
    "lora_paths": Entry("versioned", "startup adapters are identified by their loaded content, not their path, so "
                        "an adapter retrained at the same path never reads the old one's KV (row lora-l3-restart)",
                        LORA_PATHS),
    "disaggregation_mode": Entry("versioned", "P/D roles: prefill's weight identity travels with its KV and decode "
                                 "refuses KV of other weights; decode stamps received KV in the ledger (rows "
                                 "pd-handshake, backstop-pd); a decode role without its radix cache is refused "
                                 "(row pd-decode-radix-off)", PD + PD_RADIX_OFF),
    "disaggregation_decode_enable_radix_cache": Entry("versioned", "the decode role's radix cache, which vradix "
                                                      "needs there (without it decode is refused: row "
                                                      "pd-decode-radix-off); decode's prefix promises are revoked "
                                                      "at a publication (row pd-promises)",
                                                      PD_PROMISES + PD_RADIX_OFF),
    "disaggregation_decode_enable_offload_kvcache": Entry("versioned", "a crossing request offloads none of its "
                                                          "mixed KV; offloaded pages are attributed to their "
                                                          "identity (row pd-decode-offload)", PD_OFFLOAD),
    "disaggregation_decode_retraction_backup": Entry("versioned", "a retracted decode request resumes from its own "
                                                     "backup as a crossing request, in CPU tensors or the HiCache "
                                                     "host pool (rows pd-retraction-backup, pd-retraction-host-pool)",
                                                     PD_RETRACTION),
    "disaggregation_decode_host_receive_threshold": Entry(
        "versioned", "host-staged receiving: the request holds no KV of its own and is re-bound; the ledger is off "
        "on such a decode role (row pd-host-staged)", PD_HOST_STAGED),
    "enable_pd_role_switch": _refused("--enable-pd-role-switch", "a role switch resets the tree under the launch "
                                      "role's scope", "separate prefill and decode engines"),
    "enable_streaming_session": Entry("versioned", "a slot's record is lent only to a turn of the epoch that wrote "
                                      "all of it; refused on a P/D decode role, with --disable-radix-cache and with "
                                      "a staleness window (rows streaming-session, radix-off-streaming-session, "
                                      "bounded-staleness)", SESSIONS),
    "speculative_algorithm": Entry("versioned", "draft KV lives in the target's namespaced slots; the ledger is off "
                                   "(docs/kernels.md), so a staleness window is refused with it (rows "
                                   "spec-draft-kv, bounded-staleness)", NAMESPACE + WINDOW_LEDGER),
    "speculative_accept_threshold_single": _refused(
        "--speculative-accept-threshold-single below 1", "relaxed acceptance lets the draft's unversioned state "
        "decide outputs; at 1.0 (the default) verification is lossless and nothing is refused",
        "speculative decoding with the default thresholds (1.0)"),
    "speculative_accept_threshold_acc": _refused(
        "--speculative-accept-threshold-acc below 1", "as speculative_accept_threshold_single",
        "speculative decoding with the default thresholds (1.0)"),
    "enable_return_routed_experts": _refused(
        "--enable-return-routed-experts with HiCache, P/D decode or the external linker", "the capture buffer is "
        "written per KV slot by forwards only, so a prefix loaded without a forward returns what its slots last "
        "held; alone (device-tree hits only) it is not refused", "routed-experts capture on an engine without "
        "HiCache, P/D decode or the external linker"),
    "enable_return_indexer_topk": _refused(
        "--enable-return-indexer-topk with HiCache, P/D decode or the external linker",
        "as enable_return_routed_experts", "indexer top-k capture on an engine without HiCache, P/D decode or the "
        "external linker"),
    "enable_torch_compile": _refused(
        "--enable-torch-compile on the CPU engine", "Inductor freezing folds the weights into the compiled graph "
        "and an update does not recompile it; on GPU it is not refused: the compiled code reads the parameters, "
        "which an update writes in place (not run here: no GPU)",
        "the CPU engine without --enable-torch-compile"),
    "elastic_ep_backend": _refused("--elastic-ep-backend", "recovery reloads experts from the startup checkpoint, "
                                   "not the last publication", "a fixed EP layout"),
    "kt_weight_path": _refused("--kt-weight-path", "KTransformers serves the CPU experts from this path and "
                               "reloads them from it at every post-load step, so a publication's CPU experts never "
                               "reach them", "every expert on the device (leave --kt-weight-path unset), or a "
                               "restart on the new checkpoint"),
    "dllm_algorithm": _refused("--dllm-algorithm", "diffusion-LLM serving stages requests in its own queues, "
                               "outside the queues a publication re-binds or marks crossing",
                               "autoregressive serving (leave --dllm-algorithm unset)"),
    "cpu_offload_gb": Entry("irrelevant", "weights kept in host memory are the weights themselves, written in place "
                            "by the loader at every publication (docs/paths.md row cpu-offload), not a cache of "
                            "older ones"),
    "ple_offload_embedding": Entry("irrelevant", "Qwen4 PLE n-gram embedding weights kept in pinned host memory (or a "
                                   "file-backed table): a parameter whose `weight_loader` an update writes in place"),
    "enable_memory_saver": Entry("irrelevant", "releasing KV memory flushes the cache on an idle engine (SGLang's idle "
                                 "flush, which vradix counts); release and resume are classified with the control "
                                 "requests"),
    "enable_weights_cpu_backup": Entry("irrelevant", "a weights backup taken at release is restored at resume, on an "
                                       "idle engine whose released weights no update can write meanwhile: it restores "
                                       "the weights of the current epoch"),
    "enable_draft_weights_cpu_backup": Entry("irrelevant", "as enable_weights_cpu_backup, for the draft model, whose "
                                             "proposals cannot change an output (lossless verification)"),
    "speculative_draft_model_path": Entry("irrelevant", "the draft model's weights, which a publication may not "
                                          "reach: proposals only; verification by the target at the default "
                                          "thresholds is lossless (relaxed thresholds are refused), and a draft copy "
                                          "an update would leave stale is refused at update (row gpu-derived)"),
    "uno_lora_path": Entry("irrelevant", "UNO's draft adapter: proposals only, lossless verification, as "
                           "speculative_draft_model_path"),
    "enable_eplb": Entry("irrelevant", "expert rebalancing copies the experts the model holds now between ranks; a "
                         "publication's loader writes every physical replica of a logical expert"),
    "ep_num_redundant_experts": Entry("irrelevant", "redundant experts are physical replicas of logical ones, written "
                                      "by the same loader at every publication"),
    "enable_linear_replayssm": Entry("irrelevant", "a per-request ring of the decode's own inputs, flushed into its "
                                     "recurrent state every few steps; no other request reads it"),
    "enable_linear_replayssm_spec": Entry("irrelevant", "as enable_linear_replayssm, for speculative verify (a "
                                          "per-slot window of the request's own inputs)"),
    "linear_replayssm_cache_len": Entry("irrelevant", "the ring length of enable_linear_replayssm"),
    "prefill_only_disable_kv_cache": Entry("irrelevant", "prefill-only requests (embeddings, scores) write no KV "
                                           "to the cache at all: nothing is kept for a later request"),
    "disable_chunked_prefix_cache": Entry("irrelevant", "MLA's chunked prefix cache reads one request's own prefix "
                                          "KV in chunks during its prefill; the prefix itself came from a namespaced "
                                          "match"),
    "kv_events_config": Entry("irrelevant", "KV events are routing hints for an external router; a router acting on "
                              "a stale block still gets the engine's namespaced match (row kv-events)"),
    "mamba_radix_cache_strategy": Entry("versioned", "hybrid models keep recurrent states on namespaced tree nodes; "
                                        "a publication frees the unlocked stale ones (row mamba-state); a window is "
                                        "refused on a hybrid tree", HYBRID),
    "uses_mamba_radix_cache": Entry("versioned", "as mamba_radix_cache_strategy (derived from the architecture)",
                                    HYBRID),
}

#: the CUDA graph switches besides cuda_graph_config, which share its row
_CUDA_GRAPH_SWITCHES = {
    name: Entry("versioned", f"as cuda_graph_config (--{name.replace('_', '-')} selects which graphs are captured)",
                GPU_DERIVED)
    for name in ("cuda_graph_backend_decode cuda_graph_backend_prefill cuda_graph_max_bs_decode "
                 "cuda_graph_max_bs_prefill cuda_graph_bs_decode cuda_graph_bs_prefill cuda_graph_prefill_max_context "
                 "cuda_graph_max_seq_len_prefill disable_prefill_cuda_graph disable_decode_cuda_graph "
                 "disable_cuda_graph disable_cuda_graph_padding").split()}
#: every classification, by group; no field is in two (test_flag_matrix.py)
GROUPS = (_OPS, _NETWORK, _TEXT, _SCHEDULING, _SIZES, _KERNELS, _PARALLEL, _MM_INPUT, _LORA_TUNING, _MODEL_CONFIG,
          _SPEC_TUNING, _ONLY_WITH_REFUSED, _OUTPUTS, _PDMUX, _OFFLOAD_TUNING, _KT, _OWN, _CUDA_GRAPH_SWITCHES)
FLAGS: Dict[str, Entry] = {name: entry for group in GROUPS for name, entry in group.items()}

#: versioned fields about the weights themselves and their identity (the matrix treats them alike)
IDENTITY_FIELDS = frozenset((
    "model_path load_format custom_weight_loader remote_instance_weight_loader_seed_instance_ip "
    "remote_instance_weight_loader_seed_instance_service_port remote_instance_weight_loader_send_weights_group_ports "
    "remote_instance_weight_loader_backend remote_instance_weight_loader_start_seed_via_transfer_engine "
    "modelexpress_config modelopt_quant modelopt_checkpoint_restore_path quantize_and_serve rl_quant_profile "
    "weight_version").split())
#: versioned fields that lay one model out over ranks, each keeping its own tree
RANK_FIELDS = frozenset("tp_size dp_size enable_dp_attention".split())

#: the page the tables are rendered on (docs/)
DOC = "census/flags.md"
TABLES = {"flags": ("ServerArgs fields", enumerate_flags, FLAGS)}


def _render_matrix() -> str:
    from vradix_census import matrix

    return matrix.render(FLAGS)


EXTRA_BLOCKS = {"flag-matrix": _render_matrix}
