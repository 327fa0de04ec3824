"""The publication scenarios shared by the E2E tests and `make demo` (real server, real HTTP calls).

Timing preconditions: a scenario that needs a request in flight at a pause does not trust the clock. It holds the
request (a long `max_new_tokens` with `ignore_eos`), waits until the request has streamed a token (it is decoding),
pauses, and then checks that the request was still running when the pause took effect (`pause_holding`); a request
that finished first, or came so near its end that its scheduler may have finished it (`near_end`), voids the attempt,
which is undone (continue, collect its requests' results) and started afresh, within a deadline. Where the weight
version changes during the pause, `crossed_update` confirms it afterwards from SGLang's own per-request record
(`weight_versions`). A request that must keep running past later pauses (`across_publications`) is judged by that
record alone: its client can lag its scheduler by more than the request has left.
"""
from __future__ import annotations

import glob
import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence

import requests

from vradix.testing.harness.http import vradix_of

PREFIX = [(i * 7) % 500 + 5 for i in range(200)]  # a 200-token shared prefix, cached under the old weights
PROBE = PREFIX + [11]
LONG_PROMPT = [9, 8, 7] * 20


#: how many tokens before its end a streamed request counts as possibly finished in its scheduler (`near_end`)
NEAR_END_TOKENS = 32


class StreamingRequest:
    """A /generate stream in a thread; `started` is set once the first chunk arrived, i.e. it is running."""

    def __init__(self, url: str, input_ids, max_new_tokens: int, timeout: float = 300.0, **extra):
        self.max_new_tokens = max_new_tokens
        self.started = threading.Event()
        self.final: Optional[dict] = None
        self.error: Optional[BaseException] = None
        payload = {"input_ids": list(input_ids), "stream": True,
                   "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True},
                   **extra}
        self._thread = threading.Thread(target=self._run, args=(url, payload, timeout), daemon=True)
        self._thread.start()

    def _run(self, url, payload, timeout):
        try:
            with requests.post(url + "/generate", json=payload, stream=True, timeout=timeout) as r:
                r.raise_for_status()
                for line in r.iter_lines():
                    if line.startswith(b"data:") and line.strip() != b"data: [DONE]":
                        self.final = json.loads(line[5:])
                        self.started.set()
        except BaseException as e:  # surfaced by result()
            self.error = e
        finally:
            self.started.set()

    @property
    def done(self) -> bool:
        """Whether the stream ended: its last chunk (a finish reason) arrived, or it failed."""
        return not self._thread.is_alive() or self.error is not None or bool(
            self.final and self.final["meta_info"].get("finish_reason"))

    @property
    def near_end(self) -> bool:
        """Whether the request may have finished in its scheduler: it is `done`, or its client has seen it within
        `NEAR_END_TOKENS` of its `max_new_tokens`. A finished request's last chunks reach the client through the
        detokenizer process, which no round trip to the scheduler waits for; on a loaded machine they can lag the
        scheduler by a few decode steps, so a request this close to its end may already be over there."""
        return self.done or self.seen >= self.max_new_tokens - NEAR_END_TOKENS

    @property
    def seen(self) -> int:
        """Output tokens its client has seen so far (the last chunk's `completion_tokens`)."""
        return (self.final or {}).get("meta_info", {}).get("completion_tokens", 0)

    def wait_more_tokens(self, tokens: int, timeout: float = 120.0) -> bool:
        """Until its client has seen `tokens` more output tokens than now (True) or the stream ended first (False).
        A stream that does neither within `timeout` is stalled: AssertionError."""
        start = self.seen
        deadline = time.monotonic() + timeout
        while self.seen < start + tokens:
            if self.done:
                return self.seen >= start + tokens
            assert time.monotonic() < deadline, (f"streaming request made no progress from {start} tokens in "
                                                 f"{timeout:.0f} s: {self.final}")
            time.sleep(0.05)
        return True

    def wait_decoding(self, timeout: float = 120.0) -> None:
        """Until the request has streamed an output token (it is past prefill and decoding); raises if it failed."""
        assert self.started.wait(timeout), "streaming request never started"
        if self.error is not None:
            raise self.error

    def result(self, timeout: float = 300.0) -> dict:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError("streaming request did not finish")
        if self.error is not None:
            raise self.error
        assert self.final is not None, "streaming request finished without a final message"
        return self.final


#: how long `pause_holding` retries by default: a loaded 2-core machine can void a few attempts
HOLD_DEADLINE_S = 300.0


def pause_took_effect(server) -> dict:
    """Return once the scheduler of `server` (anything with its `url`) has handled every call sent before it (SGLang
    answers a pause before its scheduler has seen it).

    A server-info call travels to the scheduler behind the pause and is answered after it; the outputs the scheduler
    emitted before the pause travel on a second socket to the same tokenizer, so a second round trip lets the
    tokenizer stream them out before this returns. Those outputs pass through the detokenizer process, which neither
    round trip waits for: a request that finished first may lag there by a few decode steps, which `near_end` allows
    for. Returns the second call's server info (the scheduler's state with the pause in effect)."""
    for _ in range(2):
        r = requests.get(server.url + "/get_server_info", timeout=60)
        r.raise_for_status()
    return r.json()


def scheduler_holds(server_info: Optional[dict], n: int) -> bool:
    """Whether the scheduler whose `/get_server_info` answer this is holds at least `n` live requests (running or
    waiting, as vradix's block reports them from the scheduler). A client can lag its scheduler by more than a request
    has left (outputs pass the detokenizer process), so its view alone can take a finished request for a running one.
    A server without vradix reports nothing: True (its client's view stands)."""
    pool = ((vradix_of(server_info) if server_info else None) or {}).get("pool")
    return pool is None or pool["running_requests"] + pool["waiting_requests"] >= n


def pause_holding(server, start: Callable[[], Sequence[StreamingRequest]], *,
                  pause: Optional[Callable[[], None]] = None, resume: Optional[Callable[[], None]] = None,
                  deadline_s: float = HOLD_DEADLINE_S, what: str = "requests") -> List[StreamingRequest]:
    """Start requests (`start()`), wait until each is decoding, pause, and return them once the pause took effect
    with every one still running: the precondition of a request in flight at a pause.

    `server`: where the requests run (the one whose pause is checked); `pause` / `resume` (default: `server`'s
    in_place pause and its continue) pause and resume everything the scenario pauses (both roles of a P/D pair).
    An attempt in which a request finished before the pause is void: it is resumed and its requests' results
    collected, and a new attempt starts, until `deadline_s` (then AssertionError naming the precondition). A request
    counts as finished when its client saw it end or come `near_end`, or when the scheduler holds fewer live requests
    than were started (`scheduler_holds`, where vradix reports them). Invariant: on return the engine is paused and,
    as far as its client and its scheduler's count tell, none of the returned requests has finished; a request that
    must run on past the continue is proven by its own record (`across_publications`)."""
    pause = pause or (lambda: server.pause("in_place"))
    resume = resume or server.resume
    deadline = time.monotonic() + deadline_s
    attempts = 0
    while True:
        attempts += 1
        streams = list(start())
        for s in streams:
            s.wait_decoding()
        pause()
        info = pause_took_effect(server)
        if not any(s.near_end for s in streams) and scheduler_holds(info, len(streams)):
            return streams
        resume()
        for s in streams:
            s.result()
        assert time.monotonic() < deadline, (f"{what} never still running at a pause in {attempts} attempt(s) "
                                             f"({deadline_s}s): each time one finished first")


def begin_bucketed_update_holding(server):
    """PROBE cached, the server info before, and `/begin_weight_update` (which pauses in place) with a request in
    flight when its pause took effect. An attempt where the request finished first is void: its bucketed update ends
    with no bucket (one bump, weights unchanged), and the next attempt reads `before` afresh. Returns (before, the begin
    response, the request)."""
    attempt = {}

    def start():
        server.generate(PROBE, 4)  # PROBE's prefix cached under A
        attempt["before"] = server.vradix_info()
        return [StreamingRequest(server.url, LONG_PROMPT, 200)]

    def begin():
        attempt["begin"] = server.post("/begin_weight_update", {})

    def end_void_bucketed_update():
        assert server.post("/end_weight_update", {}).status_code == 200

    (inflight,) = pause_holding(server, start, pause=begin, resume=end_void_bucketed_update,
                                what="the in-flight request")
    return attempt["before"], attempt["begin"], inflight


def crossed_update(meta: dict) -> bool:
    """Whether the request whose final `meta_info` this is was running when its server's weight version changed.

    SGLang's scheduler records a version event on every live request with output tokens when the version changes
    (`record_weight_version_change`); the final chunk's `weight_versions` then holds two spans or more. A request
    that finished before the change has one. This is SGLang's record, independent of vradix's provenance."""
    return version_spans(meta) >= 2


def version_spans(meta: dict) -> int:
    """How many weight versions the request whose final `meta_info` this is sampled under: the spans of SGLang's
    `weight_versions` (adjacent tokens of one version form one span)."""
    return len(meta.get("weight_versions") or ())


@dataclass
class Crossing:
    """A request that ran across every publication of `across_publications`, as its own record proves."""
    #: the request's final chunk
    final: dict
    #: each publication's reply message, in order
    messages: List[str]
    #: what `prepare()` returned at the start of the attempt that held
    before: object
    #: attempts made, the void ones included
    attempts: int


def across_publications(server, start: Callable[[], StreamingRequest], publications: Sequence[Callable[[], str]], *,
                        prepare: Callable[[], object] = lambda: None, tokens_between: int = 5,
                        pause: Optional[Callable[[], None]] = None, resume: Optional[Callable[[], None]] = None,
                        deadline_s: float = HOLD_DEADLINE_S) -> Crossing:
    """A request in flight across each of `publications`: `prepare()`, start the request (`start()`), hold it at an
    in_place pause (`pause_holding`), run the first publication (it publishes on the paused `server`, continues it,
    and returns its reply message), wait until the client has seen `tokens_between` more tokens, pause again, run the
    next one, and so on; then collect the request's final chunk.

    Whether the request was still running at a later pause cannot be read from its client: its outputs reach the
    client through the detokenizer process, which no call waits for, so on a loaded machine the client can lag the
    scheduler by more than the request has left. The request's own record decides instead: the attempt held when
    SGLang's `weight_versions` shows one span per weight version it ran under (one more than the publications).
    Otherwise the attempt is void (every publication it made still stands) and the next one starts with
    `prepare()`, until `deadline_s` (then AssertionError naming the precondition). `pause` / `resume`: as in
    `pause_holding` (every pause is `pause()`)."""
    pause = pause or (lambda: server.pause("in_place"))
    deadline = time.monotonic() + deadline_s
    attempts = 0
    while True:
        attempts += 1
        before = prepare()
        (stream,) = pause_holding(server, lambda: [start()], pause=pause, resume=resume,
                                  deadline_s=max(0.0, deadline - time.monotonic()), what="the crossing request")
        messages = []
        for i, publish in enumerate(publications):
            if i:
                if not stream.wait_more_tokens(tokens_between):
                    break
                pause()
                pause_took_effect(server)
            messages.append(publish())
        final = stream.result()
        if len(messages) == len(publications) and version_spans(final["meta_info"]) == len(publications) + 1:
            return Crossing(final, messages, before, attempts)
        assert time.monotonic() < deadline, (f"the crossing request never ran across {len(publications)} "
                                             f"publication(s) in {attempts} attempt(s) ({deadline_s}s): each time it "
                                             "finished first")


@dataclass
class PublicationOutcome:
    warm_cached: int = 0
    warm_repeat_cached: int = 0
    cached_after: int = 0
    label_after: str = ""
    output_after: list = field(default_factory=list)
    cached_again: int = 0
    inflight_retractions: int = -1
    inflight_tokens: int = 0
    update_message: str = ""
    vradix: Optional[dict] = None


def stale_prefix_publication(server, new_model: str, version: str = "v2") -> PublicationOutcome:
    """Warm PREFIX, start a long request, in_place pause, update weights (no flush), continue, probe PREFIX."""
    out = PublicationOutcome()
    out.warm_cached = server.generate(PROBE, 4)["meta_info"]["cached_tokens"]
    out.warm_repeat_cached = server.generate(PROBE, 4)["meta_info"]["cached_tokens"]
    (inflight,) = pause_holding(server, lambda: [StreamingRequest(server.url, LONG_PROMPT, 300)],
                                what="the long request")
    upd = server.post("/update_weights_from_disk",
                      {"model_path": new_model, "flush_cache": False, "weight_version": version}).json()
    assert upd["success"], upd
    out.update_message = upd["message"]
    assert server.post("/continue_generation", {}).status_code == 200
    r = server.generate(PROBE, 4)
    out.cached_after, out.label_after, out.output_after = (r["meta_info"]["cached_tokens"],
                                                           r["meta_info"]["weight_version"], r["output_ids"])
    final = inflight.result()
    out.inflight_retractions = final["meta_info"]["num_retractions"]
    out.inflight_tokens = final["meta_info"]["completion_tokens"]
    out.cached_again = server.generate(PROBE, 4)["meta_info"]["cached_tokens"]
    out.vradix = server.vradix_info()
    return out


@dataclass
class BurstOutcome:
    """One batch of prompts that share an uncached prefix, sent in one /generate call (so they reach the scheduler
    together): how many prompt tokens the server computed, against computing the shared prefix once."""

    computed: int
    computed_once: int
    cached: list


def shared_prefix_burst(server, n: int = 8, prefix_len: int = 200, tail_len: int = 16, seed: int = 0) -> BurstOutcome:
    """`n` prompts = one fresh `prefix_len`-token prefix + distinct `tail_len`-token tails, greedy, 2 new tokens."""
    prefix = [(seed * 997 + i * 37) % 480 + 12 for i in range(prefix_len)]
    prompts = [prefix + [(k * 53 + j * 11 + seed) % 480 + 12 for j in range(tail_len)] for k in range(n)]
    r = server.post("/generate", {"input_ids": prompts,
                                  "sampling_params": {"temperature": 0, "max_new_tokens": 2, "ignore_eos": True}})
    r.raise_for_status()
    metas = [x["meta_info"] for x in r.json()]
    return BurstOutcome(computed=sum(m["prompt_tokens"] - m["cached_tokens"] for m in metas),
                        computed_once=prefix_len + n * tail_len, cached=[m["cached_tokens"] for m in metas])


def tensor_buckets(model_dir: str, n: int):
    """The checkpoint's tensors in `n` buckets, in the HTTP form SGLang expects for tp=1 (one base64
    `MultiprocessingSerializer` payload per TP rank); shared-memory files, since the server is no child of ours."""
    import torch
    from safetensors.torch import load_file
    from sglang.srt.utils import MultiprocessingSerializer

    torch.multiprocessing.set_sharing_strategy("file_system")
    tensors = {}
    for path in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
        tensors.update(load_file(path))
    names = sorted(tensors)
    for group in (names[i::n] for i in range(n)):
        yield [MultiprocessingSerializer.serialize([(k, tensors[k]) for k in group], output_str=True)]
