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
