"""The process census: every process SGLang 0.5.23 can start that handles requests, control calls or outputs, and
every server it starts inside one, classified by whether vradix runs there.

`enumerate_processes()` reads SGLang's installed launch code with `ast` (never a list written by reading it): every
call that starts a process (`<context>.Process(...)` except psutil's, a `ProcessPoolExecutor`, uvicorn's worker
supervisors `uvicorn.run` and `_ReusePortMultiprocess`, Granian's `Server`), every class made a Ray actor
(`@ray.remote`), every call that joins a running engine as a tokenizer worker (`read_from_shared_memory`, the
launch data SGLang hands each one), and every call that starts a server in a process (`uvicorn.Server`, a gRPC `server`, aiohttp's
`TCPSite`, `HTTPServer`, a Rust extension's `Server` or `start_server`), in every module of the `sglang` package but
its tests and benchmarks, named `module:function -> callee(target)`. SGLang's diffusion runtime
(`sglang.multimodal_gen`) is one entry. A `subprocess` call runs another program (a compiler, a device tool, or a
whole `sglang serve`, whose processes this census lists) and is not a process of the server.

`PROCESSES` classifies each: `vradix present` (a test finds vradix's hooks installed in that process), `not needed`
(why, in one line) or `refused` (the launch that would start it is refused; the alternative named). A thread runs in
a process listed here and shares its class.

Invariants: `set(PROCESSES) == set(enumerate_processes())` (test/closed_world/test_census.py); a `vradix present`
entry names the tests that find vradix there.
"""
from __future__ import annotations

import ast
import pathlib

from vradix_census import Entry

#: callee names (`ast.unparse` of the call's function) that start a process, or a server inside one
_WORKER_SUPERVISORS = ("uvicorn.run", "_ReusePortMultiprocess", "Server")
#: a call that reads the launch data SGLang hands every tokenizer worker: a process joining a running engine
_JOINS = ("read_from_shared_memory",)
_SERVERS = ("uvicorn.Server", "grpc.aio.server", "grpc.server", "web.TCPSite", "HTTPServer", "ThreadingHTTPServer",
            "extension.Server")
#: packages of `sglang` outside the census: tests and benchmarks start processes of their own
_SKIPPED_PARTS = ("test", "tests", "benchmark", "multimodal_gen")
DIFFUSION = "multimodal_gen: the diffusion runtime (sglang serve on a diffusion model)"


def starts_a_process(callee: str) -> bool:
    return ((callee.endswith("Process") and not callee.startswith("psutil"))
            or callee.endswith("ProcessPoolExecutor") or callee in _WORKER_SUPERVISORS or callee in _SERVERS
            or callee.endswith(".start_server") or callee in _JOINS)


def sites_in(source: str, module: str) -> set:
    """`module:function -> callee(target)` for every process start in one module's source."""
    found, stack = set(), []

    class Visitor(ast.NodeVisitor):
        def visit_FunctionDef(self, node):
            stack.append(node.name)
            self.generic_visit(node)
            stack.pop()

        visit_AsyncFunctionDef = visit_FunctionDef

        def visit_ClassDef(self, node):
            if any("remote" in ast.unparse(d) for d in node.decorator_list):
                found.add(f"{module}:{'.'.join(stack + [node.name])} -> ray.remote(actor)")
            stack.append(node.name)
            self.generic_visit(node)
            stack.pop()

        def visit_Call(self, node):
            callee = ast.unparse(node.func)
            if starts_a_process(callee):
                target = next((ast.unparse(k.value) for k in node.keywords if k.arg == "target"), "")
                found.add(f"{module}:{'.'.join(stack) or '<module>'} -> {callee}({target})")
            self.generic_visit(node)

    Visitor().visit(ast.parse(source))
    return found


def enumerate_processes(root: pathlib.Path | None = None) -> list[str]:
    """Every process start in SGLang's installed package (`root`: the `sglang` package directory)."""
    if root is None:
        import sglang
        root = pathlib.Path(sglang.__file__).parent
    found = set()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part in _SKIPPED_PARTS for part in rel.parts[:-1]) or rel.name.startswith(("test_", "bench")):
            continue
        module = ".".join(rel.with_suffix("").parts)
        found |= sites_in(path.read_text(encoding="utf-8", errors="replace"), module)
    if (root / "multimodal_gen").is_dir():
        found.add(DIFFUSION)
    return sorted(found)


def _present(why: str, *tests: str) -> Entry:
    return Entry("vradix present", why, tests)


def _not_needed(why: str) -> Entry:
    return Entry("not needed", why)


def _refused(why: str, alternative: str, *tests: str) -> Entry:
    return Entry("refused", why, tests or REFUSED_AT_LAUNCH, alternative)


REFUSED_AT_LAUNCH = ("test_coverage.py::test_a_refused_flag_stops_the_launch",)
SCHEDULER = ("test_e2e_tp.py::test_both_ranks_log_vradix_and_detection_only",
             "test_e2e_server.py::test_vradix_publication_never_reuses_stale_prefix")
LAUNCHER = ("test_e2e_provenance.py::test_provenance_in_meta_info_across_two_publications",
            "test_plugin.py::test_the_import_fault_switch_stops_a_real_launch_and_is_announced")
TOKENIZER_WORKERS = ("test_tokenizer_workers.py::test_every_tokenizer_worker_installs_vradix",
                     "test_tokenizer_workers.py::test_provenance_reaches_the_client_through_every_worker",
                     ("test_tokenizer_workers.py::"
                      "test_a_bucketed_update_through_the_workers_holds_generation_between_buckets"),
                     "test_tokenizer_worker.py::test_a_worker_where_vradix_cannot_install_stops_before_it_serves")
ATTACHED_WORKER = ("test_tokenizer_worker.py::test_reading_the_launch_data_installs_vradix_in_the_reading_process",
                   "test_tokenizer_worker.py::test_a_worker_where_vradix_cannot_install_stops_before_it_serves")
EPD = ("test_e2e_multimodal.py::test_an_encoder_only_launch_does_not_start",) + REFUSED_AT_LAUNCH
EPD_ALTERNATIVE = "the multimodal model served whole, its encoder in the scheduler (no --encoder-only/--language-only)"
_LAUNCHES_A_SERVER = ("starts a whole SGLang server (`launch_server`) in a child process: that child is the launcher, "
                      "where SGLang calls load_plugins() before anything starts")

PROCESSES = {
    # the engine's own processes
    "srt.entrypoints.engine:Engine._launch_scheduler_processes -> mp.Process(target)": _present(
        "a scheduler (`run_scheduler_process`, one per TP/PP rank): calls load_plugins() first; vradix's "
        "fail-closed install is guaranteed here, and every safety decision is made here", *SCHEDULER),
    "srt.managers.data_parallel_controller:DataParallelController.launch_tensor_parallel_group -> "
    "mp.Process(self.run_scheduler_process_func)": _present(
        "a scheduler of one DP rank: the same `run_scheduler_process` (load_plugins() first)", *SCHEDULER),
    "srt.entrypoints.engine:Engine._launch_scheduler_processes -> mp.Process(run_data_parallel_controller_process)":
        _not_needed("the DP controller only routes each request to a DP rank's scheduler; it holds no KV, no "
                    "weights and no outputs (it calls load_plugins() all the same)"),
    "srt.entrypoints.engine:Engine._launch_detokenizer_subprocesses -> mp.Process(run_detokenizer_process_func)":
        _not_needed("the detokenizer turns token ids into text and passes each output's `customized_info` "
                    "(provenance) through unchanged (it calls load_plugins() all the same)"),
    "srt.entrypoints.engine:Engine._launch_detokenizer_subprocesses -> mp.Process(run_multi_detokenizer_router_process)":
        _not_needed("the detokenizer router (--detokenizer-worker-num > 1) forwards each output to its "
                    "detokenizer, splitting `customized_info` (provenance) per request"),
    "srt.ray.scheduler_actor:SchedulerActor -> ray.remote(actor)": _present(
        "a scheduler as a Ray actor (--use-ray), which never calls load_plugins(): its worker loads vradix "
        "first (`vradix.hooks.ray_actor`) or the actor does not start",
        "test_ray_actor.py::test_a_ray_scheduler_actor_serves_with_vradix_and_a_publication_is_verified",
        "test_ray_actor.py::test_a_ray_scheduler_actor_without_vradix_refuses_to_start"),
    # the HTTP frontends and the tokenizer workers
    "srt.entrypoints.http_server:_setup_and_run_http_server -> uvicorn.Server()": _present(
        "the one-worker HTTP server, in the launcher process with its TokenizerManager (native /generate, OpenAI, "
        "control calls)", *LAUNCHER),
    "srt.entrypoints.http_server:_setup_and_run_http_server -> uvicorn.run()": _present(
        "--tokenizer-worker-num > 1: uvicorn's workers import the app SGLANG_HTTP_SERVER_APP_PATH names, never "
        "calling load_plugins(); vradix names its own app there (`vradix.hooks.tokenizer_worker`), which loads "
        "vradix first or stops the worker before it serves", *TOKENIZER_WORKERS),
    "srt.entrypoints.http_server:_setup_and_run_http_server -> _ReusePortMultiprocess()": _present(
        "as uvicorn.run, with --enable-http-worker-reuseport: the same workers and app", *TOKENIZER_WORKERS),
    "srt.entrypoints.http_server:_run_granian_server -> Server()": _present(
        "--enable-http2: one worker is embedded in the launcher (as uvicorn.Server); several are Granian workers "
        "importing the same app SGLANG_HTTP_SERVER_APP_PATH names (as uvicorn.run)", *TOKENIZER_WORKERS),
    "srt.entrypoints.http_server:init_multi_tokenizer -> read_from_shared_memory()": _present(
        "each multi-tokenizer HTTP worker reads its launch data before it builds its TokenizerWorker: the data "
        "carries vradix's `WorkerLoad`, which loads vradix there first or stops the worker", *ATTACHED_WORKER),
    "srt.entrypoints.engine:Engine.attach_tokenizer_worker -> read_from_shared_memory()": _present(
        "a process joining an Engine launched with --tokenizer-worker-num > 1: its launch data loads vradix "
        "before its TokenizerWorker is built (`WorkerLoad`), or stops it", *ATTACHED_WORKER),
    "srt.entrypoints.http_server:_start_native_grpc_server_for_runtime -> grpc_native.start_server()": _present(
        "SGLang's native gRPC server (--grpc-port) runs in the launcher process and sends every request through "
        "its TokenizerManager, where vradix's launcher hooks run", *LAUNCHER),
    "srt.entrypoints.sidecar:start_sidecar -> mp.get_context('spawn').Process(_run_sidecar)": _not_needed(
        "--sidecar runs an operator's module as a client of the native gRPC server: its requests go through the "
        "launcher's TokenizerManager"),
    "srt.rust_server.server:RustServer.launch -> extension.Server()": _refused(
        "SGLANG_RUST_SERVER: the embedded Rust frontend replaces the HTTP server and the TokenizerManager, so "
        "none of vradix's launcher-side steps runs", "the Python HTTP server (leave SGLANG_RUST_SERVER unset)"),
    "srt.entrypoints.grpc_server:_start_sidecar_server -> web.TCPSite()": _refused(
        "--smg-grpc-mode: the SMG gRPC server replaces the HTTP server and the TokenizerManager",
        "the HTTP server, with SGLang's native gRPC server beside it if needed (--grpc-port)"),
    # whole-server launchers
    "srt.entrypoints.http_server_engine:launch_server_process -> multiprocessing.Process(launch_server)": _present(
        _LAUNCHES_A_SERVER, *LAUNCHER),
    "lang.backend.runtime_endpoint:Runtime.__init__ -> ctx.Process(launch_server)": _present(
        _LAUNCHES_A_SERVER + " (the frontend language's `Runtime`)", *LAUNCHER),
    "compile_deep_gemm:launch_server_process_and_send_one_request -> multiprocessing.Process(launch_server_internal)":
        _present(_LAUNCHES_A_SERVER + " (DeepGEMM kernel precompilation, one request)", *LAUNCHER),
    # encoder disaggregation (EPD): refused with its flags
    "srt.disaggregation.encoder.grpc_server:serve_grpc_encoder -> ctx.Process(launch_encoder)": _refused(
        "an EPD encoder server (--encoder-only): its image embeddings carry no weight identity", EPD_ALTERNATIVE,
        *EPD),
    "srt.disaggregation.encoder.grpc_server:serve_grpc_encoder -> grpc.aio.server()": _refused(
        "the EPD encoder's gRPC server (--encoder-only)", EPD_ALTERNATIVE, *EPD),
    "srt.disaggregation.encoder.http_server:launch_server -> uvicorn.run()": _refused(
        "the EPD encoder's HTTP server (--encoder-only)", EPD_ALTERNATIVE, *EPD),
    "srt.disaggregation.encoder.receiver:EncoderBootstrapServer._run_server -> uvicorn.Server()": _refused(
        "the language side's receiver of encoder embeddings (--language-only)", EPD_ALTERNATIVE, *EPD),
    "srt.disaggregation.encoder.runtime:launch_dp_runtime -> ctx.Process(launch_dp_worker)": _refused(
        "an EPD encoder's DP worker (--encoder-only)", EPD_ALTERNATIVE, *EPD),
    "srt.disaggregation.encoder.runtime:launch_local_runtime -> process_context.Process(launch_encoder)": _refused(
        "an EPD encoder's local runtime (--encoder-only)", EPD_ALTERNATIVE, *EPD),
    "srt.elastic_ep.expert_backup_manager:run_expert_backup_manager -> mp.Process(run_expert_backup_manager_process)":
        _refused("--elastic-ep-backend: the expert backup manager keeps copies of expert weights no publication "
                 "reaches", "a fixed expert placement (no --elastic-ep-backend)"),
    # processes and servers that handle no request, control call or output
    "srt.disaggregation.common.conn:CommonKVBootstrapServer._run_server -> web.TCPSite()": _not_needed(
        "the P/D bootstrap server exchanges KV transfer endpoints between roles; KV of other weights is refused "
        "by the decode scheduler's handshake"),
    "srt.entrypoints.engine_info_bootstrap_server:EngineInfoBootstrapServer.__init__ -> uvicorn.Server()":
        _not_needed("collects each rank's model info at startup; read-only"),
    "srt.distributed.gated_launch:_GatedLaunchServer.serve -> uvicorn.Server()": _not_needed(
        "a startup gate a launch waits on before it starts its ranks; serves no request"),
    "srt.utils.common:launch_dummy_health_check_server -> uvicorn.Server()": _not_needed(
        "answers /health on nodes of rank 1 and up, which serve no request themselves"),
    "srt.debug_utils.dumper:_start_http_server -> HTTPServer()": _not_needed(
        "the debug tensor dumper's switch: dumps tensors, changes nothing a response is computed from"),
    "srt.distributed.device_communicators.custom_all_reduce_utils:can_actually_p2p -> smp.Process(consumer)":
        _not_needed("probes GPU peer-to-peer access at startup"),
    "srt.distributed.device_communicators.custom_all_reduce_utils:can_actually_p2p -> smp.Process(producer)":
        _not_needed("probes GPU peer-to-peer access at startup"),
    "srt.model_executor.mindspore_runner:set_ms_parallel_env -> mp.Process(run_scheduler_init)": _not_needed(
        "MindSpore's distributed rendezvous (its scheduler role) at startup; serves no request"),
    "srt.multimodal.processors.base_processor:BaseMultimodalProcessor._create_cpu_executor -> "
    "concurrent.futures.ProcessPoolExecutor()": _not_needed(
        "decodes and resizes images for the tokenizer: input only, no weights, no cache"),
    "srt.observability.trace_async:start_trace_exporter -> _TraceExporterProcess()": _not_needed(
        "exports tracing spans"),
    "srt.mem_cache.storage.hf3fs.mini_3fs_metadata_server:Hf3fsMetadataServer.run -> uvicorn.run()": _not_needed(
        "the HF3FS storage backend's page index: the page keys it stores carry vradix's namespace"),
    "srt.weight_cache.daemon:spawn_weight_cache_daemon -> ctx.Process(run_weight_cache_daemon)": _not_needed(
        "holds the checkpoint's weights for engine processes to map at load; SGLang refuses weight updates in "
        "this mode (row sglang-guarded)"),
    DIFFUSION: _not_needed("a diffusion pipeline: no KV cache, no radix cache, nothing vradix versions"),
}

#: the page the tables are rendered on (docs/)
DOC = "census/processes.md"
TABLES = {"processes": ("Processes SGLang can start (`python -m vradix_census`; docs/processes.md)",
                        enumerate_processes, PROCESSES)}
