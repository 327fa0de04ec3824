"""How the scheduler answers a request it refuses where it receives it.

The launcher refuses the same input earlier (`hooks.launcher`, `hooks.pd_launcher`), with the same rules, which live
in their step's package (`pd.bootstrap`, `core.staleness`, `core.epochs`); the scheduler's copy is the one that holds
when a caller bypasses the launcher. A generate or embedding request refused before SGLang built anything for it gets
SGLang's own abort output (`AbortReq` with an HTTP 400 `finished_reason`), which the TokenizerManager answers with
HTTP 400; it is never queued, so it is answered even while generation is paused.
"""
from __future__ import annotations

import logging
from http import HTTPStatus

logger = logging.getLogger("vradix")


def answer_refused(scheduler, recv_req, message: str) -> None:
    """Answer `recv_req` (a tokenized generate or embedding request) with HTTP 400 and `message`, through SGLang's
    `Scheduler.send_abort_output`; nothing of it is built or queued."""
    from sglang.srt.managers.io_struct import AbortReq

    logger.error("%s (request %s)", message, recv_req.rid)
    reason = {"type": "abort", "message": message, "status_code": HTTPStatus.BAD_REQUEST,
              "err_type": "BadRequestError"}
    scheduler.send_abort_output(AbortReq(rid=recv_req.rid, finished_reason=reason), recv_req)
