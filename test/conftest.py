"""Shared fixtures. The vradix plugin is loaded through SGLang's own `load_plugins()`, so every test process runs
the real hooks on SGLang's real functions, exactly as a scheduler process does.

How test files are found and imported: pytest's defaults, with no pytest configuration file. The rootdir is the
repository root (pytest finds `setup.py` there), so node ids read `test/<folder>/test_<name>.py::...`; test files are
collected by the default `test_*.py` pattern, and imported in the default `prepend` mode: the test folders hold no
`__init__.py`, so each file is imported as a top-level module named by its basename, its folder put first on
`sys.path`. That needs every test file's basename to be unique across test/, which the suite relies on anyway: docs,
the hook table and the census tables name tests as `file.py::name` by basename (`vradix.testing.harness.suite`).
`--import-mode=importlib` would allow duplicate basenames but not those names, so the default is kept and
`test_architecture.py` checks that basenames are unique.

A test file imports no other test file: helpers and stand-ins shared across files live in `vradix.testing`
(`harness.engine`, `harness.cache_steps`, `harness.l3_store`, `harness.suite`, ...), fixtures shared across
folders here (`test_architecture.py` checks this too)."""
import os
import pathlib

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# One OpenMP thread per process: this test process and every CPU server it starts (they inherit the environment).
# Torch's default is a thread per core; two workers' servers and tests then run more busy threads than the machine has
# cores, and each parallel region waits on threads that are not running: 24 requests on two servers at once took
# 21-24 s with the default, 0.9 s with one thread (one server alone: under 1 s either way;
# benchmark/server/bench_threads.py, docs/cpu-environment.md).
# Torch reads it when it is first imported, below.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.pop("VRADIX_DISABLE", None)
# The escape watch, a test mode (docs/reliability.md), is on in every scheduler the suite starts, in-process and in
# the CPU servers, which inherit this process's environment: a test that drives a path vradix misses fails. Its
# package, `vradix_census`, is not in the wheel: the checkout's python/ goes first on the PYTHONPATH the servers
# inherit, so each server's plugin finds it (or its install fails closed)
os.environ.setdefault("VRADIX_CENSUS", "1")
SOURCES = str(pathlib.Path(__file__).resolve().parents[1] / "python")
if SOURCES not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (SOURCES, os.environ.get("PYTHONPATH")) if p)
# The Triton kernels run on CPU only under the interpreter, which must be on before triton.language is first imported
# (SGLang imports it during load_plugins). CpuServer does not pass it on to the servers it starts.
os.environ.setdefault("TRITON_INTERPRET", "1")

from sglang.srt.plugins import load_plugins  # noqa: E402

load_plugins()

from vradix import settings  # noqa: E402

if settings.value("VRADIX_CENSUS"):
    from vradix_census.watch import failure_in  # noqa: E402

    from vradix.testing.harness.server import CpuServer  # noqa: E402

    CpuServer.log_checks.append(failure_in)


@pytest.fixture(autouse=True)
def restore_environment():
    """Each test leaves `os.environ` as it found it. In-process launches (SGLang's `prepare_server_args`, vradix's
    launcher hook) export settings such as `VRADIX_WEIGHT_IDENTITY` into it for the scheduler processes a server
    starts, and every `CpuServer` a later test starts inherits `os.environ`: a leaked identity made a decode role that
    must be refused start, and a nonce reader prove a fingerprint."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


#: how many of `CpuServer.log_failures` (the escape watch's) a test or the session has failed on already
WATCH_REPORTED = [0]


def unreported_watch_failures() -> list:
    from vradix.testing.harness.server import CpuServer
    new = CpuServer.log_failures[WATCH_REPORTED[0]:]
    WATCH_REPORTED[0] = len(CpuServer.log_failures)
    return new


@pytest.fixture(autouse=True)
def watch_failures_fail_the_test():
    """A server whose scheduler failed the escape watch (`vradix_census.watch`) fails the test during which it was
    stopped, with the watch's message; one stopped by a module's fixture after its last test fails the next test,
    and the pooled servers fail the session (`server_pool`, `pytest_sessionfinish`)."""
    yield
    new = unreported_watch_failures()
    if new:
        pytest.fail("escape watch failure in a server stopped during or before this test:\n" + "\n".join(new),
                    pytrace=False)


#: escape watch failures no test reported, from this process and (under xdist) from every worker
STRAGGLERS: list = []


def pytest_sessionfinish(session):
    """An escape watch failure no test reported (a server stopped after the last test) fails the run. A worker hands
    its own, and its pool's reuse count, to the controller (`pytest_testnodedown`)."""
    STRAGGLERS.extend(unreported_watch_failures())
    worker_output = getattr(session.config, "workeroutput", None)
    if worker_output is not None:
        pool = session.config.stash.get(POOL_KEY, None)
        worker_output["watch_stragglers"] = list(STRAGGLERS)
        worker_output["pool_reuses"] = pool.summary()["reuses"] if pool is not None else 0
        return
    if STRAGGLERS:
        print("\nescape watch failure in a server stopped after the last test:\n" + "\n".join(STRAGGLERS))
        session.exitstatus = 1


#: leases served by a running pooled server, summed over the xdist workers
WORKER_POOL_REUSES = [0]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """(xdist controller) collect what a finished worker handed over in `pytest_sessionfinish`."""
    output = getattr(node, "workeroutput", {})
    STRAGGLERS.extend(output.get("watch_stragglers", []))
    WORKER_POOL_REUSES[0] += output.get("pool_reuses", 0)


@pytest.fixture(autouse=True)
def restore_torch_reductions():
    """Each test leaves torch's tensor pickling as it found it. SGLang's in-process update paths install
    `monkey_patch_torch_reductions` (CUDA tensors travel with a device uuid), whose reducer assumes the CUDA
    argument layout: a later test that serialises CPU tensors for a server (`MultiprocessingSerializer`) then fails."""
    from torch.multiprocessing import reductions
    saved = (reductions.reduce_tensor, reductions.rebuild_cuda_tensor)
    patched = hasattr(reductions, "_reduce_tensor_original")
    yield
    if not patched and hasattr(reductions, "_reduce_tensor_original"):
        reductions.reduce_tensor, reductions.rebuild_cuda_tensor = saved
        del reductions._reduce_tensor_original, reductions._rebuild_cuda_tensor_original
        reductions.init_reductions()


#: (tree core, page size) every cache-level module runs on
CACHE_CONFIGS = [("rust", 1), ("rust", 16), ("python", 1), ("python", 16)]


@pytest.fixture(params=CACHE_CONFIGS, ids=[f"{c}-ps{p}" for c, p in CACHE_CONFIGS])
def env(request):
    """A 2048-token UnifiedRadixCache on the named tree core and page size, with vradix attached: `(fixture, state)`.
    A module that needs another size defines its own `env`."""
    from vradix.engine import attach
    from vradix.testing.harness.cache_fixture import build_cache
    core, ps = request.param
    fx = build_cache(core, ps, kv_tokens=2048)
    assert fx.tree_core_name == {"rust": "RustUnifiedTreeCore", "python": "UnifiedTreeCore"}[core]
    state = attach(fx.cache)
    assert state.ledger is not None and state.guard.config.verify == "strict"  # vradix's defaults
    return fx, state


def pytest_configure(config):
    config.addinivalue_line("markers", "e2e: starts real SGLang CPU servers (slow)")
    config.addinivalue_line("markers", "long: a long profile: `make test-long` runs it, `make test` (CI) does not")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`make test` runs on two xdist workers (`-n 2 --dist loadgroup`), grouped by `suite.worker_group`: a test file
    runs whole on one worker (its module fixtures start once), and the server files in two groups, one per worker,
    each sharing that worker's server pool. (xdist's own `xdist_group` marks do not reach the node ids on this
    pytest, so the grouping is the scheduler's.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # groups in collection order (the server groups first), not by size

    from vradix.testing.harness.suite import worker_group

    class ServerGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid)

    return ServerGroups(config, log)


def pytest_collection_modifyitems(config, items):
    """In an xdist worker of `make test`: the two server groups first, so each worker starts on one, and the other
    files go to whichever worker is free, the slowest first (the scheduler hands out groups in collection order;
    `suite.hand_out_order`)."""
    if getattr(config.option, "loadgroup", False):  # what xdist sets in a worker of `--dist loadgroup`
        from vradix.testing.harness.suite import hand_out_order
        items.sort(key=lambda i: hand_out_order(i.nodeid))


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    """Two tiny float32 Llama checkpoints with peaky logits: A (served first) and B (published)."""
    from vradix.testing.models.llama import generate
    d = tmp_path_factory.mktemp("models")
    return (generate(str(d / "A"), seed=1, dtype="float32", init_range=0.2),
            generate(str(d / "B"), seed=2, dtype="float32", init_range=0.2))


@pytest.fixture(scope="session")
def pd_oracle(models, server_pool):
    """Greedy outputs (6 tokens) for the P/D tests' prompt (`vradix.testing.harness.pd.PROMPT`) of a fresh non-P/D stock
    server on A and on B (the pool's stock server, reset): computed once, shared by the P/D modules."""
    from vradix.testing.harness.pd import PROMPT
    from vradix.testing.harness.server import fresh_stock_outputs
    out = fresh_stock_outputs(dict(zip("AB", models)), lambda s: s.generate(PROMPT, 6)["output_ids"], pool=server_pool)
    assert out["A"] != out["B"]
    return out


@pytest.fixture(scope="session")
def hybrid_models(tmp_path_factory):
    """Two tiny NemotronH (Mamba2 + attention) hybrid checkpoints: A (served first) and B (published)."""
    from vradix.testing.models.hybrid import generate
    d = tmp_path_factory.mktemp("hybrid")
    return generate(str(d / "A"), seed=1), generate(str(d / "B"), seed=2)


@pytest.fixture(scope="session")
def hf_greedy(hybrid_models):
    """HF transformers' greedy outputs on A and B for the hybrid tests' prompts (`vradix.testing.harness.hybrid_oracle`):
    computed once, shared by the hybrid modules."""
    from vradix.testing.harness.hybrid_oracle import hf_greedy
    return hf_greedy(dict(zip("AB", hybrid_models)))


#: where `server_pool` leaves its pool for the summary
POOL_KEY = pytest.StashKey()


@pytest.fixture(scope="session")
def server_pool(request):
    """One running CPU server per launch configuration, shared across modules (`vradix.testing.harness.pool`): a test
    that needs no fresh process leases its server here. Stopped at the end of the session."""
    from vradix.testing.harness.pool import ServerPool
    # two xdist workers each keep a pool: fewer parked servers each, so both fit the machine's memory
    parked = 3 if hasattr(request.config, "workerinput") else 4
    pool = request.config.stash[POOL_KEY] = ServerPool(max_parked=parked)
    yield pool
    pool.close()
    new = unreported_watch_failures()
    if new:
        pytest.fail("escape watch failure in a pooled server:\n" + "\n".join(new), pytrace=False)


@pytest.fixture(autouse=True)
def held_servers_run_only_for_their_tests(request):
    """Module-scoped servers held with `stopped_while_unused` run only during the tests that request them."""
    from vradix.testing.harness.pool import run_held_servers_for
    run_held_servers_for(request.fixturenames)


#: `CpuServer.launches` when this process made its last test report
LAUNCHES_REPORTED = [0]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each setup, call and teardown report carries the CPU server processes launched since the previous report
    (`server_starts`; a module's fixture start-up counts in its first test's setup): the per-file table reads them
    from the reports, which xdist workers hand to the controller."""
    from vradix.testing.harness.server import CpuServer
    outcome = yield
    started, LAUNCHES_REPORTED[0] = CpuServer.launches - LAUNCHES_REPORTED[0], CpuServer.launches
    if started:
        outcome.get_result().user_properties.append(("server_starts", started))


def pytest_terminal_summary(terminalreporter):
    """The wall time of each test file, slowest first, with the CPU server processes it launched, and their total:
    where the suite's time goes. Under xdist the total sums both workers' files (the run's wall time is less)."""
    from vradix.testing.harness.suite import module_starts, module_times
    reports = [r for reports in terminalreporter.stats.values() for r in reports]
    times, starts = module_times(reports), module_starts(reports)
    if not times:
        return
    terminalreporter.section("time per test file (setup + call + teardown)")
    for path, seconds in sorted(times.items(), key=lambda kv: -kv[1]):
        started = starts.get(path, 0)
        terminalreporter.write_line(f"{seconds:8.1f} s  {path}" + (f"  ({started} server starts)" if started else ""))
    workers = terminalreporter.config.getoption("numprocesses", None)
    summed = f", summed over {workers} workers" if workers else ""
    terminalreporter.write_line(f"{sum(times.values()):8.1f} s  total ({sum(times.values()) / 60:.1f} min{summed})")
    pool = terminalreporter.config.stash.get(POOL_KEY, None)
    reuses = WORKER_POOL_REUSES[0] + (pool.summary()["reuses"] if pool is not None else 0)
    terminalreporter.write_line(f"CPU server processes launched: {sum(starts.values())}, "
                                f"{reuses} leases served by a running pooled server")

