"""Repack the upstream `sglang==0.5.23` wheel with vradix inside: the replacement wheel `sglang-0.5.23+vradix<v>`.

Data path: `fetch_upstream` (pip download by exact version, checked against the pinned published sha256)
-> `repack` (upstream files copied byte for byte + the plugin wheel's files + an edited dist-info + a new RECORD)
-> `validate_record` (every file listed once with its sha256 and size; RECORD itself without).

Invariants of the output:
- every upstream file is in it with identical bytes; the only upstream files not copied as they are, are the four
  dist-info files `repack` rewrites (METADATA, entry_points.txt, top_level.txt, RECORD), under the renamed
  `sglang-0.5.23+vradix<v>.dist-info/`;
- METADATA differs from upstream's only in its `Version:` line; entry_points.txt is upstream's plus the plugin's
  console script (`vradix`, in upstream's `[console_scripts]`) and `[sglang.srt.plugins]` entry; top_level.txt
  gains the plugin's top-level packages;
- reproducible: entries sorted by name (dist-info last, RECORD last of all), added or rewritten entries stamped with
  SOURCE_DATE_EPOCH (default `DEFAULT_EPOCH`), upstream entries keep their own timestamps and modes, so two runs on
  the same inputs give byte-identical wheels.
Standard library only.
"""
from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import os
import subprocess
import sys
import time
import zipfile
from collections import Counter
from pathlib import Path

NAME = "sglang"
VERSION = "0.5.23"
#: sha256 of each published `sglang==0.5.23` wheel, as PyPI lists them (https://pypi.org/simple/sglang/)
UPSTREAM_SHA256 = {
    "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl":
        "00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937",
    "sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl":
        "8d257a319395b322bb1be327d05e5528859358153c8563b04c0a4a3c8af164b6",
    "sglang-0.5.23-cp313-cp313-manylinux_2_34_x86_64.whl":
        "10f0b2b29c8fea616e4b27cbbbb147f32a879bf3db71c9767425a3d9d77a36cb",
}
#: 1980-01-01 00:00:00 UTC, the earliest time a zip entry can carry; used when SOURCE_DATE_EPOCH is unset
DEFAULT_EPOCH = 315532800
PLUGIN_GROUP = "sglang.srt.plugins"


class RepackError(RuntimeError):
    pass


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_upstream(cache_dir: Path, python: str = sys.executable) -> Path:
    """The upstream wheel for `python`'s interpreter, downloaded once into `cache_dir` with pip (exact version, no
    dependencies, binary only) and checked against `UPSTREAM_SHA256` on every call."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    found = [p for p in cache_dir.glob(f"{NAME}-{VERSION}-*.whl") if p.name in UPSTREAM_SHA256]
    tag = subprocess.run([python, "-c", "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')"],
                         capture_output=True, text=True, check=True).stdout.strip()
    found = [p for p in found if f"-{tag}-{tag}-" in p.name]
    if not found:
        out = subprocess.run([python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                              "--disable-pip-version-check", "-q", "-d", str(cache_dir), f"{NAME}=={VERSION}"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise RepackError(f"pip download {NAME}=={VERSION} failed:\n{out.stdout}{out.stderr}")
        found = [p for p in cache_dir.glob(f"{NAME}-{VERSION}-*{tag}*.whl")]
    if len(found) != 1 or found[0].name not in UPSTREAM_SHA256:
        raise RepackError(f"expected one pinned {NAME}=={VERSION} wheel for {tag} in {cache_dir}, found "
                          f"{[p.name for p in found]}; pinned: {sorted(UPSTREAM_SHA256)}")
    check_pinned_hash(found[0])
    return found[0]


def check_pinned_hash(wheel: Path) -> None:
    got, want = sha256_file(wheel), UPSTREAM_SHA256.get(wheel.name)
    if got != want:
        raise RepackError(f"{wheel} has sha256 {got}, the published hash is {want}: refusing to repack it")


def local_version(plugin_version: str) -> str:
    return f"{VERSION}+vradix{plugin_version}"


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def dist_info(wheel: zipfile.ZipFile) -> str:
    """The one top-level `*.dist-info` directory of a wheel."""
    dirs = {n.split("/", 1)[0] for n in wheel.namelist() if n.split("/", 1)[0].endswith(".dist-info")}
    if len(dirs) != 1:
        raise RepackError(f"{wheel.filename}: expected one .dist-info directory, found {sorted(dirs)}")
    return dirs.pop()


def read_metadata_field(metadata: str, field: str) -> str:
    for line in metadata.splitlines():
        if line.startswith(field + ": "):
            return line[len(field) + 2:]
    raise RepackError(f"METADATA has no {field} field")


def with_version(metadata: str, version: str) -> str:
    """Upstream METADATA with only its `Version:` header line replaced (the header ends at the first blank line)."""
    lines = metadata.split("\n")
    for i, line in enumerate(lines):
        if line == "":
            break
        if line.startswith("Version: "):
            lines[i] = f"Version: {version}"
            return "\n".join(lines)
    raise RepackError("METADATA has no Version header")


def entry_point_sections(text: str) -> dict:
    """entry_points.txt as {section: [non-empty lines]}, in file order."""
    sections, current = {}, None
    for line in text.splitlines():
        if line.startswith("["):
            current = line.strip()[1:-1]
            sections.setdefault(current, [])
        elif current is not None and line.strip():
            sections[current].append(line)
    return sections


def with_plugin_entry_points(upstream: str, plugin: str) -> str:
    """Upstream entry_points.txt with the plugin's console scripts appended to upstream's `[console_scripts]`
    section, followed by the plugin's `[sglang.srt.plugins]` section taken verbatim."""
    ours = entry_point_sections(plugin)
    section = ours.get(PLUGIN_GROUP)
    if not section:
        raise RepackError(f"the plugin wheel has no [{PLUGIN_GROUP}] entry point")
    if f"[{PLUGIN_GROUP}]" in upstream:
        raise RepackError(f"upstream already declares [{PLUGIN_GROUP}]; merging by hand is not supported")
    scripts = ours.get("console_scripts", [])
    theirs = {line.split("=")[0].strip() for line in entry_point_sections(upstream).get("console_scripts", [])}
    clash = sorted({line.split("=")[0].strip() for line in scripts} & theirs)
    if clash:
        raise RepackError(f"upstream already has console script(s) {clash}")
    lines = upstream.rstrip("\n").splitlines()
    if scripts:
        if "[console_scripts]" not in (line.strip() for line in lines):
            lines += ["", "[console_scripts]"]
        at = next(i for i, line in enumerate(lines) if line.strip() == "[console_scripts]") + 1
        while at < len(lines) and lines[at].strip() and not lines[at].startswith("["):
            at += 1
        lines[at:at] = scripts
    return "\n".join(lines) + "\n\n" + "\n".join([f"[{PLUGIN_GROUP}]", *section]) + "\n\n"


def with_plugin_packages(upstream: str, plugin: str) -> str:
    """top_level.txt: upstream's top-level packages and the plugin's, one per line, sorted."""
    return "".join(f"{name}\n" for name in sorted(set(upstream.split()) | set(plugin.split())))


def entry_order(name: str, info: str) -> tuple:
    """Sorted by name, the dist-info directory last and its RECORD last of all (what installers expect)."""
    return (name.startswith(info + "/"), name == f"{info}/RECORD", name)


def new_entry(name: str, epoch: int, mode: int = 0o644) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, time.gmtime(max(epoch, DEFAULT_EPOCH))[:6])
    info.compress_type = zipfile.ZIP_DEFLATED
    info.create_system = 3  # unix, so the mode bits below are honoured
    info.external_attr = (0o100000 | mode) << 16
    return info


def repack(upstream_whl: Path, plugin_whl: Path, out_dir: Path, epoch: int | None = None) -> Path:
    """Write `sglang-0.5.23+vradix<v>-<upstream tags>.whl` into `out_dir` and return its path."""
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", DEFAULT_EPOCH)) if epoch is None else epoch
    with zipfile.ZipFile(upstream_whl) as up, zipfile.ZipFile(plugin_whl) as pl:
        up_info, pl_info = dist_info(up), dist_info(pl)
        plugin_version = read_metadata_field(pl.read(f"{pl_info}/METADATA").decode(), "Version")
        version = local_version(plugin_version)
        info = f"{NAME}-{version}.dist-info"
        files = {}  # name -> (ZipInfo, bytes)
        for zi in up.infolist():
            if zi.is_dir() or zi.filename == f"{up_info}/RECORD":
                continue
            name = zi.filename.replace(f"{up_info}/", f"{info}/", 1)
            files[name] = (upstream_entry(zi, name), up.read(zi))
        for zi in pl.infolist():
            if zi.is_dir() or zi.filename.startswith(pl_info + "/"):
                continue
            if zi.filename in files:
                raise RepackError(f"{zi.filename} is in both wheels")
            mode = 0o755 if (zi.external_attr >> 16) & 0o111 else 0o644
            files[zi.filename] = (new_entry(zi.filename, epoch, mode), pl.read(zi))
        edits = {
            "METADATA": with_version(up.read(f"{up_info}/METADATA").decode(), version),
            "entry_points.txt": with_plugin_entry_points(up.read(f"{up_info}/entry_points.txt").decode(),
                                                         pl.read(f"{pl_info}/entry_points.txt").decode()),
            "top_level.txt": with_plugin_packages(up.read(f"{up_info}/top_level.txt").decode(),
                                                  pl.read(f"{pl_info}/top_level.txt").decode()),
        }
        for leaf, text in edits.items():
            files[f"{info}/{leaf}"] = (new_entry(f"{info}/{leaf}", epoch), text.encode())
        tags = upstream_whl.name[len(f"{NAME}-{VERSION}-"):]
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"{NAME}-{version}-{tags}"
    write_wheel(out, files, info, epoch)
    validate_record(out)
    return out


def upstream_entry(zi: zipfile.ZipInfo, name: str) -> zipfile.ZipInfo:
    """A fresh ZipInfo with upstream's timestamp, mode and compression (nothing else carried over: no extra fields,
    no comments), under the possibly renamed `name`."""
    out = zipfile.ZipInfo(name, zi.date_time)
    out.compress_type, out.create_system, out.external_attr = zi.compress_type, 3, zi.external_attr
    return out


def write_wheel(out: Path, files: dict, info: str, epoch: int) -> None:
    """Write `files` sorted (see `entry_order`), then a RECORD listing each one's sha256 and size."""
    rows = [(name, record_hash(data), str(len(data))) for name, (_, data) in files.items()]
    rows.sort(key=lambda r: entry_order(r[0], info))
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerows(rows + [(f"{info}/RECORD", "", "")])
    files[f"{info}/RECORD"] = (new_entry(f"{info}/RECORD", epoch), buf.getvalue().encode())
    tmp = out.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w") as z:
        for name in sorted(files, key=lambda n: entry_order(n, info)):
            zi, data = files[name]
            z.writestr(zi, data)
    os.replace(tmp, out)


def validate_record(wheel: Path) -> int:
    """Check a wheel's RECORD: every file in the archive listed exactly once with its correct sha256 and size, no
    listed file missing, and RECORD's own row without hash or size. Returns the number of files checked."""
    with zipfile.ZipFile(wheel) as z:
        info = dist_info(z)
        record = f"{info}/RECORD"
        rows = list(csv.reader(io.StringIO(z.read(record).decode())))
        listed = [r[0] for r in rows]
        dupes = sorted(n for n, k in Counter(listed).items() if k > 1)
        if dupes:
            raise RepackError(f"{wheel.name}: RECORD lists {dupes} more than once")
        members = [n for n in z.namelist() if not n.endswith("/")]
        if sorted(set(members)) != sorted(listed) or len(members) != len(set(members)):
            raise RepackError(f"{wheel.name}: RECORD and archive differ: not listed "
                              f"{sorted(set(members) - set(listed))[:5]}, listed but absent "
                              f"{sorted(set(listed) - set(members))[:5]}, duplicates in archive "
                              f"{len(members) - len(set(members))}")
        for name, digest, size in rows:
            if name == record:
                if digest or size:
                    raise RepackError(f"{wheel.name}: RECORD's own row must carry no hash or size")
                continue
            data = z.read(name)
            if digest != record_hash(data) or size != str(len(data)):
                raise RepackError(f"{wheel.name}: {name}: RECORD says {digest},{size}, the file is "
                                  f"{record_hash(data)},{len(data)}")
    return len(rows) - 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("plugin_wheel", type=Path, help="the sglang_vradix wheel to put inside")
    p.add_argument("--out", type=Path, default=Path("dist"))
    p.add_argument("--cache", type=Path, default=Path("build/upstream"), help="where the upstream wheel is kept")
    args = p.parse_args(argv)
    print(repack(fetch_upstream(args.cache), args.plugin_wheel, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
