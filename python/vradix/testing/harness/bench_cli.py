"""What the benchmark packages' CLIs share: running as a folder, and comma-separated choices.

Run as a folder (`python benchmark/<package>`, the way the docs and the Makefile call it), a package's `__main__.py`
has no package, and Python put the folder itself first on `sys.path`, where the package's modules (`trace`, `task`, `policy`, ...) would shadow top-level ones of the same name.
`run_folder_as_package` reruns it as the package's module from the parent folder instead. It imports only the
standard library, so it is safe to call before anything else is imported."""
from __future__ import annotations

import argparse
import os
import runpy
import sys


def run_folder_as_package(main_file: str, package: str) -> None:
    """Drop the folder of `main_file` from `sys.path`, put its parent first, run `package` as `__main__`, exit."""
    here = os.path.dirname(os.path.abspath(main_file))
    sys.path[:] = [os.path.dirname(here)] + [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    runpy.run_module(package, run_name="__main__", alter_sys=True)
    sys.exit(0)


def choice_list(choices):
    """An argparse type: a comma-separated list of items of `choices` (at least one), each checked."""
    def parse(s: str):
        items = [x.strip() for x in s.split(",") if x.strip()]
        bad = [x for x in items if x not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"unknown {bad or s!r}; choose from {', '.join(choices)}")
        return items
    return parse
