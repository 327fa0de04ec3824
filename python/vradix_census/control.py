"""The control census: every request type SGLang's scheduler dispatches, every route of its HTTP server and every
public coroutine of its TokenizerManager, read from SGLang 0.5.23's live objects and classified.

- `requests`: the types in `Scheduler._request_dispatcher`, the `TypeBasedDispatcher` that
  `Scheduler.init_request_dispatcher` builds; it is built here on a probe (a `Scheduler` made with `object.__new__`
  whose missing attributes are placeholders), so whatever the method registers is what is read. Each key that
  `SetInternalStateReq` may change (`SchedulerInternalStateController._update_handlers()`) is a row of its own,
  `SetInternalStateReq[key]`, because each key is a separate runtime switch.
- `routes`: `METHODS path` of every route of `sglang.srt.entrypoints.http_server.app`, included routers expanded,
  plus the routes the module registers only under an import-time setting (read from an app the same module builds
  with those settings on), plus the routes vradix adds (`OWN_ROUTES`).
- `coroutines`: the public `async def` methods (hooks unwrapped) of `TokenizerManager`, `TokenizerControlMixin`
  and `TokenizerWorker` (the multi-tokenizer HTTP worker, a TokenizerManager).

A route or coroutine that only forwards one request type shares that type's `Entry`, so a route, its coroutine and
its request never disagree.

Outside these objects, so outside this census: `BlockReqInput`, which the scheduler's input blocker consumes before
the dispatcher (it only holds requests back); the front ends that replace the Python server and its TokenizerManager
(`SGLANG_RUST_SERVER`, `--smg-grpc-mode`), which the environment and flag censuses classify. The native gRPC server
(`--grpc-port`) calls the TokenizerManager coroutines listed here.

Invariants: the enumerations import SGLang but never start it; each returns names only; a table has exactly the
names its enumeration returns (test/closed_world/test_census.py).
"""
from __future__ import annotations

import contextlib
import importlib.util
import inspect
import os

from vradix_census import Entry

#: routes vradix adds to SGLang's app (BEFORE `http_server.launch_server`, the cache inspector)
OWN_ROUTES = ("GET /vradix/cache",)

#: import-time environment under which `http_server` registers every route it has: the debug dumper's control route
#: exists only with DUMPER_SERVER_PORT=reuse; the Ollama, Vertex and root paths at their defaults
ROUTE_ENVIRONMENT = {"DUMPER_SERVER_PORT": "reuse", "SGLANG_OLLAMA_ROOT_ROUTE": None,
                     "SGLANG_OLLAMA_CHAT_ROUTE": None, "SGLANG_OLLAMA_GENERATE_ROUTE": None,
                     "SGLANG_OLLAMA_TAGS_ROUTE": None, "SGLANG_OLLAMA_SHOW_ROUTE": None, "AIP_PREDICT_ROUTE": None}


# --------------------------------------------------------------------------------------------- enumeration: requests

class Placeholder:
    """What the probe answers for an attribute `Scheduler.__init__` would have set. Any attribute of a placeholder is
    another placeholder, so `self.weight_updater.update_weights_from_disk` is named by its path without the
    component; `path` is that name."""

    def __init__(self, path: str):
        self.path = path

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return Placeholder(f"{self.path}.{name}")


def scheduler_probe(scheduler_class=None):
    """An instance of `scheduler_class` (SGLang's `Scheduler` by default) made without `__init__`: methods are the
    class's own, every instance attribute is a `Placeholder`."""
    if scheduler_class is None:
        from sglang.srt.managers.scheduler import Scheduler as scheduler_class

    class SchedulerProbe(scheduler_class):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return Placeholder(name)

    return object.__new__(SchedulerProbe)


def dispatched(scheduler_class=None) -> dict:
    """{request type: handler} as `init_request_dispatcher` registers them on a probe of `scheduler_class`."""
    probe = scheduler_probe(scheduler_class)
    probe.init_request_dispatcher()
    return dict(probe._request_dispatcher._mapping)


def internal_state_keys(scheduler_class=None, controller_class=None) -> list[str]:
    """The keys `SetInternalStateReq` may change: those the internal-state controller (SGLang's
    `SchedulerInternalStateController` by default) has an update handler for."""
    if controller_class is None:
        from sglang.srt.managers.scheduler_components.internal_state import SchedulerInternalStateController
        controller_class = SchedulerInternalStateController
    controller = controller_class(scheduler_probe(scheduler_class), record_step_time=False)
    return sorted(controller._update_handlers())


def enumerate_requests(scheduler_class=None) -> list[str]:
    """Every request type name the scheduler dispatches, and `SetInternalStateReq[key]` for each settable key."""
    names = {t.__name__ for t in dispatched(scheduler_class)}
    return sorted(names | {f"SetInternalStateReq[{k}]" for k in internal_state_keys(scheduler_class)})


# ----------------------------------------------------------------------------------------------- enumeration: routes

def route_key(route) -> str:
    """`METHODS path` (methods sorted, space separated; `WEBSOCKET` for a websocket route)."""
    methods = sorted(getattr(route, "methods", None) or []) or ["WEBSOCKET"]
    return f"{' '.join(methods)} {route.path}"


def flat_routes(routes):
    """Every route, the routes of included routers expanded (FastAPI keeps those as `_IncludedRouter` entries)."""
    for route in routes:
        if hasattr(route, "effective_candidates"):
            yield from flat_routes(route.effective_candidates())
        else:
            yield route


@contextlib.contextmanager
def environment(settings: dict):
    """`os.environ` with `settings` applied (None removes a variable), restored afterwards."""
    saved = {k: os.environ.get(k) for k in settings}
    try:
        _apply(settings)
        yield
    finally:
        _apply(saved)


def _apply(settings: dict) -> None:
    for k, v in settings.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def app_with_every_route():
    """A second FastAPI app built by executing SGLang's `http_server` module afresh under `ROUTE_ENVIRONMENT`, so the
    routes it registers only under an import-time setting are on it. The loaded `http_server` is not touched."""
    import sglang.srt.entrypoints.http_server as loaded

    spec = importlib.util.spec_from_file_location("vradix_census_http_server", loaded.__file__)
    module = importlib.util.module_from_spec(spec)
    with environment(ROUTE_ENVIRONMENT):
        spec.loader.exec_module(module)
    return module.app


def sglang_routes() -> set[str]:
    """The routes of SGLang's loaded app and of the app built with every import-time route on."""
    from sglang.srt.entrypoints.http_server import app
    return {route_key(r) for a in (app, app_with_every_route()) for r in flat_routes(a.routes)
            if route_key(r) not in OWN_ROUTES}


def enumerate_routes() -> list[str]:
    """SGLang's routes (`sglang_routes`) and vradix's (`OWN_ROUTES`)."""
    return sorted(sglang_routes() | set(OWN_ROUTES))


# ------------------------------------------------------------------------------------------- enumeration: coroutines

def tokenizer_classes() -> tuple:
    from sglang.srt.managers.multi_tokenizer_mixin import TokenizerWorker
    from sglang.srt.managers.tokenizer_control_mixin import TokenizerControlMixin
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    return TokenizerManager, TokenizerControlMixin, TokenizerWorker


def is_async(fn) -> bool:
    """Whether `fn` was written `async def` (a coroutine or an async generator); a hook's wrapper, a plain function,
    is judged by what it wraps."""
    fn = inspect.unwrap(fn)
    return inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)


def public_coroutines(cls) -> set[str]:
    """The public `async def` methods of `cls` and its bases."""
    return {name for name, fn in inspect.getmembers(cls, inspect.isfunction)
            if not name.startswith("_") and is_async(fn)}


def enumerate_coroutines() -> list[str]:
    return sorted(set().union(*(public_coroutines(c) for c in tokenizer_classes())))


# -------------------------------------------------------------------------------------------------- classification

_GENERATE_TESTS = ("test_e2e_server.py::test_vradix_publication_never_reuses_stale_prefix",
                   "test_cache_level.py::test_stale_prefix_misses_after_bump_and_is_cached_again",
                   "test_cache_level.py::test_crossing_request_keeps_its_kv_and_frees_stale_path_at_release")
_EMBEDDING_TESTS = ("test_cache_level.py::test_stale_prefix_misses_after_bump_and_is_cached_again",
                    "test_cache_level.py::test_queued_request_is_rebound_before_prefill")
_LORA_TESTS = ("test_hooks.py::test_adapter_load_insert_and_unload_hooks",
               "test_lora_identity.py::test_a_retrained_adapter_at_the_same_path_never_reads_the_old_adapters_l3_pages",
               "test_cache_level.py::test_user_extra_key_and_lora_isolation_unchanged")
_LAUNCH_REFUSAL = ("test_coverage.py::test_a_refused_flag_stops_the_launch",)
_RELAXED_ACCEPTANCE = Entry(
    "refused", "lowers speculative acceptance below lossless verification (1.0), so the draft model, whose state no "
    "publication versions, would decide outputs: a value below 1 is refused with HTTP 400 by the launcher and by the "
    "scheduler (`updated=false`, nothing set), as the same flag is at launch; 1 or more is accepted",
    ("test_control_requests.py::test_relaxing_speculative_acceptance_at_runtime_is_refused",
     "test_reconfigure.py::test_relaxed_speculative_acceptance_is_refused_by_the_scheduler_without_the_launcher"),
    "keep the thresholds at 1.0, or serve relaxed acceptance with VRADIX_DISABLE=1")
_NGRAM_CORPUS = ("the NGRAM draft's external corpus: draft proposals only, which the target verifies losslessly at "
                 "the acceptance thresholds vradix starts with (relaxed ones are refused)")

REQUESTS = {
    # the data path
    "TokenizedGenerateReqInput": Entry(
        "versioned", "a generate request: bound to its epoch's namespace where it is queued "
        "(`_add_request_to_queue`) and matched only there; a request that crosses "
        "a publication keeps its own KV and inserts none", _GENERATE_TESTS),
    "BatchTokenizedGenerateReqInput": Entry(
        "versioned", "a batch of generate requests: the scheduler hands each to `handle_generate_request`, so each "
        "is stamped like a single one", _GENERATE_TESTS),
    "TokenizedEmbeddingReqInput": Entry(
        "versioned", "an embedding, reward or classification request: it prefills through the same queue and tree "
        "match as a generate request and is bound by the same hook; no CPU test serves an embedding model",
        _EMBEDDING_TESTS),
    "BatchTokenizedEmbeddingReqInput": Entry(
        "versioned", "a batch of embedding requests: each goes through `handle_embedding_request` (row "
        "`TokenizedEmbeddingReqInput`)",
        _EMBEDDING_TESTS),
    # publications
    "FlushCacheReqInput": Entry(
        "publication", "the flush (`/flush_cache`, an update's `flush_cache=true`): on an idle engine SGLang resets "
        "the tree and vradix counts it; with requests holding KV vradix's lock-aware flush bumps the epoch once "
        "(stock refuses); inside a bucketed update, or after an update's own bump, it is that publication's "
        "bump, never a second one",
        ("test_e2e_server.py::test_lock_aware_flush_and_update_weight_version",
         "test_publication_hooks.py::test_successful_update_bumps_once_although_the_flush_runs",
         "test_mm_embedding_cache.py::test_a_lock_aware_flush_clears_the_multimodal_embedding_cache")),
    "UpdateWeightFromDiskReqInput": Entry(
        "publication", "loads a checkpoint into the running model: one bump when it succeeds (or, conservatively, "
        "when it failed after touching weights), the flush it asks for included; a malformed request is refused in "
        "the launcher before anything loads",
        ("test_e2e_server.py::test_vradix_publication_never_reuses_stale_prefix",
         "test_publication_hooks.py::test_successful_update_bumps_once_although_the_flush_runs",
         "test_publication_hooks.py::test_launcher_refuses_malformed_disk_updates")),
    "UpdateWeightsFromDistributedReqInput": Entry(
        "publication", "a bucket broadcast over the update group: SGLang runs it only inside a bucketed "
        "update, whose end is its one publication (a bucket alone does not bump)",
        ("test_publication_hooks.py::test_distributed_buckets_in_a_bucketed_update_are_one_publication",)),
    "UpdateWeightsFromTensorReqInput": Entry(
        "publication", "a bucket of tensors: SGLang runs it only inside a bucketed update (outside one it "
        "touches nothing and nothing bumps), whose end is its one publication; a `load_format='direct'` update of a "
        "model that derives weights after loading is refused before loading",
        ("test_publication_hooks.py::test_a_bucketed_update_is_one_publication_whatever_its_buckets",
         "test_publication_hooks.py::test_a_tensor_update_outside_a_bucketed_update_touches_nothing_and_does_not_bump",
         "test_weight_derived.py::test_a_direct_tensor_update_of_an_mla_model_is_refused_before_loading")),
    "UpdateWeightsFromIPCReqInput": Entry(
        "publication", "a checkpoint-engine update: one bump per call (inside a bucketed update, the bucketed "
        "update's end); a post-load step that failed fails the update, which is not published",
        ("test_publication_hooks.py::test_an_ipc_update_outside_a_bucketed_update_is_one_publication",
         "test_weight_derived.py::test_an_ipc_update_whose_post_hook_failed_is_not_published")),
    "EndWeightUpdateReqInput": Entry(
        "publication", "ends a bucketed update: its one publication, whatever its buckets (one with none still "
        "bumps once); generation resumes if its begin paused it",
        ("test_publication_hooks.py::test_a_bucketed_update_is_one_publication_whatever_its_buckets",
         "test_bucketed_updates.py::test_a_bucketed_update_without_buckets_bumps_once_and_an_explicit_pause_stays",
         "test_publication_hooks.py::test_an_end_that_fails_says_generation_stays_paused")),
    "UpdateWeightVersionReqInput": Entry(
        "publication", "relabels the weights: one bump for a new label (the same label changes nothing); inside a "
        "bucketed update it only relabels; a malformed label, or one an earlier declared identity used, is refused in "
        "the launcher",
        ("test_e2e_server.py::test_lock_aware_flush_and_update_weight_version",
         "test_publication_hooks.py::test_a_label_alone_keeps_the_proven_identity",
         "test_fault_injection.py::test_bad_version_labels_are_refused_and_change_nothing")),
    "CheckWeightsReqInput": Entry(
        "publication", "`/weights_checker`: action `reset_tensors` overwrites every checked parameter with random "
        "values (`WeightChecker._reset_tensors`), a publication (one bump); `snapshot` copies the weights aside, "
        "`compare` and `checksum` read them",
        ("test_control_requests.py::test_a_weights_checker_reset_is_a_publication",)),
    "ResumeMemoryOccupationReqInput": Entry(
        "publication", "brings released device memory back: with the `weights` tag and no "
        "`--enable-weights-cpu-backup` the weights return without their contents, a publication (one bump); with "
        "the backup, and for the `kv_cache` and `cuda_graph` tags, nothing a response reads changes (the tree was "
        "flushed at release)",
        ("test_control_requests.py::test_resuming_weights_without_a_cpu_backup_is_a_publication",)),
    # generation control
    "PauseGenerationReqInput": Entry(
        "generation control", "pauses generation: `in_place` keeps requests and their KV (vradix first drains the "
        "overlap queue, so a batch in flight is labelled with the weights that computed it), `retract` frees running "
        "requests' KV and re-queues them, `abort` aborts them. Inside a pause it pauses again (same state); inside a "
        "bucketed update generation is already held and its end resumes it (a pause made before the bucketed "
        "update's begin stays the caller's)",
        ("test_e2e_server.py::test_overlap_batch_in_flight_at_pause_is_labelled_with_its_weights",
         "test_fault_injection.py::test_in_place_pauses_under_decode_load_lose_no_request",
         "test_bucketed_updates.py::test_a_bucketed_update_without_buckets_bumps_once_and_an_explicit_pause_stays")),
    "ContinueGenerationReqInput": Entry(
        "generation control", "resumes generation: requests kept in place continue, crossing any publication made "
        "meanwhile with their own KV; outside a pause it changes nothing. Inside an open bucketed update it is "
        "refused (HTTP 400 naming `end_weight_update`, and the scheduler keeps generation paused): the bucketed "
        "update's buckets are live before its publication",
        ("test_control_requests.py::test_continue_generation_inside_a_bucketed_update_is_refused",
         "test_fault_injection.py::test_pause_continue_without_publication_keeps_the_cache")),
    "AbortReq": Entry(
        "generation control", "ends the requests it names (or all): queued ones leave the queue, running ones end "
        "after one more step and release their KV through `release_kv_cache`, where a crossing request frees its "
        "stale path. Inside a pause it marks paused requests to end (queued ones leave at once, running ones end at "
        "their next step after the resume) and the engine stays paused, across a publication too; inside a "
        "bucketed update likewise, and the bucketed update stays open",
        ("test_fault_injection.py::test_abort_of_requests_paused_in_place",
         "test_cache_level.py::test_crossing_request_keeps_its_kv_and_frees_stale_path_at_release")),
    "BeginWeightUpdateReqInput": Entry(
        "generation control", "opens a bucketed update: generation is held in place until `end_weight_update` "
        "(vradix pauses it unless the caller already did, and resumes only what it paused). Inside a pause the "
        "caller's pause stays; inside an open one SGLang refuses it ('already open'); a bucketed update a P2P/RDMA "
        "write would leave a GPU-derived copy stale is refused at begin",
        ("test_bucketed_updates.py::test_a_bucketed_update_is_one_publication_with_requests_in_flight",
         "test_publication_hooks.py::test_a_begin_that_raises_does_not_leave_generation_paused",
         "test_weight_derived.py::test_a_bucketed_update_a_p2p_write_would_leave_stale_is_refused_at_begin")),
    # adapters and sessions
    "LoadLoRAAdapterReqInput": Entry(
        "versioned", "loads an adapter: each load mints a new `lora_id`, a fresh namespace, and vradix tags it with "
        "the adapter's content, so its requests match only KV computed with this content; the base epoch is "
        "unchanged, the base weights are", _LORA_TESTS),
    "LoadLoRAAdapterFromTensorsReqInput": Entry(
        "versioned", "loads an adapter from tensors: as a load from disk (row `LoadLoRAAdapterReqInput`), identified "
        "by the tensors loaded",
        ("test_hooks.py::test_adapter_load_insert_and_unload_hooks",
         "test_lora_identity.py::test_the_adapter_tag_is_the_adapters_content_and_no_user_key_can_forge_it")),
    "UnloadLoRAAdapterReqInput": Entry(
        "versioned", "unloads an adapter once its requests finished: vradix frees that adapter's cached entries and "
        "only those; a later load of the same name is a fresh namespace",
        ("test_provenance_cache_level.py::test_reloading_adapter_frees_only_its_own_entries",
         "test_hooks.py::test_adapter_load_insert_and_unload_hooks")),
    "OpenSessionReqInput": Entry(
        "versioned", "opens a session: each turn is a request stamped and matched in its epoch's namespace; a "
        "streaming session's slot lends its KV record only to a turn of the epoch that wrote it",
        ("test_fault_injection.py::test_a_request_for_a_missing_session_is_refused_and_the_engine_keeps_serving",
         "test_streaming_sessions.py::test_turn_after_publication_never_borrows_the_old_slot_record",
         "test_e2e_streaming_session.py::test_streaming_session_turn_after_publication_is_computed_under_the_new_weights")),
    "CloseSessionReqInput": Entry(
        "irrelevant", "releases a session's slot and radix pins: it frees KV and lends none"),
    # HiCache storage
    "AttachHiCacheStorageReqInput": Entry(
        "versioned", "attaches an L3 backend at runtime (idle engine only): every page key it reads or writes is "
        "seeded by the request's namespace, which carries the weight identity, so pages of other weights never "
        "match, and prefetches queued at a publication are revoked; the scheduler checks the resulting "
        "configuration like a launch (an attach the launch would refuse, e.g. with streaming sessions or, on a P/D "
        "decode role, a restore policy other than `wait_complete`, is refused) and derives its publication steps "
        "again (runtime census, docs/census/runtime.md)",
        ("test_e2e_hicache.py::test_vradix_restart_on_new_weights_never_reads_the_old_weights_pages",
         "test_reconfigure.py::test_a_storage_attached_at_runtime_makes_the_next_publication_revoke_queued_prefetches",
         "test_reconfigure.py::test_a_runtime_attach_the_launch_refuses_is_refused_by_the_scheduler_and_changes_nothing",
         "test_pd_rules.py::test_a_runtime_attach_with_another_policy_is_refused_before_any_scheduler",
         "test_coverage.py::test_storage_keys_of_two_weight_identities_never_collide")),
    "DetachHiCacheStorageReqInput": Entry(
        "irrelevant", "stops using the L3 backend (idle engine only): nothing is read from it afterwards; the "
        "scheduler derives its publication steps again (docs/census/runtime.md)"),
    "ClearHiCacheReqInput": Entry(
        "irrelevant", "deletes the L3 backend's pages (`clear_storage_backend`): later lookups miss"),
    "GetHiCacheL3LayoutReq": Entry("read-only", "reports the L3 object-key layout for external routers"),
    # weight transfer plumbing
    "InitWeightsUpdateGroupReqInput": Entry(
        "irrelevant", "creates the process group a trainer broadcasts weights over; the weights change only in "
        "`update_weights_from_distributed`"),
    "DestroyWeightsUpdateGroupReqInput": Entry("irrelevant", "destroys that process group"),
    "InitWeightsSendGroupForRemoteInstanceReqInput": Entry(
        "irrelevant", "creates the group this engine sends its weights to a starting instance over"),
    "SendWeightsToRemoteInstanceReqInput": Entry(
        "read-only", "broadcasts this engine's weights to a starting instance (`weight_exporter`): reads them"),
    "GetWeightsByNameReqInput": Entry("read-only", "returns (a slice of) a named parameter"),
    "ReleaseMemoryOccupationReqInput": Entry(
        "irrelevant", "frees device memory of an idle or paused engine: the `kv_cache` tag flushes the tree through "
        "`Scheduler.flush_cache` (vradix's flush), the `weights` tag stashes the model's buffers first; nothing is "
        "served from released memory, and what comes back is decided at resume (ResumeMemoryOccupationReqInput)"),
    # refused
    "PdRoleSwitchReqInput": Entry(
        "refused", "flips a P/D role at runtime: `--enable-pd-role-switch` does not start (vradix's role scope, L3 "
        "namespaces and restore rules, is the launch role's); without it SGLang rejects the switch",
        _LAUNCH_REFUSAL, "one engine per role; restart an engine to change its role"),
    "ScaleElasticEPReqInput": Entry(
        "refused", "scales elastic EP: `--elastic-ep-backend` does not start (a recovered engine would mix startup "
        "experts into published weights); without it the route answers 404",
        _LAUNCH_REFUSAL, "restart the engine with the new EP size"),
    "RpcReqInput": Entry(
        "refused", "`Engine.collective_rpc` calls any scheduler method by name (`handle_rpc_request`: "
        "`getattr(self, method)(**parameters)`), around every request handler and hook: refused unless the method is "
        "on vradix's read-only allow-list",
        ("test_control_requests.py::test_an_rpc_to_a_method_that_changes_state_is_refused",),
        "the engine's own request: update_weights_*, update_weight_version, flush_cache, load_lora_adapter, ..."),
    "SetInternalStateReq": Entry(
        "refused", "changes runtime settings by key (rows `SetInternalStateReq[...]`): relaxing speculative "
        "acceptance below 1 is refused with HTTP 400; the other keys change scheduling, the draft's budget or its "
        "statistics", _RELAXED_ACCEPTANCE.tests, _RELAXED_ACCEPTANCE.alternative),
    "SetInternalStateReq[speculative_accept_threshold_single]": _RELAXED_ACCEPTANCE,
    "SetInternalStateReq[speculative_accept_threshold_acc]": _RELAXED_ACCEPTANCE,
    "SetInternalStateReq[pp_max_micro_batch_size]": Entry(
        "irrelevant", "the pipeline-parallel micro-batch size: scheduling only"),
    "SetInternalStateReq[dspark_force_budget_frac]": Entry(
        "irrelevant", "how much of the verification budget the DSpark draft may use: draft proposals only, which the "
        "target verifies losslessly at the thresholds vradix starts with"),
    "SetInternalStateReq[dspark_clear_info_records]": Entry("irrelevant", "clears the DSpark draft's statistics"),
    "GetInternalStateReq": Entry(
        "read-only", "`/server_info`, and vradix's cache inspector riding the same channel: reads the configuration "
        "and the cache's records, changes no tree node, lock or ledger page",
        ("test_inspector.py::test_a_snapshot_changes_nothing_in_the_tree",)),
    # the rest
    "AddExternalCorpusReqInput": Entry("irrelevant", f"adds documents to {_NGRAM_CORPUS}"),
    "RemoveExternalCorpusReqInput": Entry("irrelevant", f"removes documents from {_NGRAM_CORPUS}"),
    "ListExternalCorporaReqInput": Entry("read-only", "lists the NGRAM draft's external corpora"),
    "SlowDownReqInput": Entry("irrelevant", "sleeps between forward passes (a test aid): timing only"),
    "ProfileReq": Entry("irrelevant", "starts or stops the torch profiler"),
    "ExpertDistributionReq": Entry("irrelevant", "starts, stops or dumps the expert-routing statistics recorder"),
    "FreezeGCReq": Entry("irrelevant", "freezes Python's garbage collector"),
    "ConfigureLoggingReq": Entry("irrelevant", "changes request logging and the log level"),
    "ShutdownReq": Entry("irrelevant", "ends the scheduler's event loop"),
    "DumperControlReqInput": Entry(
        "irrelevant", "configures SGLang's debug tensor dumper (which answers only when DUMPER_SERVER_PORT is set at "
        "launch): dumps forward tensors to files; the dumper's grafter, which can overwrite activations, keeps the "
        "configuration it was built with from the launch environment and is not reconfigured by this request"),
}

#: coroutine -> the one request type it forwards to the scheduler (it shares that type's `Entry`)
FORWARDS = {
    "flush_cache": "FlushCacheReqInput", "update_weights_from_disk": "UpdateWeightFromDiskReqInput",
    "update_weights_from_distributed": "UpdateWeightsFromDistributedReqInput",
    "update_weights_from_tensor": "UpdateWeightsFromTensorReqInput",
    "update_weights_from_ipc": "UpdateWeightsFromIPCReqInput", "begin_weight_update": "BeginWeightUpdateReqInput",
    "end_weight_update": "EndWeightUpdateReqInput", "update_weight_version": "UpdateWeightVersionReqInput",
    "check_weights": "CheckWeightsReqInput", "resume_memory_occupation": "ResumeMemoryOccupationReqInput",
    "release_memory_occupation": "ReleaseMemoryOccupationReqInput", "pause_generation": "PauseGenerationReqInput",
    "continue_generation": "ContinueGenerationReqInput", "load_lora_adapter": "LoadLoRAAdapterReqInput",
    "load_lora_adapter_from_tensors": "LoadLoRAAdapterFromTensorsReqInput",
    "unload_lora_adapter": "UnloadLoRAAdapterReqInput", "open_session": "OpenSessionReqInput",
    "close_session": "CloseSessionReqInput", "attach_hicache_storage": "AttachHiCacheStorageReqInput",
    "detach_hicache_storage": "DetachHiCacheStorageReqInput", "clear_hicache_storage": "ClearHiCacheReqInput",
    "get_hicache_l3_cache_layout": "GetHiCacheL3LayoutReq",
    "init_weights_update_group": "InitWeightsUpdateGroupReqInput",
    "destroy_weights_update_group": "DestroyWeightsUpdateGroupReqInput",
    "init_weights_send_group_for_remote_instance": "InitWeightsSendGroupForRemoteInstanceReqInput",
    "send_weights_to_remote_instance": "SendWeightsToRemoteInstanceReqInput",
    "get_weights_by_name": "GetWeightsByNameReqInput", "pd_role_switch": "PdRoleSwitchReqInput",
    "scale_elastic_ep": "ScaleElasticEPReqInput", "set_internal_state": "SetInternalStateReq",
    "get_internal_state": "GetInternalStateReq", "add_external_corpus": "AddExternalCorpusReqInput",
    "remove_external_corpus": "RemoveExternalCorpusReqInput", "list_external_corpora": "ListExternalCorporaReqInput",
    "slow_down": "SlowDownReqInput", "start_profile": "ProfileReq", "stop_profile": "ProfileReq",
    "start_expert_distribution_record": "ExpertDistributionReq",
    "stop_expert_distribution_record": "ExpertDistributionReq",
    "dump_expert_distribution_record": "ExpertDistributionReq", "freeze_gc": "FreezeGCReq",
    "dumper_control": "DumperControlReqInput",
}

_GENERATE = Entry(
    "versioned", "the data path: tokenizes and sends generate or embedding requests (rows TokenizedGenerateReqInput, "
    "TokenizedEmbeddingReqInput); each answer's meta_info carries its KV provenance, and a staleness bound above the "
    "server's window is refused with HTTP 400",
    _GENERATE_TESTS[:1] + ("test_e2e_provenance.py::test_provenance_in_meta_info_across_two_publications",
                           "test_staleness.py::test_a_bound_above_the_window_is_refused_with_a_400_error"))

COROUTINES = {
    **{name: REQUESTS[request] for name, request in FORWARDS.items()},
    "generate_request": _GENERATE,
    "score_prompts": Entry("versioned", "scores prompts through `generate_request` (its row)", _GENERATE.tests),
    "score_request": Entry("versioned", "scores items through `score_prompts` (its row)", _GENERATE.tests),
    "get_loads": Entry("read-only", "reads the load snapshots the schedulers publish"),
    "handle_loop": Entry(
        "irrelevant", "the receive loop `auto_create_handle_loop` starts once: hands each scheduler output to the "
        "request waiting for it, keeps nothing across requests"),
    "sigterm_watchdog": Entry("irrelevant", "waits for a graceful shutdown"),
}

_OPENAI = Entry(
    "versioned", "OpenAI-compatible generation through `generate_request`; the response's metadata carries the "
    "weight version and KV provenance",
    _GENERATE.tests + ("test_e2e_staleness.py::test_the_bound_travels_through_generate_and_the_openai_endpoints",))
_EMBED_ROUTE = Entry("versioned", "an embedding, rerank or classification request through `generate_request`",
                     _EMBEDDING_TESTS)
_MEDIA = Entry("versioned", "transcription: a generate request with audio inputs through `generate_request` (the "
               "multimodal embedding cache is dropped at every publication); no audio model runs on CPU",
               ("test_e2e_multimodal.py::test_a_publication_recomputes_image_embeddings",) + _GENERATE_TESTS[:1])
_TOKENIZER_ONLY = Entry("irrelevant", "runs the tokenizer only, not the model")
_PARSER_ONLY = Entry("irrelevant", "parses text it is given, without the model")
_DOC_PAGE = Entry("irrelevant", "FastAPI's API description pages")


def _via(coroutine: str) -> Entry:
    return COROUTINES[coroutine]


ROUTES = {
    "GET HEAD /openapi.json": _DOC_PAGE, "GET HEAD /docs": _DOC_PAGE, "GET HEAD /docs/oauth2-redirect": _DOC_PAGE,
    "GET HEAD /redoc": _DOC_PAGE,
    "GET /ready": Entry("read-only", "whether the server accepts requests"),
    "GET /ping": Entry("read-only", "SageMaker health: a flag check"),
    "GET /": Entry("read-only", "'SGLang is running'"), "HEAD /": Entry("read-only", "'SGLang is running'"),
    "GET /health": Entry(
        "versioned", "health check: a one-token generate request through `generate_request`, stamped like any, whose "
        "answer is only a status code (with SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0: a flag check)",
        ("test_pd_rules.py::test_sglangs_own_health_and_warmup_requests_pass",) + _GENERATE_TESTS[:1]),
    "GET /health_generate": Entry(
        "versioned", "health check: a one-token generate request through `generate_request`, stamped like any, whose "
        "answer is only a status code",
        ("test_pd_rules.py::test_sglangs_own_health_and_warmup_requests_pass",) + _GENERATE_TESTS[:1]),
    "GET /get_model_info": Entry("read-only", "model path, served name, weight version (deprecated alias)"),
    "GET /model_info": Entry("read-only", "model path, served name, weight version"),
    "GET /get_server_info": _via("get_internal_state"), "GET /server_info": _via("get_internal_state"),
    "POST PUT /set_internal_state": _via("set_internal_state"),
    "POST PUT /generate": _via("generate_request"),
    "POST PUT /encode": _EMBED_ROUTE, "POST PUT /classify": _EMBED_ROUTE,
    "GET POST /flush_cache": _via("flush_cache"),
    "POST /add_external_corpus": _via("add_external_corpus"),
    "POST /remove_external_corpus": _via("remove_external_corpus"),
    "GET /list_external_corpora": _via("list_external_corpora"),
    "POST /hicache/storage-backend/clear": _via("clear_hicache_storage"),
    "PUT /hicache/storage-backend": _via("attach_hicache_storage"),
    "DELETE /hicache/storage-backend": _via("detach_hicache_storage"),
    "GET /hicache/storage-backend": Entry("read-only", "the tokenizer's view of the L3 backend settings"),
    "GET /get_hicache_l3_cache_layout": _via("get_hicache_l3_cache_layout"),
    "GET POST /start_profile": _via("start_profile"), "GET POST /stop_profile": _via("stop_profile"),
    "GET POST /set_trace_level": Entry("irrelevant", "sets the request tracing level"),
    "GET POST /freeze_gc": _via("freeze_gc"),
    "GET POST /start_expert_distribution_record": _via("start_expert_distribution_record"),
    "GET POST /stop_expert_distribution_record": _via("stop_expert_distribution_record"),
    "GET POST /dump_expert_distribution_record": _via("dump_expert_distribution_record"),
    "POST /update_weights_from_disk": _via("update_weights_from_disk"),
    "POST /init_weights_send_group_for_remote_instance": _via("init_weights_send_group_for_remote_instance"),
    "POST /send_weights_to_remote_instance": _via("send_weights_to_remote_instance"),
    "GET /get_remote_instance_transfer_engine_info": Entry(
        "read-only", "asks the engine-info bootstrap server for a rank's transfer-engine address (deprecated alias)"),
    "GET /remote_instance_transfer_engine_info": Entry(
        "read-only", "asks the engine-info bootstrap server for a rank's transfer-engine address"),
    "POST /init_weights_update_group": _via("init_weights_update_group"),
    "POST /destroy_weights_update_group": _via("destroy_weights_update_group"),
    "POST /update_weights_from_tensor": _via("update_weights_from_tensor"),
    "POST /begin_weight_update": _via("begin_weight_update"),
    "POST /end_weight_update": _via("end_weight_update"),
    "POST /update_weights_from_distributed": _via("update_weights_from_distributed"),
    "POST /update_weights_from_ipc": _via("update_weights_from_ipc"),
    "POST /update_weight_version": _via("update_weight_version"),
    "GET POST /get_weights_by_name": _via("get_weights_by_name"),
    "GET POST /release_memory_occupation": _via("release_memory_occupation"),
    "GET POST /resume_memory_occupation": _via("resume_memory_occupation"),
    "GET POST /weights_checker": _via("check_weights"),
    "GET POST /slow_down": _via("slow_down"),
    "POST /pd_role_switch": _via("pd_role_switch"),
    "POST /load_lora_adapter": _via("load_lora_adapter"),
    "POST /load_lora_adapter_from_tensors": _via("load_lora_adapter_from_tensors"),
    "POST /unload_lora_adapter": _via("unload_lora_adapter"),
    "GET POST /open_session": _via("open_session"), "GET POST /close_session": _via("close_session"),
    "GET POST /configure_logging": REQUESTS["ConfigureLoggingReq"],
    "POST /abort_request": REQUESTS["AbortReq"],
    "POST /parse_function_call": _PARSER_ONLY, "POST /separate_reasoning": _PARSER_ONLY,
    "POST /pause_generation": _via("pause_generation"), "POST /continue_generation": _via("continue_generation"),
    "POST /v1/completions": _OPENAI, "POST /v1/chat/completions": _OPENAI,
    "POST /v1/embeddings": _EMBED_ROUTE, "POST /v1/classify": _EMBED_ROUTE, "POST PUT /v1/rerank": _EMBED_ROUTE,
    "POST /tokenize": _TOKENIZER_ONLY, "POST /v1/tokenize": _TOKENIZER_ONLY,
    "POST /detokenize": _TOKENIZER_ONLY, "POST /v1/detokenize": _TOKENIZER_ONLY,
    "POST /v1/audio/transcriptions": _MEDIA, "WEBSOCKET /v1/realtime": _MEDIA,
    "GET /v1/models": Entry("read-only", "the served model and loaded adapters"),
    "GET /v1/models/{model:path}": Entry("read-only", "one served model's card"),
    "POST /v1/score": _via("score_request"),
    "POST /v1/decisions": Entry("versioned", "decision scoring through `generate_request`", _GENERATE.tests),
    "POST /v1/systemone": Entry("versioned", "System One decisions: candidate scoring through `generate_request`",
                                _GENERATE.tests),
    "POST /v1/responses": _OPENAI,
    "GET /v1/responses/{response_id}": Entry(
        "read-only", "returns a response stored when it was generated (its text, not KV)"),
    "POST /v1/responses/{response_id}/cancel": Entry(
        "generation control", "aborts a background response's request (row AbortReq), inside a pause or a "
        "bucketed update alike", REQUESTS["AbortReq"].tests),
    "POST /api/chat": _OPENAI, "POST /api/generate": _via("generate_request"),
    "GET /api/tags": Entry("read-only", "Ollama-compatible model list"),
    "POST /api/show": Entry("read-only", "Ollama-compatible model information"),
    "POST /v1/messages": _OPENAI,
    "POST /v1/messages/count_tokens": _TOKENIZER_ONLY,
    "POST /invocations": _OPENAI, "POST /vertex_generate": _via("generate_request"),
    "GET /v1/loads": _via("get_loads"),
    "POST /scale_elastic_ep": _via("scale_elastic_ep"),
    "GET /is_scaling_elastic_ep": Entry("read-only", "the tokenizer's mirror of the elastic EP scale state"),
    "POST /dumper/{method}": _via("dumper_control"),
    "GET /vradix/cache": Entry(
        "read-only", "vradix's cache inspector: one bounded snapshot per rank over the internal-state channel",
        ("test_inspector.py::test_a_snapshot_changes_nothing_in_the_tree",)),
}

#: the page the tables are rendered on (docs/)
DOC = "census/control.md"
TABLES = {
    "requests": ("Request types the scheduler dispatches (`Scheduler._request_dispatcher`)", enumerate_requests,
                 REQUESTS),
    "routes": ("HTTP routes (`http_server.app`, and vradix's)", enumerate_routes, ROUTES),
    "coroutines": ("Public coroutines of TokenizerManager, TokenizerControlMixin and TokenizerWorker",
                   enumerate_coroutines, COROUTINES),
}
