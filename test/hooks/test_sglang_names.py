"""Every private SGLang name vradix uses outside the hook table is listed (`vradix.hooks.sglang_names`) and checked
at install: the real list holds on SGLang 0.5.23, a missing name stops the install naming it, and vradix's source
uses no leading-underscore name of another object that the list (or vradix itself) does not account for."""
import ast
import pathlib

import pytest

from vradix import plugin
from vradix.hooks import sglang_names
from vradix.hooks.sglang_names import ASSIGNED, INSTANCE, MEMBER, PrivateName

PACKAGE = pathlib.Path(sglang_names.__file__).resolve().parents[1]
#: the product code: everything but the test aids, which patch SGLang for CPU runs and are exercised by the tests
PRODUCT = [p for p in sorted(PACKAGE.rglob("*.py")) if "testing" not in p.relative_to(PACKAGE).parts]
#: private names of other libraries vradix's product code uses, and where
NOT_SGLANG = {"_content": "requests.Response (vradix.client rebuilds a worker's answer the gateway wrapped)"}


def test_every_private_name_vradix_uses_exists_in_sglang():
    names = sglang_names.all_names()
    assert {n.kind for n in names} == {MEMBER, INSTANCE, ASSIGNED}
    assert len(sglang_names.PRIVATE_NAMES) >= 16
    assert sglang_names.missing() == []


@pytest.mark.parametrize("planted", [
    PrivateName("sglang.srt.mem_cache.unified_radix_cache:UnifiedRadixCache", "_evict_renamed", MEMBER, "a test"),
    PrivateName("sglang.srt.managers.scheduler:Scheduler", "_paused_renamed", INSTANCE, "a test"),
    PrivateName("sglang.srt.mem_cache.common", "_key_renamed", MEMBER, "a test"),
    PrivateName("sglang.srt.models.kimi_vl_moonvit", "_grid_memo_renamed", ASSIGNED, "a test"),
    PrivateName("sglang.srt.mem_cache.no_such_module:Gone", "_anything", MEMBER, "a test"),
], ids=["method", "instance-attribute", "module-function", "assigned-copy", "moved-owner"])
def test_a_missing_private_name_stops_the_install_naming_it(planted, monkeypatch):
    """The install refuses before it applies any hook (so this runs in-process): the error names the SGLang name."""
    monkeypatch.setattr(sglang_names, "PRIVATE_NAMES", sglang_names.PRIVATE_NAMES + (planted,))
    with pytest.raises(plugin.VradixInstallError, match=planted.label().replace(".", r"\.")):
        with plugin.failing_closed():
            plugin._install()


def own_names(paths) -> set:
    """Leading-underscore names vradix defines: functions and methods, class-body names (fields), attributes it
    assigns on `self`, and the `_vradix*` attributes it hangs on SGLang objects."""
    names = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            if isinstance(node, ast.ClassDef):
                for stmt in node.body:
                    targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
                    names.update(t.id for t in targets if isinstance(t, ast.Name))
            if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                    and isinstance(node.value, ast.Name) and node.value.id == "self"):
                names.add(node.attr)
    return {n for n in names if n.startswith("_")}


def private_uses(source: str) -> set:
    """Leading-underscore (not dunder) names `source` reads or sets on an object, names with `getattr`/`hasattr`/
    `setattr`, or imports from SGLang."""
    used = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            used.add(node.attr)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            used.add(node.args[1].value)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sglang"):
            used.update(alias.name for alias in node.names)
    return {n for n in used if n.startswith("_") and not n.startswith("__")}


def unaccounted(paths) -> dict:
    """{name: files} for private names the product code uses that are neither vradix's own, nor listed in
    `sglang_names`, nor another library's (`NOT_SGLANG`)."""
    allowed = own_names(PRODUCT) | {n.name for n in sglang_names.all_names()} | set(NOT_SGLANG)
    out = {}
    for path in paths:
        for name in private_uses(path.read_text()) - allowed:
            if not name.startswith("_vradix"):
                out.setdefault(name, []).append(path.name)
    return out


def test_vradix_uses_no_private_sglang_name_the_list_does_not_hold():
    assert unaccounted(PRODUCT) == {}


def test_the_scan_finds_a_private_name_the_list_does_not_hold(tmp_path):
    """A step that reads a new private SGLang attribute, or imports a private SGLang function, fails the scan."""
    step = tmp_path / "step.py"
    step.write_text("from sglang.srt.mem_cache.common import _new_helper\n\n"
                    "def evict(cache):\n    return cache._evict_something_new(), getattr(cache, '_other_new')\n")
    assert set(unaccounted([step])) == {"_new_helper", "_evict_something_new", "_other_new"}
