"""`make gpu-bundle`: one archive that serves SGLang 0.5.23 with vradix on a CUDA machine holding only the torch
stack (torch, torchvision, Triton, numpy) and no package registry (docs/gpu-bundle.md).

    python scripts/gpu_bundle.py [--out build/gpu-bundle] [--python 3.12] [--limit-mib 60] [--xz-preset 6]
    python scripts/gpu_bundle.py --torch-only-python DEST   # a venv seeing only the torch stack (tests, dry runs)

The archive `vradix-gpu-bundle.tar.xz` holds one folder `vradix-gpu-bundle/`:
- `wheels/`: SGLang 0.5.23 (upstream's installed files, less its compiled Rust extensions and the diffusion server
  `sglang/multimodal_gen`, as a pure-Python wheel), the distributions its serving path imports that the torch stack
  lacks (`ROOTS` and what they require), and vradix's plugin wheel. Each comes from this environment's installed
  files, rewrapped as a wheel, except compiled distributions whose installed build does not fit `--python`: those
  are downloaded for that Python (`pip download --only-binary`, manylinux x86_64) into `build/gpu-bundle-cache`;
- `requirements.txt` (every wheel pinned), `MANIFEST.json` (what is inside and why), `install.sh` (offline).
Wheels are stored uncompressed inside the archive: xz then compresses across all of them. The build fails when the
archive exceeds `--limit-mib`.

`install.sh [VENV] [PYTHON]`: a venv at VENV (default ./venv) that sees PYTHON's packages (default python3; its torch
stack) after its own, every wheel installed with `pip --no-index --no-deps`, the import-only `sgl_kernel` shim
placed by `python -m vradix.testing.gpu_aids install-shim` (which refuses a real `sgl_kernel`), and an import check.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Dict, Iterable, List, Optional

from packaging.requirements import Requirement

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_wheels  # noqa: E402
import repack_sglang_wheel as repack  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "build" / "gpu-bundle"
NAME = "vradix-gpu-bundle"
LIMIT_MIB = 60
#: xz preset of `make gpu-bundle` (the smallest archive); preset 1 is about 7x faster and about 20% larger
XZ_PRESET = 6
#: the Python of the device machine's torch (python3 there is CPython 3.12)
DEVICE_PYTHON = "3.12"
#: what the target machine brings: the torch stack (and, through `closure`, what it requires)
BASE = ("torch", "torchvision", "triton", "numpy")
#: what SGLang 0.5.23's serving path (launch_server, the HTTP server, tokenizer and detokenizer managers, the
#: scheduler and model runner, the Llama model, the plugins' load) and vradix import beyond the torch stack: found by
#: importing each of those modules in a venv that sees only the torch stack, adding the distribution of every missing
#: module until the imports succeeded, then serving a tiny model from the installed bundle until the server started
#: (einops, jsonschema, xgrammar, soundfile: imported lazily); test/packaging/test_gpu_bundle.py serves from it
ROOTS = ("aiohttp", "apache-tvm-ffi", "click", "compressed-tensors", "dill", "einops", "fastapi", "gguf",
         "huggingface-hub", "ipython", "jsonschema", "msgspec", "openai", "opentelemetry-api", "orjson", "packaging",
         "partial-json-parser", "pillow", "psutil", "pybase64", "pydantic", "python-multipart", "pyyaml", "pyzmq",
         "regex", "requests", "sentencepiece", "setproctitle", "soundfile", "starlette", "tqdm", "transformers",
         "uvicorn", "uvloop", "xgrammar")
#: parts of the installed SGLang the bundle leaves out: its compiled Rust extensions (built for this CPython and
#: against torch 2.14; the Python TreeCore serves instead) and the diffusion server
SGLANG_DROP = (re.compile(r".*\.so$"), re.compile(r"^sglang/multimodal_gen/"), re.compile(r".*/__pycache__/"))
#: manylinux platforms a downloaded wheel may carry (the device's glibc is recent; pip matches each tag exactly)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_26_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64")

INSTALL_SH = r"""#!/usr/bin/env bash
# Offline install of the vradix GPU bundle: install.sh [VENV] [PYTHON] (docs/gpu-bundle.md).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
VENV="${1:-$HERE/venv}"
PY="${2:-${PYTHON:-python3}}"
"$PY" -c "import torch, triton" || { echo "[install] $PY has no torch/triton: give the torch stack's python" >&2; exit 1; }
# a python without ensurepip (Debian's, say) makes the venv without pip: the base's pip, seen through the .pth below,
# then installs into it
"$PY" -m venv "$VENV" 2>/dev/null || "$PY" -m venv --without-pip "$VENV"
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
# the venv sees the base interpreter's packages (its torch stack) after its own: every sys.path entry of the base
# that is not its standard library, in order
"$PY" - "$SITE/zz_vradix_base.pth" <<'EOF'
import os, sys, sysconfig
std = sysconfig.get_paths()["stdlib"]
paths = [p for p in sys.path if p and not p.endswith(".zip") and os.path.commonpath([p, std]) != std]
open(sys.argv[1], "w").write("".join(p + "\n" for p in paths))
EOF
"$VENV/bin/python" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check \
  --find-links "$HERE/wheels" -r "$HERE/requirements.txt"
"$VENV/bin/python" -m vradix.testing.gpu_aids install-shim "$SITE"
"$VENV/bin/python" -c "import sglang, torch, triton, vradix, vradix.plugin; print('[install] sglang', sglang.__version__, 'torch', torch.__version__, 'triton', triton.__version__, 'vradix', vradix.__version__)"
echo "[install] done: $VENV/bin/python"
"""


class BundleError(RuntimeError):
    pass


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(roots: Iterable[str], stop: Iterable[str] = ()) -> Dict[str, metadata.Distribution]:
    """{canonical name: installed distribution} for `roots` and everything they require (no extras), not entering
    `stop`. Raises when one is not installed here."""
    stop = {canonical(n) for n in stop}
    seen: Dict[str, metadata.Distribution] = {}
    todo = list(roots)
    while todo:
        key = canonical(todo.pop())
        if key in seen or key in stop:
            continue
        try:
            dist = metadata.distribution(key)
        except metadata.PackageNotFoundError:
            raise BundleError(f"{key} is not installed in {sys.prefix}: run `make setup` first") from None
        seen[key] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def base_closure() -> set:
    """Canonical names of the torch stack and what it requires."""
    return set(closure(BASE))


def wheel_tags(dist: metadata.Distribution) -> List[str]:
    return [line.split(":", 1)[1].strip() for line in (dist.read_text("WHEEL") or "").splitlines()
            if line.startswith("Tag:")]


def fits(tag: str, python: str) -> bool:
    """Whether a wheel tag `py-abi-platform` installs on CPython `python` (x.y) on x86-64 Linux."""
    py, abi, plat = tag.split("-")
    minor = int(python.split(".")[1])
    if plat != "any" and not plat.endswith("x86_64"):
        return False
    if "py3" in py.split(".") and abi == "none":
        return True
    m = re.fullmatch(r"cp3(\d+)", py)
    if m is None:
        return False
    return (abi == "abi3" and int(m.group(1)) <= minor) or (abi == f"cp3{minor}" and int(m.group(1)) == minor)


def wheel_from_installed(dist: metadata.Distribution, out_dir: Path, drop=(), tag: Optional[str] = None,
                         pure: bool = False) -> Path:
    """A wheel of `dist`'s installed files (its RECORD, without files outside site-packages, bytecode and the
    `drop` patterns), entries stored uncompressed, with a fresh RECORD, named with `tag` (default: its first).
    `pure` rewrites its WHEEL file to the one tag `tag`, pure Python."""
    name, version = dist.metadata["Name"], dist.version
    info = next((str(f.parts[0]) for f in dist.files or [] if str(f.parts[0]).endswith(".dist-info")), None)
    if info is None:
        raise BundleError(f"{name} has no dist-info in its RECORD")
    epoch = repack.DEFAULT_EPOCH
    files = {}
    for f in dist.files or []:
        rel = f.as_posix()
        leaf = rel.rsplit("/", 1)[-1]
        if rel.startswith("..") or "__pycache__" in f.parts or any(p.match(rel) for p in drop) \
                or leaf in ("RECORD", "INSTALLER", "REQUESTED", "direct_url.json"):
            continue
        path = Path(str(dist.locate_file(f)))
        if not path.is_file():
            continue
        data = path.read_bytes()
        if pure and rel == f"{info}/WHEEL":
            data = re.sub(r"(?m)^(Root-Is-Purelib: ).*$", r"\g<1>true", re.sub(r"(?m)^Tag: .*\n", "", data.decode()))
            data = (data.rstrip("\n") + f"\nTag: {tag}\n").encode()
        zi = repack.new_entry(rel, epoch, 0o755 if os.access(path, os.X_OK) else 0o644)
        zi.compress_type = zipfile.ZIP_STORED
        files[rel] = (zi, data)
    tag = tag or wheel_tags(dist)[0]
    out = out_dir / f"{re.sub(r'[-_.]+', '_', name)}-{version}-{tag}.whl"
    repack.write_wheel(out, files, info, epoch)
    return out


def download(dists: List[metadata.Distribution], python: str, cache: Path) -> Dict[str, Path]:
    """{canonical name: wheel} of each of `dists` at its installed version for CPython `python`, from `cache` or
    downloaded into it."""
    cache.mkdir(parents=True, exist_ok=True)
    tag = "cp3" + python.split(".")[1]
    want = {canonical(d.metadata["Name"]): d.version for d in dists}

    def cached() -> Dict[str, Path]:
        found = {}
        for whl in cache.glob("*.whl"):
            dist_name, version, py = whl.name.split("-")[:3]
            if want.get(canonical(dist_name)) == version and tag in py.split(".") + [py]:
                found[canonical(dist_name)] = whl
        return found

    missing = [f"{n}=={v}" for n, v in want.items() if n not in cached()]
    if missing:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
               python, "--implementation", "cp", "--abi", tag, "--abi", "abi3",
               *(x for p in PLATFORMS for x in ("--platform", p)), "-d", str(cache), *missing]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            raise BundleError(f"pip download for CPython {python} failed ({' '.join(missing)}):\n{out.stderr[-2000:]}")
    found = cached()
    if set(found) != set(want):
        raise BundleError(f"no CPython {python} wheel for {sorted(set(want) - set(found))}")
    return found


def restore(whl: Path, out_dir: Path) -> Path:
    """A copy of a downloaded wheel with its entries stored uncompressed (same files, same RECORD)."""
    out = out_dir / whl.name
    with zipfile.ZipFile(whl) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for zi in src.infolist():
            data = src.read(zi)
            zi.compress_type = zipfile.ZIP_STORED
            dst.writestr(zi, data)
    return out


def collect(wheels: Path, python: str, cache: Path) -> List[dict]:
    """Write every wheel of the bundle into `wheels`; returns one manifest row per wheel."""
    base = base_closure()
    deps = closure(ROOTS, stop=base | {"sglang", "sglang-vradix"})
    rows = []
    for key, dist in sorted(deps.items()):
        tag = next((t for t in wheel_tags(dist) if fits(t, python)), None)
        if tag is not None:
            whl, source = wheel_from_installed(dist, wheels, tag=tag), "installed"
        else:
            whl, source = None, "download"
        rows.append({"name": dist.metadata["Name"], "version": dist.version, "wheel": whl, "source": source,
                     "dist": dist})
    foreign = [r["dist"] for r in rows if r["wheel"] is None]
    got = download(foreign, python, cache) if foreign else {}
    for r in rows:
        if r["wheel"] is None:
            r["wheel"] = restore(got[canonical(r["name"])], wheels)
    sglang = metadata.distribution("sglang")
    rows.append({"name": "sglang", "version": sglang.version, "source": "installed, less compiled extensions",
                 "wheel": wheel_from_installed(sglang, wheels, SGLANG_DROP, tag="py3-none-any", pure=True)})
    plugin = build_wheels.build_plugin_wheel(wheels, env={"VRADIX_BUILD_CUDA": "0"})
    rows.append({"name": "sglang-vradix", "version": plugin.name.split("-")[1], "source": "this tree", "wheel": plugin})
    for r in rows:
        r.pop("dist", None)
        r["wheel"] = Path(r["wheel"]).name
        r["bytes"] = (wheels / r["wheel"]).stat().st_size
    return rows


def build(out_dir: Path = OUT, python: str = DEVICE_PYTHON, limit_mib: float = LIMIT_MIB,
          cache: Optional[Path] = None, preset: int = XZ_PRESET) -> Path:
    """Build `out_dir/vradix-gpu-bundle.tar.xz` for CPython `python` at xz `preset`; raises `BundleError` above
    `limit_mib`."""
    if re.fullmatch(r"3\.\d+", python) is None:
        raise BundleError(f"the target Python is x.y (e.g. {DEVICE_PYTHON}, the device's), not {python!r}")
    t0 = time.monotonic()
    out_dir.mkdir(parents=True, exist_ok=True)
    cache = cache or out_dir.parent / f"{out_dir.name}-cache"  # beside, not inside: the folder is what travels
    with tempfile.TemporaryDirectory(prefix="vradix-gpu-bundle-") as tmp:
        top = Path(tmp) / NAME
        wheels = top / "wheels"
        wheels.mkdir(parents=True)
        rows = collect(wheels, python, cache)
        (top / "requirements.txt").write_text("".join(f"{r['name']}=={r['version']}\n" for r in rows))
        (top / "install.sh").write_text(INSTALL_SH)
        (top / "install.sh").chmod(0o755)
        manifest = {"python": python, "base": list(BASE), "roots": list(ROOTS), "wheels": rows,
                    "sglang_dropped": [p.pattern for p in SGLANG_DROP],
                    "uncompressed_bytes": sum(r["bytes"] for r in rows)}
        (top / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
        archive = out_dir / f"{NAME}.tar.xz"
        plain = Path(tmp) / f"{NAME}.tar"
        with tarfile.open(plain, "w") as tar:
            tar.add(top, arcname=NAME, filter=reproducible)
        # xz on every core (Python's lzma uses one); the threaded stream splits into blocks, a little larger
        with open(archive.with_suffix(".tmp"), "wb") as f:
            subprocess.run(["xz", "-T0", f"-{preset}", "-c", str(plain)], stdout=f, check=True)
        os.replace(archive.with_suffix(".tmp"), archive)
    size = archive.stat().st_size
    (out_dir / "MANIFEST.json").write_text(json.dumps({**manifest, "archive_bytes": size}, indent=1) + "\n")
    print(f"[gpu-bundle] {archive}: {size / (1 << 20):.1f} MiB at xz -{preset} ({len(rows)} wheels, "
          f"{manifest['uncompressed_bytes'] / (1 << 20):.0f} MiB unpacked, CPython {python}) in "
          f"{time.monotonic() - t0:.0f} s")
    check_size(archive, limit_mib)
    return archive


def check_size(archive: Path, limit_mib: float) -> None:
    """Raise `BundleError` when `archive` is larger than `limit_mib` MiB."""
    mib = archive.stat().st_size / (1 << 20)
    if mib > limit_mib:
        raise BundleError(f"{archive} is {mib:.1f} MiB, over the {limit_mib:g} MiB limit (docs/gpu-bundle.md: "
                          "what to leave out)")


def reproducible(ti: tarfile.TarInfo) -> tarfile.TarInfo:
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    ti.mtime = repack.DEFAULT_EPOCH
    return ti


def torch_only_python(dest: Path) -> Path:
    """A venv at `dest` that sees only the torch stack of this environment (`BASE` and what it requires, through a
    folder of links to their installed files and a .pth): the machine the bundle is for, without a GPU. Returns its
    python."""
    site_links = dest / "torch-stack"
    site_links.mkdir(parents=True)
    for dist in closure(BASE).values():
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] not in ("..", "__pycache__")}:
            link = site_links / top
            if not link.exists():
                link.symlink_to(Path(str(dist.locate_file(top))))
    subprocess.run([sys.executable, "-m", "venv", str(dest / "venv")], check=True, timeout=300)
    py = dest / "venv" / "bin" / "python"
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], check=True,
                          capture_output=True, text=True).stdout.strip()
    (Path(site) / "torch_stack.pth").write_text(f"{site_links}\n")
    return py


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--python", default=DEVICE_PYTHON, help="the target CPython, x.y (default: the device's)")
    p.add_argument("--limit-mib", type=float, default=LIMIT_MIB)
    p.add_argument("--xz-preset", type=int, default=XZ_PRESET, choices=range(10))
    p.add_argument("--torch-only-python", type=Path, metavar="DEST",
                   help="instead: make a venv at DEST that sees only this environment's torch stack; print its python")
    a = p.parse_args(argv)
    if a.torch_only_python is not None:
        print(torch_only_python(a.torch_only_python.resolve()))
        return 0
    try:
        build(a.out, a.python, a.limit_mib, preset=a.xz_preset)
    except BundleError as e:
        print(f"[gpu-bundle] FAILED: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
