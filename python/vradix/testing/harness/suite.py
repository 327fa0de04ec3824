"""The test suite read as data, from a source checkout's test/ folder.

- tests named by node id (`file.py::name`), as docs/coverage.md, the hook table and the census tables name them, read
  with `ast` (nothing is imported or run): the functions a test file defines, and whether a test runs only in
  `make test-long` (marked `long` on the function or by the module's `pytestmark`). A node id names its file by
  basename, found anywhere under test/ (the folders mirror the packages);
- `module_times`: where the suite's time goes, per test file (test/conftest.py prints it after a run).
"""
from __future__ import annotations

import ast
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


def module_times(reports) -> dict:
    """{test file: seconds} summed over the setup, call and teardown of every test in it (a module's fixture start-up
    is part of its first test's setup)."""
    times = {}
    for r in reports:
        if getattr(r, "when", None) in ("setup", "call", "teardown"):
            path = r.nodeid.split("::", 1)[0]
            times[path] = times.get(path, 0.0) + r.duration
    return times
