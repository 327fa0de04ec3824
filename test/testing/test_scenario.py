"""`pause_holding` (the precondition of a request in flight at a pause), without a server: an attempt in which a request
finished before the pause took effect is resumed, its result collected, and started afresh; a held attempt returns
paused; a precondition never met fails at the deadline, naming it. `across_publications` (a request in flight across
several publications) judges each attempt by the request's own record, not by its client, and redoes a void one
(on a real server with a lagging client: `test_e2e_provenance.py`)."""
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


class RecordedStream:
    """A stream whose final record shows `spans` weight-version spans; `ends_early`: its client sees it end before
    the next pause."""

    def __init__(self, spans: int, ends_early: bool = False):
        self.spans, self.ends_early = spans, ends_early
        self.done = self.near_end = False

    def wait_decoding(self, timeout=120.0):
        pass

    def wait_more_tokens(self, tokens, timeout=120.0):
        return not self.ends_early

    def result(self, timeout=300.0):
        return {"meta_info": {"weight_versions": [{"version": str(i)} for i in range(self.spans)]}}


def crossing_run(streams, deadline_s=60.0):
    server, published, prepared = FakeServer(), [], []
    streams = iter(streams)

    def publication(name):
        def publish():
            server.calls.append(name)
            published.append(name)
            return f"published {name}"
        return publish

    crossing = scenario.across_publications(server, lambda: next(streams), [publication("v2"), publication("v3")],
                                            prepare=lambda: prepared.append(len(prepared)) or len(prepared),
                                            deadline_s=deadline_s)
    return crossing, server.calls


def test_an_attempt_the_request_s_record_does_not_prove_is_redone():
    """The client saw the request running at every pause, but its record shows it sampled under two versions only
    (it finished before the second publication in its scheduler): void; the next attempt, with three spans, holds."""
    crossing, calls = crossing_run([RecordedStream(2), RecordedStream(3)])
    assert crossing.attempts == 2 and crossing.before == 2
    assert crossing.messages == ["published v2", "published v3"] and len(crossing.final["meta_info"][
        "weight_versions"]) == 3
    assert calls == ["pause", "v2", "pause", "v3"] * 2


def test_a_request_its_client_saw_end_stops_its_attempt_before_the_next_pause():
    crossing, calls = crossing_run([RecordedStream(2, ends_early=True), RecordedStream(3)])
    assert crossing.attempts == 2
    assert calls == ["pause", "v2", "pause", "v2", "pause", "v3"]


def test_a_crossing_never_proven_fails_at_the_deadline_naming_it():
    with pytest.raises(AssertionError, match="the crossing request never ran across 2 publication"):
        crossing_run([RecordedStream(1)], deadline_s=0)
