"""The gateway kit recovers when another process takes a port it chose before smg binds it: smg exits with the bind
error and is started afresh on new ports. Before, the start failed with "smg exited"."""
import socket

import pytest

from vradix.testing.harness import gateway

# the kit's own recovery, in `make test-long` (as the CPU server's and the P/D pair's)
pytestmark = [pytest.mark.e2e, pytest.mark.long, pytest.mark.timeout(300)]
pytest.importorskip("smg")


def test_the_gateway_comes_up_on_new_ports_when_its_ports_were_taken(monkeypatch):
    taken = [socket.socket(), socket.socket()]
    for s in taken:
        s.bind(("127.0.0.1", 0))
        s.listen()
    first = iter([s.getsockname()[1] for s in taken])  # the first launch's HTTP and metrics ports: both taken
    real_free_port = gateway.free_port
    monkeypatch.setattr(gateway, "free_port", lambda: next(first, None) or real_free_port())
    try:
        with gateway.Gateway([], startup_timeout=120) as gw:
            assert next(first, None) is None  # both taken ports were handed out
            assert gw.port not in [s.getsockname()[1] for s in taken]
            assert gw.workers() == []  # the RL control plane answers on the new port
    finally:
        for s in taken:
            s.close()
