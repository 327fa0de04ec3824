"""The HTTP calls tests and benchmarks make to an SGLang server, in one place.

`ServerClient(url)` wraps a running server (a `CpuServer` extends it; the benchmarks wrap `--url` servers with it):
generation, server info, the publication calls (pause, update, flush, continue) and the Prometheus prefill
counters. Every call is bounded by a timeout; a call the server refuses raises with the server's answer.
"""
from __future__ import annotations

import time
from typing import Dict, Optional, Sequence

import requests

#: the /metrics counters the benchmarks read, as (metric name, `mode` label) -> key
PREFILL_COUNTERS: Dict[tuple[str, Optional[str]], str] = {("sglang:realtime_tokens_total", "prefill_compute"): "computed",
                    ("sglang:realtime_tokens_total", "prefill_cache"): "cache_hit",
                    ("sglang:prefill_effective_tokens_total", "input"): "computed_first_attempt"}


class ServerRefused(requests.HTTPError):
    """The server answered a call with an error status or `success: false` (an HTTPError, as raise_for_status)."""


class ServerClient:
    """HTTP calls to one SGLang server at `url`; `timeout` bounds every call that does not pass its own."""

    def __init__(self, url: str, timeout: float = 120.0):
        self.url = url.rstrip("/")
        self.timeout = timeout

    # ---- raw calls --------------------------------------------------------------------------------------------------
    def post(self, path: str, payload: Optional[dict] = None, timeout: Optional[float] = None) -> requests.Response:
        return requests.post(self.url + path, json=payload or {}, timeout=timeout or self.timeout)

    def get(self, path: str, timeout: Optional[float] = None) -> requests.Response:
        return requests.get(self.url + path, timeout=timeout or min(self.timeout, 60.0))

    def _ok(self, path: str, payload: Optional[dict] = None, timeout: Optional[float] = None) -> requests.Response:
        r = self.post(path, payload, timeout)
        if r.status_code != 200:
            raise ServerRefused(f"{path} failed ({r.status_code}): {r.text[:300]}")
        return r

    # ---- generation and state ---------------------------------------------------------------------------------------
    def generate(self, input_ids: Sequence[int], max_new_tokens: int = 8, timeout: Optional[float] = None,
                 **extra) -> dict:
        """Greedy generation of exactly `max_new_tokens` (ignore_eos); the JSON answer (output_ids, meta_info)."""
        payload = {"input_ids": list(input_ids),
                   "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True}}
        payload.update(extra)
        return self._ok("/generate", payload, timeout).json()

    def server_info(self) -> dict:
        return self.get("/get_server_info").json()

    def vradix_info(self) -> Optional[dict]:
        """vradix's block of the scheduler's internal state (None on a server without vradix)."""
        return vradix_of(self.server_info())

    def prefill_counters(self) -> Dict[str, float]:
        """Cumulative prefill token counters from /metrics (needs --enable-metrics), summed over ranks."""
        out = {key: 0.0 for key in PREFILL_COUNTERS.values()}
        for line in self.get("/metrics").text.splitlines():
            if line.startswith("#") or "{" not in line:
                continue
            name, rest = line.split("{", 1)
            mode = rest.split('mode="', 1)[1].split('"', 1)[0] if 'mode="' in rest else None
            key = PREFILL_COUNTERS.get((name, mode))
            if key is not None:
                out[key] += float(line.rsplit(" ", 1)[1])
        return out

    # ---- publication calls ------------------------------------------------------------------------------------------
    def pause(self, mode: str = "in_place") -> None:
        self._ok("/pause_generation", {"mode": mode})

    def resume(self) -> None:
        self._ok("/continue_generation")

    def flush_cache(self) -> None:
        """POST /flush_cache; raises when the server refuses (it only flushes an idle engine)."""
        self._ok("/flush_cache")

    def update_weights(self, model_path: str, version: str, flush: bool = False,
                       timeout: Optional[float] = None) -> dict:
        """`update_weights_from_disk` as weight version `version`; raises unless it succeeded."""
        r = self.post("/update_weights_from_disk", {"model_path": model_path, "flush_cache": flush,
                                                    "weight_version": version}, timeout)
        try:
            body = r.json()
        except ValueError:
            body = {}
        if r.status_code != 200 or not body.get("success"):
            raise ServerRefused(f"update_weights_from_disk({model_path}, {version}) failed: {r.text[:300]}")
        return body

    def reset(self, model_path: str, version: str, deadline_s: float = 300.0) -> None:
        """Load `model_path` as `version` and flush the whole cache. The flush only succeeds on an idle engine, so
        this retries until the previous traffic has finished (a deadline, no fixed sleep)."""
        deadline = time.monotonic() + deadline_s
        while True:
            try:
                self.update_weights(model_path, version, flush=True)
                return
            except ServerRefused:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.2)


def vradix_of(server_info: dict) -> Optional[dict]:
    """vradix's block of the first scheduler's internal state in a `/get_server_info` answer (None on a server
    without vradix)."""
    states = server_info.get("internal_states") or [{}]
    return (states[0] or {}).get("vradix")
