"""Bad input on the decode role: a request without the bootstrap fields that name its prefill peer.

SGLang 0.5.23's decode scheduler builds the peer's address from `bootstrap_host` and `bootstrap_port`
(`disaggregation/decode.py: _bootstrap_addr`) before it checks anything else about them; a request whose
`bootstrap_room` is set but whose host is missing crashes the scheduler (`AttributeError: 'NoneType' object has no
attribute 'startswith'`) and the whole engine exits. A request with no room at all is refused by the scheduler, but
only after it was tokenized and sent there. The router always adds all three fields; a client that calls the decode
server directly may not.

Invariant (enforced by `vradix.hooks.pd_launcher.reject_decode_request_without_bootstrap`, from the launcher's request check, in the tokenizer manager, before
anything is sent to a scheduler): every request a decode-role engine accepts carries a non-empty `bootstrap_host`, a
`bootstrap_port` in 1..65535 and a `bootstrap_room` in 0..2**64-1. Two exceptions are SGLang's own: the `fake`
transfer backend assigns the room itself, so there it may be missing; and a request to SGLang's fake bootstrap host
(`FAKE_BOOTSTRAP_HOST`, what `/health_generate` and the disaggregation warmup send) moves no KV and needs no port.
Anything else is a `MissingBootstrapError` (a ValueError: SGLang's HTTP layer answers HTTP 400 with its message),
which names every missing or invalid field.
"""
from __future__ import annotations

from typing import List, Optional

FIELDS = ("bootstrap_host", "bootstrap_port", "bootstrap_room")
MAX_ROOM = 2 ** 64 - 1
#: SGLang's `disaggregation.utils.FAKE_BOOTSTRAP_HOST`: the in-process health and warmup requests' peer (no KV moves)
FAKE_BOOTSTRAP_HOST = "2.2.2.2"


class MissingBootstrapError(ValueError):
    """A decode-role request without usable bootstrap information (nothing reached the scheduler)."""


def problems(host, port, room, room_assigned_by_engine: bool = False) -> List[str]:
    """What is wrong with one request's bootstrap fields, one phrase per field (empty when they are usable)."""
    out = []
    if host is None:
        out.append("bootstrap_host is missing")
    elif not isinstance(host, str) or not host.strip():
        out.append(f"bootstrap_host={host!r} is not a host name")
    if port is None:
        if host != FAKE_BOOTSTRAP_HOST:
            out.append("bootstrap_port is missing")
    elif not _is_int(port) or not 1 <= port <= 65535:
        out.append(f"bootstrap_port={port!r} is not a port (1..65535)")
    if room is None:
        if not room_assigned_by_engine:
            out.append("bootstrap_room is missing")
    elif not _is_int(room) or not 0 <= room <= MAX_ROOM:
        out.append(f"bootstrap_room={room!r} is not a room id (0..2**64-1)")
    return out


def check_decode_request(host, port, room, transfer_backend: Optional[str]) -> None:
    """Raise MissingBootstrapError unless one decode-role request's bootstrap fields are usable."""
    found = problems(host, port, room, room_assigned_by_engine=transfer_backend == "fake")
    if found:
        raise MissingBootstrapError(
            "invalid request for a decode-role server (P/D disaggregation): " + "; ".join(found)
            + ". Send requests through the P/D router, or set bootstrap_host, bootstrap_port and bootstrap_room "
              "to the prefill server's bootstrap address and a fresh room id.")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
