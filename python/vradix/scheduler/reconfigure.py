"""Runtime reconfiguration, checked like a launch: a control request that changes the engine's configuration while it
runs (a HiCache storage attach or detach, `/set_internal_state`; the runtime census, `vradix_census.runtime`,
lists them all) is judged in the scheduler process, on the configuration it would leave, by the rules a launch runs.

1. before the change (`refusal`): the launch rules (`vradix.scheduler.launch.RULES`, the ones a scheduler checks
   before it starts: the closed world's refusals, the EPD flags, the staleness window's flags, the P/D rules) run
   on `resulting_configuration(changes)`, the engine's configuration as it runs now (startup values and every runtime override) with the request's fields applied; and
   the startup rules on the engine itself (`engine_refusal`: the KV page ledger against its blind spots, the
   staleness window's preconditions). A refused change returns its reason and the caller changes nothing;
2. after a change (`rederive`): what startup derived from the configuration is derived again: the publication steps
   (`publication.EngineSteps`). The ledger's blind spots and the staleness window's preconditions are re-checked in
   step 1 (the ledger itself is built once; a change that would need it off is refused), and the identity's scope
   (the P/D role and its KV layout) changes only by a role switch, which is refused at launch.

Invariants: a refusal changes nothing (it runs before SGLang's handler); nothing here touches the data path (a
control request runs between scheduler iterations, on an idle engine for a storage attach or detach).
"""
from __future__ import annotations

import logging
import types
from typing import Any, Iterable, Mapping, Optional

from vradix.core import deferred_reclaim, staleness
from vradix.engine import of_scheduler, state_of_scheduler
from vradix.scheduler import launch, publication

logger = logging.getLogger("vradix")

#: the runtime settings that relax speculative acceptance below lossless verification (1.0)
ACCEPT_THRESHOLDS = ("speculative_accept_threshold_single", "speculative_accept_threshold_acc")


def resulting_configuration(changes: Mapping[str, object]):
    """The engine's configuration as it runs now (SGLang's resolved server arguments with every runtime override,
    `RuntimeContext.resolved_server_args_dict`) with `changes` applied; fields read by attribute, as the launch
    rules read `ServerArgs`."""
    from sglang.srt.runtime_context import get_context

    return types.SimpleNamespace(**{**get_context().resolved_server_args_dict(), **changes})


def relaxed_acceptance(changes: Mapping[str, object]) -> Optional[str]:
    """The refusal of a speculative acceptance threshold below 1 (or NaN) among `changes`, else None. A value that
    is not a number is left to SGLang's own validation."""
    for key in ACCEPT_THRESHOLDS:
        value: Any = changes.get(key)  # any type: one that is not a number is left to SGLang
        try:
            relaxed = value is not None and not float(value) >= 1.0  # NaN is not lossless either
        except (TypeError, ValueError):
            continue
        if relaxed:
            return (f"vradix refused set_internal_state {key}={value!r}: relaxed speculative acceptance lets the draft "
                    "model, which a publication does not version, decide outputs. Keep the thresholds at 1.0 "
                    "(lossless verification), or serve relaxed acceptance with VRADIX_DISABLE=1 (docs/coverage.md)")
    return None


def launch_refusal(config) -> Optional[str]:
    """The error the launch would stop with on `config`, or None when every launch rule passes."""
    try:
        launch.check(config)
    except launch.ERRORS as e:
        return str(e)
    return None


def engine_refusal(scheduler, blind_spots: Iterable[str]) -> Optional[str]:
    """The startup rules on the engine itself, re-run: the KV page ledger built at startup must still see every KV
    write path (`blind_spots`: `hooks.startup.ledger_blind_spots` now), and a staleness window keeps its
    preconditions (the ledger, a tree that ages epochs out). Returns the refusal, or None."""
    state = state_of_scheduler(scheduler) if hasattr(scheduler, "tree_cache") else None
    if state is None:
        return None
    spots = list(blind_spots)
    if state.ledger is not None and spots:
        return (f"vradix refused the change: the engine's KV page ledger was built at startup and would no longer "
                f"see KV that arrives via {', '.join(spots)}. Start the engine with that configuration (the ledger "
                "is then off), or keep the configuration it started with")
    try:
        window = state.staleness.window
        staleness.check_ledger(window, spots)
        staleness.check_cache(scheduler.tree_cache, window, deferred_reclaim.supported(scheduler.tree_cache))
    except staleness.StalenessError as e:
        return str(e)
    return None


def refusal(scheduler, changes: Mapping[str, object], blind_spots: Iterable[str] = ()) -> Optional[str]:
    """Why the scheduler refuses a runtime change of `changes` (module docstring, step 1), or None. Logged."""
    reason = (relaxed_acceptance(changes) or launch_refusal(resulting_configuration(changes))
              or engine_refusal(scheduler, blind_spots))
    if reason is not None:
        logger.error("vradix: runtime change %s refused: %s", dict(changes), reason)
    return reason


def rederive(scheduler) -> Optional[publication.EngineSteps]:
    """After a runtime change: derive the engine's publication steps again (module docstring, step 2). A scheduler
    whose steps were never read (vradix did not attach to it) is left alone: its steps are read when first needed."""
    holder = of_scheduler(scheduler)
    before = holder.steps if holder is not None else None
    if before is None:
        return None
    steps = publication.install_steps(scheduler)
    if steps != before:
        logger.info("vradix: publication steps derived again after a runtime change: %s", steps)
    return steps
