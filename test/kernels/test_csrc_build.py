"""CI compile check for csrc/: `scripts/build_csrc.sh` builds `vradix._C` for sm_90 with the venv's CUDA torch 2.14.1
(nothing CUDA runs here). The result must load, expose the four page-epoch kernels and the fingerprint digest, and
carry sm_90 device code (and only that) in its fatbin.

Needs nvcc (CUDA 13 toolkit, as on the CI machines). VRADIX_SKIP_CSRC_BUILD=1 skips it explicitly (e.g. a laptop
without the toolkit); it never skips on its own."""
import glob
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(os.environ.get("VRADIX_SKIP_CSRC_BUILD") == "1",
                                reason="VRADIX_SKIP_CSRC_BUILD=1: csrc compile check explicitly skipped")


@pytest.mark.timeout(3600)
def test_csrc_compiles_for_sm90_and_loads():
    out = ROOT / "build" / "csrc-sm90"
    env = {**os.environ, "PY": sys.executable, "TORCH_CUDA_ARCH_LIST": "9.0"}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "build_csrc.sh"), str(out)], env=env, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    (so,) = glob.glob(str(out / "vradix" / "_C*.so"))
    spec = importlib.util.spec_from_file_location("vradix._C", so)
    import torch  # noqa: F401  (the extension links against torch's libraries)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert {"stamp", "verify", "row_epochs", "invalidate", "fingerprint_words"} <= set(dir(mod))
    assert device_code_archs(so, out / "fatbin.bin") == {b"sm_90"}


def device_code_archs(so: str, scratch: Path) -> set:
    """The `sm_NN` names in the device-code section (`.nv_fatbin`) of `so`. The host code's read-only data names other
    architectures (torch's headers), so the whole file says nothing about the device code."""
    subprocess.run(["objcopy", "-O", "binary", "--only-section=.nv_fatbin", so, str(scratch)], check=True)
    return set(re.findall(rb"sm_\d+a?", scratch.read_bytes()))
