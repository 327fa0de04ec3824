"""vradix's settings: every `VRADIX_*` environment variable the product reads, parsed in one place (docs/settings.md).

`SETTINGS` is the table: each `Setting` names its variable, default, accepted values, what it does and who reads it,
and carries the one parser for it. `value(name)` is how the product reads a setting: it parses the variable as it is
in the environment now (a launcher exports some before its scheduler processes start), and an unusable value raises
`SettingsError`, whose message names the variable. `load()` parses them all: the plugin's install does that first, so
a bad value stops the engine before it serves.

Invariants:
- a variable the product reads is in `SETTINGS`, and only `value()` parses it (no second parser with its own rules);
- an unset variable reads as its default, which every parser accepts;
- `SettingsError` is the only error a bad value raises.

Standard library only: the plugin's entry point imports it before anything else, and every layer may import it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional

#: Ray's `worker_process_setup_hook` for SGLang's scheduler actors, and where it finds the setup hook it replaced
RAY_SETUP_HOOK = "vradix.plugin.load_in_ray_scheduler_worker"
RAY_CHAINED_SETUP_HOOK_ENV = "VRADIX_RAY_CHAINED_SETUP_HOOK"
#: the app SGLang's multi-tokenizer HTTP workers import (its `SGLANG_HTTP_SERVER_APP_PATH`), and where vradix's app
#: finds the one it replaced
TOKENIZER_WORKER_APP = "vradix.plugin:tokenizer_worker_app"
#: what the tokenizer workers' launch data resolves when it is read: loads vradix there (`vradix.plugin`)
TOKENIZER_WORKER_LOAD = "vradix.plugin:tokenizer_worker_loaded"
CHAINED_APP_PATH_ENV = "VRADIX_CHAINED_HTTP_SERVER_APP_PATH"

VERIFY_MODES = ("off", "sample", "strict")
AUDIT_MODES = ("off", "report", "repair")
DEDUP_MODES = ("on", "off")
IDENTITY_MODES = ("auto", "nonce", "fingerprint", "declared")
KERNEL_IMPLS = ("auto", "cuda", "triton", "torch")
#: the values of VRADIX_DISABLE that opt out
TRUE_WORDS = ("1", "true", "yes", "on")


class SettingsError(ValueError):
    """A `VRADIX_*` setting vradix does not understand; the message names the variable and what it accepts."""


@dataclass(frozen=True)
class Setting:
    """One environment variable: `parse(raw)` turns its text (the default when unset) into the value readers get."""

    name: str
    default: str
    values: str
    what: str
    readers: str
    parse: Callable[[str, str], Any]


def _choice(modes, normalise: bool = True, echo_raw: bool = False, empty_is_default: bool = False):
    """A parser accepting one of `modes` (lower-cased and stripped when `normalise`)."""

    def parse(name: str, raw: str):
        text = raw.strip().lower() if normalise else raw
        if empty_is_default and not text:
            text = SETTINGS[name].default
        if text not in modes:
            shown = raw if echo_raw else text
            raise SettingsError(f"{name}={shown!r}: expected one of {', '.join(modes)}")
        return text

    return parse


def _positive_int(name: str, raw: str) -> int:
    text = raw.strip()
    if not text.isdigit() or int(text) < 1:
        raise SettingsError(f"{name}={text!r}: expected a positive integer")
    return int(text)


def _non_negative_int(name: str, raw: str) -> int:
    text = raw.strip()
    if not text.isdigit():
        raise SettingsError(f"{name}={text!r}: expected a non-negative integer")
    return int(text)


def _true_word(name: str, raw: str) -> bool:
    return raw.strip().lower() in TRUE_WORDS


def _exactly_one(name: str, raw: str) -> bool:
    return raw == "1"


def _text(name: str, raw: str) -> str:
    return raw


_TABLE = (
    Setting("VRADIX_DISABLE", "", "`1`, `true`, `yes`, `on` (any case) disable; anything else enables",
            "Opt out: vradix installs nothing and SGLang serves its stock radix cache (A/B runs).",
            "vradix.plugin", _true_word),
    Setting("VRADIX_VERIFY", "strict", "`off`, `sample`, `strict` (any case)",
            "The KV page ledger's verify guard: `strict` fails a request that would read KV of another epoch; "
            "`sample` checks every Nth extend batch and only counts; `off` checks nothing.",
            "vradix.ledger.guard", _choice(VERIFY_MODES)),
    Setting("VRADIX_VERIFY_SAMPLE_EVERY", "16", "a positive integer",
            "Under `VRADIX_VERIFY=sample`: give every Nth extend batch the strict check, detection only.",
            "vradix.ledger.guard", _positive_int),
    Setting("VRADIX_AUDIT", "report", "`off`, `report`, `repair` (any case)",
            "The post-publication audit of stale pages nobody owns: count them (`report`), also free them "
            "(`repair`), or skip it (`off`).",
            "vradix.ledger.guard", _choice(AUDIT_MODES)),
    Setting("VRADIX_PREFILL_DEDUP", "on", "`on`, `off` (any case)",
            "Hold back a request whose uncached prefix another request is already computing.",
            "vradix.core.dedup", _choice(DEDUP_MODES)),
    Setting("VRADIX_WEIGHT_IDENTITY", "auto",
            "`auto`, `nonce`, `fingerprint`, `declared` (any case; empty is `auto`)",
            "How each epoch's global `weight_id` is chosen (`auto`: `fingerprint` on a P/D role, else `nonce`); the "
            "server flag `--vradix-weight-identity` exports it.",
            "vradix.identity (scheduler startup, P/D role check, declared-label refusal)",
            _choice(IDENTITY_MODES, echo_raw=True, empty_is_default=True)),
    Setting("VRADIX_MAX_STALENESS", "0", "a non-negative integer",
            "Bounded staleness: the server's window K, the epochs older than the current one whose cached KV is kept, "
            "and the bound of a request that names none (0: exact reuse only); a request lowers it with "
            "`custom_params.vradix_max_staleness`. The server flag `--vradix-max-staleness` exports it.",
            "vradix.core.staleness (launcher request check, scheduler admission and reclaim)", _non_negative_int),
    Setting("VRADIX_RECLAIM_SLICE_NODES", "8", "a positive integer",
            "Stale tree nodes one scheduler iteration frees at most after a bump (read once, at import).",
            "vradix.core.deferred_reclaim", _positive_int),
    Setting("VRADIX_KERNELS", "auto", "`auto`, `cuda`, `triton`, `torch` (exact)",
            "The ledger and fingerprint kernels' implementation; `auto` picks CUDA, then Triton, for CUDA tensors "
            "and torch otherwise. A KV page ledger reads it once, when it is attached (`kernels.bind`; a forced "
            "implementation the device lacks fails there).",
            "vradix.kernels", _choice(KERNEL_IMPLS, normalise=False)),
    Setting("VRADIX_CENSUS", "", "`1`, `true`, `yes`, `on` (any case) turn it on; anything else leaves it off",
            "The escape watch, a test mode: at every epoch bump, fail when a request the scheduler holds with KV "
            "was neither marked crossing nor finished; before every forward, fail when the served weights changed "
            "without a publication (docs/reliability.md). It lives in the `vradix_census` package, which the wheel "
            "does not ship: asked for without it, the install fails closed.",
            "vradix.plugin (read once at install; the hooks of vradix_census.watch)", _true_word),
    Setting("VRADIX_ALLOW_UNTESTED_SGLANG", "", "`1` allows; anything else refuses",
            "Install on an SGLang release other than the supported one.",
            "vradix.plugin", _exactly_one),
    Setting(RAY_CHAINED_SETUP_HOOK_ENV, "", "a `module.function` path (set by vradix, not by users)",
            "The Ray `worker_process_setup_hook` vradix's own hook replaced on a scheduler actor; run after it.",
            "vradix.plugin (set by vradix.hooks.ray_actor)", _text),
    Setting(CHAINED_APP_PATH_ENV, "", "a `module:attribute` path (set by vradix, not by users)",
            "The `SGLANG_HTTP_SERVER_APP_PATH` vradix's own multi-tokenizer worker app replaced; it serves that app.",
            "vradix.hooks.tokenizer_worker", _text),
    Setting("VRADIX_API_KEY", "", "any text; empty: none",
            "The API key `vradix publish` and `vradix inspect` send (`Authorization: Bearer`), for servers started "
            "with `--api-key` / `--admin-api-key`; their `--api-key` flag overrides it. Read by the clients only.",
            "vradix.client, vradix.inspector", _text),
    Setting("VRADIX_FAULT_MISSING_HOOK", "", "a hook target suffix (test only)",
            "Fault injection: the hook targets ending with it are renamed to ones that do not exist.",
            "vradix.plugin", _text),
    Setting("VRADIX_FAULT_IMPORT", "", "any non-empty text (test only)",
            "Fault injection: the install fails with an ImportError.",
            "vradix.plugin", _text),
    Setting("VRADIX_FAULT_NO_NAMESPACE", "", "`1` (test only)",
            "Fault injection: admitted requests are not stamped with their epoch's namespace, so only the ledger's "
            "guard stands between them and stale KV.",
            "vradix.engine", _exactly_one),
)
#: name -> its Setting, in the order of docs/settings.md
SETTINGS: Dict[str, Setting] = {s.name: s for s in _TABLE}
#: the test-only switches; each one logs at startup that a fault is active
FAULT_SWITCHES = tuple(name for name in SETTINGS if name.startswith("VRADIX_FAULT_"))


def value(name: str, environ: Optional[Mapping[str, str]] = None) -> Any:
    """The parsed value of setting `name` in `environ` (the process environment when None). Raises SettingsError for
    an unusable value and KeyError for a name that is not a setting."""
    setting = SETTINGS[name]
    raw = (os.environ if environ is None else environ).get(name)
    return setting.parse(name, setting.default if raw is None else raw)


def load(environ: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """Every setting's parsed value (name -> value). Raises SettingsError for the first unusable one."""
    return {name: value(name, environ) for name in SETTINGS}
