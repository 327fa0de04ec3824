"""What `vradix-plugin-check.pth` runs at the start of every Python process of the environment (SGLang engines,
trainers, pip alike; beside the SGLANG_PLUGINS warning, `vradix.plugin.warn_if_excluded`), so it imports only `sys`
and `importlib` and does nothing until SGLang is imported.

When `sglang.srt.server_args` is first imported, in any process, upstream SGLang's `--enable-prefill-weight-versions`
is added to `ServerArgs.add_cli_args` where this SGLang lacks it (0.5.23), unless VRADIX_DISABLE opts out. RL
  frameworks check for that flag in their own process, where SGLang never loads plugins (miles'
  `--sglang-enable-prefill-weight-versions` parses SGLang's arguments in the trainer); vradix reports
  `prefill_weight_versions` on every response, so the flag is accepted and changes nothing (docs/provenance.md).
  The plugin's own `ServerArgs.add_cli_args` hook adds it the same way where this did not run.
"""
from __future__ import annotations

import sys

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing would cost every process ~8 ms
if TYPE_CHECKING:
    from typing import Callable

#: upstream SGLang's switch for per-response `prefill_weight_versions` (after 0.5.23)
UPSTREAM_FLAG = "--enable-prefill-weight-versions"
SERVER_ARGS_MODULE = "sglang.srt.server_args"


class AfterImport:
    """A `sys.meta_path` finder that runs `then()` right after `module` is first imported, inside that import (one
    shot). Not an `importlib.abc.MetaPathFinder` subclass: importing `importlib.abc` would cost every process."""

    def __init__(self, module: str, then: Callable[[], None]):
        self.module, self.then = module, then

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.module:
            return None
        import importlib.util
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            exec_module, then = spec.loader.exec_module, self.then

            def exec_then(module):
                exec_module(module)
                then()

            spec.loader.exec_module = exec_then
        return spec


def add_upstream_flag(parser) -> bool:
    """Add `UPSTREAM_FLAG` (a no-op switch) to SGLang's argument parser unless it has it. Returns whether it added."""
    import argparse
    try:
        parser.add_argument(UPSTREAM_FLAG, action="store_true", default=False,
                            help="upstream SGLang's switch for per-response prefill_weight_versions; under vradix "
                                 "they are always reported, so this is accepted and changes nothing")
    except argparse.ArgumentError:
        return False  # SGLang's own flag (after 0.5.23), or already added
    return True


def patch_server_args() -> None:
    """`ServerArgs.add_cli_args` also adds `UPSTREAM_FLAG` (unless VRADIX_DISABLE opts out)."""
    from vradix import settings
    if settings.value("VRADIX_DISABLE"):
        return
    server_args = sys.modules[SERVER_ARGS_MODULE]
    cls = server_args.ServerArgs
    original = cls.__dict__["add_cli_args"].__func__

    def add_cli_args(parser):
        original(parser)
        add_upstream_flag(parser)

    add_cli_args.__wrapped__ = original  # type: ignore[attr-defined]
    cls.add_cli_args = staticmethod(add_cli_args)


def run() -> None:
    """The interpreter-start step (idempotent: some environments read site-packages' .pth files twice)."""
    if SERVER_ARGS_MODULE in sys.modules or any(isinstance(f, AfterImport) and f.module == SERVER_ARGS_MODULE
                                                for f in sys.meta_path):
        return
    sys.meta_path.insert(0, AfterImport(SERVER_ARGS_MODULE, patch_server_args))
