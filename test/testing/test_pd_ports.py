"""The P/D kit recovers when another process takes a port it chose before binding it: prefill's bootstrap port
(prefill binds it during start-up, then serves HTTP without that listener when it was taken) and the router's HTTP
port (the router exits). Before: prefill was relaunched on the same taken bootstrap port until its attempts ran out,
and a router that lost its port failed the pair's start."""
import socket

import pytest

from vradix.testing.harness import pd

# a pair of its own for the kit's recovery path: `make test-long` (docs/cpu-environment.md lists what covers it in CI)
pytestmark = [pytest.mark.e2e, pytest.mark.long, pytest.mark.timeout(900)]

MISSING = pd.missing_requirements()


def listener() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


@pytest.mark.skipif(bool(MISSING), reason="P/D kit needs: " + ", ".join(MISSING))
def test_the_pair_comes_up_on_new_ports_when_its_bootstrap_and_router_ports_were_taken(models, monkeypatch):
    taken = [listener(), listener()]
    bootstrap, router = (s.getsockname()[1] for s in taken)
    real_free_port = pd.free_port
    first = {"bootstrap": iter([bootstrap]), "router": iter([router])}  # each kit's first choice: a taken port
    monkeypatch.setattr(pd, "free_bootstrap_port", lambda: next(first["bootstrap"], None) or real_free_port())
    monkeypatch.setattr(pd, "free_port", lambda: next(first["router"], None) or real_free_port())
    try:
        with pd.PdPair(models[0], vradix=False, startup_timeout=600) as pair:
            assert all(next(ports, None) is None for ports in first.values())  # both taken ports were handed out
            assert pair.bootstrap_port != bootstrap and pair.router.port != router
            assert len(pair.generate(pd.PROMPT[:64], 2)["output_ids"]) == 2  # the KV moved over the new bootstrap
    finally:
        for s in taken:
            s.close()
