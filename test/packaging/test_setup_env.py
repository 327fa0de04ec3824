"""`make setup` (scripts/setup_env.sh) is quiet and honest: the full output goes to `<venv>/setup.log`, a failure
prints the log's tail and its path and exits nonzero, and an up-to-date venv costs one line. Run against throwaway
venv directories (VRADIX_VENV), never the project's .venv."""
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "setup_env.sh"


def run_setup(venv: Path, **env) -> subprocess.CompletedProcess:
    e = {**os.environ, "VRADIX_VENV": str(venv), "PYTHON": getattr(sys, "_base_executable", sys.executable), **env}
    return subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=300, env=e)


@pytest.mark.timeout(300)
def test_a_failing_pip_step_prints_the_log_tail_and_its_path(tmp_path):
    """A real pip failure: no index and an empty find-links directory, so the first step (`pip>=24`) has nothing
    to install."""
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    venv = tmp_path / "venv"
    out = run_setup(venv, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(empty))
    log = venv / "setup.log"
    assert out.returncode != 0
    assert out.stdout == f"[setup] building {venv} (a few minutes; full output in {log})\n"
    err = out.stderr.splitlines()
    assert err[0].startswith("[setup] FAILED after ") and err[0].endswith("s: upgrade pip, setuptools, wheel")
    assert err[1] == f"[setup] last 40 lines of {log}:" and err[-1] == f"[setup] full log: {log}"
    assert any("No matching distribution found for pip>=24" in line for line in err)  # pip's own words
    assert len(err) <= 43  # the tail, not the whole log
    text = log.read_text()
    assert "==> upgrade pip, setuptools, wheel" in text and "No matching distribution found for pip>=24" in text
    assert not (venv / ".vradix-setup-stamp").exists()  # a failed build is not marked up to date


def test_an_up_to_date_venv_costs_one_line(tmp_path):
    key = hashlib.sha256(b"".join(p.read_bytes() for p in (SCRIPT, ROOT / "pyproject.toml", ROOT / "setup.py",
                                                           ROOT / "scripts" / "derive_constraints.py"))).hexdigest()
    (tmp_path / ".vradix-setup-stamp").write_text(key[:16] + "\n")
    out = run_setup(tmp_path)
    assert (out.returncode, out.stdout, out.stderr) == (0, "[setup] .venv up to date\n", "")
    assert not (tmp_path / "setup.log").exists()
