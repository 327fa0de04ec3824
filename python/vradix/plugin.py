"""The vradix SGLang plugin entry point and its fail-closed install.

Entry point: `sglang.srt.plugins: vradix = vradix.plugin:register`. SGLang's `load_plugins()` calls `register()` in
the launcher and, first thing, in every scheduler process (`run_scheduler_process`).

Fail closed, in three layers, because `load_plugins()` only logs a plugin whose module fails to import or whose
callable raises an `Exception`, and `HookRegistry.apply_hooks()` only logs a target it cannot patch:
1. this module imports nothing but the standard library, so SGLang can always load the entry point;
2. `register()` imports SGLang and every vradix step inside one guard: any exception there becomes
   `VradixInstallError`, a `SystemExit` subclass that `load_plugins()` does not swallow, so the launcher (and any
   scheduler process) exits with an error naming vradix;
3. before applying the hooks, `register()` checks that every private SGLang name vradix uses outside the hook table
   exists (`vradix.hooks.sglang_names`), and after applying them that every target in `vradix.hooks.HOOKS` really
   carries its hook.
`VRADIX_DISABLE=1` opts out (stock SGLang) for A/B runs. `VRADIX_CENSUS=1` asks for the escape watch, a test mode
(`vradix_census.watch`, a package the wheel does not ship): `register()` reads the setting once, imports the package
and installs its hooks after vradix's own, or fails closed when the package is missing; with the mode off nothing of
`vradix_census` is imported and none of its hooks is registered. Excluding vradix through `SGLANG_PLUGINS` is warned about
at interpreter start by `vradix-plugin-check.pth` (see `warn_if_excluded`), since SGLang then never calls us.

A hook whose target module imports an optional dependency (`vradix.hooks.DEFERRED_MODULES`: the EPD encoder
server, SGLang's Ray scheduler actor) is installed, and checked the same way, when that module is first imported
(`AfterImport`); a failure there raises `VradixInstallError` out of that import. SGLang's Ray scheduler actor never
calls `load_plugins()`: its worker process runs `load_in_ray_scheduler_worker` instead (Ray's
`worker_process_setup_hook`, set by `vradix.hooks.ray_actor`), which refuses to let the actor start unless vradix installed there.
SGLang's multi-tokenizer workers (`--tokenizer-worker-num` > 1, `Engine.attach_tokenizer_worker`) never call it
either: they run `load_in_tokenizer_worker` first (`vradix.hooks.tokenizer_worker`), which stops the worker before it
serves unless vradix installed there.
"""
from __future__ import annotations

import functools
import importlib
import logging
import os
import pkgutil
import sys

from vradix import __version__, settings
from vradix.settings import FAULT_SWITCHES, RAY_CHAINED_SETUP_HOOK_ENV
from vradix.startup import AfterImport

logger = logging.getLogger("vradix")

SUPPORTED_SGLANG = "0.5.23"
ENTRY_POINT_NAME = "vradix"

#: how many hooks `register()` installed in this process (None: it did not install)
_installed_hooks = None


class VradixInstallError(SystemExit):
    """vradix could not install; the engine must not serve an unversioned radix cache."""


def disabled(environ=None) -> bool:
    """Whether VRADIX_DISABLE opts out (in `environ`, the process environment when None)."""
    return settings.value("VRADIX_DISABLE", environ)


def register() -> None:
    """Install every hook in `vradix.hooks.HOOKS` and verify each one took, or exit with `VradixInstallError`."""
    if disabled():
        logger.warning("vradix %s installed but disabled by VRADIX_DISABLE: stock SGLang radix cache", __version__)
        return
    global _installed_hooks
    warn_active_faults()
    with failing_closed():
        installed = _install()
    _installed_hooks = installed
    logger.info("vradix %s: %d hooks installed", __version__, installed)


class failing_closed:
    """Any exception while installing becomes `VradixInstallError`: an unversioned cache must not serve."""

    def __enter__(self):
        return self

    def __exit__(self, kind, e, tb):
        if e is None or isinstance(e, VradixInstallError) or not isinstance(e, Exception):
            return False
        raise VradixInstallError(
            f"vradix {__version__} failed to install ({type(e).__name__}: {e}); refusing to serve an unversioned "
            "radix cache (set VRADIX_DISABLE=1 for stock behaviour)") from e


def _install() -> int:
    fault = settings.value("VRADIX_FAULT_IMPORT")
    if fault:
        raise ImportError(f"VRADIX_FAULT_IMPORT={fault!r}: injected import failure")
    from importlib.metadata import version as dist_version

    sglang_version = dist_version("sglang")
    if not supported_sglang(sglang_version) and not settings.value("VRADIX_ALLOW_UNTESTED_SGLANG"):
        raise VradixInstallError(
            f"vradix {__version__} supports sglang=={SUPPORTED_SGLANG}, found {sglang_version}; refusing to start "
            "(set VRADIX_DISABLE=1 for stock behaviour)")
    try:  # before the hooks are imported: one of their modules reads a setting at import
        settings.load()
    except settings.SettingsError as e:
        raise VradixInstallError(f"vradix {__version__}: {e}") from None
    from vradix.hooks import DEFERRED_MODULES, HOOKS

    _check_private_names(sglang_version)
    table = [*HOOKS, *escape_watch_hooks()]
    hooks = [(_fault_injected(target), kind, hook) for target, kind, hook in table]
    for module in DEFERRED_MODULES:
        group = [h for h in hooks if h[0].startswith(module + ".")]
        hooks = [h for h in hooks if h not in group]
        if module in sys.modules:
            hooks += group
        elif not any(isinstance(f, AfterImport) and f.module == module for f in sys.meta_path):
            sys.meta_path.insert(0, AfterImport(module, functools.partial(_apply_checked, group, sglang_version)))
    _apply_checked(hooks, sglang_version)
    return len(table)


#: the escape watch's module (`VRADIX_CENSUS=1`); its package, `vradix_census`, is not in the wheel
ESCAPE_WATCH = "vradix_census.watch"


def escape_watch_hooks() -> list:
    """The escape watch's hooks (`vradix_census.watch.HOOKS`) when `VRADIX_CENSUS` asks for the test mode (read here,
    once per install), else none: with the mode off nothing of `vradix_census` is imported. Asked for where the
    package cannot be imported (a wheel install), the install fails closed with `VradixInstallError`."""
    if not settings.value("VRADIX_CENSUS"):
        return []
    try:
        watch = importlib.import_module(ESCAPE_WATCH)
    except ModuleNotFoundError as e:
        if e.name not in ("vradix_census", ESCAPE_WATCH):
            raise
        raise VradixInstallError(
            f"vradix {__version__}: VRADIX_CENSUS asks for the escape watch (a test mode), but its package "
            "vradix_census cannot be imported: the wheel does not ship it (run from a source checkout with python/ "
            "on PYTHONPATH). Refusing to start; unset VRADIX_CENSUS to serve without the test mode") from None
    return list(watch.HOOKS)


def _check_private_names(sglang_version: str) -> None:
    """Before any hook is applied: every private SGLang name vradix uses outside `HOOKS`
    (`vradix.hooks.sglang_names`) exists, or the install stops naming the missing ones."""
    from vradix.hooks import sglang_names

    absent = sglang_names.missing()
    if absent:
        raise VradixInstallError(
            f"vradix {__version__}: sglang {sglang_version} lacks {', '.join(absent)}, which vradix uses; refusing "
            "to serve an unversioned radix cache (set VRADIX_DISABLE=1 for stock behaviour)")


def _apply_checked(hooks, sglang_version: str) -> None:
    """Register and apply `hooks` through SGLang's HookRegistry, then check that every one took."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    with failing_closed():
        for target, kind, hook in hooks:
            HookRegistry.register(target, hook, getattr(HookType, kind))
        with one_scan_propagation():
            HookRegistry.apply_hooks()
    missing = [target for target, _, hook in hooks if not is_installed(target, hook)]
    if missing:
        raise VradixInstallError(
            f"vradix {__version__}: could not install hook(s) {', '.join(missing)} on sglang {sglang_version}; "
            "refusing to serve an unversioned radix cache (set VRADIX_DISABLE=1 for stock behaviour)")


class one_scan_propagation:
    """`HookRegistry.apply_hooks()` with SGLang's `from X import Y` rebinding done in one scan of `sys.modules` for
    every target instead of one scan per target (its `_propagate_patch`: about 35 ms per scan once SGLang's model
    stack is imported, so ~3 s for vradix's targets, in every process that loads the plugin).

    Same result: while `apply_hooks()` runs, `_propagate_patch(original, wrapped, source)` only records its call;
    on exit every module global that is one of the recorded originals (outside that original's `source`) is rebound
    to its wrapper, in modules imported before or during the apply alike, as SGLang's scan would have done right
    after each patch. The first wrapper recorded for an original wins, as with SGLang's scans (a later scan for the
    same original finds its aliases already rebound)."""

    def __enter__(self):
        from sglang.srt.plugins import hook_registry

        self.registry, self.scan = hook_registry, hook_registry._propagate_patch
        self.pending = {}
        hook_registry._propagate_patch = self.record
        return self

    def record(self, original, wrapped, source) -> int:
        self.pending.setdefault(id(original), (original, wrapped, source))
        return 0

    def __exit__(self, *exc):
        self.registry._propagate_patch = self.scan
        if self.pending:
            rebind(self.pending)
        return False


def rebind(pending: dict) -> int:
    """Rebind every module global that is a pending original (`{id(original): (original, wrapped, source)}`) to its
    wrapper, except in the original's own source; returns how many bindings it rebound."""
    import types

    n = 0
    for mod in list(sys.modules.values()):
        if not isinstance(mod, types.ModuleType):
            continue
        try:
            items = list(vars(mod).items())
        except TypeError:
            continue
        for attr, value in items:
            hit = pending.get(id(value))
            if hit is None or hit[0] is not value or mod is hit[2]:
                continue
            try:
                setattr(mod, attr, hit[1])
                n += 1
            except (AttributeError, TypeError):
                pass
    return n


def installed() -> bool:
    """Whether `register()` installed vradix in this process."""
    return _installed_hooks is not None


def load_in_ray_scheduler_worker() -> None:
    """Ray's `worker_process_setup_hook` for SGLang's scheduler actors (set by `vradix.hooks.ray_actor`): what
    `run_scheduler_process` does first, `load_plugins()`, before the actor builds its Scheduler; then vradix must be
    installed here, as it is in the launcher that created the actor. Then the setup hook the actor would otherwise
    have run. Raises RuntimeError naming vradix: Ray reports an exception from a setup hook as the actor's failure to
    start (a SystemExit would end the worker without the message)."""
    from sglang.srt.plugins import load_plugins

    try:
        load_plugins()
        if not installed():
            raise not_installed_error("this Ray scheduler actor", "the actor's")
    except VradixInstallError as e:
        raise RuntimeError(str(e)) from None
    chained = settings.value(RAY_CHAINED_SETUP_HOOK_ENV)
    if chained:
        from ray._private.runtime_env.setup_hook import load_and_execute_setup_hook

        error = load_and_execute_setup_hook(chained)
        if error is not None:
            raise RuntimeError(error)


def not_installed_error(where: str, whose: str) -> VradixInstallError:
    """The error of a process SGLang started from a launcher with vradix active, where vradix did not install."""
    why = (f"VRADIX_DISABLE is set in {whose} environment" if disabled() else
           f"SGLANG_PLUGINS={os.environ.get('SGLANG_PLUGINS')!r} leaves it out" if excluded_by_allow_list()
           else "SGLang did not call its entry point")
    return VradixInstallError(
        f"vradix {__version__} is active in the launcher but not installed in {where} ({why}); refusing to serve "
        "an unversioned radix cache (set VRADIX_DISABLE=1 in the launcher, too, for stock behaviour)")


def load_in_tokenizer_worker() -> str:
    """Load vradix in one of SGLang's multi-tokenizer workers (an HTTP worker that uvicorn or Granian started, or an
    `Engine.attach_tokenizer_worker` process), before it builds its TokenizerWorker: what `run_scheduler_process`
    does first, `load_plugins()`, then vradix must be installed here, or `VradixInstallError` stops the worker
    before it serves. Idempotent; says so on stderr once per process, naming the pid. Returns a short text (the
    value the launch data's `WorkerLoad` entry unpickles to)."""
    global _announced_worker
    if not installed():
        from sglang.srt.plugins import load_plugins

        load_plugins()
        if not installed():
            raise not_installed_error(f"this tokenizer worker (pid {os.getpid()})", "the worker's")
    if not _announced_worker:
        _announced_worker = True
        sys.stderr.write(f"vradix {__version__}: {_installed_hooks} hooks installed in tokenizer worker "
                         f"{os.getpid()}\n")
    return f"vradix {__version__} installed"


_announced_worker = False


def __getattr__(name: str):
    """`vradix.plugin:tokenizer_worker_app` (`settings.TOKENIZER_WORKER_APP`), the app SGLang's multi-tokenizer HTTP
    workers import once `vradix.hooks.tokenizer_worker` named it: vradix loads first (`load_in_tokenizer_worker`,
    fail closed), then the app it replaced is served (`vradix.hooks.tokenizer_worker.serving_app`).
    `vradix.plugin:tokenizer_worker_loaded` (`settings.TOKENIZER_WORKER_LOAD`, what the workers' launch data
    resolves): vradix loads, fail closed, and the attribute is `load_in_tokenizer_worker`'s text."""
    if name == "tokenizer_worker_loaded":
        return load_in_tokenizer_worker()
    if name != "tokenizer_worker_app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    load_in_tokenizer_worker()
    with failing_closed():
        from vradix.hooks.tokenizer_worker import serving_app

        return serving_app()


def supported_sglang(version: str) -> bool:
    """Whether `version` is the SGLang release vradix supports. A local version label names a rebuild of that same
    release (`0.5.23+vradix<version>` is the replacement wheel: upstream's files plus vradix, docs/packaging.md)."""
    return version.split("+", 1)[0] == SUPPORTED_SGLANG


def is_installed(target: str, hook) -> bool:
    """Whether the callable now at `target` is a HookRegistry wrapper chain that contains `hook`."""
    try:
        fn = pkgutil.resolve_name(target)
    except (ImportError, AttributeError, ValueError):
        return False
    fn = getattr(fn, "__func__", fn)
    while fn is not None:
        if any(getattr(cell, "cell_contents", None) is hook for cell in (getattr(fn, "__closure__", None) or ())):
            return True
        fn = getattr(fn, "__wrapped__", None)
    return False


def warn_active_faults() -> None:
    for name in FAULT_SWITCHES:
        if os.environ.get(name):  # the raw text, whatever the switch makes of it
            logger.warning("vradix: TEST FAULT ACTIVE: %s=%r (a test-only switch; never set it in production)",
                           name, os.environ[name])


def _fault_injected(target: str) -> str:
    """Fault injection for the fail-closed test: VRADIX_FAULT_MISSING_HOOK=<suffix> renames that target to one that
    does not exist, as a different sglang version would."""
    fault = settings.value("VRADIX_FAULT_MISSING_HOOK")
    return target + "_missing_in_this_sglang" if fault and target.endswith(fault) else target


_warned_excluded = False


def excluded_by_allow_list(environ=os.environ) -> bool:
    """Whether SGLANG_PLUGINS (SGLang's plugin allow-list) is set and leaves vradix out."""
    allowed = environ.get("SGLANG_PLUGINS", "")
    names = {x.strip() for x in allowed.split(",") if x.strip()}
    return bool(names) and ENTRY_POINT_NAME not in names


def warn_if_excluded(environ=os.environ, stream=None) -> bool:
    """Run at interpreter start by `vradix-plugin-check.pth`: SGLang never calls `register()` when SGLANG_PLUGINS
    leaves vradix out, so this is the only place that can say so. Silent under VRADIX_DISABLE (an explicit opt-out).
    Warns at most once per process (some environments read site-packages' .pth files twice). Returns whether it
    warned."""
    global _warned_excluded
    if _warned_excluded or not excluded_by_allow_list(environ) or disabled(environ):
        return False
    _warned_excluded = True
    (stream or sys.stderr).write(
        f"WARNING vradix {__version__} is installed but SGLANG_PLUGINS={environ.get('SGLANG_PLUGINS')!r} excludes it: "
        "SGLang engines started from this environment serve an UNVERSIONED radix cache (KV computed under old "
        "weights is reused after a weight update). Add 'vradix' to SGLANG_PLUGINS, or set VRADIX_DISABLE=1 to opt "
        "out explicitly.\n")
    return True
