"""The test suite read as data, from a source checkout's test/ folder.

- tests named by node id (`file.py::name`), as docs/coverage.md, the hook table and the census tables name them, read
  with `ast` (nothing is imported or run): the functions a test file defines, and whether a test runs only in
  `make test-long` (marked `long` on the function or by the module's `pytestmark`). A node id names its file by
  basename, found anywhere under test/ (the folders mirror the packages);
- `module_times`, `module_starts`: where the suite's time goes, per test file (test/conftest.py prints it after a
  run);
- `worker_group`: which of `make test`'s two xdist workers runs a test file whole (the server files in two groups).
"""
from __future__ import annotations

import ast
import functools
import pathlib
from typing import Optional

#: the checkout's test/ folder (python/vradix/testing/harness -> the repository root)
TEST_DIR = pathlib.Path(__file__).resolve().parents[4] / "test"


def find_test_file(file: str) -> Optional[pathlib.Path]:
    """The test file `file` (a basename, or a path whose basename is used) under test/, or None."""
    return next(TEST_DIR.rglob(pathlib.Path(file).name), None)


def functions_in(path: pathlib.Path) -> set:
    """The names of the module-level functions `path` defines."""
    tree = ast.parse(path.read_text())
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def is_long_mark(node: ast.expr) -> bool:
    """Whether a decorator or `pytestmark` entry is `pytest.mark.long`."""
    return isinstance(node, ast.Attribute) and node.attr == "long" and ast.unparse(node.value) == "pytest.mark"


def long_tests_in(path: pathlib.Path) -> set:
    """The test functions of `path` that only `make test-long` runs: marked `long` themselves or by the module's
    `pytestmark`."""
    tree = ast.parse(path.read_text())
    module_marks = [n.value for n in tree.body if isinstance(n, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in n.targets)]
    marks = [m for v in module_marks for m in (v.elts if isinstance(v, (ast.List, ast.Tuple)) else [v])]
    functions = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if any(is_long_mark(m) for m in marks):
        return {f.name for f in functions}
    return {f.name for f in functions if any(is_long_mark(d) for d in f.decorator_list)}


def is_long_test(node_id: str) -> bool:
    """Whether the test `file.py::name` (any folder under test/) runs only in `make test-long`."""
    file, name = node_id.split("::")
    path = find_test_file(file)
    return path is not None and name in long_tests_in(path)


def per_file(reports, value) -> dict:
    """{test file: the sum of `value(report)` over the setup, call and teardown reports of its tests}."""
    sums: dict[str, float] = {}
    for r in reports:
        if getattr(r, "when", None) in ("setup", "call", "teardown"):
            path = r.nodeid.split("::", 1)[0]
            sums[path] = sums.get(path, 0) + value(r)
    return sums


def module_times(reports) -> dict:
    """{test file: seconds} summed over the setup, call and teardown of every test in it (a module's fixture start-up
    is part of its first test's setup)."""
    return per_file(reports, lambda r: r.duration)


def module_starts(reports) -> dict:
    """{test file: CPU server processes launched while its tests ran}, for the files that launched any, from the
    `server_starts` each setup, call and teardown report carries (test/conftest.py's `pytest_runtest_makereport`)."""
    starts = per_file(reports, lambda r: sum(v for k, v in r.user_properties if k == "server_starts"))
    return {path: n for path, n in starts.items() if n}


#: the two xdist groups of the files that start CPU servers, one per worker of `make test`
SERVER_GROUPS = ("servers", "servers-side")
#: the server files the second worker runs; the others run on the first. A server start is one core's work for
#: about 20 s (imports, in the launcher, then in the scheduler), so two workers nearly halve the wall time of the
#: starts. The modules that hold the most memory at once stay on the first: HiCache, P/D, Ray (its memory monitor
#: kills its actor near the machine's limit) and TP (three engines, two of them with two scheduler processes, grew
#: the machine to 23.5 of 24 GiB used beside the P/D modules)
SIDE_SERVER_FILES = ("test_e2e_identity.py", "test_e2e_l3.py", "test_e2e_multimodal.py", "test_e2e_provenance.py",
                     "test_e2e_staleness.py", "test_e2e_streaming_session.py", "test_wheels.py", "test_hybrid_cpu.py",
                     "test_gpu_bundle.py")
#: the files without servers that take longest (40-60 s each in `make test`; the table of docs/cpu-environment.md),
#: handed out first among those files, longest first, so that the worker that finishes its server group first takes
#: them and the two workers end together
SLOW_FILES = ("test_plugin.py", "test_csrc_build.py", "test_model_based.py", "test_census.py",
              "test_process_census.py")
#: what a test file that starts CPU servers says in its source
SERVER_SIGNS = ("pytest.mark.e2e", "server_pool", "CpuServer(")


def hand_out_order(node_id: str) -> tuple:
    """The sort key of a test in a `make test` worker's collection (test/conftest.py): the two server groups first,
    then `SLOW_FILES` in their order, then every other file in collection order (a stable sort keeps it)."""
    group = worker_group(node_id)
    if group in SERVER_GROUPS:
        return (SERVER_GROUPS.index(group), 0)
    name = pathlib.Path(node_id.split("::", 1)[0]).name
    return (2, SLOW_FILES.index(name)) if name in SLOW_FILES else (3, 0)


@functools.lru_cache(maxsize=None)
def starts_servers(file: str) -> bool:
    """Whether the test file `file` (a node id's file part) starts CPU servers: an E2E mark, the server pool or a
    `CpuServer` in its source."""
    path = find_test_file(file)
    return path is not None and any(sign in path.read_text() for sign in SERVER_SIGNS)


def worker_group(node_id: str) -> str:
    """The xdist group of a test (test/conftest.py's scheduler): its file, or, for a file that starts servers, one
    of `SERVER_GROUPS`."""
    file = node_id.split("::", 1)[0]
    if not starts_servers(file):
        return file
    return SERVER_GROUPS[1] if pathlib.Path(file).name in SIDE_SERVER_FILES else SERVER_GROUPS[0]
