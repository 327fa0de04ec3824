"""The CPU test server recovers when another process takes its HTTP port before the server binds it (the server
binds only after model load, so a port probed free can be gone by then). Before: the server logged the bind error,
never became healthy, and the test waited out the whole startup deadline and failed."""
import socket

import pytest

from vradix.testing.harness import server as server_mod
from vradix.testing.harness.server import CpuServer

# the kit's own recovery (two server starts), in `make test-long`: a port race is rare, and every CI server start
# goes through the same launch loop
pytestmark = [pytest.mark.e2e, pytest.mark.long]


def test_server_restarts_on_a_new_port_when_its_port_was_taken(models, monkeypatch):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    ports = iter([taken.getsockname()[1]])
    real_free_port = server_mod.free_port
    monkeypatch.setattr(server_mod, "free_port", lambda: next(ports, None) or real_free_port())
    try:
        with CpuServer(models[0], startup_timeout=120) as srv:
            assert srv.port != taken.getsockname()[1]
            assert len(srv.generate([1, 2, 3], max_new_tokens=2)["output_ids"]) == 2
    finally:
        taken.close()
