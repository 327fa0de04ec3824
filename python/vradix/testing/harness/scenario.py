"""The publication scenarios shared by the E2E tests and `make demo` (real server, real HTTP calls)."""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Optional

import requests

PREFIX = [(i * 7) % 500 + 5 for i in range(200)]  # the 200-token shared prefix of the issue
PROBE = PREFIX + [11]
LONG_PROMPT = [9, 8, 7] * 20


class StreamingRequest:
    """A /generate stream in a thread; `started` is set once the first chunk arrived, i.e. it is running."""

    def __init__(self, url: str, input_ids, max_new_tokens: int, timeout: float = 300.0, **extra):
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

    def result(self, timeout: float = 300.0) -> dict:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError("streaming request did not finish")
        if self.error is not None:
            raise self.error
        return self.final


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
    inflight = StreamingRequest(server.url, LONG_PROMPT, 300)
    assert inflight.started.wait(120), "in-flight request never started"
    assert server.post("/pause_generation", {"mode": "in_place"}).status_code == 200
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
