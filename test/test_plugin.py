"""Fail-closed install: the entry-point module imports only the standard library, any
failure inside `register()` stops the process with an error naming vradix, test faults announce themselves, and an
SGLANG_PLUGINS allow-list that leaves vradix out is warned about."""
import os
import subprocess
import sys
import zipfile

import pytest

from vradix import __version__, plugin
from vradix.testing.harness.server import CPU_FLAGS, free_port

ROOT = os.path.join(os.path.dirname(__file__), "..")

#: make one vradix step unimportable, the way a broken dependency or a packaging error would
BLOCK_IMPORT = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "vradix.core.reclaim":
            raise ImportError("simulated broken dependency of vradix.core.reclaim")
sys.meta_path.insert(0, Block())
"""


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("VRADIX_", "SGLANG_PLUGINS"))}
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=e)


def test_entry_point_module_imports_only_the_standard_library():
    """...and `vradix.settings` and `vradix.startup` (the interpreter-start step, which the environment's .pth has
    imported already), standard library only themselves."""
    out = run_python("import sys, vradix.plugin; "
                     "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sglang', 'torch', 'triton') "
                     "or (m.startswith('vradix.') and m != 'vradix.plugin')))")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['vradix.settings', 'vradix.startup']"


# vradix.plugin imports the hook bodies inside `register()`, not at module load: an import error at module load would
# make SGLang's load_plugins() log and skip vradix, and the process would go on to serve an unversioned cache
def test_a_broken_import_inside_vradix_stops_load_plugins_with_an_error_naming_vradix():
    out = run_python(BLOCK_IMPORT + "from sglang.srt.plugins import load_plugins\nload_plugins()\n"
                     "print('SERVING-UNVERSIONED')")
    assert "SERVING-UNVERSIONED" not in out.stdout
    assert out.returncode != 0
    assert f"vradix {__version__} failed to install (ImportError: simulated broken dependency" in out.stderr
    assert "refusing to serve an unversioned radix cache" in out.stderr


def test_the_import_fault_switch_stops_a_real_launch_and_is_announced(models):
    e = {k: v for k, v in os.environ.items() if not k.startswith("VRADIX_")}
    e.update({"SGLANG_USE_CPU_ENGINE": "1", "VRADIX_FAULT_IMPORT": "1"})
    out = subprocess.run([sys.executable, "-m", "sglang.launch_server", "--model-path", models[0],
                          "--port", str(free_port()), *CPU_FLAGS], capture_output=True, text=True, timeout=240, env=e)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "TEST FAULT ACTIVE: VRADIX_FAULT_IMPORT='1'" in text
    assert f"vradix {__version__} failed to install (ImportError: VRADIX_FAULT_IMPORT" in text


def test_disabled_installs_nothing_and_says_so(caplog):
    out = run_python("from sglang.srt.plugins import load_plugins\nload_plugins()\n"
                     "from sglang.srt.mem_cache import common\nprint(hasattr(common.match_kv_cache, '__wrapped__'))",
                     VRADIX_DISABLE="1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"
    assert "installed but disabled by VRADIX_DISABLE" in out.stderr


#: after load_plugins(): is any census code imported, and does the escape watch's hook wrap the bump
WATCH_PROBE = """from sglang.srt.plugins import load_plugins
load_plugins()
import sys
from vradix.scheduler import publication
print(sorted(m for m in sys.modules if m.startswith("vradix_census")), hasattr(publication.bump_scheduler, "__wrapped__"))
"""


@pytest.mark.parametrize("setting,imported,wrapped", [("", "[]", "False"), ("1", "['vradix_census', 'vradix_census.watch']", "True")],
                         ids=["off", "on"])
def test_the_escape_watch_is_installed_only_when_asked_for(setting, imported, wrapped):
    """`VRADIX_CENSUS` read once at install: off, nothing of `vradix_census` is imported and no watch hook is
    registered (the bump runs unwrapped); on, the plugin imports `vradix_census.watch` and installs its hooks."""
    out = run_python(WATCH_PROBE, VRADIX_CENSUS=setting)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == f"{imported} {wrapped}"


def test_the_escape_watch_asked_for_without_its_package_fails_closed():
    """A wheel install has no `vradix_census`: asking for the watch there stops the install, naming the package."""
    block = BLOCK_IMPORT.replace('name == "vradix.core.reclaim"', 'name.startswith("vradix_census")').replace(
        'raise ImportError("simulated broken dependency of vradix.core.reclaim")',
        'raise ModuleNotFoundError(f"No module named {name!r}", name=name)')
    out = run_python(block + "from sglang.srt.plugins import load_plugins\nload_plugins()\nprint('SERVING')",
                     VRADIX_CENSUS="1")
    assert "SERVING" not in out.stdout and out.returncode != 0
    assert "VRADIX_CENSUS asks for the escape watch (a test mode), but its package vradix_census cannot be imported" \
        in out.stderr


@pytest.mark.parametrize("allow,disable,warns", [("other", "", True), ("other,vradix", "", False), ("", "", False),
                                                 ("other", "1", False)])
def test_an_allow_list_that_excludes_vradix_is_warned_about(allow, disable, warns):
    import io
    buf = io.StringIO()
    plugin._warned_excluded = False
    env = {"SGLANG_PLUGINS": allow, "VRADIX_DISABLE": disable}
    assert plugin.warn_if_excluded(env, buf) is warns
    assert ("serve an UNVERSIONED radix cache" in buf.getvalue()) is warns
    plugin._warned_excluded = False


def test_the_startup_check_runs_at_interpreter_start_once():
    """The .pth the wheel ships (and `make setup` places) runs the check in every process of the environment."""
    out = run_python("pass", SGLANG_PLUGINS="other")
    assert out.stderr.count("excludes it: SGLang engines started from this environment") == 1, out.stderr
    assert run_python("pass", SGLANG_PLUGINS="vradix").stderr == ""


def test_the_wheel_ships_the_entry_point_and_the_startup_check(tmp_path):
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(tmp_path), ROOT], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "VRADIX_BUILD_CUDA": "0"})
    assert out.returncode == 0, out.stderr
    (whl,) = tmp_path.glob("sglang_vradix-*.whl")
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        assert "vradix-plugin-check.pth" in names
        eps = z.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "[sglang.srt.plugins]" in eps and "vradix = vradix.plugin:register" in eps
    assert census_free(names)


def census_free(names) -> bool:
    """No census table, generator or escape watch in a wheel's file list: `vradix_census` stays in the checkout, and
    nothing of it is left under vradix."""
    bad = [n for n in names if n.startswith("vradix_census") or "/census" in n or n.endswith(("/watch.py",))]
    assert not bad, f"the wheel ships census code: {bad}"
    return True


@pytest.mark.parametrize("one_scan", [False, True], ids=["sglang-scans", "one-scan"])
def test_one_scan_propagation_rebinds_exactly_what_sglangs_scan_per_target_rebinds(one_scan, monkeypatch):
    """SGLang's HookRegistry on two throwaway modules: a function target aliased by `from src import f` elsewhere
    (and twice in one module), a method target aliased at module level, and an alias inside the source module itself (SGLang's scan skips
    the source). One scan leaves every binding as SGLang's per-target scans do."""
    import collections
    import types
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    src, user = types.ModuleType("vradix_scan_src"), types.ModuleType("vradix_scan_user")
    exec("def f():\n    return 1\nclass C:\n    def m(self):\n        return 1\nsame = f\n", src.__dict__)
    user.f, user.g, user.m = src.f, src.f, src.C.m
    original_f = src.f
    for mod in (src, user):
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setattr(HookRegistry, "_hooks", collections.defaultdict(list))
    monkeypatch.setattr(HookRegistry, "_patched", set())
    HookRegistry.register("vradix_scan_src.f", lambda result: result + 1, HookType.AFTER)
    HookRegistry.register("vradix_scan_src.C.m", lambda result, self: result + 10, HookType.AFTER)
    if one_scan:
        with plugin.one_scan_propagation() as scan:
            HookRegistry.apply_hooks()
        assert len(scan.pending) == 2
    else:
        HookRegistry.apply_hooks()
    assert (src.f(), user.f(), user.g(), src.C().m()) == (2, 2, 2, 11)
    assert src.same is original_f  # the source's own alias is left alone, as SGLang's scan leaves it
    assert user.m is src.C.m  # a module-level alias of the method's function is rebound too
    from sglang.srt.plugins import hook_registry
    assert hook_registry._propagate_patch.__module__ == hook_registry.__name__  # restored
