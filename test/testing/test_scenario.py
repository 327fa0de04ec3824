"""`pause_holding` (the precondition of a request in flight at a pause), without a server: an attempt in which a request
finished before the pause took effect is resumed, its result collected, and started afresh; a held attempt returns
paused; a precondition never met fails at the deadline, naming it."""
import pytest

from vradix.testing.harness import scenario


class FakeStream:
    def __init__(self, finishes_first: bool):
        self.done = self.near_end = finishes_first
        self.collected = False

    def wait_decoding(self, timeout=120.0):
        pass

    def result(self, timeout=300.0):
        self.collected = True
        return {"meta_info": {}}


class FakeServer:
    url = "http://fake"

    def __init__(self):
        self.calls = []

    def pause(self, mode):
        self.calls.append("pause")

    def resume(self):
        self.calls.append("resume")


@pytest.fixture(autouse=True)
def no_fence(monkeypatch):
    monkeypatch.setattr(scenario, "pause_took_effect", lambda server: None)


def test_a_void_attempt_is_resumed_collected_and_retried():
    server, outcomes, started = FakeServer(), iter([True, False]), []

    def start():
        started.append(FakeStream(next(outcomes)))
        return started[-1:]

    (held,) = scenario.pause_holding(server, start)
    assert held is started[1] and not held.done and started[0].collected
    assert server.calls == ["pause", "resume", "pause"]  # paused on return


def test_a_precondition_never_met_fails_at_the_deadline_naming_it():
    with pytest.raises(AssertionError, match="the long request never still running at a pause"):
        scenario.pause_holding(FakeServer(), lambda: [FakeStream(True)], deadline_s=0, what="the long request")


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_on_a_real_server_a_request_that_finished_first_voids_the_attempt(models, monkeypatch, server_pool):
    """A one-token request has finished by the time the pause took effect (its only chunk is its last): the attempt is
    voided and the engine continued; the long request of the next attempt is held, paused, until it is resumed."""
    monkeypatch.undo()  # the real fence
    tokens = iter([1, 300])
    with server_pool.lease(models[0]) as s:
        (held,) = scenario.pause_holding(s, lambda: [scenario.StreamingRequest(s.url, scenario.LONG_PROMPT,
                                                                               next(tokens))])
        assert next(tokens, None) is None and not held.done  # the second attempt is the one returned
        assert s.vradix_info()["pool"]["paused"]
        s.resume()
        assert held.result()["meta_info"]["completion_tokens"] == 300


def test_a_request_near_its_end_counts_as_possibly_finished_in_its_scheduler():
    """The client sees a finished request's last chunks only after the detokenizer passed them on: a stream within
    `NEAR_END_TOKENS` of its end may be over in its scheduler, so it voids a hold like a finished one."""
    stream = scenario.StreamingRequest.__new__(scenario.StreamingRequest)
    stream.max_new_tokens, stream.error = 200, None
    stream._thread = type("Alive", (), {"is_alive": staticmethod(lambda: True)})()
    for seen, near in [(1, False), (200 - scenario.NEAR_END_TOKENS - 1, False), (200 - scenario.NEAR_END_TOKENS, True)]:
        stream.final = {"meta_info": {"completion_tokens": seen, "finish_reason": None}}
        assert (stream.done, stream.near_end) == (False, near)
