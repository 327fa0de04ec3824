"""The wheel ships every CPU aid's plugin metadata: each `*.dist-info` folder under `python/vradix` is matched by a
`package-data` glob of pyproject.toml (a wheel install without one cannot start that kind of CPU server)."""
import fnmatch
import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PKG = ROOT / "python" / "vradix"


def package_data() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]["package-data"]


def shipped(path: pathlib.Path, data: dict) -> bool:
    for package, globs in data.items():
        base = ROOT / "python" / package.replace(".", "/")
        if base in path.parents:
            rel = path.relative_to(base).as_posix()
            if any(fnmatch.fnmatch(rel, g) for g in globs):
                return True
    return False


def test_every_cpu_aid_metadata_file_is_in_package_data():
    data = package_data()
    files = [f for d in PKG.rglob("*.dist-info") for f in d.iterdir() if f.is_file()]
    assert len(files) >= 8, files  # four aids, METADATA + entry_points.txt each
    missing = [str(f.relative_to(ROOT)) for f in files if not shipped(f, data)]
    assert not missing, f"not in pyproject.toml package-data: {missing}"


def test_the_check_sees_a_missing_glob():
    data = package_data()
    pd_meta = next(PKG.rglob("pd_plugin/*.dist-info/METADATA"))
    without = {k: [g for g in v if not g.startswith("pd_plugin/")] for k, v in data.items()}
    assert shipped(pd_meta, data) and not shipped(pd_meta, without)
