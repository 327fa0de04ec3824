"""The census test mode's failures reach the tests: a server whose scheduler stopped on `CensusViolation` leaves the
census's message in its log, `CpuServer.stop` collects it once, and test/conftest.py fails the test with it (no
server is started here: the stopped server is a finished process with such a log)."""
import subprocess
import tempfile

from vradix.scheduler import census
from vradix.testing.harness.server import CpuServer, census_failure

#: how SGLang's scheduler process logs an exception before it takes its server down (`run_scheduler_process`)
SCHEDULER_EXCEPTION = ("[2026-01-01 00:00:00] Scheduler hit an exception: Traceback (most recent call last):\n"
                       "  File \"scheduler.py\", line 1, in event_loop_overlap\n"
                       f"vradix.scheduler.census.CensusViolation: {census.MARKER} the served weights changed "
                       "without a publication: parameter lm_head.weight was written in place, since engine start\n"
                       "[2026-01-01 00:00:01] Received sigquit from a child process. It usually means the child "
                       "failed.\n")


def stopped_server(log_text: str) -> CpuServer:
    server = CpuServer.__new__(CpuServer)
    server.log = tempfile.NamedTemporaryFile("w+", prefix="sglang-", suffix=".log")
    server.log.write(log_text)
    server.proc = subprocess.Popen(["true"])
    server.proc.wait()
    return server


def test_a_census_failure_in_a_server_log_is_collected_once_at_stop(monkeypatch):
    monkeypatch.setattr(CpuServer, "census_failures", [])
    server = stopped_server("server up\n" + SCHEDULER_EXCEPTION)
    server.stop()
    server.stop()
    (line,) = CpuServer.census_failures
    assert line.startswith(census.MARKER) and line.endswith("since engine start")


def test_a_server_log_without_a_census_failure_adds_nothing(monkeypatch):
    monkeypatch.setattr(CpuServer, "census_failures", [])
    stopped_server("vradix census: bump to epoch 1: 1 request(s) reachable, 0 untreated holder(s)\n").stop()
    assert CpuServer.census_failures == [] and census_failure("no marker here") is None
