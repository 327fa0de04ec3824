"""Requests and control calls the scheduler refuses where it receives them, and how it answers.

The launcher refuses the same input earlier (`hooks.launcher`, `hooks.pd_launcher`), with the same rules, which live
here or in their step's package; the scheduler's copy is the one that holds when a caller bypasses the launcher.

- `answer_refused`: a generate or embedding request refused before SGLang built anything for it gets SGLang's own
  abort output (`AbortReq` with an HTTP 400 `finished_reason`), which the TokenizerManager answers with HTTP 400; it
  is never queued, so it is answered even while generation is paused;
- `check_disk_update_request`: the fields of an `/update_weights_from_disk` request, checked before anything loads.
"""
from __future__ import annotations

import logging
import typing
from http import HTTPStatus

from vradix.core import epochs

logger = logging.getLogger("vradix")


class InvalidUpdateRequest(ValueError):
    """A weight-update request that would fail (or stop the engine) inside the scheduler."""


def answer_refused(scheduler, recv_req, message: str) -> None:
    """Answer `recv_req` (a tokenized generate or embedding request) with HTTP 400 and `message`, through SGLang's
    `Scheduler.send_abort_output`; nothing of it is built or queued."""
    from sglang.srt.managers.io_struct import AbortReq

    logger.error("%s (request %s)", message, recv_req.rid)
    reason = {"type": "abort", "message": message, "status_code": HTTPStatus.BAD_REQUEST,
              "err_type": "BadRequestError"}
    scheduler.send_abort_output(AbortReq(rid=recv_req.rid, finished_reason=reason), recv_req)


def check_disk_update_request(obj) -> None:
    """Every field of an `UpdateWeightFromDiskReqInput` has its declared type (the Python Engine API builds the
    request without validation), `model_path` is a non-empty string, `load_format` is None or a value of SGLang's own
    `LoadFormat`, and `weight_version` is a valid label. Raises InvalidUpdateRequest / InvalidLabelError."""
    for name, expected, value in declared_fields(obj):
        if not has_declared_type(value, expected):
            raise InvalidUpdateRequest(f"invalid update_weights_from_disk request: {name}={value!r} is not "
                                       f"{getattr(expected, '__name__', expected)}")
    if not obj.model_path.strip():
        raise InvalidUpdateRequest("invalid update_weights_from_disk request: model_path is empty")
    check_load_format(obj.load_format)
    epochs.check_label(obj.weight_version)


def declared_fields(obj):
    import msgspec
    return [(f.name, f.type, getattr(obj, f.name)) for f in msgspec.structs.fields(type(obj))]


def has_declared_type(value, expected) -> bool:
    """Whether `value` fits a field type made of bool / int / str / dict / list and Optional; other types pass."""
    if typing.get_origin(expected) is typing.Union:
        return any(has_declared_type(value, arg) for arg in typing.get_args(expected))
    base = typing.get_origin(expected) or expected
    if expected is type(None):
        return value is None
    if base is int:  # a bool is an int to Python, not to a request
        return isinstance(value, int) and not isinstance(value, bool)
    if base in (bool, str, dict, list):
        return isinstance(value, base)
    return True


def check_load_format(load_format) -> None:
    """None (the server's own format) or a value of SGLang's `LoadFormat`, case-insensitive as `LoadConfig` reads it."""
    from sglang.srt.configs.load_config import LoadFormat
    if load_format is None:
        return
    valid = [f.value for f in LoadFormat]
    if load_format.lower() not in valid:
        raise InvalidUpdateRequest(f"invalid update_weights_from_disk request: load_format {load_format!r} is not a "
                                   f"valid LoadFormat (one of: {', '.join(valid)})")
