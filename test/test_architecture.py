"""The package's shape (docs/architecture.md): which package may import which, and no import circles.

Every `import`/`from ... import` of a vradix module inside `python/vradix` is read with `ast`, including imports
inside functions (a lazy import is still a dependency). A package may import only the layers below it; `settings`
(standard library only) is below everything and imports no vradix module; the root vocabulary (`request`,
`identity`, `predicate`) is above it and the kernels; `testing` may import anything and nothing of the
product imports it (the demo is a tool). A new module must be given a layer here."""
import ast
import pathlib

import pytest

PKG = pathlib.Path(__file__).resolve().parents[1] / "python" / "vradix"

#: layer -> the layers it may import (besides itself)
ALLOWED = {
    "settings": set(),
    "vocabulary": {"settings", "kernels"},
    "kernels": {"settings"},
    "ledger": {"settings", "vocabulary", "kernels"},
    "core": {"settings", "vocabulary", "kernels", "ledger"},
    "closed_world": {"settings", "vocabulary"},
    "engine": {"settings", "vocabulary", "kernels", "ledger", "core"},
    "l3": {"settings", "vocabulary", "kernels", "ledger", "core", "engine"},
    "pd": {"settings", "vocabulary", "kernels", "ledger", "core", "engine"},
    "observability": {"settings", "vocabulary", "kernels", "ledger", "core", "engine"},
    "scheduler": {"settings", "vocabulary", "kernels", "ledger", "core", "engine", "closed_world", "l3", "pd",
                  "observability"},
    "hooks": {"settings", "vocabulary", "kernels", "ledger", "core", "engine", "closed_world", "l3", "pd",
              "observability", "scheduler"},
    "plugin": {"settings", "vocabulary", "hooks"},
    "tools": {"settings", "vocabulary"},
    "demo": {"settings", "vocabulary", "tools", "testing"},
    "testing": {"settings", "vocabulary", "kernels", "ledger", "core", "engine", "closed_world", "l3", "pd", "observability",
                "scheduler", "hooks", "plugin", "tools"},
}
ROOT_MODULES = {"__init__": "vocabulary", "request": "vocabulary", "identity": "vocabulary",
                "settings": "settings", "predicate": "vocabulary", "plugin": "plugin", "client": "tools",
                "publish": "tools", "inspector": "tools", "cli": "tools", "demo": "demo", "_C": "kernels",
                "collectives": "vocabulary", "engine": "engine", "trainer": "tools", "startup": "vocabulary", "labels": "vocabulary"}


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str:
    parts = module.split(".")
    if module == "vradix._C":
        return "kernels"
    if len(parts) == 1:
        return "vocabulary"
    if parts[1] in ALLOWED:
        return parts[1]
    if parts[1] in ROOT_MODULES:
        return ROOT_MODULES[parts[1]]
    raise AssertionError(f"{module} has no layer in test_architecture.py")


def imports_of(path: pathlib.Path, module: str):
    """(imported vradix module, line, top level?) for every import in the file, except those under `if
    TYPE_CHECKING:` (names for annotations only, never imported at run time)."""
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    typing_only = {id(n) for node in ast.walk(tree)
                   if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
                   for stmt in node.body for n in ast.walk(stmt)}
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            if name == "vradix" or name.startswith("vradix."):
                yield name, node.lineno, id(node) in top


def modules():
    return {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def resolve(name: str, known) -> str:
    """`from vradix.core import state` names both `vradix.core` and `vradix.core.state`: keep the modules."""
    if name == "vradix._C":  # the compiled CUDA extension, built by setup.py
        return name
    while name not in known and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def test_every_import_goes_down_the_layers():
    known = modules()
    bad = []
    for module, path in known.items():
        mine = layer_of(module)
        for name, line, _ in imports_of(path, module):
            target = resolve(name, known)
            theirs = layer_of(target)
            if theirs != mine and theirs not in ALLOWED[mine]:
                bad.append(f"{path.relative_to(PKG.parent)}:{line}: {mine} imports {target} ({theirs})")
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def test_no_import_circles():
    known = modules()
    graph = {m: {resolve(n, known) for n, _, top in imports_of(p, m) if top} - {m} for m, p in known.items()}
    # a package's __init__ importing its own submodules is how a package is built, not a circle
    graph = {m: {t for t in ts if not m.startswith(t + ".") or known[t].name != "__init__.py"} for m, ts in graph.items()}
    seen, stack, circles = set(), [], []

    def visit(m):
        if m in stack:
            circles.append(" -> ".join(stack[stack.index(m):] + [m]))
            return
        if m in seen:
            return
        seen.add(m)
        stack.append(m)
        for t in sorted(graph.get(m, ())):
            visit(t)
        stack.pop()

    for m in sorted(graph):
        visit(m)
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_only_the_hooks_package_names_hook_targets():
    """A hook target (an `sglang.srt...` path registered with HookRegistry) is written only in `vradix.hooks`."""
    from vradix.hooks import HOOKS

    targets = {t for t, _, _ in HOOKS}
    bad = []
    for module, path in modules().items():
        if layer_of(module) == "hooks":
            continue
        text = path.read_text()
        bad += [f"{module}: {t}" for t in targets if f'"{t}"' in text]
    assert not bad, bad


def census_imports(path: pathlib.Path) -> list:
    """(module, line) of every import of `vradix_census` in the file, at any depth."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "vradix_census"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vradix_census":
            out.append((node.module, node.lineno))
    return out


def test_serving_imports_no_census_code():
    """The census tables, their generator and the escape watch live in `vradix_census`, outside the wheel: no module of
    vradix (its `testing` included) imports it, and none is left under vradix. Only `vradix.plugin` imports the watch,
    by name, when `VRADIX_CENSUS` asks for it (test_plugin.py); the tables import vradix's rules, not the reverse."""
    known = modules()
    bad = [f"{path.relative_to(PKG.parent)}:{line}: imports {m}" for path in known.values()
           for m, line in census_imports(path)]
    assert not bad, "vradix imports census code:\n" + "\n".join(bad)
    assert not [m for m in known if "census" in m.split(".")[-1]], "census modules left in vradix"
    assert (PKG.parent / "vradix_census" / "watch.py").exists()


@pytest.mark.parametrize("bad_import", ["from vradix.hooks import publication", "import vradix.testing.harness.server"])
def test_the_layer_check_sees_an_upward_import(tmp_path, bad_import):
    """The check itself can fail: an upward import written into a core module is reported."""
    path = PKG / "core" / "state.py"
    fake = tmp_path / "state.py"
    fake.write_text(path.read_text() + "\n" + bad_import + "\n")
    known = modules()
    layers = {layer_of(resolve(n, known)) for n, _, _ in imports_of(fake, "vradix.core.state")}
    assert layers - ALLOWED["core"] - {"core"} == {bad_import.split()[1].split(".")[1]}


#: test/<folder> -> what its tests exercise: a vradix package, or one of the groups that span packages
TEST_FOLDERS = {"core": "vradix.core", "ledger": "vradix.ledger", "kernels": "vradix.kernels", "l3": "vradix.l3",
                "pd": "vradix.pd", "closed_world": "vradix.closed_world", "hooks": "vradix.hooks",
                "observability": "vradix.observability", "scheduler": "vradix.scheduler", "testing": "vradix.testing",
                "e2e": "real servers, every package at once", "benchmark": "benchmark/",
                "packaging": "setup.py, scripts/, docs/", "trainer": "vradix.trainer"}
#: test files at the top of test/ -> the root module they test
ROOT_TESTS = {"test_architecture.py": "the layout itself", "test_identity.py": "vradix.identity",
              "test_plugin.py": "vradix.plugin", "test_predicate.py": "vradix.predicate",
              "test_request_state.py": "vradix.request", "test_settings.py": "vradix.settings",
              "test_cli.py": "vradix.cli", "test_one_writer.py": "who writes each state record",
              "test_engine.py": "vradix.engine"}


def test_every_test_file_lives_under_the_package_it_tests():
    tests = PKG.parents[1] / "test"
    folders = {p.name for p in tests.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == TEST_FOLDERS.keys(), "test folders without a package here, or listed and gone"
    for folder, what in TEST_FOLDERS.items():
        if what.startswith("vradix."):
            assert (PKG / folder / "__init__.py").exists(), f"test/{folder} mirrors no package"
    top = {p.name for p in tests.glob("test_*.py")}
    assert top <= ROOT_TESTS.keys(), f"test files at the top of test/ that test no root module: {top - ROOT_TESTS.keys()}"
    for name, module in ROOT_TESTS.items():
        if module.startswith("vradix.") and (tests / name).exists():
            assert (PKG / (module.split(".")[1] + ".py")).exists(), f"{name} names {module}, which does not exist"


def suite_files() -> list:
    """Every test file under test/ (pytest's default `test_*.py`)."""
    return sorted((PKG.parents[1] / "test").rglob("test_*.py"))


def imported_test_modules(path: pathlib.Path, names) -> list:
    """(module, line) of every import in `path`, at any depth, of a module in `names`."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] in names]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] in names:
            out.append((node.module, node.lineno))
    return out


def test_test_files_have_unique_basenames_and_import_no_other_test_file():
    """pytest imports each test file as a top-level module named by its basename (test/conftest.py says why): two
    files with one basename would collide, and a test file importing another works only when pytest happened to put
    that file's folder on `sys.path` first. Shared helpers live in `vradix.testing`."""
    files = suite_files()
    names = {p.stem for p in files} | {"conftest"}
    seen, dupes = {}, []
    for p in files:
        if p.name in seen:
            dupes.append(f"{seen[p.name]} and {p}")
        seen.setdefault(p.name, p)
    assert not dupes, "test files sharing a basename:\n" + "\n".join(dupes)
    bad = [f"{p.relative_to(PKG.parents[1])}:{line}: imports {m}"
           for p in files + sorted((PKG.parents[1] / "test").rglob("conftest.py"))
           for m, line in imported_test_modules(p, names)]
    assert not bad, "test files importing other test files (move the shared part to vradix.testing):\n" + "\n".join(bad)


@pytest.mark.parametrize("line,module", [("from test_cache_level import check", "test_cache_level"),
                                         ("import test_l3", "test_l3"),
                                         ("def f():\n    from conftest import CACHE_CONFIGS", "conftest")],
                         ids=["from", "import", "in-a-function"])
def test_the_test_import_check_sees_an_import_of_a_test_file(tmp_path, line, module):
    """The check itself can fail: an import of a test file, at the top or inside a function, is reported (and an
    import of `vradix.testing` is not)."""
    fake = tmp_path / "test_fake.py"
    fake.write_text("import pytest\nfrom vradix.testing.harness.cache_steps import check\n" + line + "\n")
    names = {p.stem for p in suite_files()} | {"conftest"}
    assert [m for m, _ in imported_test_modules(fake, names)] == [module]
