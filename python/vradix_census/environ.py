"""The environment-settings census: every setting SGLang 0.5.23 declares in `sglang.srt.environ.Envs`, classified.

`enumerate_environ()` reads the live class (its `EnvField` attributes), never the file's text. `ENVIRON` maps each
name to an `Entry`. Settings that share one reason are grouped (`_group`), by what they switch: logging, ports,
timeouts, profiling, a kernel or a communication pattern that computes the same thing from the weights loaded now.
Every setting that switches a path able to keep KV, weights or weight-derived state across requests, or to relax
correctness, has its own entry (`_own`), with the tests that prove its class.

Invariants: `set(ENVIRON) == set(enumerate_environ())` (checked by test/closed_world/test_census.py); a name is
classified once (`_table` raises on a second entry); a `refused` entry names a refusal
`vradix.closed_world.unversioned.REFUSALS` holds, or SGLang's own refusal of every weight update.
"""
from __future__ import annotations

from vradix_census import Entry, launch_rule

#: the launch refusals of `vradix.closed_world.unversioned` (docs/coverage.md's "refused at launch" rows)
REFUSED_AT_LAUNCH = ("test_coverage.py::test_a_refused_flag_stops_the_launch",)
#: vradix's refusal of an update that would leave a GPU-derived copy stale (row `gpu-derived`)
GPU_DERIVED = ("test_weight_derived.py::test_a_copy_no_update_rebuilds_refuses_every_update_path_before_loading",
               "test_weight_derived.py::test_every_gpu_derived_copy_is_built_where_the_table_says_in_sglangs_source")
#: SGLang refuses every update call itself while a derived cache is built, and vradix refuses the bucketed update's
#: begin that would bypass that check (row `sglang-guarded`)
SGLANG_GUARDED = ("test_publication_hooks.py::test_load_format_refused_before_loading_does_not_bump",
                  "test_weight_derived.py::test_a_bucketed_update_a_p2p_write_would_leave_stale_is_refused_at_begin")

_KERNEL = ("selects a kernel, fusion, tile, layout, stream or communication pattern: a forward still reads the KV it "
           "was handed and the weights loaded now; what such a setting keeps across forwards (a captured graph, a "
           "RoPE table, a workspace, a tuned tile) comes from shapes and the config, not from the weights or "
           "another request's KV, and a captured graph reads weights an update writes in place (row cuda-graphs)")


def enumerate_environ() -> list[str]:
    """The names of every `EnvField` the live `sglang.srt.environ.Envs` class declares."""
    from sglang.srt.environ import EnvField, Envs

    return [name for name, value in vars(Envs).items() if isinstance(value, EnvField)]


def _group(names: str, why: str) -> list:
    """One `irrelevant` entry for each of the whitespace-separated `names`, for the one reason they share."""
    return [(name, Entry("irrelevant", why)) for name in names.split()]


def _own(name: str, class_: str, why: str, tests: tuple = (), alternative: str = "") -> list:
    return [(name, Entry(class_, why, tests, alternative))]


def _refused_at_launch(name: str, why: str, alternative: str) -> list:
    """A setting refused at launch: the serving rule that refuses it (`launch_rule`) must exist."""
    launch_rule(name)
    return _own(name, "refused", f"vradix refuses the launch: {why}", REFUSED_AT_LAUNCH, alternative)


def _table(*parts: list) -> dict:
    table = {}
    for part in parts:
        for name, entry in part:
            if name in table:
                raise ValueError(f"{name} is classified twice")
            table[name] = entry
    return table


RUNTIME = _group(
    "SGLANG_ROLE_NAMESPACES SGLANG_ROLE_NAMESPACES_OUT IS_H200 SGLANG_ENABLE_TORCH_INFERENCE_MODE "
    "SGLANG_USE_MODELSCOPE "
    "SGLANG_SORT_WEIGHT_FILES SGLANG_DISABLED_MODEL_ARCHS SGLANG_PREFETCH_BLOCK_SIZE_MB "
    "SGLANG_MOE_COPY_WEIGHT_VIEWS_BEFORE_H2D SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN HF_HUB_DISABLE_XET "
    "SGLANG_WARMUP_TIMEOUT SGLANG_GEMMA_OUT_OF_PLACE_POSITION_MUTATION",
    "process setup, model discovery or the order and transport of checkpoint files: the same tensors reach the "
    "same parameters through `load_weights`, and nothing is kept beside them")
WEIGHT_LOADING = (
    _own("SGLANG_ENABLE_WEIGHT_LOADER_V2", "irrelevant",
         "another body of the Llama/Qwen2 `load_weights`: the same named tensors reach the same parameters, and "
         "vradix records the (name, tensor) stream handed to `load_weights`, whichever body consumes it")
    + _own("SGLANG_LOAD_SNAPSHOT_USE_ZMQ", "irrelevant",
           "the transport of scheduler load metrics (running requests, tokens) for DP balancing and /v1/loads")
    + _refused_at_launch(
        "SGLANG_EXTERNAL_MODEL_PACKAGE",
        "model classes from an external package keep weight-derived state vradix has not read (row external-model)",
        "a model class SGLang ships (leave SGLANG_EXTERNAL_MODEL_PACKAGE unset)")
    + _own("SGLANG_EXTERNAL_MM_MODEL_ARCH", "irrelevant",
           "marks an architecture name as multimodal, so its requests take the multimodal path, whose embedding "
           "cache every publication clears (row mm-embeddings); external model classes are refused "
           "(SGLANG_EXTERNAL_MODEL_PACKAGE)")
    + _own("SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE", "irrelevant",
           "an external input processor (pixels to tensors, content hashes) runs before the model and reads no "
           "weights; the embeddings it leads to are cached in the multimodal cache every publication clears")
)
PLE = (
    _group("SGLANG_USE_ATTN_TP_NGRAM SGLANG_ENABLE_QWEN4_PLE_FUSION", _KERNEL)
    + _own("SGLANG_QWEN4_PLE_FILE_DIR", "irrelevant",
           "the directory of the `--ple-offload-backend file` PLE table: that file is the PLE weights' own storage "
           "(a shared mapping the loader and every update write), not a cache of them; the backend itself is the "
           "`--ple-offload-backend` flag's to classify")
    + _group("SGLANG_QWEN4_PLE_FILE_PREFETCH SGLANG_QWEN4_PLE_FILE_SKIP_DEVICE_CHECK "
             "SGLANG_QWEN4_PLE_FILE_RSS_BUDGET_GB "
             "SGLANG_QWEN4_PLE_FILE_RSS_INTERVAL_S",
             "page-cache hints, residency trimming and a device check of the file-backed PLE table: they change "
             "which rows are resident, never their bytes")
)
HTTP_LOGGING_PORTS = _group(
    "SGLANG_ENABLE_REQUEST_DECOMPRESSION SGLANG_ENABLE_REQUEST_HEADER_OVERRIDES DISABLE_OPENAPI_DOC "
    "SGLANG_TIMEOUT_KEEP_ALIVE SGLANG_UVICORN_WORKER_HEALTHCHECK_TIMEOUT SGLANG_HTTP_SERVER_APP_PATH "
    "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION SGLANG_EXPOSE_OWN_ENV_VARS SGLANG_DIAG_BYPASS_HEALTH_GENERATE "
    "SGLANG_LOG_GC SGLANG_LOG_FORWARD_ITERS SGLANG_LOG_DECODE_GRAPH_KEY SGLANG_LOG_MS SGLANG_LOG_REQUEST_EXCEEDED_MS "
    "SGLANG_LOG_REQUEST_HEADERS SGLANG_LOG_SCHEDULER_STATUS_TARGET SGLANG_LOG_SCHEDULER_STATUS_INTERVAL "
    "SGLANG_JIT_LOG_LEVEL SGLANG_ENABLE_RANK_CONSENSUS_CHECKER SGLANG_USE_PICKLE_IPC SGLANG_LOG_PICKLE_IPC_OBJECTS "
    "SGLANG_ZMQ_ALLOWED_PEERS SGLANG_ZMQ_SOURCE_IP SGLANG_USE_MESSAGE_QUEUE_BROADCASTER SGLANG_TCP_STORE_PORT "
    "SGLANG_PORT SGLANG_BACKUP_PORT_BASE SGLANG_GRPC_PORT SGLANG_GRPC_WORKER_THREADS",
    "the HTTP front door, logging, IPC serialisation and ports: they carry requests and report, and keep no model "
    "state (the ASGI app path, like the default, must be an app extending SGLang's, which vradix's launcher hooks "
    "patch)")
TESTS_AND_DIAGNOSTICS = _group(
    "SGLANG_IS_IN_CI SGLANG_IS_IN_CI_AMD SGLANG_TEST_MAX_RETRY SGLANG_TEST_TI2I_INPUT_IMAGE "
    "SGLANG_JIT_KERNEL_RUN_FULL_TESTS SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK SGLANG_CUDA_COREDUMP "
    "SGLANG_CUDA_COREDUMP_DIR SGLANG_FORCE_SHUTDOWN SGLANG_PYSPY_DUMP_BEFORE_CRASH SGLANG_CUDA_COREDUMP_BEFORE_CRASH "
    "SGLANG_CUDA_COREDUMP_BEFORE_CRASH_WAIT_SECS SGLANG_TEST_STUCK_DETOKENIZER SGLANG_TEST_STUCK_DP_CONTROLLER "
    "SGLANG_TEST_STUCK_SCHEDULER_INIT SGLANG_TEST_STUCK_TOKENIZER SGLANG_TEST_CRASH_AFTER_STREAM_OUTPUTS "
    "SGLANG_TEST_REQUEST_TIME_STATS SGLANG_TEST_DISAGG_FAILURE_PROB SGLANG_TEST_DISAGG_KV_CHECKSUM_MISMATCH_PROB "
    "SGLANG_TEST_MAMBA_LAZY_ALLOC_FAIL SGLANG_TEST_SKIP_CACHE_HIT_ASSERT SGLANG_TEST_HICACHE_H2D_DELAY_CYCLES "
    "SGLANG_TEST_METRICS_FILE SGLANG_TEST_PD_DISAGG_BACKEND SGLANG_TEST_PD_DISAGG_DEVICES "
    "SGLANG_TEST_FORCE_OPTIMISTIC_PREFILL_RETRY_PROB SGLANG_TEST_SCRIPTED_RUNTIME "
    "SGLANG_TEST_SCRIPTED_RUNTIME_IPC_ADDR "
    "SGLANG_TEST_SCRIPTED_RUNTIME_OUT_OF_BAND_ERROR_PATH SGLANG_TEST_SCRIPTED_RUNTIME_SYS_PATH_ENTRY "
    "SGLANG_TEST_RAGGED_VERIFY_FORCE_UNIFORM_CAPTURE SGLANG_TEST_HICACHE_BACKEND_RANDOM_DELAY "
    "SGLANG_TEST_HICACHE_BACKEND_RANDOM_FAILURE",
    "CI switches, crash dumps and fault injections that delay, crash, fail or retry a step (a failed transfer, a "
    "checksum mismatch, a stuck process, an allocation or storage failure): a failure fails the request or the "
    "engine, and none hands a request KV or state it would not otherwise get")
RETRACTION = _own(
    "SGLANG_TEST_RETRACT", "versioned",
    "forces decode retraction: a retracted request frees its KV and re-enters the queue, where it is re-bound and "
    "re-prefills under the current epoch (row retract-unified)",
    ("test_cache_level.py::test_retracted_crossing_request_reprefills_under_new_epoch",
     "test_provenance_cache_level.py::test_retracted_crossing_request_starts_a_fresh_history"))
RETRACTION_TUNING = _group(
    "SGLANG_TEST_RETRACT_INTERVAL SGLANG_TEST_RETRACT_NO_PREFILL_BS",
    "how often the forced retraction (SGLANG_TEST_RETRACT) runs; retraction is versioned (row retract-unified)")
GRAMMAR_TOOLS_TOKENIZER = _group(
    "SGLANG_GRAMMAR_POLL_INTERVAL SGLANG_GRAMMAR_MAX_POLL_ITERATIONS SGLANG_DISABLE_OUTLINES_DISK_CACHE "
    "SGLANG_FORWARD_UNKNOWN_TOOLS EXA_API_KEY SGLANG_EXA_NUM_RESULTS SGLANG_EXA_SEARCH_TYPE "
    "SGLANG_EXA_INCLUDE_HIGHLIGHTS SGLANG_TOOL_STRICT_LEVEL SGLANG_ENABLE_RESPONSE_TEMPLATE_TURN_GRAMMAR "
    "SGLANG_EMBEDDINGS_SPARSE_HEAD SGLANG_MAX_THINK_TOKENS SGLANG_PATCH_TOKENIZER SGLANG_BATCH_TOKENIZER_OUTPUTS "
    "SGLANG_PARALLEL_PROMPT_ENCODE SGLANG_PARALLEL_PROMPT_ENCODE_MIN_CHARS SGLANG_REQUEST_STATE_WAIT_TIMEOUT "
    "SGLANG_DEFAULT_THINKING SGLANG_DSV4_REASONING_EFFORT SGLANG_DSV41_REASONING_EFFORT "
    "SGLANG_INKLING_DEFAULT_REASONING_EFFORT",
    "grammars, tool calls, web search, tokenization and reasoning defaults: derived from the tokenizer and the "
    "request, not from the weights (row tokenizer-grammar)")
PROFILING = _group(
    "SGLANG_PROFILE_WITH_STACK SGLANG_PROFILE_RECORD_SHAPES SGLANG_PROFILE_V2 SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS "
    "SGLANG_ENABLE_NVTX_SCHEDULER SGLANG_ENABLE_NVTX_OPERATIONS SGLANG_RECORD_STEP_TIME "
    "SGLANG_ENABLE_CUDA_GRAPH_CAPTURE_TRACE SGLANG_GRAPH_BATCH_CAPTURE SGLANG_TORCH_PROFILER_DIR "
    "SGLANG_MEM_PROFILE_MAX_ENTRIES SGLANG_OTLP_EXPORTER_SCHEDULE_DELAY_MILLIS "
    "SGLANG_OTLP_EXPORTER_MAX_EXPORT_BATCH_SIZE "
    "SGLANG_TRACE_ASYNC SGLANG_TRACE_ASYNC_FLUSH_THRESHOLD SGLANG_ENABLE_METRICS_DEVICE_TIMER "
    "SGLANG_ENABLE_METRICS_DP_ATTENTION SGLANG_TRACE_LOGITS_E2E SGLANG_TRACE_LOGITS_E2E_SYNC SGLANG_TRACE_SAMPLER_E2E "
    "SGLANG_TRACE_QWEN_MOE_DEEPEP_E2E SGLANG_DEEPEP_V2_TRACE_CONTIG SGLANG_DEEPEP_V2_TRACE_MASKED "
    "SGLANG_EXPERT_LOCATION_UPDATER_LOG_INPUT SGLANG_EXPERT_LOCATION_UPDATER_LOG_METRICS "
    "SGLANG_LOG_EXPERT_LOCATION_METADATA SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR "
    "SGLANG_EPLB_HEATMAP_COLLECTION_INTERVAL "
    "SGLANG_LOG_LAZY_COMPACTION_STATS SGLANG_LOG_LAZY_COMPACTION_STATS_INTERVAL_SEC "
    "SGLANG_DSPARK_DEBUG_CONFIDENCE_METRICS "
    "SGLANG_DSPARK_DEBUG_DUMP SGLANG_DSPARK_LOG_SPS_PRED_INTERVAL SGLANG_DSPARK_STS_COLLECT_PATH "
    "SGLANG_DSPARK_ENABLE_SPS_RECORD SGLANG_KV_CANARY_STATS_PRINT_EVERY_N_STEPS "
    "SGLANG_KV_CANARY_SWA_DIVERGENCE_STATS_INTERVAL "
    "SGLANG_GDN_DECODE_FUSION_LOG_LAYER_HITS SGLANG_JIT_CACHE_DEBUG SGLANG_JIT_LOG_RESOURCE_USAGE "
    "SGLANG_JIT_BENCHMARK_DISABLE_LOG_BANDWIDTH SGLANG_JIT_BENCHMARK_DISABLE_LOG_FLOPS",
    "profiling, tracing, metrics and dumps: they record what ran and change nothing a later response is computed "
    "from")
CHECKS = _group(
    "SGLANG_DETECT_SLOW_RANK SGLANG_DEBUG_MEMORY_POOL SGLANG_VALIDATE_MAMBA_REPLAY_STATE_INDICES "
    "SGLANG_GDN_DECODE_FUSION_VERIFY_REAL_TENSORS SGLANG_DEBUG_POISON_POOL SGLANG_PHASE_CHECKER_DEBUG "
    "SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY "
    "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE SGLANG_ENABLE_TREE_CACHE_SANITY_CHECK SGLANG_CHECK_KV_PAGE_INVARIANTS "
    "SGLANG_TBO_DEBUG SGLANG_ENABLE_ASYNC_ASSERT SGLANG_ENABLE_NAN_LOGITS_CHECK SGLANG_INVARIANT_CHECK "
    "SGLANG_SANITIZE_NAN_LOGITS SGLANG_DEEPGEMM_SANITY_CHECK SGLANG_DEBUG_SYMM_MEM "
    "SGLANG_EXPERT_LOCATION_UPDATER_CANARY "
    "SGLANG_KV_CANARY_RING_CAPACITY SGLANG_KV_CANARY_ENABLE_WRITE_INPUT_ASSERT "
    "SGLANG_KV_CANARY_ENABLE_VERIFY_TOKEN_ASSERT SGLANG_KV_CANARY_ENABLE_MHA_V SGLANG_CRASH_ON_TRITON_LOAD_AFTER_READY "
    "SGLANG_CRASH_ON_JIT_COMPILE SGLANG_CRASH_ON_NUMA_BIND_FAILURE SGLANG_DSPARK_DEBUG_CONFIDENCE_PREFIX_SCHEDULER",
    "invariant checks, canaries and sanity checks: they read state and report or stop the engine, never hand a "
    "request KV or state (NaN-poisoning the pool at boot only fills free memory)")
TOKEN_ORACLE = _own(
    "SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE", "irrelevant",
    "adds `token_oracle` to `--sampling-backend`'s choices (a canary test aid): with that backend the next tokens "
    "come from a scripted oracle, not from the model, so no output is computed from any weights' KV; choosing it "
    "is `--sampling-backend`'s to classify")
DEBUG_REVERT = _refused_at_launch(
    "SGLANG_DEBUG_REVERT_PR",
    "it undoes a registered bug fix by patching SGLang's source at startup (attention metadata under CUDA graphs, "
    "the request-to-token table's size, draft steps), so which KV a request reads is no longer what the released "
    "code says (row debug-revert-pr)",
    "leave it unset (a regression-test setting)")
SIMULATIONS = (
    _refused_at_launch("SGLANG_SIMULATE_ACC_LEN",
                       "draft tokens are accepted without verification, so the draft model's unversioned state "
                       "decides outputs (row spec-simulated-accept)",
                       "leave SGLANG_SIMULATE_ACC_LEN unset (a benchmark setting)")
    + _group("SGLANG_SIMULATE_ACC_METHOD SGLANG_SIMULATE_ACC_TOKEN_MODE SGLANG_SIMULATE_ACC_GREEDY "
             "SGLANG_DSPARK_SIMULATE_FOLD SGLANG_OPT_DSV41_DSPARK_SIM_DRAW_AHEAD",
             "read only while SGLANG_SIMULATE_ACC_LEN is above 0, which vradix refuses at launch")
    + _own("SGLANG_SIMULATE_UNIFORM_EXPERTS", "irrelevant",
           "a benchmark setting that replaces the router's expert choice with a uniform draw: outputs are not the "
           "model's, by design, but every forward still reads the KV it was handed and the weights loaded now, so "
           "nothing of other weights reaches a response")
    + _own("SGLANG_SIMULATE_ROUND_ROBIN_EXPERTS", "irrelevant",
           "as SGLANG_SIMULATE_UNIFORM_EXPERTS, with a round-robin choice: synthetic routing over the current "
           "weights and the request's own KV")
)
SPECULATIVE = (
    _group("SGLANG_DSPARK_FAST_KERNEL SGLANG_DSPARK_FP32_LM_HEAD SGLANG_DSPARK_FOLDED_PROPOSAL "
           "SGLANG_DSPARK_STACKED_CTX_KV "
           "SGLANG_DSPARK_EMBED_IN_GRAPH SGLANG_DSPARK_OPT_MARKOV_W2_BF16 SGLANG_DSPARK_OPT_MARKOV_W2_TP_SHARD "
           "SGLANG_DSPARK_NVLINK_VOCAB_GATHER SGLANG_DSPARK_ENABLE_MULTI_STREAM "
           "SGLANG_DSPARK_CONFIDENCE_RELAY_LAG_STEPS "
           "SGLANG_DSPARK_FUSED_ACCEPT_TAIL SGLANG_DSPARK_ACCEPT_TAIL_MIN_BS SGLANG_DSPARK_ACCEPT_TAIL_MAX_BS "
           "SGLANG_DSPARK_DEFER_CONTEXT_KV SGLANG_OPT_DSV41_DSPARK_DRAFT_PREP_FORK SGLANG_OPT_DSV41_DSPARK_POST_FOLD "
           "SGLANG_OPT_DSV41_DSPARK_SKIP_PREFILLED_INPUTS SGLANG_OPT_DSV41_BLOCKWISE_REJECTION "
           "SGLANG_OPT_DSV41_DSPARK_ONE_LAUNCH_COMMIT_STAGE SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH "
           "SGLANG_DSPARK_BLOCK_ACCEPT_ONLINE_INTERVAL SGLANG_DSPARK_USE_GREEDY_DRAFT "
           "SGLANG_ENABLE_OVERLAP_PLAN_STREAM "
           "SGLANG_ENABLE_PP_SPEC SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION SGLANG_ENABLE_METADATA_GLUE_GRAPH "
           "SGLANG_OPT_FLASHINFER_DRAFT_HOST_INDPTR SGLANG_OPT_FLASHINFER_VERIFY_HOST_PLAN SGLANG_OPT_FUSED_KDA_VERIFY "
           "SGLANG_DFLASH_EAGER_DRAFT_SAMPLER SGLANG_ENABLE_LILICORR_SAMPLING SGLANG_LILICORR_REQUIRE_SAMPLING "
           "SGLANG_RAGGED_VERIFY_MODE SGLANG_SPEC_TP_SYNC SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH "
           "SGLANG_ENABLE_SPLITKV_VERIFY SGLANG_SPEC_EXPANSION_SAFETY_FACTOR SGLANG_ENABLE_SINGLE_CG_DRAFT "
           "SGLANG_OPT_USE_GUMBEL_SAMPLE SGLANG_ENABLE_MTP_BOUNDARY_KV_FIX SGLANG_GLM_NEXTN_MOE_PTPC "
           "SGLANG_NVFP4_CKPT_FP8_NEXTN_MOE SGLANG_OPT_SM120_MTP_ROUTER_TOP22",
           "how the draft proposes and how the target verifies (kernels, graphs, the draft's own dtype and head): "
           "the draft's KV sits in the target's namespaced slots (row spec-draft-kv) and verification is lossless "
           "at the default thresholds, so a draft of any state can change acceptance, never an output (relaxed "
           "thresholds and simulated acceptance are refused)")
    + _own("SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND", "irrelevant",
           "skips the draft's KV catch-up while drafting is off, so the draft resumes on its own older KV of the "
           "same request: lower acceptance only, since the target verifies every token losslessly")
    + _own("SGLANG_NGRAM_FORCE_GREEDY_VERIFY", "irrelevant",
           "n-gram verification takes the target's argmax: every emitted token is the target model's, computed "
           "from the request's own KV")
)
MEMORY_POOLS = (
    _group("SGLANG_NATIVE_MOVE_KV_CACHE SGLANG_DISABLE_LAZY_COMPACTION SGLANG_LAZY_COMPACTION_MAX_MOVES_PER_CALL "
           "SGLANG_COMPACTION_MAX_PAGES_PER_MOVE",
           "how the unified memory pool (`--enable-unified-memory`) moves and compacts pages: the same bytes arrive "
           "at the new place; whether that pool is versioned is the flag's to classify")
    + _group("SGLANG_USE_HND_KVCACHE SGLANG_ENABLE_KV_SHARD_ZERO_SM_GATHER SGLANG_ENABLE_POST_CAPTURE_KV_SIZING "
             "SGLANG_AITER_KV_CACHE_LAYOUT SGLANG_DSV4_KV_LAYOUT SGLANG_DSV4_COMPRESSED_KV_LAYOUT "
             "SGLANG_DSV4_UNIFIED_KV_FP8 SGLANG_DSV4_USE_BF16_KV_QUANT_SOURCE SGLANG_MAMBA_CONV_DTYPE "
             "SGLANG_MAMBA_SSM_DTYPE SGLANG_DISABLE_FUSED_MAMBA_SLOT_OPS SGLANG_HIP_DSV41_INDEX_K_PAGE8 "
             "SGLANG_OPT_SM120_DIRECT_SWA_KV SGLANG_HUGEPAGE_SIZE SGLANG_SYMM_MEM_PREALLOC_GB_SIZE",
             "the layout, dtype and size of the KV, index and state pools: what a slot holds is still written by "
             "a forward under the request's epoch and handed out by the namespaced tree")
    + _own("SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK", "irrelevant",
           "leaves a matched prefix's Mamba state unlocked during decode because the request already reads its own "
           "copy (copy-on-write into its slot): a publication that frees the node's state takes nothing the "
           "request reads")
)
SCHEDULING = (
    _group("SGLANG_INIT_NEW_TOKEN_RATIO SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS "
           "SGLANG_RETRACT_DECODE_STEPS SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION SGLANG_MAX_NEW_TOKENS_LIMIT "
           "SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR SGLANG_CACHE_HIT_RATE_WINDOW_SECONDS "
           "SGLANG_PREFILL_DELAYER_MAX_DELAY_PASSES SGLANG_PREFILL_DELAYER_TOKEN_USAGE_LOW_WATERMARK "
           "SGLANG_DATA_PARALLEL_BUDGET_INTERVAL SGLANG_PREFILL_TILE_BUDGET SGLANG_PREFILL_TILE_BUDGET_MODE "
           "SGLANG_PREFILL_DELAYER_MAX_PREFILL_BS_WINDOW_SIZE SGLANG_EXACT_CHUNK_FILL "
           "SGLANG_SCHEDULER_RECV_SKIPPER_WEIGHT_DEFAULT SGLANG_SCHEDULER_RECV_SKIPPER_WEIGHT_DECODE "
           "SGLANG_SCHEDULER_RECV_SKIPPER_WEIGHT_TARGET_VERIFY SGLANG_SCHEDULER_RECV_SKIPPER_WEIGHT_NONE "
           "SGLANG_EMPTY_CACHE_INTERVAL SGLANG_SCHEDULER_MAX_RECV_PER_POLL SGLANG_SCHEDULER_SKIP_ALL_GATHER "
           "SGLANG_SCHEDULER_DECREASE_PREFILL_IDLE SGLANG_KILLPG_ON_SCHEDULER_EXCEPTION SGLANG_REQ_WAITING_TIMEOUT "
           "SGLANG_REQ_RUNNING_TIMEOUT SGLANG_FORCE_STREAM_INTERVAL SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP "
           "SGLANG_ENABLE_DELAY_SAMPLE SGLANG_ENABLE_WAR_BARRIER SGLANG_FORCE_COARSE_WAR_BARRIER "
           "SGLANG_ENABLE_PREFILL_WAR_READ_DONE SGLANG_PP_SKIP_PURE_CHUNKED_OUTPUT_COMM SGLANG_PP_COMM_OVERLAP "
           "SGLANG_NCCL_ALL_GATHER_IN_OVERLAP_SCHEDULER_SYNC_BATCH SGLANG_FORCE_CONFIDENTIAL_COMPUTE "
           "SGLANG_MAX_BATCH_REQS_PER_HTTP_REQ",
           "admission budgets, chunk sizes, polling, timeouts, streaming and overlap barriers: they decide when a "
           "request runs, not what KV it reads, which the namespaced match and the per-batch backstop decide")
    + _own("SGLANG_ENABLE_DISAGG_PREFILL_CONTINUOUS_INPUT_POLLING", "irrelevant",
           "a P/D prefill role keeps receiving while results are pending; SGLang then counts the result queue's "
           "batches among the in-flight requests (`collect_inflight_reqs`), which a publication reads")
    + _own("SGLANG_ENABLE_WAITING_PREFIX_REFRESH", "irrelevant",
           "touches the LRU time of waiting requests' cached prefixes (`touch_waiting_prefix`): it hands no KV; the "
           "match that does runs through `match_kv_cache`, before which vradix re-binds the request")
)
RADIX = (
    _own("SGLANG_RADIX_FORCE_MISS", "irrelevant", "every prefix match misses: less reuse, never stale reuse")
    + _own("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", "versioned",
           "chooses the tree core (Rust or Python) under UnifiedRadixCache; vradix attaches to either and the "
           "cache-level tests run on both",
           ("test_cache_level.py::test_stale_prefix_misses_after_bump_and_is_cached_again",
            "test_cache_level.py::test_lazy_rebind_at_match_covers_requests_the_bump_did_not_see"))
    + _group("SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD SGLANG_MAX_KV_CHUNK_CAPACITY SGLANG_DISABLE_HISPARSE_PREFETCH "
             "SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS SGLANG_SWA_EVICTION_INTERVAL "
             "SGLANG_OPT_RELEASE_PREFILL_SWA",
             "when out-of-window SWA KV is freed or made evictable, how a cached prefix is attended in chunks, "
             "and whether HiSparse prefetches: they free or read the request's own matched KV, never add a match")
)
PD = (
    _group("SGLANG_DISAGGREGATION_THREAD_POOL_SIZE SGLANG_DISAGGREGATION_QUEUE_SIZE SGLANG_ENABLE_DISAGG_SAMPLING_MASK "
           "SGLANG_DISAGGREGATION_SAMPLING_MASK_MAX_TOKENS SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT "
           "SGLANG_DISAGGREGATION_ZMQ_SEND_TIMEOUT SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL "
           "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE SGLANG_DISAGGREGATION_WAITING_TIMEOUT "
           "SGLANG_DISAGGREGATION_ENGINE_INIT_TIMEOUT SGLANG_DISAGGREGATION_NIXL_BACKEND "
           "SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS SGLANG_DISAGGREGATION_ZMQ_MAX_SOCKETS "
           "SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK "
           "SGLANG_DISAGGREGATION_BOOTSTRAP_ENTRY_CLEANUP_INTERVAL SGLANG_DISAGG_STAGING_BUFFER "
           "SGLANG_DISAGG_STAGING_POOL_SIZE_MB SGLANG_STAGING_USE_TORCH SGLANG_MOONCAKE_CUSTOM_MEM_POOL "
           "SGLANG_MOONCAKE_MAX_TRANSFER_BATCH_INDICES ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE ASCEND_NPU_PHY_ID "
           "SGLANG_MOONCAKE_SEND_AUX_TCP SGLANG_ENABLE_FAILED_SESSION_PROBE SGLANG_FAILED_SESSION_PROBE_INTERVAL_S "
           "SGLANG_FAILED_SESSION_PROBE_MAX_INTERVAL_S SGLANG_FAILED_SESSION_IDLE_TIMEOUT_S SGLANG_MORI_SEND_AUX_RDMA "
           "SGLANG_MORI_QP_PER_TRANSFER SGLANG_MORI_POST_BATCH_SIZE SGLANG_MORI_NUM_WORKERS "
           "SGLANG_MORI_TRANSFER_SHARDS "
           "SGLANG_MORI_WAIT_POLL_MS SGLANG_MORI_TRANSFER_TIMEOUT_MS",
           "the P/D transport (threads, queues, timeouts, heartbeats, RDMA and staging buffers, backends): it moves "
           "prefill's KV and metadata, and decode checks the weight identity that travels with them at the commit "
           "(row pd-handshake) whichever way they came")
    + _own("SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX", "versioned",
           "prefill sends its cached prefix before the rest of the prompt is computed; decode commits nothing "
           "until the handshake has checked prefill's weight identity, early pages included (on by default, so "
           "the P/D tests run with it)",
           ("test_pd_ledger.py::test_a_received_transfer_is_stamped_at_commit_and_passes_its_first_prebuilt_check",
            "test_e2e_pd.py::test_skew_with_prefill_updated_first_fails_the_request_and_caches_nothing"))
    + _group("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE "
             "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT",
             "an aborted decode request's pages are held until prefill acknowledges that its transfers finished "
             "(SGLang's drain ack): held memory, never inserted or matched")
)
DISTRIBUTED = _group(
    "SGLANG_ONE_VISIBLE_DEVICE_PER_PROCESS SGLANG_RAY_BUNDLE_INDICES SGLANG_DISTRIBUTED_INIT_METHOD_OVERRIDE "
    "SGLANG_IS_FIRST_RANK_ON_NODE SGLANG_SYNC_TOKEN_IDS_ACROSS_TP SGLANG_ENABLE_COLOCATED_BATCH_GEN "
    "SGLANG_SHARED_EXPERT_TP1 SGLANG_ENABLE_EMBED_REPLICATION SGLANG_SET_CPU_AFFINITY SGLANG_NUMA_BIND_V2 "
    "SGLANG_AUTO_NUMA_BIND SGLANG_EPLB_P2P_BATCH_CHUNK_SIZE",
    "process placement, ranks, affinity and how weights are sharded or replicated across ranks: each rank loads "
    "the same published tensors through `load_weights` and every rank bumps with each publication (row tp-ranks)")
HICACHE = (
    _own("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", "versioned",
         "where the `file` L3 store keeps pages; their keys carry the namespace and so the weight identity, and "
         "every page is attributed to its identity in the manifest (rows hicache-l3, and `vradix.l3 gc`)",
         ("test_e2e_hicache.py::test_vradix_restart_on_new_weights_never_reads_the_old_weights_pages",
          "test_l3.py::test_the_landing_guard_discards_a_prefetch_the_publication_did_not_revoke"))
    + _own("SGLANG_HICACHE_DECODE_OFFLOAD_STRIDE", "versioned",
           "how often P/D decode offloads KV to L3; a crossing request offloads none of its mixed KV and every "
           "offloaded page is attributed to its identity (row pd-decode-offload)",
           ("test_pd_decode_offload.py::test_a_request_that_crossed_a_publication_offloads_none_of_its_mixed_kv",
            "test_pd_decode_offload.py::test_every_page_decode_offloads_is_in_the_manifest_under_its_identity"))
    + _group("SGLANG_HICACHE_HOST_REGISTER_CHUNK_GB SGLANG_HICACHE_TMA_TRANSFER SGLANG_MLA_DEDUP_CHUNK_TOKENS "
             "SGLANG_HICACHE_HF3FS_CONFIG_PATH SGLANG_HICACHE_SKIP_HOST_DUPLICATE_RECLAIM "
             "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE SGLANG_HICACHE_FILE_BACKEND_EVICTION_RATIO "
             "SGLANG_HICACHE_FILE_BACKEND_MIN_FREE_SPACE SGLANG_HICACHE_FILE_BACKEND_ENABLE_METADATA_CACHE "
             "SGLANG_HICACHE_FILE_BACKEND_METADATA_TTL SGLANG_HICACHE_BUFFER_ANCHOR_LOCK_CAP "
             "SGLANG_ENABLE_HICACHE_SWA_TAIL_ONLY_BACKUP SGLANG_HICACHE_NIXL_BACKEND_STORAGE_DIR "
             "SGLANG_HICACHE_NIXL_USE_DIRECT_IO SGLANG_HICACHE_HOST_PARALLEL_ALLOC_THREADS "
             "SGLANG_HICACHE_MOONCAKE_CONFIG_PATH SGLANG_HICACHE_MOONCAKE_REUSE_TE MOONCAKE_MASTER MOONCAKE_CLIENT "
             "MOONCAKE_LOCAL_HOSTNAME MOONCAKE_TE_META_DATA_SERVER MOONCAKE_GLOBAL_SEGMENT_SIZE MOONCAKE_PROTOCOL "
             "MOONCAKE_DEVICE MOONCAKE_MASTER_METRICS_PORT MOONCAKE_CHECK_SERVER MOONCAKE_STANDALONE_STORAGE "
             "MOONCAKE_ENABLE_SSD_OFFLOAD MOONCAKE_OFFLOAD_FILE_STORAGE_PATH MOONCAKE_TENANT_ID "
             "SGLANG_HICACHE_MEMCACHE_CONFIG_PATH SGLANG_NPU_MEMCACHE_ENABLE_WARMUP",
             "where and how HiCache's host pool and L3 stores keep, transfer, register and evict pages: every L3 "
             "key is seeded by the request's `extra_key`, which carries the weight identity, and every copy carries "
             "its page's epoch (rows hicache-l2, hicache-l3, hicache-buffer-only); none of these changes what a key "
             "names, and a store shared across engines sees distinct keys for distinct weights")
)
CACHE_DIRS = _group(
    "SGLANG_CACHE_DIR SGLANG_CUTE_AOT_CACHE_DIR SGLANG_DG_CACHE_DIR SGLANG_JIT_CACHE_DIR SGLANG_JIT_CACHE_KEEP "
    "SGLANG_JIT_FORCE_RECOMPILE SGLANG_SAIL_GPU_ARCH SGLANG_LORA_MOE_CONFIG_DIR SGLANG_LORA_DENSE_CONFIG_DIR "
    "SGLANG_USE_CUSTOM_TRITON_KERNEL_CACHE SGLANG_TRITON_SLOW_COMPILE_THRESHOLD_SECS "
    "SGLANG_TRITON_LOAD_WARNING_THRESHOLD_GB SGLANG_JIT_DEEPGEMM_PRECOMPILE SGLANG_JIT_DEEPGEMM_FAST_WARMUP "
    "SGLANG_IN_DEEPGEMM_PRECOMPILE_STAGE SGLANG_DG_USE_NVRTC SGLANG_PP_PARALLEL_DEEPGEMM_WARMUP "
    "SGLANG_FLASHINFER_AUTOTUNE_CACHE SGLANG_FLASHINFER_AUTOTUNE_EXTEND SGLANG_ENABLE_FLUX3_PRIMS_TS_AUTOTUNE "
    "SGLANG_OPT_FLUX3_PRIMS_TS_TUNING_BUCKETS",
    "compiled-kernel caches, tuning tables and their warm-up: they hold compiled code and tile choices keyed by "
    "shape, never weights or KV")
TORCH_COMPILE = _own(
    "SGLANG_ENABLE_TORCH_COMPILE", "irrelevant",
    "SGLang sets it from `--enable-torch-compile` so the FlashInfer backends pick compile-friendly wrappers; the "
    "CPU graph runner's compile, which freezes weights, is refused with that flag (row cpu-torch-compile)")
MULTIMODAL = (
    _own("SGLANG_VLM_CACHE_SIZE_MB", "versioned",
         "the size of the multimodal embedding cache (content-hash keys): every publication and lock-aware flush "
         "clears it (row mm-embeddings)",
         ("test_mm_embedding_cache.py::test_a_publication_clears_the_multimodal_embedding_cache",
          "test_e2e_multimodal.py::test_a_publication_recomputes_image_embeddings"))
    + _own("SGLANG_MM_SKIP_COMPUTE_HASH", "irrelevant",
           "every multimodal item gets a fresh random hash instead of its content hash: no embedding cache hit and "
           "no cross-request prefix reuse of image tokens, never a stale one")
    + _own("SGLANG_MM_PRECOMPUTE_HASH", "irrelevant",
           "computes the same content hash earlier, in the tokenizer process; the embedding cache it keys is "
           "cleared at every publication")
    + _group("SGLANG_IMAGE_MAX_PIXELS SGLANG_RESIZE_RESAMPLE SGLANG_MM_BUFFER_SIZE_MB "
             "SGLANG_FORCE_CPU_IMAGE_PREPROCESSING SGLANG_MM_AVOID_RETOKENIZE SGLANG_USE_CUDA_IPC_TRANSPORT "
             "SGLANG_USE_IPC_POOL_HANDLE_CACHE SGLANG_MM_FEATURE_CACHE_MB SGLANG_MM_ITEM_MEM_POOL_RECYCLE_INTERVAL_SEC "
             "SGLANG_INKLING_RS_MM_PREPROCESS SGLANG_MINIMAX_VIT_TOKEN_BLOCK",
             "image preprocessing and the transport of preprocessed inputs (pixels, not embeddings) to the "
             "scheduler: they read no weights")
    + _group("SGLANG_VIT_ENABLE_CUDA_GRAPH SGLANG_VIT_ENABLE_VECTORIZED_POS_EMBED "
             "SGLANG_KIMI_K3_VIT_CUDA_GRAPH_CACHE_CAPACITY SGLANG_KIMI_K3_VIT_CUDA_GRAPH_MIN_HITS "
             "SGLANG_KIMI_K3_VIT_CUDA_GRAPH_MAX_SEQLEN",
             "how the vision tower runs (captured graphs per shape, a vectorised position interpolation): the "
             "graphs read the tower's parameters in place, which updates write in place, and the interpolation "
             "memos are dropped at every publication (row vit-pos-emb)")
)
ENCODER = _group(
    "SGLANG_ENCODER_GRPC_TIMEOUT_SECS SGLANG_ENCODER_MM_RECEIVER_MODE SGLANG_ENCODER_RECV_TIMEOUT "
    "SGLANG_ENCODER_SEND_TIMEOUT SGLANG_ENCODER_HTTP_TIMEOUT SGLANG_ENCODER_REQ_TIMEOUT "
    "SGLANG_ENCODER_DISPATCH_MIN_ITEMS "
    "SGLANG_ENCODER_IMAGE_PROCESSOR_USE_GPU SGLANG_ENCODER_MAX_BATCH_SIZE SGLANG_ENCODER_PREPROC_WORKERS "
    "SGLANG_ENCODER_MM_LOAD_WORKERS SGLANG_ENCODER_BOOTSTRAP_HEALTH_CHECK_INTERVAL "
    "SGLANG_ENCODER_BOOTSTRAP_HEALTH_CHECK_TIMEOUT SGLANG_ENCODER_BOOTSTRAP_EVICTED_TTL SGLANG_EMBEDDING_POOL_SIZE_MB "
    "SGLANG_ENCODER_DP_WORKER_MAX_INFLIGHT",
    "tunes encoder disaggregation (EPD), which vradix refuses at launch (`--encoder-only`, `--language-only`, "
    "`--enable-mm-global-cache`; rows epd-*): without those flags nothing reads these")
# SGLang refuses every weight-update call while these derived caches exist (`_unsupported_derived_weight_cache_error`)
SGLANG_REFUSES_UPDATES = (
    _own("SGLANG_OPT_HOPPER_BLOCK_FP8_BF16", "refused",
         "the BF16 expansions of Hopper group-32 FP8 weights are a derived cache: the layer declares "
         "`_derived_weight_cache_error`, so SGLang refuses every weight update, and vradix publishes only a "
         "successful one and refuses the bucketed update's begin a P2P/RDMA write would use (row sglang-guarded)",
         SGLANG_GUARDED, "SGLANG_OPT_HOPPER_BLOCK_FP8_BF16=0 (named in SGLang's error), or restart on the new weights")
    + _own("SGLANG_OPT_DEEPGEMM_HC_PRENORM", "refused",
           "the compensated mHC weight splits are a derived cache SGLang refuses every weight update for, and "
           "vradix refuses the bucketed update's begin that would bypass that check (row sglang-guarded)",
           SGLANG_GUARDED, "SGLANG_OPT_DEEPGEMM_HC_PRENORM=0 (named in SGLang's error), or restart on the new weights")
    + _own("SGLANG_OPT_BF16_FP32_GEMM_ALGO", "refused",
           "`hpc` caches bf16xfp32 weight splits (`hpc_bf16xfp32_gemm_enabled`), for which SGLang refuses every "
           "weight update, and vradix the bucketed update's begin (row sglang-guarded); `cublas` (the default) keeps "
           "none",
           SGLANG_GUARDED, "SGLANG_OPT_BF16_FP32_GEMM_ALGO=cublas")
)
# vradix refuses, on every update path, an update that would leave one of these copies stale (row gpu-derived)
GPU_DERIVED_COPIES = (
    _own("SGLANG_K3_FUSED_FRONT", "refused",
         "Kimi-K3 merges the router gate, shared gate_up and latent down_proj into one front weight (`_front_w`), "
         "rebuilt as a new tensor captured CUDA graphs do not see: vradix refuses an update it would leave stale "
         "(`post_load.GPU_DERIVED_COPIES`)", GPU_DERIVED,
         "restart on the new checkpoint, or serve without CUDA graphs")
    + _own("SGLANG_ROCM_K3_FUSE_KDA_INPROJ", "refused",
           "Kimi-K3 on ROCm folds the KDA [f_a | b] rows into the wide in-proj buffer (`_bfa_w`), a copy vradix "
           "refuses to leave stale under captured graphs (`post_load.GPU_DERIVED_COPIES`)", GPU_DERIVED,
           "restart on the new checkpoint, or serve without CUDA graphs")
    + _own("SGLANG_OPT_DEEPGEMM_MEGA_MOE_FUSE_SHARED_EXPERTS", "refused",
           "MegaMoE fuses the shared experts into weights built once after the startup load "
           "(`mega_shared_l1_weights`), which no update rebuilds: vradix refuses every update of a model holding "
           "them (`post_load.GPU_DERIVED_COPIES`)", GPU_DERIVED, "restart on the new checkpoint")
    + _own("SGLANG_AMD_USE_FLYDSL_MEGA_MOE", "refused",
           "the ROCm MegaMoE path repacks the experts in place once (`_mega_moe_weights_built`), which no update "
           "redoes: vradix refuses every update of a model holding them (`post_load.GPU_DERIVED_COPIES`)",
           GPU_DERIVED, "restart on the new checkpoint")
)
# direct tensor updates vradix refuses while a weight loader's derived buffer is built (row loader-derived-direct)
LOADER_DERIVED = _own(
    "SGLANG_OPT_LINEARIZED_SHARED_SINK", "refused",
    "Inkling's weight loader restacks the shared experts' w2 into `_w2_lin` at every load of w2; a "
    "`load_format=\"direct\"` tensor update copies into the parameter without it, so vradix refuses such an update "
    "before loading while the buffer is built (`post_load.LOADER_DERIVED`); every other update runs the loader",
    ("test_weight_derived.py::test_a_direct_update_while_a_weight_loader_buffer_is_built_is_refused",),
    "send the bucket with load_format=None (the weight loader rebuilds the buffer)")
# launch refusals of `vradix.closed_world.unversioned` for settings that keep weight-derived copies no update refreshes,
# or that corrupt what a request reads on purpose
REFUSED_SETTINGS = (
    _refused_at_launch("SGLANG_RUST_SERVER",
                       "the embedded Rust frontend replaces the HTTP server and TokenizerManager, where vradix's "
                       "launcher steps run (provenance, the staleness 400, the bucketed update's hold, the flush "
                       "report, the inspector; row rust-server)",
                       "the Python HTTP server (leave SGLANG_RUST_SERVER unset)")
    + _own("SGLANG_RUST_BUILD_MODE", "irrelevant",
           "how the Rust frontend extension is built; the frontend itself (SGLANG_RUST_SERVER) is refused")
    + _refused_at_launch("SGLANG_ROCM_OPT_DSPARK_FP8_LM_HEAD",
                         "the FP8 copy of the target's lm_head is quantized at first use and never rebuilt by an "
                         "update (row dspark-fp8-lm-head)",
                         "leave it unset (the lm_head GEMM reads the live weight)")
    + _refused_at_launch("SGLANG_OPT_FUSE_SWIGLU_INTERLEAVED",
                         "w13 is permuted in place after loading and no update restores the checkpoint layout first "
                         "(row swiglu-interleaved)",
                         "leave it unset (the separate SwiGLU reads the checkpoint layout)")
    + _own("SGLANG_OPT_BEAM_DECODE_GEMV", "irrelevant",
           "requires SGLANG_OPT_FUSE_SWIGLU_INTERLEAVED, which vradix refuses at launch")
    + _refused_at_launch("SGLANG_DSV4_DENSE_MXSCALE",
                         "the e8m0 copy of each dense weight's scale is built after loading and a tensor, "
                         "distributed or IPC update leaves it computed from the old scales (row dsv4-dense-mxscale)",
                         "leave it unset (the fp32-scale GEMM reads the live scales)")
    + _own("SGLANG_DSV4_DENSE_MXSCALE_SHAPES", "irrelevant",
           "the shapes SGLANG_DSV4_DENSE_MXSCALE applies to; that setting is refused at launch")
    + _refused_at_launch("SGLANG_DEBUG_HISPARSE_SKIP_IO",
                         "the HiSparse swap-in skips the KV copy, so a request attends over what its slots held "
                         "before, KV of other requests and weights (row hisparse-skip-io)",
                         "leave it unset (a timing probe)")
)
KV_CANARY_PERTURBATIONS = (
    [entry for name in ("SGLANG_KV_CANARY_PERTURB_REQ_TO_TOKEN_PROB", "SGLANG_KV_CANARY_PERTURB_REAL_KV_USED_PROB",
                        "SGLANG_KV_CANARY_PERTURB_REAL_KV_UNUSED_CACHE_PROB",
                        "SGLANG_KV_CANARY_PERTURB_REAL_KV_POST_FORWARD_PROB",
                        "SGLANG_KV_CANARY_PERTURB_NEXT_TOKEN_SWAP_PROB")
     for entry in _refused_at_launch(name, "a KV canary fault injection corrupts what a request reads on purpose "
                                           "(its slot table, KV rows or next token; row kv-canary-perturb)",
                                     "leave it unset (the canary without perturbation only detects)")]
    + _group("SGLANG_KV_CANARY_PERTURB_WARMUP_STEPS SGLANG_KV_CANARY_PERTURB_TARGET_GROUP",
             "read only while a SGLANG_KV_CANARY_PERTURB_*_PROB is above 0, which vradix refuses at launch")
)
WEIGHTS_THEMSELVES = (
    _group("SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE SGLANG_DSV41_ENGRAM_HOST_TABLE_LAYOUT "
           "SGLANG_OPT_DSV41_ENGRAM_PEER_SHARDS "
           "SGLANG_OPT_DSV41_ENGRAM_HOST_STAGING SGLANG_OPT_ENGRAM_EXTEND_HASH",
           "where the DeepSeek-V4.1 engram table lives (host memory, peer-mapped device shards) and how its rows "
           "are gathered: the table is the engram weights' own storage, written by the loader and by every update, "
           "not a copy beside them")
    + _own("SGLANG_DSV4_FP4_DEQUANT", "irrelevant",
           "the loader converts DeepSeek-V4's FP4 experts to FP8 as they are loaded: the converted experts are the "
           "parameters, not a copy kept beside them, and each load through the loader converts again")
)
QUANTIZATION = _group(
    "SGLANG_DSV4_FP4_EXPERTS SGLANG_INT4_WEIGHT SGLANG_CPU_QUANTIZATION SGLANG_FORCE_FP8_MARLIN "
    "SGLANG_MOE_NVFP4_DISPATCH SGLANG_NVFP4_CKPT_FP8_GEMM_IN_ATTN SGLANG_QUANT_ALLOW_DOWNCASTING "
    "SGLANG_FORCE_MXFP8_BLOCK_CONVERT_DENSE SGLANG_FP8_IGNORED_LAYERS SGLANG_FP4_IGNORED_LAYERS "
    "SGLANG_NPU_ARCH35_REQUANT_BLOCK_FP8 SGLANG_NPU_W4A4_NEW_PACKING SGLANG_NPU_DISABLE_ACL_FORMAT_WEIGHT "
    "SGLANG_ROCM_MXFP8_AITER_PRESHUFFLE SGLANG_HUMMING_ONLINE_QUANT_CONFIG SGLANG_HUMMING_INPUT_QUANT_CONFIG "
    "SGLANG_USE_AITER_MOE_GU_ITLV SGLANG_DSA_HIP_DISABLE_PRESHUFFLE",
    "which quantization, packing or layout a quantization method applies to the loaded weights in its post-load "
    "step: the result replaces the parameters (no copy is kept beside them), and a disk update or a bucketed update's "
    "end reruns the step (`load_weights_and_postprocess`, `postprocess_weights`). A plain tensor update writes through "
    "the parameters' weight loaders without rerunning it, as for any quantized checkpoint with a post-load layout: "
    "that is the quantization method's property, not this setting's (the one SGLang documents as incompatible with "
    "updates, SGLANG_OPT_FUSE_SWIGLU_INTERLEAVED, is refused)")
KERNELS = _group(
    # AMD, ROCm and AITER
    "SGLANG_USE_AITER SGLANG_DISABLE_GFX1250_FP8_GEMM SGLANG_AITER_INTREE_GEMM_TUNE SGLANG_AITER_INTREE_MHC_TILE_M16 "
    "SGLANG_M3_USE_AITER_FUSED_QKNORM SGLANG_USE_AITER_AG SGLANG_DP_USE_REDUCE_SCATTER SGLANG_ENABLE_DP_GATHER_FP8 "
    "SGLANG_USE_AITER_UNIFIED_ATTN SGLANG_GFX1250_W4A8_BACKEND SGLANG_GFX1250_W4A8_KERNEL_GATHER "
    "SGLANG_AITER_MOE_SORTING_DISPATCH_POLICY SGLANG_AITER_FUSE_RMSNORM_PAD SGLANG_ROCM_FUSED_DECODE_MLA "
    "SGLANG_ROCM_DISABLE_LINEARQUANT USE_ROCM_AITER_ROPE_BACKEND SGLANG_ROCM_USE_MULTI_STREAM "
    "SGLANG_ROCM_SMALLM_ROUTER "
    "SGLANG_ROCM_SMALLM_MOE SGLANG_ROCM_SMALLM_FP8_PROJ SGLANG_ROCM_USE_AITER_FP4_ASM_GEMM "
    "SGLANG_ROCM_K3_FUSE_KDA_INPROJ_MAX_TOKENS SGLANG_HACK_FLASHMLA_BACKEND SGLANG_USE_AITER_FP8_PER_TOKEN "
    "SGLANG_AMD_FLYDSL_MEGA_MOE_MTPR SGLANG_AMD_FLYDSL_MEGA_MOE_DECODE_MTPR SGLANG_AMD_FLYDSL_MEGA_QUANT "
    "SGLANG_AITER_MEGA_RANK_SYNC SGLANG_AITER_MEGA_EPLB_PREFILL_ONLY SGLANG_AITER_MEGA_EPLB_FUSED_MAP_RECORD "
    "SGLANG_AITER_HONOR_EXPLICIT_MEM_FRACTION SGLANG_AITER_MLA_GLUON SGLANG_AITER_MLA_DECODE_BACKEND "
    "SGLANG_AITER_MLA_VERIFY_BACKEND SGLANG_AITER_MLA_AUTO_KV_SPLITS SGLANG_AITER_GFX942_BLOCKSCALE_USE_CK "
    "SGLANG_OPT_USE_AITER_SILU_MUL SGLANG_OPT_USE_FUSED_QK_NORM_ROPE SGLANG_OPT_FUSED_QK_NORM_ROPE_VERIFY "
    "SGLANG_OPT_USE_AITER_INDEXER SGLANG_DSV4_FP4_LOGITS_BUDGET_MB SGLANG_MLA_HCA_KV_SPLITS "
    "SGLANG_AITER_UNIFIED_DRAFT_EXTEND SGLANG_AITER_ASM_PREFILL_HD128 SGLANG_AITER_PAGED_PREFILL_ASM "
    # Apple, Ascend, MUSA, XPU
    "SGLANG_USE_MLX SGLANG_MLX_USE_CUSTOM_ROPE SGLANG_MLX_FUSE_SWIGLU SGLANG_MLX_CLEAR_CACHE_STEPS "
    "SGLANG_MLX_CACHE_LIMIT_GB SGLANG_NPU_USE_MULTI_STREAM SGLANG_NPU_FINE_GRAINED_MOE_DUAL_STREAM "
    "SGLANG_NPU_USE_MLAPO "
    "SGLANG_NPU_MOE_SITU_MXFP8_FUSED SGLANG_NPU_ENABLE_SPARSE_KV_OFFLOAD SGLANG_NPU_USE_FIAS_V2_BSND "
    "SGLANG_OPT_NPU_BF16_WO_A_GEMM SGLANG_NPU_FORWARD_NATIVE_GELUTANH SGLANG_NPU_FORWARD_NATIVE_GEMMA_RMS_NORM "
    "SGLANG_USE_AG_AFTER_QLORA SGLANG_NPU_USE_SCATTER_PA_KV_CACHE SGLANG_NPU_USE_TRITON_PREFIX_KV_CACHE_STORE "
    "DEEP_NORMAL_MODE_USE_INT8_QUANT SGLANG_ZBAL_LOCAL_MEM_SIZE SGLANG_ZBAL_BOOTSTRAP_URL "
    "SGLANG_NPU_ATTN_BACKEND_NEEDS_CPU_SEQ_LENS SGLANG_MUSA_FA3_FORCE_UPDATE_METADATA SGLANG_XPU_LN_MOD_NUM_WARPS "
    # quantized GEMMs and MoE
    "SGLANG_ENABLE_FP8_GEMM_CONFIG_TUNE SGLANG_HUMMING_USE_F16_ACCUM SGLANG_HUMMING_MOE_GEMM_TYPE "
    "SGLANG_IS_FLASHINFER_AVAILABLE SGLANG_FLASHINFER_USE_PAGED SGLANG_FLASHINFER_WORKSPACE_SIZE "
    "SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK SGLANG_FLASHINFER_MEGAMOE_MAX_TOKENS_PER_RANK "
    "SGLANG_FLASHINFER_MEGAMOE_IN_KERNEL_FC2_REDUCE SGLANG_FLASHINFER_MEGAMOE_COMBINE_DTYPE "
    "SGLANG_FLASHINFER_NVFP4_PER_TOKEN_ACTIVATION SGLANG_FLASHINFER_CUTEDSL_NVFP4_W4A16 "
    "SGLANG_TRTLLM_MOE_PDL_MAX_TOKENS "
    "SGLANG_FLASHINFER_MOE_FUSED_FINALIZE SGLANG_OPT_SM120_NVFP4_PHASE_LAYOUT SGLANG_EXPERIMENTAL_LORA_OPTI "
    "SGLANG_ENABLE_LORA_CSGMV_SPLIT_K FLASHINFER_NVFP4_4OVER6 FLASHINFER_NVFP4_4OVER6_E4M3_USE_256 "
    "SGLANG_SKIP_SOFTMAX_PREFILL_THRESHOLD_SCALE_FACTOR SGLANG_SKIP_SOFTMAX_DECODE_THRESHOLD_SCALE_FACTOR "
    "SGLANG_TRTLLM_MHA_DECODE_SEQ_LEN_SPLITS SGLANG_SM120_FLASHMLA_BACKEND SGLANG_FLASHINFER_PREFILL_SPLIT_TILE_SIZE "
    "SGLANG_FLASHINFER_DECODE_SPLIT_TILE_SIZE SGLANG_USE_SAGE_ATTENTION_IMPL "
    # Triton, DeepGEMM, MoE dispatch, top-k, fused ops
    "SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS SGLANG_DISABLE_LEAN_ATTENTION SGLANG_FORCE_LEAN_GRID_CU_MULT "
    "SGLANG_TRITON_COMPACT_EXTEND_ATTENTION SGLANG_MLA_DECODE_TUNE SGLANG_TRITON_FP8_PREFILL_ATTN "
    "SGLANG_TRITON_DENSE_PREFILL_ATTN SGLANG_TRITON_DECODE_SPLIT_TILE_SIZE SGLANG_ENABLE_JIT_DEEPGEMM "
    "SGLANG_ENABLE_BF16_SPLITK_GEMM SGLANG_DEEPGEMM_STANDARD_LAYOUT SGLANG_DEEPGEMM_MASKED_MEMORY_BUDGET_FRACTION "
    "SGLANG_OPT_DG_MASKED_M_CAP SGLANG_OPT_DG_COMPACT_EAGER SGLANG_OPT_MASK_DP_PAD_MOE SGLANG_USE_DEEPGEMM_BMM "
    "SGLANG_DEEPGEMM_PDL SGLANG_DEEPEP_BF16_DISPATCH SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK "
    "SGLANG_DEEPEP_V2_NUM_MAX_DISPATCH_TOKENS_PER_RANK SGLANG_DEEPEP_V2_NUM_SMS SGLANG_DEEPEP_V2_ENABLE_PREFILL_EXPAND "
    "SGLANG_DEEPEP_LL_COMBINE_SEND_NUM_SMS SGLANG_BLACKWELL_OVERLAP_SHARED_EXPERTS_OUTSIDE_SBO "
    "SGLANG_ENABLE_QWEN_DEEPEP_SHARED_OVERLAP SGLANG_DISABLE_STATIC_WATERFILL SGLANG_NIXL_EP_BF16_DISPATCH "
    "SGLANG_NIXL_EP_NUM_MAX_DISPATCH_TOKENS_PER_RANK SGLANG_PPLX_NUM_MAX_DISPATCH_TOKENS_PER_RANK "
    "SGLANG_ENABLE_MOE_DEFERRED_FINALIZE SGLANG_MOE_DEFERRED_FINALIZE_MAX_TOKENS SGLANG_OPT_MOE_QUANT_ONCE "
    "SGLANG_DEEPEP_V2_FORCE_MAX_LEN SGLANG_MORI_NUM_MAX_DISPATCH_TOKENS_PER_RANK SGLANG_MORI_EP_V2 "
    "SGLANG_MORI_DISPATCH_DTYPE SGLANG_MORI_COMBINE_DTYPE SGLANG_MORI_PREALLOC_MAX_RECV_TOKENS SGLANG_MORI_RECV_BOUND "
    "SGLANG_OPT_MXFP4_DEFERRED_FINALIZED_SHAPE SGLANG_MORI_MOE_MAX_INPUT_TOKENS "
    "SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK SGLANG_OPT_DEEPGEMM_MEGA_MOE_RESERVED_SMS "
    "SGLANG_OPT_DEEPGEMM_MEGA_GATE SGLANG_OPT_USE_FUSED_HASH_TOPK SGLANG_OPT_USE_JIT_KERNEL_GROUPED_TOPK "
    "SGLANG_OPT_USE_TOPK_V2 SGLANG_MINICPM_FUSE_TOPK SGLANG_MINICPM_DENSE_AS_SPARSE SGLANG_MINICPM_FORCE_DENSE "
    "SGLANG_USE_SGL_FA3_KERNEL SGLANG_FORCE_FUSED_OP_BACKEND USE_TRITON_W8A8_FP8_KERNEL SGLANG_MOE_PADDING "
    # logits, all-reduce, RoPE, graphs
    "SGLANG_RETURN_ORIGINAL_LOGPROB SGLANG_ENABLE_LOGPROB_CHUNK SGLANG_LOGPROB_CHUNK_SIZE "
    "SGLANG_ENABLE_FAST_INPUT_LOGPROBS SGLANG_ENABLE_DETERMINISTIC_INFERENCE SGLANG_USE_1STAGE_ALLREDUCE "
    "SGLANG_DETERMINISTIC_NCCL_NCHANNELS SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2 SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB "
    "SGLANG_FORCE_CUSTOM_ALL_REDUCE_V2_PULL_SIZE_KB SGLANG_FORCE_CUSTOM_ALL_REDUCE_V2_PUSH_SIZE_KB "
    "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE SGLANG_PCIE_IPC_MAX_NUMEL SGLANG_ROPE_CACHE_FP32 SGLANG_ROPE_CACHE_SAFETY_MARGIN "
    "SGLANG_ROPE_CACHE_ALIGN SGLANG_USE_BREAKABLE_CUDA_GRAPH SGLANG_ENABLE_CUDA_GRAPH_DEDUP "
    "SGLANG_MEMORY_SAVER_CUDA_GRAPH SGLANG_OPT_CUDA_GRAPH_FILL_FAST_PATH SGLANG_ENABLE_GRAPH_POOL_BORROW "
    "SGLANG_ENABLE_GRAPH_POOL_PRECARVE SGLANG_EAGER_INPUT_NO_COPY SGLANG_DISABLE_KDA_PREFILL_GRAPH_EXTEND "
    "SGLANG_KDA_PREFILL_GRAPH_MAX_SEQS SGLANG_ENABLE_GDN_DECODE_FUSED_PROJ_CONV "
    # DeepSeek V4
    "SGLANG_DSV4_DECODER_TAIL_GRAPH_MAX_ROWS SGLANG_DSV4_DECODER_TAIL_GRAPH_MIN_PREFILL_TOKENS "
    "SGLANG_DSV4_FLYDSL_DECODE "
    "SGLANG_DSV4_FLYDSL_DECODE_SOURCE SGLANG_DSV4_FLYDSL_DECODE_H128 SGLANG_DSV4_FP8_DECODE_SPLIT_MODEL "
    "SGLANG_DSV4_FP8_DECODE_SPLIT_CTX SGLANG_DSV4_FP8_HCA_PERSIST SGLANG_DSV4_FP8_HCA_PERSIST_MIN_ROWS "
    "SGLANG_OPT_DSV41_MEGA_MHC_PREFILL SGLANG_OPT_USE_TILELANG_MHC_PRE SGLANG_OPT_USE_TILELANG_MHC_POST "
    "SGLANG_OPT_USE_FLASHINFER_MHC SGLANG_OPT_FUSE_MHC_POST_PRE SGLANG_OPT_USE_TILELANG_INDEXER "
    "SGLANG_OPT_DSV4_NONPAGED_INDEXER SGLANG_OPT_DSV4_NONPAGED_INDEXER_MIN_QUERY_TOKENS "
    "SGLANG_OPT_USE_JIT_INDEXER_METADATA SGLANG_OPT_USE_ONLINE_COMPRESS SGLANG_EXPERIMENTAL_ONLINE_C128_MTP "
    "SGLANG_DSV4_COMPRESS_STATE_DTYPE SGLANG_OPT_DSV41_BF16_INDEX_LOGITS SGLANG_FP8_PAGED_MQA_LOGITS_TORCH "
    "SGLANG_OPT_FLASHMLA_SPARSE_PREFILL SGLANG_OPT_HIP_OPUS_SPARSE_PREFILL SGLANG_OPT_HIP_FLYDSL_MXFP8 "
    "SGLANG_HIP_DSPARK_DRAFT_RAW_METADATA SGLANG_HIP_SHARED_ACT_MXFP8 SGLANG_HIP_WO_A_MXFP8 SGLANG_HIP_FFN_NORM_MXFP8 "
    "SGLANG_HIP_FP4_INDEXER_ROWGROUP SGLANG_HIP_DSV4_C4_INDEXER_ROWGROUP SGLANG_HIP_MHC_BOUNDARY_WIDE_TILE "
    "SGLANG_OPT_FP8_WO_A_GEMM SGLANG_OPT_FP8_WO_A_FUSED_INVROPE SGLANG_DSV41_FUSED_WO_A "
    "SGLANG_OPT_USE_AITER_BATCHED_GEMM "
    "SGLANG_OPT_FUSE_WQA_WKV SGLANG_OPT_DSV41_DSPARK_PREPARE_INPUTS_ONCE SGLANG_OPT_DSV41_DSPARK_MID_FOLD "
    "SGLANG_OPT_DSV41_TARGET_VERIFY_METADATA_GLUE SGLANG_OPT_DSV41_TARGET_METADATA_EARLY "
    "SGLANG_OPT_SKIP_GLUED_REPLAY_VIEW "
    "SGLANG_OPT_DSV41_POST_FORWARD_CUDA_GRAPH SGLANG_OPT_DSV41_SAMPLING_ACCEPT_GRAPH "
    "SGLANG_OPT_USE_MULTI_STREAM_OVERLAP "
    # Inkling, DSA, Muse Spark, MiniMax, Kimi K3
    "SGLANG_OPT_USE_FUSED_GATE_TOPK SGLANG_OPT_USE_GATE_TOPK_JIT SGLANG_OPT_GATE_GEMV_MODE "
    "SGLANG_OPT_USE_INKLING_MULTI_STREAM_OVERLAP SGLANG_OPT_USE_INKLING_SHEARED_BIAS "
    "SGLANG_OPT_USE_INKLING_CUSTOM_AR SGLANG_OPT_USE_INKLING_FUSED_AR_SCONV_NORM SGLANG_OPT_USE_INKLING_FUSED_AR_SCONV "
    "SGLANG_OPT_USE_INKLING_FUSED_ATTN_PROLOGUE SGLANG_OPT_USE_INKLING_SHARED_FUSED_MOE "
    "SGLANG_OPT_USE_INKLING_FUSED_AR_SHARED SGLANG_OPT_USE_INKLING_FUSED_LOG_TAU "
    "SGLANG_OPT_USE_INKLING_REL_PROJ_DISPATCH "
    "SGLANG_OPT_INKLING_MXFP8_FUSED_QUANT_STORE SGLANG_DSA_FUSE_TOPK SGLANG_EXPERIMENTAL_DSA_KPOOL_METADATA_FUSION "
    "SGLANG_DSA_TOPK_FLASHINFER_DETERMINISTIC SGLANG_DSA_TOPK_FLASHINFER_TIE_BREAK "
    "SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD SGLANG_DSA_MQA_LOGITS_FREE_MEM_FRACTION "
    "SGLANG_ENABLE_PCG_DSV2_DUAL_STREAM SGLANG_DSA_TOPK_BROADCAST SGLANG_DISABLE_DSA_INDEXER_FUSION "
    "SGLANG_DISABLE_AITER_FUSED_FP8_DSA_INDEXER SGLANG_ENABLE_DSA_Q8KV8_BORN_FP8_Q SGLANG_ENABLE_DSA_Q8KV8_TOPK_LENGTH "
    "SGLANG_ENABLE_DSA_Q8KV8_QPREP_OVERLAP SGLANG_ENABLE_DSA_Q8KV8_KV_CAT_FUSION SGLANG_OPT_Q8KV8_QPREP_VARIANT "
    "SGLANG_ENABLE_MUSE_SPARK_FINALIZE_AR SGLANG_ENABLE_MUSE_SPARK_AG_NORM_FUSION SGLANG_USE_CUSTOM_ROUTER_SUM "
    "SGLANG_OPT_USE_BF16_ROUTER_GEMM SGLANG_OPT_USE_MINIMAX_DENSE_SPARSE_DECODE SGLANG_DISABLE_MSA "
    "SGLANG_OPT_USE_MSA_DECODE_UNDER_GRAPH SGLANG_DISABLE_M3_FP8_ATTN_GEMM SGLANG_DISABLE_MSA_V1_Q8KV4 "
    "SGLANG_OPT_USE_MINIMAX_DECODE_TOPK_RADIX SGLANG_OPT_USE_MINIMAX_FUSED_KV_INDEX_STORE "
    "SGLANG_OPT_USE_MINIMAX_FP8_Q_EPILOGUE SGLANG_MINIMAX_M3_FUSED_SWIGLU_MXFP8 SGLANG_MINIMAX_M3_FUSED_MOE_COMBINE "
    "SGLANG_MINIMAX_M3_INDEX_TOPK_FREQ SGLANG_MINIMAX_M3_INDEXER_CP SGLANG_OPT_MINIMAX_M3_FP8_INDEX_CACHE "
    "SGLANG_OPT_USE_MINIMAX_GLUON_PREFILL SGLANG_MINIMAX_NPU_PREFILL_FIA SGLANG_MINIMAX_NPU_NATIVE_INDEXER "
    "SGLANG_MINIMAX_NPU_NATIVE_ATTN SGLANG_M3_ALLOW_CUSTOM_AR SGLANG_K3_AR_FUSION SGLANG_K3_SP_COLLECTIVE "
    "SGLANG_K3_SP_ATTN_RES SGLANG_K3_RADIX4_TOPK",
    _KERNEL + ". Where a model family keeps a weight-derived copy beside its parameters, vradix reads that copy "
              "off the live modules whichever setting built it, and refuses an update it would leave stale (row "
              "gpu-derived); copies SGLang declares are refused by SGLang (row sglang-guarded)")
PLATFORM = (
    _own("SGLANG_PLUGINS", "versioned",
         "SGLang's plugin allow-list: unset or naming vradix, every path here runs versioned; a list that leaves "
         "vradix out is an opt-out warned about at interpreter start (`vradix-plugin-check.pth`), and a Ray "
         "scheduler actor without vradix refuses to start (docs/fail-closed.md)",
         ("test_plugin.py::test_an_allow_list_that_excludes_vradix_is_warned_about",
          "test_plugin.py::test_the_startup_check_runs_at_interpreter_start_once"))
    + _own("SGLANG_PLATFORM", "irrelevant",
           "selects the hardware platform plugin (device, memory and kernel backends); the tree, the scheduler and "
           "the update paths vradix hooks are the same on every platform")
    + _group("SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE SGLANG_WEIGHT_CACHE_READY_TEMPLATE",
             "file paths of the weight cache daemon (`--weight-cache-mode`), whose weight updates SGLang refuses "
             "(`_assert_weight_cache_inactive`, row sglang-guarded)")
)

ENVIRON = _table(RUNTIME, WEIGHT_LOADING, PLE, HTTP_LOGGING_PORTS, TESTS_AND_DIAGNOSTICS, RETRACTION, RETRACTION_TUNING,
                 GRAMMAR_TOOLS_TOKENIZER, PROFILING, CHECKS, TOKEN_ORACLE, DEBUG_REVERT, SIMULATIONS, SPECULATIVE,
                 MEMORY_POOLS, SCHEDULING, RADIX, PD, DISTRIBUTED, HICACHE, CACHE_DIRS, TORCH_COMPILE, MULTIMODAL,
                 ENCODER, SGLANG_REFUSES_UPDATES, GPU_DERIVED_COPIES, LOADER_DERIVED, REFUSED_SETTINGS,
                 KV_CANARY_PERTURBATIONS, WEIGHTS_THEMSELVES, QUANTIZATION, KERNELS, PLATFORM)

#: the page the tables are rendered on (docs/)
DOC = "census/environ.md"
TABLES = {"environ": ("Environment settings SGLang 0.5.23 declares (`sglang.srt.environ.Envs`)", enumerate_environ,
                      ENVIRON)}
