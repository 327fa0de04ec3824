"""The two wheels of `make wheel` (docs/packaging.md): the plugin wheel and the replacement wheel
`sglang-0.5.23+vradix<v>` (the pinned upstream sglang wheel repacked with vradix inside).

Built here from this tree (pure Python plugin; the `vradix._C` compile is test_csrc_build's). The E2E test installs
the replacement wheel into a fresh environment whose dependencies are hard links of this one's site-packages (no
sglang, no vradix, no editable finder), serves the stale-prefix scenario on a CPU server with vradix active, then
puts stock sglang==0.5.23 back and sees nothing of vradix left (stock's behaviour on the same scenario is
test_e2e_server.py's, on the same upstream files)."""
import csv
import difflib
import io
import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from vradix import __version__, plugin
from vradix.testing.harness.scenario import stale_prefix_publication
from vradix.testing.harness.server import CpuServer

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import build_wheels  # noqa: E402
import repack_sglang_wheel as repack  # noqa: E402

LOCAL_VERSION = f"0.5.23+vradix{__version__}"
INFO = f"sglang-{LOCAL_VERSION}.dist-info"
#: the dist-info files the repack rewrites (every other upstream file is copied byte for byte)
REWRITTEN = {"METADATA", "entry_points.txt", "top_level.txt", "RECORD"}


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    """(plugin wheel, replacement wheel, upstream wheel) built from this tree."""
    out = tmp_path_factory.mktemp("dist")
    plugin_whl, replacement = build_wheels.build(out, env={"VRADIX_BUILD_CUDA": "0"})
    return plugin_whl, replacement, repack.fetch_upstream(build_wheels.UPSTREAM_CACHE)


def files_of(wheel: Path) -> dict:
    with zipfile.ZipFile(wheel) as z:
        return {zi.filename: z.read(zi) for zi in z.infolist() if not zi.is_dir()}


def test_replacement_wheel_is_upstream_byte_for_byte_plus_the_plugin(wheels):
    plugin_whl, replacement, upstream = wheels
    assert plugin_whl.name == f"sglang_vradix-{__version__}-py3-none-any.whl"
    assert replacement.name == f"sglang-{LOCAL_VERSION}-cp311-cp311-manylinux_2_34_x86_64.whl"
    new, up, pl = files_of(replacement), files_of(upstream), files_of(plugin_whl)
    up_info = "sglang-0.5.23.dist-info"
    copied = {n.replace(up_info, INFO, 1): data for n, data in up.items() if n.rsplit("/", 1)[-1] not in REWRITTEN}
    assert len(copied) > 5000 and all(new[n] == data for n, data in copied.items())
    plugin_files = {n: d for n, d in pl.items() if not n.startswith(f"sglang_vradix-{__version__}.dist-info/")}
    assert "vradix-plugin-check.pth" in plugin_files and all(new[n] == d for n, d in plugin_files.items())
    # the census tables, their generator and the escape watch (python/vradix_census) stay in the source checkout
    census = [n for n in pl if n.startswith("vradix_census/") or "/census" in n or n.endswith("/watch.py")]
    assert census == [], census
    assert pl[f"sglang_vradix-{__version__}.dist-info/top_level.txt"] == b"vradix\n"
    # the CPU aids' plugin metadata ships too (a HiCache, P/D, hybrid or VLM CPU server run from a wheel install needs it)
    assert {"vradix/testing/cpu_aids/plugin/vradix_cpu_aids-0.dist-info/entry_points.txt",
            "vradix/testing/cpu_aids/pd_plugin/vradix_cpu_aids_pd-0.dist-info/entry_points.txt",
            "vradix/testing/cpu_aids/vlm/plugin/vradix_vlm_aids-0.dist-info/entry_points.txt",
            "vradix/testing/cpu_aids/hybrid_plugin/vradix_hybrid_cpu_aids-0.dist-info/entry_points.txt"} \
        <= set(plugin_files)
    assert set(new) == set(copied) | set(plugin_files) | {f"{INFO}/{leaf}" for leaf in REWRITTEN}
    metadata_diff = [line for line in difflib.unified_diff(up[f"{up_info}/METADATA"].decode().splitlines(),
                                                            new[f"{INFO}/METADATA"].decode().splitlines(),
                                                            lineterm="", n=0) if line[:1] in "+-"]
    assert metadata_diff == ["--- ", "+++ ", "-Version: 0.5.23", f"+Version: {LOCAL_VERSION}"]
    eps = new[f"{INFO}/entry_points.txt"].decode()
    assert eps.startswith(up[f"{up_info}/entry_points.txt"].decode().rstrip("\n"))
    assert eps.endswith("[sglang.srt.plugins]\nvradix = vradix.plugin:register\n\n")
    assert "sglang = sglang.cli.main:main\nvradix = vradix.cli:main\n\n" in eps  # the console script, upstream's section
    assert new[f"{INFO}/top_level.txt"] == b"sglang\nvradix\n"
    assert repack.validate_record(replacement) == len(new) - 1


def test_both_wheels_are_reproducible(wheels, tmp_path):
    plugin_whl, replacement, upstream = wheels
    again = build_wheels.build_plugin_wheel(tmp_path, env={"VRADIX_BUILD_CUDA": "0"})
    assert again.read_bytes() == plugin_whl.read_bytes()
    assert repack.repack(upstream, again, tmp_path).read_bytes() == replacement.read_bytes()


def tiny_wheel(path: Path, files: dict, record_rows: list) -> Path:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(record_rows)
    with zipfile.ZipFile(path, "w") as z:
        for name, data in {**files, "t-1.dist-info/RECORD": buf.getvalue().encode()}.items():
            z.writestr(name, data)
    return path


GOOD = ("t/a.py", repack.record_hash(b"a = 1\n"), "6")
SELF = ("t-1.dist-info/RECORD", "", "")


@pytest.mark.parametrize("files,rows,error", [
    ({"t/a.py": b"a = 2\n"}, [GOOD, SELF], "RECORD says"),  # content changed after RECORD was written
    ({"t/a.py": b"a = 1\n"}, [GOOD[:2] + ("7",), SELF], "RECORD says"),  # wrong size
    ({"t/a.py": b"a = 1\n", "t/b.py": b""}, [GOOD, SELF], "not listed ['t/b.py']"),
    ({}, [GOOD, SELF], "listed but absent ['t/a.py']"),
    ({"t/a.py": b"a = 1\n"}, [GOOD, GOOD, SELF], "more than once"),
    ({"t/a.py": b"a = 1\n"}, [GOOD, SELF[:1] + ("sha256=x", "1")], "no hash or size"),
])
def test_validate_record_rejects_a_wrong_record(tmp_path, files, rows, error):
    assert repack.validate_record(tiny_wheel(tmp_path / "ok.whl", {"t/a.py": b"a = 1\n"}, [GOOD, SELF])) == 1
    with pytest.raises(repack.RepackError, match=error.replace("[", r"\[").replace("]", r"\]")):
        repack.validate_record(tiny_wheel(tmp_path / "bad.whl", files, rows))


def test_an_upstream_wheel_that_does_not_match_the_published_hash_is_refused(tmp_path):
    fake = tmp_path / "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl"
    fake.write_bytes(b"not the published wheel")
    with pytest.raises(repack.RepackError, match="the published hash is 00b3cd5b"):
        repack.fetch_upstream(tmp_path)


def test_the_plugin_accepts_the_replacement_wheels_local_version_label():
    assert plugin.supported_sglang("0.5.23") and plugin.supported_sglang(LOCAL_VERSION)
    assert not plugin.supported_sglang("0.5.24") and not plugin.supported_sglang("0.5.2")


# -- E2E: the replacement wheel in a fresh environment, then stock sglang back --------------------------------------

#: site-packages entries a fresh environment must not inherit: sglang, the plugin, its editable finder and .pth files
LEAVE_OUT = ("sglang", "vradix", "__editable__")
INSPECT = """import importlib.metadata as m, importlib.util as u, json, sys
print(json.dumps({"plugins": [[e.name, e.value, e.dist.name, e.dist.version]
                              for e in m.entry_points(group="sglang.srt.plugins")],
                  "vradix": getattr(u.find_spec("vradix"), "origin", None), "sys_path": sys.path}))"""


def fresh_env(dest: Path) -> Path:
    """A venv whose site-packages holds hard links of this environment's packages minus `LEAVE_OUT`."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True, timeout=120)
    py = dest / "bin" / "python"
    site = Path(subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    ours = Path(sysconfig.get_paths()["purelib"])
    keep = [str(p) for p in sorted(ours.iterdir()) if not p.name.lower().startswith(LEAVE_OUT)]
    subprocess.run(["cp", "-al", "-t", str(site), *keep], check=True, timeout=300)
    return py


def in_env(py: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SGLANG_PLUGINS")}
    out = subprocess.run([str(py), *args], capture_output=True, text=True, timeout=600,
                         env={**env, "PYTHONNOUSERSITE": "1"})
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def inspect(py: Path) -> dict:
    return json.loads(in_env(py, "-c", INSPECT))


def pip_show_version(py: Path) -> str:
    (line,) = [x for x in in_env(py, "-m", "pip", "show", "sglang").splitlines() if x.startswith("Version: ")]
    return line.split(": ", 1)[1]


def serve_stale_prefix_scenario(py: Path, models):
    """A production server: no checkout on its path, and so no escape watch (its package is not installed there)."""
    with CpuServer(models[0], python=str(py), env={"PYTHONPATH": "", "VRADIX_CENSUS": ""}) as s:
        return stale_prefix_publication(s, models[1]), s.logs()


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_replacement_wheel_in_a_fresh_environment_then_stock_sglang_back(wheels, models, tmp_path):
    _, replacement, upstream = wheels
    py = fresh_env(tmp_path / "venv")
    env_dir = str(tmp_path / "venv")
    before = inspect(py)
    assert before["plugins"] == [] and before["vradix"] is None  # nothing of this checkout leaked in
    assert not any(p.startswith(str(ROOT)) for p in before["sys_path"] if p)

    in_env(py, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", str(replacement))
    assert pip_show_version(py) == LOCAL_VERSION
    version = subprocess.run([str(py.parent / "vradix"), "--version"], capture_output=True, text=True, timeout=60)
    assert version.stdout.strip() == f"vradix {__version__} (for sglang 0.5.23)", version
    after = inspect(py)
    assert after["plugins"] == [["vradix", "vradix.plugin:register", "sglang", LOCAL_VERSION]]
    assert after["vradix"].startswith(env_dir)
    # asked for, the escape watch fails the install closed there: its package is not in the wheel
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SGLANG_PLUGINS")}
    watch = subprocess.run([str(py), "-c", "from sglang.srt.plugins import load_plugins; load_plugins()"],
                           capture_output=True, text=True, timeout=600,
                           env={**env, "PYTHONNOUSERSITE": "1", "VRADIX_CENSUS": "1"})
    assert watch.returncode != 0 and "its package vradix_census cannot be imported" in watch.stderr, watch.stderr
    o, logs = serve_stale_prefix_scenario(py, models)
    assert f"vradix {__version__} active" in logs and "Traceback" not in logs
    assert o.warm_repeat_cached == 200 and o.cached_after == 0 and o.cached_again == 200  # no stale reuse
    assert o.vradix["epoch"] == 1 and o.vradix["label"] == "v2" and o.inflight_tokens == 300

    in_env(py, "-m", "pip", "uninstall", "-y", "-q", "sglang")  # RECORD lists every file: nothing is left behind
    site = Path(after["vradix"]).parents[1]
    assert sorted(p.name for p in site.iterdir() if p.name.lower().startswith(LEAVE_OUT)) == []
    in_env(py, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", str(upstream))
    assert pip_show_version(py) == "0.5.23"
    stock = inspect(py)
    assert stock["plugins"] == [] and stock["vradix"] is None
    # SGLang's plugin loading finds nothing to load: what a server started now runs is stock sglang
    loaded = in_env(py, "-c", "from sglang.srt.plugins import load_plugins; import sys; load_plugins(); "
                              "print(sorted(m for m in sys.modules if m.split('.')[0] == 'vradix'))")
    assert loaded.strip().splitlines()[-1] == "[]", loaded
