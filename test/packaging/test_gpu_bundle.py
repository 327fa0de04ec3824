"""The carried runtime of `make gpu-bundle` (docs/gpu-bundle.md), built here for this machine's Python.

The bundle is built once per module (xz preset 1: the largest the archive gets, so the size limit checked here holds
for `make gpu-bundle`'s preset 6), installed offline by its own `install.sh` into a fresh venv whose base sees only
the torch stack (torch, torchvision, Triton, numpy and what they require: links to this environment's installed
files, `gpu_bundle.torch_only_python`), and serves the tiny float32 Llama on SGLang's CPU engine from there: greedy
ids equal HF transformers' greedy generate on the same weights, vradix active, every SGLang and vradix module
loaded from the bundle's venv."""
import json
import os
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from vradix import __version__
from vradix.testing.harness.hybrid_oracle import hf_greedy
from vradix.testing.harness.server import CpuServer

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_bundle  # noqa: E402

PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
PROMPT = [5, 17, 99, 3, 250, 77, 8, 9, 10, 11]
WHERE = """import json, sglang, sgl_kernel, sgl_kernel.utils, vradix, transformers, torch
print(json.dumps({**{m.__name__: m.__file__ for m in (sglang, sgl_kernel, vradix, transformers, torch)},
                  "pdl": sgl_kernel.utils.is_arch_support_pdl()}))"""


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """(archive, its manifest, seconds the build took)."""
    out = tmp_path_factory.mktemp("gpu-bundle")
    t0 = time.monotonic()
    archive = gpu_bundle.build(out, PYTHON, preset=1)
    return archive, json.loads((out / "MANIFEST.json").read_text()), time.monotonic() - t0


def test_the_bundle_holds_sglang_its_serving_deps_and_vradix_within_the_size_limit(bundle):
    archive, manifest, seconds = bundle
    assert archive.stat().st_size <= gpu_bundle.LIMIT_MIB << 20 and manifest["archive_bytes"] == archive.stat().st_size
    names = {gpu_bundle.canonical(r["name"]) for r in manifest["wheels"]}
    assert {"sglang", "sglang-vradix", "transformers", "fastapi", "pydantic-core", "pyzmq"} <= names
    assert not names & {"torch", "torchvision", "triton", "numpy", "nvidia-cublas"}  # the machine's own
    with tarfile.open(archive) as tar:
        members = set(tar.getnames())
        req = tar.extractfile(f"{gpu_bundle.NAME}/requirements.txt").read().decode().split()
        sglang_whl = next(m for m in members if m.startswith(f"{gpu_bundle.NAME}/wheels/sglang-0.5.23-"))
        with zipfile.ZipFile(tar.extractfile(sglang_whl)) as z:
            files = z.namelist()
    assert {f"{gpu_bundle.NAME}/{leaf}" for leaf in ("install.sh", "requirements.txt", "MANIFEST.json")} <= members
    assert len(req) == len(manifest["wheels"]) and f"sglang-vradix=={__version__}" in req
    # upstream's Python sources, without its compiled Rust extensions or the diffusion server
    assert "sglang/srt/managers/scheduler.py" in files and "sglang/srt/mem_cache/rust_tree_core/adapter.py" in files
    assert not [f for f in files if f.endswith(".so") or f.startswith("sglang/multimodal_gen/")]
    assert sglang_whl.endswith("-py3-none-any.whl")
    print(f"[gpu-bundle] {archive.stat().st_size / (1 << 20):.1f} MiB, built in {seconds:.0f} s")


def test_an_archive_over_the_limit_fails_the_build(bundle, tmp_path):
    archive, _, _ = bundle
    with pytest.raises(gpu_bundle.BundleError, match="over the 1 MiB limit"):
        gpu_bundle.check_size(archive, 1)
    assert gpu_bundle.main(["--out", str(tmp_path), "--python", "312"]) == 1 and not any(tmp_path.iterdir())


@pytest.mark.parametrize("tag,python,ok", [
    ("py3-none-any", "3.12", True), ("py2.py3-none-any", "3.12", True), ("py2-none-any", "3.12", False),
    ("cp310-abi3-manylinux_2_17_x86_64", "3.12", True), ("cp311-cp311-manylinux_2_17_x86_64", "3.12", False),
    ("cp312-cp312-manylinux_2_28_x86_64", "3.12", True), ("cp312-cp312-manylinux_2_28_aarch64", "3.12", False),
])
def test_which_installed_wheels_fit_the_target_python(tag, python, ok):
    assert gpu_bundle.fits(tag, python) is ok


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_the_bundle_installed_offline_over_a_torch_only_python_serves_a_tiny_model(bundle, models, tmp_path):
    archive, _, _ = bundle
    base = gpu_bundle.torch_only_python(tmp_path / "base")
    bare = subprocess.run([str(base), "-c", "import sglang"], capture_output=True, text=True, timeout=120)
    assert bare.returncode != 0 and "No module named 'sglang'" in bare.stderr  # the base is the torch stack alone
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path, filter="data")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PIP_CONFIG_FILE": "/dev/null", "PYTHONNOUSERSITE": "1"}
    t0 = time.monotonic()
    install = subprocess.run(["bash", str(tmp_path / gpu_bundle.NAME / "install.sh"), str(tmp_path / "venv"),
                              str(base)], capture_output=True, text=True, timeout=300, env=env)
    assert install.returncode == 0, install.stdout + install.stderr
    installed_s = time.monotonic() - t0
    py = tmp_path / "venv" / "bin" / "python"
    where = json.loads(subprocess.run([str(py), "-c", WHERE], capture_output=True, text=True, check=True,
                                      timeout=120, env=env).stdout)
    venv = str(tmp_path / "venv")
    assert all(where[m].startswith(venv) for m in ("sglang", "sgl_kernel", "vradix", "transformers")), where
    assert not where["torch"].startswith(venv)  # the machine's torch, through the base
    assert where["pdl"] is False  # the GPU aid's shim, submodules included
    expected = hf_greedy({"A": models[0]}, [PROMPT], 8)["A", tuple(PROMPT)]
    with CpuServer(models[0], python=str(py), env={"PYTHONPATH": "", "VRADIX_CENSUS": ""}) as s:
        out = s.generate(PROMPT, 8)
        logs = s.logs()
    assert out["output_ids"] == expected
    assert f"vradix {__version__} active" in logs and "Traceback" not in logs
    print(f"[gpu-bundle] installed in {installed_s:.0f} s")


@pytest.mark.long
@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_the_gpu_serving_check_passes_its_cpu_dry_run(bundle, tmp_path):
    """`gpu_serve_check.sh --cpu-dry-run`: the device script's steps on the CPU engine, from the bundle installed
    over a torch-only python (about 3 minutes on 2 cores: `make test-long`)."""
    archive, _, _ = bundle
    base = gpu_bundle.torch_only_python(tmp_path / "base")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SGLANG_USE_CPU_ENGINE")}
    env.update({"BUNDLE": str(archive), "PY": str(base), "OUT": str(tmp_path / "out"), "WORK": str(tmp_path),
                "PIP_CONFIG_FILE": "/dev/null"})
    (tmp_path / "out").mkdir()
    run = subprocess.run(["bash", str(ROOT / "benchmark/gpu_check/gpu_serve_check.sh"), "--cpu-dry-run"],
                         capture_output=True, text=True, env=env, timeout=840)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    result = json.loads((tmp_path / "out" / "gpu_serve_check.json").read_text())
    assert result["passed"] and result["environment"]["device"] == "cpu"
    pub = result["publication"]
    assert pub["vradix"]["verdict"] == "equal" and pub["stock"]["verdict"] == "differs" and pub["vradix_active"]
    assert result["ledger"]["kernels"] == "torch" and result["ledger"]["violations_caught"] == 0
    assert result["sync"]["measured"] is False  # no CUDA driver here: the count is for a GPU
    assert {r["workload"] for r in result["steady"]} == {"grpo", "decode"}
    assert all(r["mismatches"] == 0 for r in result["steady"])
