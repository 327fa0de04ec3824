"""SGLang 0.5.23's scheduler event loops, and which of them an engine with vradix runs.

`Scheduler._dispatch_event_loop_once` runs one loop per scheduler. A publication treats the requests
`vradix.scheduler.publication.live_requests` reads (crossing or re-bound) after the overlap drain settled the forward in
flight (`vradix.core.overlap`). A loop is served when every request holding KV it keeps is where `live_requests`
reads (SGLang's `collect_inflight_reqs`, the waiting queue, the chunked request, the P/D queues) and no forward of
it straddles the weight change; the escape watch (a test mode) checks the first at every bump (`vradix_census.watch`).
Otherwise it is refused when the scheduler starts (`check`, from `hooks.startup.attach_to_scheduler`): the error
names the flag that selects the loop and the alternative.

- `event_loop_normal` (`--disable-overlap-schedule`): served; `running_batch`, `last_batch`.
- `event_loop_overlap` (the default): served; its `result_queue` holds copies of `last_batch`, drained at a
  publication.
- `event_loop_{normal,overlap}_disagg_prefill` (`--disaggregation-mode prefill`): served; also the bootstrap and
  inflight queues, and the `result_queue` under continuous input polling.
- `event_loop_{normal,overlap}_disagg_decode` (`--disaggregation-mode decode`): served; also the prealloc queue (with
  its retracted requests) and the transfer queue.
- `event_loop_pp`, `event_loop_pp_disagg_{prefill,decode}` (`--pp-size` above 1): never reached, `--pp-size` above 1
  is refused before the scheduler starts (`closed_world.unversioned`, run at launch and again by
  `scheduler.launch`): `collect_inflight_reqs` reads every micro-batch (`running_mbs`, `mbs`), but the overlap drain
  does not reach the micro-batches in flight, so their tokens would be processed after a publication.
- `event_loop_pdmux` (`--enable-pdmux`): refused (`REFUSALS`).
- `event_loop_overlap_mlx` (`SGLANG_USE_MLX=1` without `--disable-overlap-schedule`): refused (`REFUSALS`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


class UnservedLoopError(RuntimeError):
    """A scheduler selected an event loop that keeps requests or forwards where a publication cannot treat them."""


@dataclass(frozen=True)
class LoopRefusal:
    loop: str
    flag: str
    is_selected: Callable[[object], bool]
    why: str
    alternative: str

    def message(self) -> str:
        return (f"vradix refuses to start the scheduler loop {self.loop} ({self.flag}): {self.why}. Instead: "
                f"{self.alternative}; or set VRADIX_DISABLE=1 for stock behaviour (docs/coverage.md).")


REFUSALS = (
    LoopRefusal("event_loop_pdmux", "--enable-pdmux", lambda s: bool(getattr(s, "enable_pdmux", False)),
                "its split prefill batch (`Scheduler.split_prefill_batch`) holds requests with KV where a publication "
                "does not look, and it runs one prefill a slice of layers per iteration, so a publication between "
                "two slices would compute one token's KV with two weights",
                "the default scheduler loop (without --enable-pdmux), or P/D disaggregation (--disaggregation-mode)"),
    LoopRefusal("event_loop_overlap_mlx", "SGLANG_USE_MLX=1 with the overlap schedule",
                lambda s: bool(getattr(s, "enable_overlap_mlx", False)),
                "its result queue holds MLX launches the publication's drain cannot process, and the loop keeps its "
                "next launch, built on the previous one's tokens, where a publication does not look",
                "--disable-overlap-schedule, which runs the MLX backend in the normal loop"),
)


def check(scheduler) -> None:
    """Raise UnservedLoopError naming the first refused loop the scheduler selected; return if none."""
    for refusal in REFUSALS:
        if refusal.is_selected(scheduler):
            raise UnservedLoopError(refusal.message())
