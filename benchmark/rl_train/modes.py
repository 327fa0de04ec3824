"""The runs: a publication mode of benchmark/rl_rollout (`rl_rollout.modes`, how the server is started and what a
publication calls) and how the trainer treats the tokens the provenance flags (`grpo.correction`)."""
from __future__ import annotations

from dataclasses import dataclass

from rl_rollout.modes import MODES, Mode


@dataclass(frozen=True)
class Run:
    name: str
    mode: Mode
    correction: str = "none"    # grpo.CORRECTIONS


#: every run, in report order: `retract+vradix` retracts in-flight requests at each publication and keeps the cache
#: (no stale, no crossing tokens); `in_place+vradix+tis` is exact in_place with a trainer that applies the truncated
#: importance weights of `vradix.trainer` to the crossing tokens; the last is K = 1 with a trainer that masks the
#: tokens that read reused stale KV
RUNS = {r.name: r for r in (
    Run("radix-off", MODES["radix-off"]),
    Run("retract+flush", MODES["retract+flush"]),
    Run("retract+vradix", MODES["retract+vradix"]),
    Run("in_place", MODES["in_place"]),
    Run("in_place+vradix", MODES["in_place+vradix"]),
    Run("in_place+vradix+tis", MODES["in_place+vradix"], "tis_crossing"),
    Run("in_place+vradix(1)", MODES["in_place+vradix(1)"]),
    Run("in_place+vradix(1)+provenance", MODES["in_place+vradix(1)"], "mask"),
)}
RUN_NAMES = tuple(RUNS)
