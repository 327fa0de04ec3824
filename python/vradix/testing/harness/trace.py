"""Which product code a call runs, traced with `sys.setprofile`: for the tests that bound a path's reach (the files
one update call enters, the kernels a ledger calls without a dispatch or a setting read)."""
from __future__ import annotations

import pathlib
import sys

import vradix

ROOT = pathlib.Path(vradix.__file__).parent
#: the test kit's own code (stand-ins, fixtures) is not the product's path
STAND_INS = ROOT / "testing"


def functions_entered(run) -> set:
    """(file relative to the `vradix` package, function name) of every Python call `run()` makes into the product,
    `vradix.testing` (and the escape watch's package, `vradix_census`, beside it) left out; a setting read is recorded as ("settings.py", the setting's name)."""
    product, stand_ins = str(ROOT) + "/", str(STAND_INS) + "/"  # not python/vradix_census (the escape watch)
    entered = set()

    def profile(frame, event, arg):
        path = frame.f_code.co_filename
        if event == "call" and path.startswith(product) and not path.startswith(stand_ins):
            name = frame.f_code.co_name
            if path.endswith("settings.py") and name == "value":
                name = frame.f_locals["name"]
            entered.add((str(pathlib.Path(path).relative_to(ROOT)), name))

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return entered


def files_entered(run) -> set:
    """The product files `run()` enters (`functions_entered`)."""
    return {path for path, _ in functions_entered(run)}
