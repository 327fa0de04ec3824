"""The server pool's rules (`vradix.testing.harness.pool`) on stand-in servers (a `sleep` process group each): one
server per configuration, reused only after a reset, parked stopped between leases, never reused after a failed
lease, bounded in number; and the per-file time table of `make test`."""
import signal
import subprocess
import time
from types import SimpleNamespace

import pytest

from vradix.testing.harness import pool as pool_mod
from vradix.testing.harness.pool import ServerPool, configuration


class FakeServer:
    """What the pool calls on a `CpuServer`: a process group, HTTP calls (recorded), `reset`, `stop`."""

    def __init__(self, model_path, **kw):
        self.model_path, self.kw = model_path, kw
        self.proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
        self.calls = []
        self.healthy = True

    def post(self, path, payload=None, timeout=None):
        self.calls.append(path)
        return SimpleNamespace(status_code=200)

    def get(self, path, timeout=None):
        self.calls.append(path)
        return SimpleNamespace(status_code=200 if self.healthy else 503)

    def reset(self, model_path, version, deadline_s=300.0):
        self.calls.append(("reset", model_path, version))
        self.model_path = model_path

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def stopped(server, want: bool = True, settle: float = 5.0) -> bool:
    """Whether the process is stopped (state T), waiting up to `settle` s for it to become `want` (a signal is
    delivered asynchronously)."""
    deadline = time.monotonic() + settle
    while True:
        with open(f"/proc/{server.proc.pid}/stat") as f:
            now = f.read().rsplit(")", 1)[1].split()[0] == "T"
        if now == want or time.monotonic() > deadline:
            return now
        time.sleep(0.02)


@pytest.fixture
def pool(monkeypatch):
    monkeypatch.setattr(pool_mod, "available_gib", lambda: 100.0)
    p = ServerPool(max_parked=2, start=FakeServer)
    yield p
    p.close()


def test_a_configuration_ignores_deadlines_and_orders_env():
    a = configuration("/m", {"vradix": False, "env": {"X": "1", "Y": "2"}, "startup_timeout": 600})
    b = configuration("/m", {"env": {"Y": "2", "X": "1"}, "vradix": False, "timeout": 30})
    assert a == b and a != configuration("/m", {"vradix": True, "env": {"X": "1", "Y": "2"}})


def test_a_second_lease_reuses_the_parked_server_after_a_reset_to_the_asked_model(pool):
    with pool.lease("/a", vradix=False) as first:
        assert first.calls == [] and not stopped(first, want=False)  # a fresh server is handed out as started
    assert stopped(first)  # parked: the process group is stopped
    with pool.lease("/b", vradix=False) as other:
        assert other is not first  # another configuration (the model path is part of it)
    with pool.lease("/a", vradix=False, startup_timeout=5) as again:
        assert again is first and not stopped(first, want=False)
        assert first.calls == ["/continue_generation", ("reset", "/a", "default"), "/health_generate"]
    assert pool.summary() == {"starts": 2, "reuses": 1, "parked": 2}


def test_a_lease_that_raised_stops_its_server(pool):
    with pytest.raises(RuntimeError):
        with pool.lease("/a") as s:
            raise RuntimeError("the test failed")
    assert s.proc.poll() is not None
    with pool.lease("/a") as fresh:
        assert fresh is not s
    assert pool.summary()["starts"] == 2


def test_a_server_that_fails_its_reset_is_replaced(pool):
    with pool.lease("/a") as s:
        s.healthy = False
    with pool.lease("/a") as fresh:
        assert fresh is not s and s.proc.poll() is not None


def test_lease_many_hands_out_distinct_servers_and_starts_only_the_missing_ones(pool):
    with pool.lease("/a") as one:
        pass
    with pool.lease_many(2, "/a") as both:
        assert one in both and len(set(map(id, both))) == 2
    assert pool.summary() == {"starts": 2, "reuses": 1, "parked": 2}


def test_at_most_max_parked_servers_are_parked_the_least_recently_used_is_stopped(pool):
    with pool.lease("/a") as a:
        pass
    with pool.lease("/b") as b:
        pass
    with pool.lease("/c"):
        pass
    assert a.proc.poll() is not None and b.proc.poll() is None and pool.summary()["parked"] == 2


def test_nothing_is_parked_while_memory_is_short(pool, monkeypatch):
    monkeypatch.setattr(pool_mod, "available_gib", lambda: 1.0)
    with pool.lease("/a") as a:
        pass
    assert a.proc.poll() is not None and pool.summary()["parked"] == 0


def test_close_stops_parked_and_leased_servers(pool):
    with pool.lease("/a") as a:
        pass
    with pool.lease("/b") as b:
        pool.close()
        assert a.proc.poll() is not None and b.proc.poll() is not None
        assert a.proc.returncode == -signal.SIGKILL  # a stopped process is continued first, then ends


def test_module_times_sum_every_phase_per_file():
    from vradix.testing.harness.suite import module_times
    reports = [SimpleNamespace(nodeid="test/e2e/test_x.py::test_a", when=w, duration=d)
               for w, d in (("setup", 30.0), ("call", 2.0), ("teardown", 1.0))]
    reports.append(SimpleNamespace(nodeid="test/test_y.py::test_b[p1]", when="call", duration=0.5))
    reports.append(SimpleNamespace(nodeid="test/test_y.py", message="a warning"))
    assert module_times(reports) == {"test/e2e/test_x.py": 33.0, "test/test_y.py": 0.5}



def test_the_workers_take_the_server_groups_first_then_the_slowest_files_without_servers():
    from vradix.testing.harness import suite
    for name in suite.SLOW_FILES + suite.SIDE_SERVER_FILES:
        assert suite.find_test_file(name) is not None, name
    assert not any(suite.starts_servers(name) for name in suite.SLOW_FILES)
    ids = ["test/test_identity.py::t", "test/kernels/test_csrc_build.py::t", "test/e2e/test_e2e_l3.py::t",
           "test/test_plugin.py::t", "test/e2e/test_e2e_pd.py::t"]
    assert sorted(ids, key=suite.hand_out_order) == [
        "test/e2e/test_e2e_pd.py::t", "test/e2e/test_e2e_l3.py::t", "test/test_plugin.py::t",
        "test/kernels/test_csrc_build.py::t", "test/test_identity.py::t"]


def test_module_starts_sum_the_server_starts_each_report_carries_per_file():
    from vradix.testing.harness.suite import module_starts
    reports = [SimpleNamespace(nodeid="test/e2e/test_x.py::test_a@servers", when=w, user_properties=props)
               for w, props in (("setup", [("server_starts", 2)]), ("call", []), ("teardown", [("server_starts", 1)]))]
    reports.append(SimpleNamespace(nodeid="test/test_y.py::test_b", when="call", user_properties=[("other", 5)]))
    reports.append(SimpleNamespace(nodeid="test/test_y.py", message="a warning"))
    assert module_starts(reports) == {"test/e2e/test_x.py": 3}

def test_a_prestarted_server_is_handed_out_unreset_and_a_once_lease_stops_it(pool):
    pool.prestart(("/a", {"vradix": False}), ("/b", {}), ("/c", {}), at_once=2)
    assert pool.summary() == {"starts": 3, "reuses": 0, "parked": 3}  # unused ones do not count against max_parked
    with pool.lease("/a", vradix=False) as a:
        assert a.calls == ["/health_generate"]  # as it started: no reset
    with pool.lease("/b", once=True) as b:
        pass
    assert b.proc.poll() is not None
    with pool.lease("/a", vradix=False, once=True) as fresh:
        assert fresh is not a  # a once lease never takes a used server
    assert pool.summary() == {"starts": 4, "reuses": 0, "parked": 2}


def test_a_held_server_runs_only_for_the_tests_that_request_its_fixture():
    from vradix.testing.harness.pool import HELD, run_held_servers_for, stopped_while_unused
    server = FakeServer("/a")
    try:
        with stopped_while_unused(SimpleNamespace(fixturename="pair"), server):
            run_held_servers_for(["models", "oracle"])
            assert stopped(server)
            run_held_servers_for(["pair", "models"])
            assert not stopped(server, want=False)
            run_held_servers_for([])
        assert not stopped(server, want=False) and "pair" not in HELD  # continued on exit, so it can be stopped
    finally:
        server.stop()


def test_a_launch_waits_for_memory_and_gives_up_waiting_after_its_limit(monkeypatch):
    """`wait_for_memory` returns once enough memory is available, and after `limit` seconds when it never is."""
    from vradix.testing.harness import server
    readings = iter([1.0, 1.0, 8.0])
    monkeypatch.setattr(server, "available_gib", lambda: next(readings))
    assert server.wait_for_memory(4.0, limit=30, poll=0.01) < 5  # the third reading has it
    monkeypatch.setattr(server, "available_gib", lambda: 1.0)
    assert 0.05 <= server.wait_for_memory(4.0, limit=0.05, poll=0.01) < 5
