"""The escape watch's failures reach the tests: a server whose scheduler stopped on `EscapeViolation` leaves the
watch's message in its log, `CpuServer.stop` runs the log checks (test/conftest.py registers the watch's,
`vradix_census.watch.failure_in`) once per server, and test/conftest.py fails the test with what they found (no
server is started here: the stopped server is a finished process with such a log)."""
import subprocess
import tempfile

from vradix.testing.harness.server import CpuServer
from vradix_census import watch

#: how SGLang's scheduler process logs an exception before it takes its server down (`run_scheduler_process`)
SCHEDULER_EXCEPTION = ("[2026-01-01 00:00:00] Scheduler hit an exception: Traceback (most recent call last):\n"
                       "  File \"scheduler.py\", line 1, in event_loop_overlap\n"
                       f"vradix_census.watch.EscapeViolation: {watch.MARKER} the served weights changed "
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


def test_the_suite_reads_every_stopped_servers_log_for_a_watch_failure():
    assert watch.failure_in in CpuServer.log_checks


def test_a_watch_failure_in_a_server_log_is_collected_once_at_stop(monkeypatch):
    monkeypatch.setattr(CpuServer, "log_failures", [])
    server = stopped_server("server up\n" + SCHEDULER_EXCEPTION)
    server.stop()
    server.stop()
    (line,) = CpuServer.log_failures
    assert line.startswith(watch.MARKER) and line.endswith("since engine start")


def test_a_server_log_without_a_watch_failure_adds_nothing(monkeypatch):
    monkeypatch.setattr(CpuServer, "log_failures", [])
    stopped_server("vradix escape watch: bump to epoch 1: 1 request(s) reachable, 0 untreated holder(s)\n").stop()
    assert CpuServer.log_failures == [] and watch.failure_in("no marker here") is None
