"""`make wheel`: build vradix's two wheels into dist/ (docs/packaging.md).

1. `build_plugin_wheel`: the plugin wheel `sglang_vradix-<v>-*.whl`, `pip wheel` of a clean copy of setup.py,
   python/ and csrc/ (so nothing stale under build/ can ship). It carries `vradix._C` when CUDA torch and nvcc are
   present (tag `cpXY-cpXY-linux_*`) and is pure Python otherwise (tag `py3-none-any`); VRADIX_BUILD_CUDA=0/1
   forces the choice (setup.py).
2. `repack_sglang_wheel.repack`: the replacement wheel `sglang-0.5.23+vradix<v>-*.whl`, the pinned upstream
   sglang wheel with the plugin wheel's files inside.
Both builds are reproducible: SOURCE_DATE_EPOCH (default `repack_sglang_wheel.DEFAULT_EPOCH`) fixes every
timestamp, and entries are written in sorted order.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import repack_sglang_wheel  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
#: what `pip wheel` needs from the source tree
SOURCES = ("pyproject.toml", "setup.py", "README.md", "LICENSE", "python", "csrc")
UPSTREAM_CACHE = ROOT / "build" / "upstream"


def copy_sources(dest: Path) -> None:
    """`SOURCES` into `dest`, without build outputs (bytecode, egg-info, compiled extensions)."""
    dest.mkdir(parents=True)
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.so")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, dest / name, ignore=skip)
        else:
            shutil.copy2(ROOT / name, dest / name)


def cuda_build_env(env: dict) -> dict:
    """Defaults for the `vradix._C` build, as `make csrc` has them: sm_90 (a GPU-less build machine has no arch to
    detect), two compile jobs, and the CUDA toolkit directory that really holds the headers (torch would take
    /usr/local from a /usr/local/bin/nvcc link)."""
    env.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    env.setdefault("MAX_JOBS", "2")
    nvcc = shutil.which("nvcc")
    for home in ("/usr/local/cuda", *([str(Path(nvcc).resolve().parent.parent)] if nvcc else [])):
        if "CUDA_HOME" not in env and (Path(home) / "include" / "cuda_runtime.h").is_file() \
                and os.access(Path(home) / "bin" / "nvcc", os.X_OK):
            env["CUDA_HOME"] = home
    return env


def build_plugin_wheel(out_dir: Path, python: str = sys.executable, env: dict | None = None) -> Path:
    """Build the plugin wheel from a clean copy of the sources; returns its path in `out_dir`. `env` overrides
    the environment (e.g. VRADIX_BUILD_CUDA=0)."""
    env = cuda_build_env({"SOURCE_DATE_EPOCH": str(repack_sglang_wheel.DEFAULT_EPOCH), **os.environ, **(env or {})})
    with tempfile.TemporaryDirectory(prefix="vradix-wheel-") as tmp:
        src, built = Path(tmp) / "src", Path(tmp) / "out"
        copy_sources(src)
        out = subprocess.run([python, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                              "--disable-pip-version-check", "-w", str(built), str(src)],
                             capture_output=True, text=True, env=env)
        if out.returncode != 0:
            raise RuntimeError(f"pip wheel failed:\n{out.stdout}{out.stderr}")
        (wheel,) = built.glob("sglang_vradix-*.whl")
        out_dir.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy(wheel, out_dir / wheel.name))


def build(out_dir: Path, python: str = sys.executable, cache: Path = UPSTREAM_CACHE,
          env: dict | None = None) -> tuple[Path, Path]:
    """(plugin wheel, replacement wheel), both in `out_dir`."""
    plugin = build_plugin_wheel(out_dir, python, env)
    upstream = repack_sglang_wheel.fetch_upstream(cache, python)
    return plugin, repack_sglang_wheel.repack(upstream, plugin, out_dir)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "dist")
    args = p.parse_args(argv)
    t0 = time.monotonic()
    plugin, replacement = build(args.out)
    kind = "pure Python" if plugin.name.endswith("-py3-none-any.whl") else "with vradix._C"
    print(f"[wheel] plugin wheel ({kind}): {plugin}")
    print(f"[wheel] replacement sglang wheel ({repack_sglang_wheel.validate_record(replacement)} files, RECORD "
          f"valid): {replacement}")
    print(f"[wheel] done in {time.monotonic() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
