"""Report hooks (data-path step 5, scheduler process): the cache inspector, `GET /vradix/cache` (see
`vradix.observability.snapshot` and docs/inspector.md).

The HTTP server runs in the launcher process and the tree in the scheduler process, so a query travels on SGLang's
own internal-state channel: the endpoint (`hooks.report.cache_inspector`, launcher process) sends a `GetInternalStateReq` whose `rid` carries the query
(`QUERY_PREFIX` + JSON), through the TokenizerManager's `get_internal_state_communicator` (one reply per DP rank).
In the scheduler, `answer_cache_inspection` (AROUND `SchedulerInternalStateController.get_internal_state`) answers
such a request with the snapshot alone, built on the scheduler thread between batches, and leaves every other
internal-state request (`/server_info`) to SGLang. `count_prefix_hit` (AFTER `PrefillAdder._commit_prefill_admission`,
where an admitted request locks its matched prefix) counts the hits the snapshot ranks prefixes by.

With VRADIX_DISABLE=1 none of this is installed and the endpoint is absent (404): `python -m vradix.inspector` says
that vradix is not active. A scheduler without a versioned cache (`--disable-radix-cache`) answers
`{"active": false}`, which the endpoint returns with status 409.
"""
from __future__ import annotations

import json

from vradix.observability import snapshot
from vradix.engine import state_of

PATH = "/vradix/cache"
#: marks a GetInternalStateReq as an inspector query; no SGLang caller sets a rid on that request
QUERY_PREFIX = "\x1evradix-inspect:"


def answer_cache_inspection(original, controller, recv_req, *args, **kwargs):
    """AROUND SchedulerInternalStateController.get_internal_state: an inspector query gets the cache snapshot (and
    nothing of SGLang's server-args dump); any other request goes to SGLang."""
    rid = getattr(recv_req, "rid", None)
    if not isinstance(rid, str) or not rid.startswith(QUERY_PREFIX):
        return original(controller, recv_req, *args, **kwargs)
    from sglang.srt.managers.io_struct import GetInternalStateReqOutput
    from sglang.srt.utils.msgspec_utils import msgspec_to_builtins

    view = inspect_scheduler(controller.scheduler, rid)
    return GetInternalStateReqOutput(internal_state=msgspec_to_builtins({"vradix_cache": view}))


def inspect_scheduler(scheduler, rid: str) -> dict:
    from vradix.scheduler.publication import live_requests

    state = state_of(scheduler.tree_cache)
    if state is None:
        return {"active": False, "reason": "radix cache disabled: vradix has no versioned cache on this engine"}
    try:
        query = snapshot.Query.parse(json.loads(rid[len(QUERY_PREFIX):]))
    except (snapshot.QueryError, ValueError) as e:
        return {"active": True, "error": str(e)}
    return snapshot.snapshot(state, scheduler.tree_cache, live_requests(scheduler), query)
