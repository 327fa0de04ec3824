"""`vradix`: vradix's command line. `vradix --help` lists the commands, `vradix COMMAND --help` explains one.

Each command is the `main` of its module, which `python -m <module>` also runs; the module is imported only when its
command runs (`vradix --version` and `--help` import nothing but this file and the version).
"""
from __future__ import annotations

import argparse
import importlib
import sys

from vradix import __version__

#: command -> (module whose `main(argv, prog)` runs it, what it does)
COMMANDS = {
    "inspect": ("vradix.inspector",
                "print what an engine's radix cache holds, per epoch and weight label (GET /vradix/cache), or a saved "
                "response's per-token weight versions (--response)"),
    "publish": ("vradix.publish",
                "publish weights from disk to one or more engines (or every worker behind a model gateway) and "
                "verify each one, fail closed"),
    "l3": ("vradix.l3.__main__",
           "HiCache L3 `file` store upkeep: `vradix l3 gc` deletes the pages of weight identities no longer live"),
}


def parser() -> argparse.ArgumentParser:
    listing = "\n".join(f"  {name:<9} {what}" for name, (_, what) in COMMANDS.items())
    p = argparse.ArgumentParser(
        prog="vradix", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="vradix: SGLang's caches, safe across reinforcement-learning weight publications. The plugin "
                    "itself needs no command: installed, it is active in every SGLang engine (VRADIX_DISABLE=1 "
                    "opts out).",
        epilog=f"commands:\n{listing}\n\n`vradix COMMAND --help` explains each one.")
    p.add_argument("--version", action="version", version=f"vradix {__version__} (for sglang 0.5.23)")
    p.add_argument("command", choices=list(COMMANDS), metavar="COMMAND", help="one of: " + ", ".join(COMMANDS))
    p.add_argument("args", nargs=argparse.REMAINDER, help="the command's own arguments")
    return p


def main(argv=None) -> int:
    ns = parser().parse_args(sys.argv[1:] if argv is None else argv)
    module = importlib.import_module(COMMANDS[ns.command][0])
    return module.main(ns.args, prog=f"vradix {ns.command}")


if __name__ == "__main__":
    sys.exit(main())
