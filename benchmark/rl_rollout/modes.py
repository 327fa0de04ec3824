"""The publication strategies (modes): how the server must be started and what one publication calls."""
from __future__ import annotations

from dataclasses import dataclass

#: bounded staleness windows benchmarked as `in_place+vradix(K)` (docs/bounded-staleness.md)
WINDOWS = (1, 2)
MODE_NAMES = ("radix-off", "retract+flush", "in_place", "in_place+vradix") + tuple(
    f"in_place+vradix({k})" for k in WINDOWS)


@dataclass(frozen=True)
class Mode:
    """One publication strategy: how the server must be started and what one publication calls."""

    name: str
    pause_mode: str          # pause_generation mode
    flush: bool              # POST /flush_cache after the update (must succeed)
    radix: bool              # radix cache enabled on the server
    vradix: bool             # vradix active on the server
    staleness: int = 0       # the server's --vradix-max-staleness window (0: exact)

    def server_group(self) -> str:
        """Modes in one group can share a server (the state is reset between runs)."""
        if self.staleness:
            return f"vradix-k{self.staleness}"
        return "vradix" if self.vradix else ("stock" if self.radix else "radix-off")

    def server_flags(self) -> list:
        """Flags this mode's server needs beyond the shared ones."""
        flags = [] if self.radix else ["--disable-radix-cache"]
        return flags + (["--vradix-max-staleness", str(self.staleness)] if self.staleness else [])

    def check_server(self, info: dict) -> None:
        """Refuse a server whose configuration does not match this mode (clear error, nothing run)."""
        radix_on = not info.get("disable_radix_cache", False)
        block = ((info.get("internal_states") or [{}])[0] or {}).get("vradix") or {}
        problems = []
        if radix_on != self.radix:
            problems.append(f"radix cache is {'on' if radix_on else 'off'}, mode needs it "
                            f"{'on' if self.radix else 'off (--disable-radix-cache)'}")
        if self.radix and bool(block.get("active")) != self.vradix:
            problems.append(f"vradix is {'active' if block.get('active') else 'not active'}, mode needs it "
                            f"{'active' if self.vradix else 'disabled (VRADIX_DISABLE=1)'}")
        window = (block.get("bounded_staleness") or {}).get("window", 0)
        if self.vradix and window != self.staleness:
            problems.append(f"its staleness window is {window}, mode needs --vradix-max-staleness {self.staleness}")
        if not info.get("enable_metrics", False):
            problems.append("the server needs --enable-metrics (prefill counters and per-request timestamps)")
        if problems:
            raise SystemExit(f"server does not match mode {self.name!r}: " + "; ".join(problems))


MODES = {
    "radix-off": Mode("radix-off", "in_place", flush=False, radix=False, vradix=False),
    "retract+flush": Mode("retract+flush", "retract", flush=True, radix=True, vradix=False),
    "in_place": Mode("in_place", "in_place", flush=False, radix=True, vradix=False),
    "in_place+vradix": Mode("in_place+vradix", "in_place", flush=False, radix=True, vradix=True),
    # retract pause on vradix, no flush: in-flight requests re-prefill under the new weights in the new epoch's
    # namespace, sharing prefixes there (run by the training-loop ablation, benchmark/rl_train; not a default here)
    "retract+vradix": Mode("retract+vradix", "retract", flush=False, radix=True, vradix=True),
    **{f"in_place+vradix({k})": Mode(f"in_place+vradix({k})", "in_place", flush=False, radix=True, vradix=True,
                                     staleness=k) for k in WINDOWS},
}
