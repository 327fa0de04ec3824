"""The GPU aid (`vradix.testing.gpu_aids`): the import-only `sgl_kernel` shim route for a CUDA machine without
`sgl_kernel` or FlashInfer, which refuses to load where a real `sgl_kernel` is importable (in-process, at install,
and as the servers' plugin). A real `sgl_kernel` here is a package folder named `sgl_kernel` without the shim's mark:
the aid decides from the file alone, importing nothing."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vradix.testing import gpu_aids
from vradix.testing.harness.server import CPU_FLAGS

REAL = '"""stands for the real sgl_kernel library"""\n__version__ = "0.4.10"\n'


def real_sgl_kernel_in(site: Path) -> Path:
    (site / "sgl_kernel").mkdir(parents=True)
    (site / "sgl_kernel" / "__init__.py").write_text(REAL)
    return site


def test_the_shim_installs_where_no_real_sgl_kernel_is_and_says_it_is_the_shim(tmp_path):
    installed = gpu_aids.install_shim(tmp_path)
    assert installed == tmp_path / "sgl_kernel"
    assert gpu_aids.SHIM_MARK in (installed / "__init__.py").read_text()
    assert gpu_aids.real_sgl_kernel([str(tmp_path)]) is None  # the shim is not the real library
    again = gpu_aids.install_shim(tmp_path)  # replaces an earlier shim
    assert again == installed


def test_a_real_sgl_kernel_is_refused_in_process_and_at_install(tmp_path):
    site = real_sgl_kernel_in(tmp_path / "site")
    assert gpu_aids.real_sgl_kernel([str(site)]) == str(site / "sgl_kernel")
    with pytest.raises(gpu_aids.RealSglKernel, match="serve with SGLang's own kernels"):
        gpu_aids.refuse_real_sgl_kernel([str(site)])
    with pytest.raises(gpu_aids.RealSglKernel):
        gpu_aids.install_shim(site)
    assert (site / "sgl_kernel" / "__init__.py").read_text() == REAL  # left as it was


@pytest.mark.parametrize("real", [False, True])
def test_the_plugin_and_the_command_refuse_a_real_sgl_kernel_on_the_path(tmp_path, real):
    site = real_sgl_kernel_in(tmp_path) if real else gpu_aids.install_shim(tmp_path).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    check = subprocess.run([sys.executable, "-m", "vradix.testing.gpu_aids", "check"], capture_output=True,
                           text=True, env=env, timeout=120)
    plugin = subprocess.run([sys.executable, "-c", "from vradix.testing.gpu_aids import register; register()"],
                            capture_output=True, text=True, env=env, timeout=120)
    assert (check.returncode, plugin.returncode != 0) == ((1, True) if real else (0, False)), check.stderr
    if real:
        assert "refused: a real sgl_kernel is installed at" in check.stderr and "RealSglKernel" in plugin.stderr


def test_the_route_flags_and_environment():
    assert gpu_aids.GPU_FLAGS[:2] == ["--device", "cuda"]
    flags = dict(zip(gpu_aids.GPU_FLAGS[::2], gpu_aids.GPU_FLAGS[1::2]))
    assert flags["--attention-backend"] == "triton" and flags["--sampling-backend"] == "pytorch"
    assert flags["--cuda-graph-backend-decode"] == flags["--cuda-graph-backend-prefill"] == "disabled"
    # the CPU route's graph and sampling flags are the same; only the device and the attention backend differ
    cpu = dict(zip(CPU_FLAGS[:10:2], CPU_FLAGS[1:10:2]))
    assert {k: v for k, v in cpu.items() if k not in ("--device", "--attention-backend")} == \
        {k: v for k, v in flags.items() if k not in ("--device", "--attention-backend")}
    env = gpu_aids.server_env({"PYTHONPATH": "/x", "SGLANG_FORCE_FUSED_OP_BACKEND": "triton"})
    assert env["PYTHONPATH"] == os.pathsep.join([gpu_aids.PLUGIN_PATH, "/x"])
    assert env["SGLANG_FORCE_FUSED_OP_BACKEND"] == "triton"  # the caller's choice stands
    assert gpu_aids.server_env(env)["PYTHONPATH"] == env["PYTHONPATH"]  # the plugin once
    assert gpu_aids.server_env({})["SGLANG_FORCE_FUSED_OP_BACKEND"] == "torch"
    eps = (Path(gpu_aids.PLUGIN_PATH) / "vradix_gpu_aids-0.dist-info" / "entry_points.txt").read_text()
    assert eps == "[sglang.srt.plugins]\nvradix_gpu_aids = vradix.testing.gpu_aids:register\n"


def test_the_sync_probe_counts_each_synchronisation_by_owner(tmp_path):
    """torch's sync debug mode needs CUDA; its warning is what the probe reads, so a warning with torch's text raised
    from a file under `vradix/` (product code), under `vradix/testing/` and elsewhere is counted as the mode's would
    be: vradix's, the engine's, the engine's; other warnings pass through; a second process's file is summed."""
    import time
    import warnings

    from vradix.testing.gpu_aids import sync_probe

    def warner(path: str):
        code = compile(f"def sync():\n    warnings.warn('x {sync_probe.SYNC_WARNING} y', UserWarning)\n", path, "exec")
        scope = {"warnings": warnings}
        exec(code, scope)
        return scope["sync"]

    probe = sync_probe.SyncProbe(str(tmp_path))
    shown = warnings.showwarning
    try:
        probe.install()
        for path, times in (("/x/vradix/ledger/guard.py", 2), ("/x/vradix/testing/harness/a.py", 1),
                            ("/x/sglang/srt/managers/scheduler.py", 3)):
            for _ in range(times):
                warner(path)()
        with warnings.catch_warnings(record=True) as other:
            warnings.simplefilter("always")
            warnings.warn("something else")
        start = time.time()
        probe.flush()
        (tmp_path / "sync-1.json").write_text('{"written_at": %f, "vradix": 1, "engine": 0, "sites": {}, '
                                              '"mode_error": null}' % (start + 1))
        counts = sync_probe.read(str(tmp_path), start - 1)
    finally:
        warnings.showwarning = shown
    assert (counts["vradix"], counts["engine"]) == (3, 4) and len(counts["processes"]) == 2
    assert counts["sites"]["vradix/ledger/guard.py:2"] == 2 and counts["sites"]["sglang/srt/managers/scheduler.py:2"] == 3
    assert len(other) == 1  # not a synchronisation: not counted


#: imports SGLang's serving path as a CUDA process would (CUDA reported available, an sm_90 card): its CUDA-gated
#: module-level imports run; prints the first missing module, or "ok"
CUDA_IMPORTS = """import importlib, torch
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 1
torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
torch.cuda.get_device_name = lambda *a, **k: "NVIDIA H100 80GB HBM3"
torch.version.cuda = "13.0"
try:
    for m in ("sglang.srt.entrypoints.http_server", "sglang.srt.managers.scheduler", "sglang.srt.models.llama",
              "sglang.srt.model_executor.model_runner", "sglang.srt.layers.attention.triton_backend",
              "sglang.srt.layers.sampler", "sglang.srt.layers.activation", "sglang.srt.layers.layernorm"):
        importlib.import_module(m)
    from sgl_kernel.utils import is_arch_support_pdl
    print("ok", is_arch_support_pdl())
except ModuleNotFoundError as e:
    print("missing", e.name)
"""


@pytest.mark.parametrize("shim", ["gpu", "cpu"])
def test_sglangs_cuda_imports_succeed_over_the_gpu_shim_and_not_over_the_cpu_one(tmp_path, shim):
    """Without a GPU: SGLang's serving path imported with CUDA reported available, over the GPU aid's shim (the CPU
    shim plus the submodules SGLang imports on CUDA) and over the CPU shim alone."""
    import shutil

    if shim == "gpu":
        gpu_aids.install_shim(tmp_path)
    else:
        shutil.copytree(gpu_aids.SHIM_PATH, tmp_path / "sgl_kernel")
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_USE_CPU_ENGINE"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", CUDA_IMPORTS], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == ("ok False" if shim == "gpu" else "missing sgl_kernel.quantization")
