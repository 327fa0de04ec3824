"""Census test mode hooks (scheduler process, `VRADIX_CENSUS=1`): the weight census before every forward, and the
control requests it names (`vradix.scheduler.census`). The request census runs inside every bump
(`scheduler.publication.bump_scheduler`); the census is attached at scheduler start (`hooks.startup`)."""
from __future__ import annotations

from vradix.scheduler import census


def check_weights_before_forward(scheduler, batch, *args, **kwargs):
    """BEFORE Scheduler.run_batch: the served weights are the ones the last publication (or the start) recorded, or
    the scheduler stops with `CensusViolation`."""
    census.check_weights(scheduler)


def note_control_request(scheduler, output, recv_req, *args, **kwargs):
    """BEFORE Scheduler.send_control_output: remember the control request answered, for a weight-census failure."""
    census.note_control_request(scheduler, recv_req)
