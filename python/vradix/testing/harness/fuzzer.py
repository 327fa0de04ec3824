"""The publication fuzzer: random supported flag combinations, random traffic and random control requests on real CPU
servers, every exact response checked against stock SGLang on the weights it is labelled with.

One run (`fuzz`) draws `combinations` server configurations from a seed (`draw_combination`: page size, chunked
prefill, radix cache on or off, overlap scheduling on or off, scheduling policy, a staleness window, HiCache,
streaming sessions, two data-parallel ranks and, behind a switch, two HTTP workers). On each it starts a vradix server
on weights A, runs load workers (single prompts, GRPO groups sent as one batch, multi-turn conversations whose history
grows with the model's own replies, aborted requests and, with streaming sessions, conversations held in a session
whose turns send only their new tokens) and, between bursts of traffic, `publications` random control steps
(`Combination.control_steps`: a disk update paused in place, paused with retract, or unpaused; a bucketed tensor
update; a label alone; a lock-aware flush; an abort-mode pause; `/set_internal_state` of a key SGLang lets it set,
and of a relaxed speculative acceptance threshold, which must be refused with every rank left unchanged; with HiCache,
a runtime storage detach or attach, tried under load first, where SGLang refuses it, then on the idle engine), each
publication naming one of the weights A, B, C in its label.

The oracle: a response whose request overlapped no weight change (no crossing request) and that asked for exact KV
(a session turn: the whole history it continues) must equal a stock server on the weights its label names, with the
combination's chunking and page size
(`oracle_sets`: weights switched by an idle flush; solo and batched outputs accepted, since float32 batched matmuls
flip a few greedy near-ties). A mismatch stock reproduces on those weights by computing the prompt another way (from
an empty cache, or with its shared prefix cached first), or whose every token is within `NEAR_TIE_LOGPROB` of
stock's top choice (`near_tie`), is counted as a near-tie; any other mismatch is a stale hit. Requests that overlapped a step that changed the weights (crossing requests) are counted,
not checked. A bounded response (a window server) whose reused prefix is all its labelled weights' KV is checked like
an exact one; one that reused another weights' KV is checked against stock on the cache state its spans describe,
rebuilt (`rebuilt_answer`: each span's prefix computed under its weights, in order, with disk updates that keep the
cache, then the labelled weights), with the same cached length.

Invariants: every HTTP error other than an abort or an expected refusal is recorded and fails the run; a control
step's effect (or, refused, its absence) is read back from every rank's resolved configuration; each server runs
SGLang's busy-time memory checks and ends with no Traceback in its log and, with a radix cache, SGLang's strict idle
memory check on every rank (`reliability.strict_idle_check`).
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import os
import random
import threading
import time
import uuid
import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import requests

from vradix.testing.harness.hicache_store import hicache_server
from vradix.testing.harness.reliability import STRICT_CHECK_ENV, strict_idle_check
from vradix.testing.harness.scenario import tensor_buckets
from vradix.testing.harness.server import CpuServer

WEIGHTS = ("A", "B", "C")
MAX_NEW_TOKENS = 4
#: the long profile's defaults (its figures in docs/reliability.md; the flag matrix names the pairs its draw runs)
LONG_PROFILE_SEED, LONG_PROFILE_COMBINATIONS, LONG_PROFILE_PUBLICATIONS = 2026, 20, 25


#: the admin key of every HiCache combination's server: SGLang answers a runtime storage attach or detach only on a
#: server started with `--admin-api-key`, and then asks it on every control call
ADMIN_KEY = "vradix-fuzz-admin"
#: what a storage attach names: the backend and policy the server started with (`hicache_store.HICACHE_ARGS`)
STORAGE_ATTACH = {"hicache_storage_backend": "file", "hicache_storage_prefetch_policy": "wait_complete"}


@dataclass(frozen=True)
class Combination:
    """One server configuration the census supports (a window is refused with HiCache, without a radix cache and with
    streaming sessions; streaming sessions are refused without a radix cache and with an L3 storage backend), that the
    CPU engine runs. Two data-parallel ranks (`dp`) are drawn without HiCache and without streaming sessions: SGLang's
    data-parallel controller routes a session's turns with no affinity to the rank that holds the session.
    `http_workers` > 1: SGLang's multi-tokenizer HTTP server (`--tokenizer-worker-num`)."""

    page_size: int = 1
    chunked_prefill_size: int = 1024
    radix: bool = True
    overlap: bool = True
    policy: str = "fcfs"
    window: int = 0
    hicache: bool = False
    sessions: bool = False
    dp: int = 1
    http_workers: int = 1

    def args(self) -> List[str]:
        out = ["--page-size", str(self.page_size), "--schedule-policy", self.policy]
        if not self.radix:
            out.append("--disable-radix-cache")
        if not self.overlap:
            out.append("--disable-overlap-schedule")
        if self.window:
            out += ["--vradix-max-staleness", str(self.window)]
        if self.sessions:
            out.append("--enable-streaming-session")
        if self.dp > 1:
            out += ["--dp-size", str(self.dp)]
        if self.http_workers > 1:
            out += ["--tokenizer-worker-num", str(self.http_workers)]
        if self.hicache:
            out += ["--admin-api-key", ADMIN_KEY]
        return out

    def env(self) -> Dict[str, str]:
        """The server's environment: each data-parallel rank's OpenMP threads on a core of its own (SGLang's CPU
        engine refuses more ranks than bound core groups)."""
        return {"SGLANG_CPU_OMP_THREADS_BIND": "|".join(str(r) for r in range(self.dp))} if self.dp > 1 else {}

    def headers(self) -> Dict[str, str]:
        """The headers of every call to the server (the admin key where it has one)."""
        return {"Authorization": f"Bearer {ADMIN_KEY}"} if self.hicache else {}

    def control_steps(self) -> Tuple[str, ...]:
        """The control steps drawn on this server: SGLang refuses a tensor update with more than one data-parallel
        rank (an assertion, not a request it serves), so that combination does not draw one; only a HiCache server
        has a storage backend to detach and attach."""
        steps = tuple(s for s in CONTROL_STEPS if not (s == "bucketed tensor update" and self.dp > 1))
        return steps + (STORAGE_STEPS if self.hicache else ())

    def name(self) -> str:
        return (f"ps{self.page_size}-chunk{self.chunked_prefill_size}-{'radix' if self.radix else 'noradix'}-"
                f"{'overlap' if self.overlap else 'normal'}-{self.policy}-K{self.window}"
                f"{'-hicache' if self.hicache else ''}{'-sessions' if self.sessions else ''}"
                f"{f'-dp{self.dp}' if self.dp > 1 else ''}{f'-http{self.http_workers}' if self.http_workers > 1 else ''}")


#: the HTTP-workers dimension (SGLang's multi-tokenizer server, whose workers load vradix themselves) is drawn only
#: when switched on (`draw_combination(http_workers=True)`, the benchmark's `--http-workers`,
#: `VRADIX_FUZZ_HTTP_WORKERS=1`), which changes that dimension only: an unpaused update from disk through a worker
#: went unanswered for 300 s in two of three runs with it (docs/reliability.md), so the long profile leaves it out
HTTP_WORKERS_ENV = "VRADIX_FUZZ_HTTP_WORKERS"
#: what a request sent inside a bucketed update the scheduler holds is refused with (HTTP 400): with several
#: HTTP workers the hold is the scheduler's (`hooks.control.REQUEST_INSIDE_BUCKETED_UPDATE`)
BUCKETED_UPDATE_REFUSAL = "a bucketed update is open"


def draw_combination(rng: random.Random, processes: Optional[random.Random] = None, *,
                     http_workers: bool = False) -> Combination:
    """One combination: its flags from `rng`, its processes (two data-parallel ranks; two HTTP workers, applied only
    with `http_workers`, but drawn whatever the switch, so the switch changes that dimension only) from `processes`
    (None: one of each)."""
    radix = rng.random() < 0.85
    hicache = radix and rng.random() < 0.2
    combo = Combination(page_size=rng.choice((1, 1, 4)), chunked_prefill_size=rng.choice((64, 1024)), radix=radix,
                        overlap=rng.random() < 0.7, policy=rng.choice(("fcfs", "lpm")),
                        window=rng.choice((0, 0, 1)) if radix and not hicache else 0, hicache=hicache)
    # streaming sessions with HiCache's L3 backend (which the fuzzer's HiCache always has) are refused at launch
    sessions = radix and not combo.window and not hicache and rng.random() < 0.4
    combo = dataclasses.replace(combo, sessions=sessions)
    if processes is None:
        return combo
    dp2, workers2 = processes.random() < 0.35, processes.random() < 0.25
    return dataclasses.replace(combo, dp=2 if dp2 and not (hicache or sessions) else 1,
                               http_workers=2 if workers2 and http_workers else 1)


def combinations(seed: int, *, http_workers: bool = False) -> Iterator[Combination]:
    """The combinations a seed draws, in order, without end: the flags from `Random(seed)` (what `draw_combination`
    alone draws from it), the processes from a stream of their own, so every seed draws the flags it drew before
    the process dimensions existed."""
    flags, processes = random.Random(seed), random.Random(f"processes-{seed}")
    while True:
        yield draw_combination(flags, processes, http_workers=http_workers)


@dataclass
class Response:
    prompt: Tuple[int, ...]
    t0: float
    t1: float
    label: str
    output: Tuple[int, ...]
    exact: bool
    #: prefix tokens it reused (SGLang's `cached_tokens`)
    cached: int = 0
    #: its `kv_weight_versions` (every bounded response has them): (label, start, end) per span of prompt + output
    spans: Tuple[Tuple[str, int, int], ...] = ()


def prefix_pool(rng: random.Random, n: int = 4, length: int = 96) -> List[List[int]]:
    """Shared prefixes (two of them share their first half), so prefixes are reused across requests and weights."""
    base = [[rng.randrange(20, 480) for _ in range(length)] for _ in range(n)]
    base[1] = base[0][:length // 2] + base[1][length // 2:]
    return base


@dataclass
class Run:
    """One server's traffic: load workers append responses; control steps that change the weights append their time
    intervals (`weight_changes`)."""

    server: CpuServer
    rng: random.Random
    prefixes: List[List[int]]
    bounded_server: bool
    sessions: bool = False
    #: the headers of every call (`Combination.headers`)
    headers: Dict[str, str] = field(default_factory=dict)
    responses: List[Response] = field(default_factory=list)
    weight_changes: List[Tuple[float, float]] = field(default_factory=list)
    errors: List[str] = field(default_factory=list)
    counts: Dict[str, int] = field(default_factory=dict)
    #: every label the server served under -> the weights it names (its start label: A)
    label_weights: Dict[str, str] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: the workers' gate: `quiet()` holds their next request and waits for the ones they are sending
    gate: threading.Condition = field(default_factory=threading.Condition)
    held: bool = False
    busy: int = 0

    def http(self, path: str, body: Optional[dict] = None, timeout: float = 300,
             method: str = "POST") -> requests.Response:
        """One call to the server (with the run's headers)."""
        return requests.request(method, self.server.url + path, json=body, headers=self.headers, timeout=timeout)

    @contextlib.contextmanager
    def quiet(self, timeout: float = 300.0) -> Iterator[None]:
        """The workers send nothing inside: their requests in flight have finished, and their next waits."""
        with self.gate:
            self.held = True
            assert self.gate.wait_for(lambda: self.busy == 0, timeout), "the workers' requests did not finish"
        try:
            yield
        finally:
            with self.gate:
                self.held = False
                self.gate.notify_all()

    def count(self, what: str, n: int = 1) -> None:
        with self.lock:
            self.counts[what] = self.counts.get(what, 0) + n

    def payload(self, prompts, exact: bool) -> dict:
        sp: Dict[str, object] = {"temperature": 0, "max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True}
        if self.bounded_server:
            sp["custom_params"] = {"vradix_max_staleness": 0 if exact else 1}
        return {"input_ids": prompts, "sampling_params": sp}

    def send(self, prompts: List[List[int]], exact: bool = True, *, histories: Optional[List[List[int]]] = None,
             **extra) -> Optional[list]:
        """One /generate call (a list of prompts: one batch); records each answer as the answer to its prompt, or to
        its entry of `histories` (a session turn: the whole history it continues). None when it was aborted."""
        t0 = time.monotonic()
        body = {**self.payload(prompts, exact), **extra}
        if "session_params" in extra:  # a session turn is one request, not a batch
            (body["input_ids"],) = prompts
        r = self.http("/generate", body)
        t1 = time.monotonic()
        if r.status_code != 200:
            if "abort" in r.text.lower():
                return None
            # the scheduler's hold (several HTTP workers)
            if r.status_code == 400 and BUCKETED_UPDATE_REFUSAL in r.text:
                self.count("refused inside a bucketed update")
                return None
            raise AssertionError(f"HTTP {r.status_code}: {r.text[:300]}")
        answers = r.json()
        answers = answers if isinstance(answers, list) else [answers]
        with self.lock:
            for p, a in zip(histories or prompts, answers):
                if (a["meta_info"].get("finish_reason") or {}).get("type") == "abort":
                    continue
                meta = a["meta_info"]
                spans = tuple((x["version"], x["start"], x["end"]) for x in meta.get("kv_weight_versions") or ())
                self.responses.append(Response(tuple(p), t0, t1, meta["weight_version"], tuple(a["output_ids"]),
                                               exact or not self.bounded_server, meta.get("cached_tokens", 0), spans))
        return answers

    @staticmethod
    def tail(rng: random.Random) -> List[int]:
        return [rng.randrange(20, 480) for _ in range(rng.randint(1, 6))]

    def single(self, rng: random.Random) -> None:
        self.send([rng.choice(self.prefixes) + self.tail(rng)], exact=rng.random() < 0.8)
        self.count("single")

    def group(self, rng: random.Random) -> None:
        prompt = rng.choice(self.prefixes) + self.tail(rng)
        self.send([prompt] * 4, exact=rng.random() < 0.7)
        self.count("grpo_group")

    def conversation(self, rng: random.Random) -> None:
        """A multi-turn conversation; on a window server half of them are bounded (every turn may reuse the
        history's older KV: the use a window is for)."""
        history, exact = list(rng.choice(self.prefixes)), rng.random() < 0.5
        for _ in range(rng.randint(2, 4)):
            history += self.tail(rng)
            answers = self.send([history], exact=exact)
            if answers is None:
                return
            history += answers[0]["output_ids"]
            self.count("turn")

    def session_conversation(self, rng: random.Random) -> None:
        """A conversation in a streaming session: each turn sends only its new tokens (the session's slot holds the
        history) and is checked as the whole history it continues. A turn aborted (an abort pause) ends it."""
        r = self.http("/open_session", {"capacity_of_str_len": 1 << 16, "streaming": True}, timeout=60)
        assert r.status_code == 200, f"open_session: HTTP {r.status_code}: {r.text[:300]}"
        sid, history = r.json(), []
        try:
            for i in range(rng.randint(2, 4)):
                new = (list(rng.choice(self.prefixes)) if i == 0 else []) + self.tail(rng)
                history += new
                answers = self.send([new], histories=[list(history)], session_params={"id": sid})
                if answers is None or (answers[0]["meta_info"].get("finish_reason") or {}).get("type") == "abort":
                    return
                history += answers[0]["output_ids"]
                self.count("session turn")
        finally:
            r = self.http("/close_session", {"session_id": sid}, timeout=60)
            assert r.status_code == 200, f"close_session: HTTP {r.status_code}: {r.text[:300]}"

    def aborted(self, rng: random.Random) -> None:
        """A long request aborted while it runs (or before it starts): its answer is never checked."""
        rid = uuid.uuid4().hex
        body = self.payload([rng.choice(self.prefixes) + self.tail(rng)], True)
        body["sampling_params"]["max_new_tokens"] = 64
        body["input_ids"], body["rid"] = body["input_ids"][0], rid
        t = threading.Thread(target=self.http, args=("/generate", body), daemon=True)
        t.start()
        time.sleep(rng.random() * 0.2)
        self.http("/abort_request", {"rid": rid}, timeout=60)
        t.join(300)
        self.count("abort")

    def worker(self, seed: int) -> None:
        rng = random.Random(seed)
        kinds: Tuple[Callable[[random.Random], None], ...] = (
            self.single, self.single, self.group, self.conversation, self.aborted)
        if self.sessions:
            kinds += (self.session_conversation, self.session_conversation)
        while not self.stop.is_set():
            with self.gate:
                self.gate.wait_for(lambda: not self.held)
                self.busy += 1
            try:
                rng.choice(kinds)(rng)
            except Exception as e:  # recorded: the run fails on any error
                self.errors.append(repr(e))
                return
            finally:
                with self.gate:
                    self.busy -= 1
                    self.gate.notify_all()


class Control:
    """The control steps of one server: each returns the weights the server serves afterwards."""

    def __init__(self, run: Run, models: Dict[str, str], combo: Combination):
        self.run, self.models, self.combo, self.radix = run, models, combo, combo.radix
        self.serving, self.n = "A", 0
        #: whether the HiCache storage backend is attached (a HiCache server starts with it)
        self.attached = combo.hicache

    def label(self, weights: str) -> str:
        self.n += 1
        label = f"{weights}-{self.n}-{uuid.uuid4().hex[:6]}"
        with self.run.lock:
            self.run.label_weights[label] = weights
        return label

    def ok(self, r: requests.Response) -> dict:
        assert r.status_code == 200, f"{r.request.path_url}: HTTP {r.status_code}: {r.text[:300]}"
        body = r.json() if r.text.strip().startswith(("{", "[")) else {}
        assert not isinstance(body, dict) or body.get("success", True), body
        return body

    def post(self, path: str, body: Optional[dict] = None) -> dict:
        return self.ok(self.run.http(path, body or {}))

    def rank_states(self) -> List[dict]:
        """Every data-parallel rank's resolved configuration: SGLang's internal state, its startup values with every
        runtime override (`/set_internal_state`, a storage attach or detach) applied."""
        r = requests.get(self.run.server.url + "/get_server_info", headers=self.run.headers, timeout=60)
        assert r.status_code == 200, f"/get_server_info: HTTP {r.status_code}: {r.text[:300]}"
        states = r.json()["internal_states"]
        assert len(states) == self.combo.dp, f"{len(states)} internal states from {self.combo.dp} data-parallel ranks"
        return states

    def settings(self, key: str) -> List[object]:
        return [state.get(key) for state in self.rank_states()]

    def internal_state(self) -> None:
        """`/set_internal_state` of a key SGLang sets on this engine: applied on every rank."""
        key, value = self.run.rng.choice((("pp_max_micro_batch_size", self.run.rng.randint(1, 8)),
                                          ("speculative_accept_threshold_single", 1.0),
                                          ("speculative_accept_threshold_acc", 1.0)))
        updated = self.post("/set_internal_state", {"server_args": {key: value}})
        assert isinstance(updated, list) and updated and all(updated), f"set_internal_state {key}={value}: {updated}"
        assert self.settings(key) == [value] * self.combo.dp, (key, value, self.settings(key))

    def refused_internal_state(self) -> None:
        """`/set_internal_state` relaxing speculative acceptance below 1: a refusal (a 400-class answer naming the
        key, or SGLang's `updated=False` from every rank), never a server error, and no rank changed."""
        key, value = self.run.rng.choice(ACCEPT_THRESHOLDS), self.run.rng.choice((0.0, 0.5, 0.9))
        before = self.settings(key)
        r = self.run.http("/set_internal_state", {"server_args": {key: value}})
        body = r.json() if r.status_code == 200 else None
        refused = (400 <= r.status_code < 500 and key in r.text) or (
            isinstance(body, list) and body and not any(body))
        assert refused, f"set_internal_state {key}={value} not refused: HTTP {r.status_code}: {r.text[:300]}"
        assert self.settings(key) == before, f"a refused {key}={value} changed the engine: {self.settings(key)}"

    def storage(self) -> None:
        """Detach the HiCache storage backend, or attach it again (the backend and policy it started with). SGLang
        does either only on an idle engine: the call is tried under load first, where a refusal (HTTP 400 naming
        the busy scheduler) must change nothing, then, refused, with the workers held, until the engine is idle."""
        attach = not self.attached

        def call() -> requests.Response:
            return self.run.http("/hicache/storage-backend", STORAGE_ATTACH if attach else None,
                                 method="PUT" if attach else "DELETE")

        what = "attach" if attach else "detach"
        r = call()
        if r.status_code == 400 and "not idle" in r.text:
            self.run.count(f"storage {what} refused while busy")
            assert set(self.settings("hicache_storage_backend")) == {STORAGE_ATTACH["hicache_storage_backend"]
                                                                     if self.attached else None}
            with self.run.quiet():  # the requests just finished may still be leaving the scheduler
                deadline = time.monotonic() + 60
                while (r := call()).status_code == 400 and "not idle" in r.text and time.monotonic() < deadline:
                    time.sleep(0.05)
        assert r.status_code == 200, f"storage {what}: HTTP {r.status_code}: {r.text[:300]}"
        self.attached = attach
        expected = STORAGE_ATTACH["hicache_storage_backend"] if attach else None
        assert self.settings("hicache_storage_backend") == [expected] * self.combo.dp, self.rank_states()
        self.run.count(f"storage {what}")

    def disk(self, mode: Optional[str]) -> None:
        weights = self.run.rng.choice(WEIGHTS)
        if mode:
            self.post("/pause_generation", {"mode": mode})
        self.post("/update_weights_from_disk", {"model_path": self.models[weights], "flush_cache": False,
                                                "weight_version": self.label(weights)})
        if mode:
            self.post("/continue_generation")
        self.serving = weights

    def bucketed_tensor_update(self) -> None:
        weights = self.run.rng.choice(WEIGHTS)
        self.post("/begin_weight_update")
        label = self.label(weights)
        for bucket in tensor_buckets(self.models[weights], 2):
            # no flush asked (SGLang's default asks one): vradix invalidates at the bucketed update's end; a flush
            # asked with requests held in it is refused without a radix cache, as on stock
            self.post("/update_weights_from_tensor", {"serialized_named_tensors": bucket, "weight_version": label,
                                                      "flush_cache": False})
        self.post("/end_weight_update")
        self.serving = weights

    def relabel(self) -> None:
        self.post("/update_weight_version", {"new_version": self.label(self.serving)})

    def flush(self) -> None:
        """A flush: lock-aware with a radix cache; without one SGLang refuses it unless idle (HTTP 400), as stock."""
        r = self.run.http("/flush_cache", {})
        if not self.radix and r.status_code == 400:
            self.run.count("flush refused while busy (no radix cache)")
            return
        self.ok(r)

    def abort_pause(self) -> None:
        self.post("/pause_generation", {"mode": "abort"})
        self.post("/continue_generation")

    def step(self) -> str:
        steps = {"disk in_place": lambda: self.disk("in_place"), "disk retract": lambda: self.disk("retract"),
                 "disk unpaused": lambda: self.disk(None), "bucketed tensor update": self.bucketed_tensor_update,
                 "label only": self.relabel, "flush": self.flush, "abort pause": self.abort_pause,
                 "internal state": self.internal_state, "internal state refused": self.refused_internal_state,
                 "storage detach or attach": self.storage}
        name = self.run.rng.choice(self.combo.control_steps())
        t0 = time.monotonic()
        steps[name]()
        if name in WEIGHT_STEPS:
            with self.run.lock:
                self.run.weight_changes.append((t0, time.monotonic()))
        self.run.count(f"control: {name}")
        return name


CONTROL_STEPS = ("disk in_place", "disk retract", "disk unpaused", "bucketed tensor update", "label only", "flush",
                 "abort pause", "internal state", "internal state refused")
#: a HiCache server's further step: its storage backend detached, or attached again
STORAGE_STEPS = ("storage detach or attach",)
#: the runtime settings that relax speculative acceptance (`/set_internal_state` refuses a value below 1)
ACCEPT_THRESHOLDS = ("speculative_accept_threshold_single", "speculative_accept_threshold_acc")
PUBLICATION_STEPS = ("disk in_place", "disk retract", "disk unpaused", "bucketed tensor update", "label only")
#: the steps that change the weights: a request running across one of them is a crossing request, never checked (a
#: relabel, a flush or an abort pause keeps the weights, so what runs across them is checked like any request)
WEIGHT_STEPS = ("disk in_place", "disk retract", "disk unpaused", "bucketed tensor update")



def overlapped(r: Response, intervals: Sequence[Tuple[float, float]]) -> bool:
    return any(s <= r.t1 and r.t0 <= e for s, e in intervals)


def start_server(models: Dict[str, str], combo: Combination, workdir: str) -> CpuServer:
    env = {**STRICT_CHECK_ENV, **combo.env()}
    if combo.hicache:
        store = os.path.join(workdir, f"l3-{uuid.uuid4().hex[:8]}")
        os.makedirs(store)
        return hicache_server(models["A"], store, max_total_tokens=512, env=env,
                              chunked_prefill_size=combo.chunked_prefill_size, extra_args=combo.args())
    return CpuServer(models["A"], env=env, chunked_prefill_size=combo.chunked_prefill_size, extra_args=combo.args())


def exercise(server: CpuServer, models: Dict[str, str], combo: Combination, rng: random.Random,
             publications: int, concurrency: int = 3, requests_between: int = 6) -> Run:
    """Traffic and `publications` control steps that publish (flushes and abort pauses come on top) on one server."""
    run = Run(server, rng, prefix_pool(rng), bounded_server=combo.window > 0, sessions=combo.sessions,
              headers=combo.headers())
    answers = run.send([run.prefixes[0] + [7]])
    assert answers is not None, "the first request was aborted"
    (first,) = answers
    run.label_weights[first["meta_info"]["weight_version"]] = "A"
    control = Control(run, models, combo)
    workers = [threading.Thread(target=run.worker, args=(rng.randrange(1 << 30),), daemon=True)
               for _ in range(concurrency)]
    for w in workers:
        w.start()
    try:
        published = 0
        while published < publications and not run.errors:
            wait_for_traffic(run, requests_between)
            published += control.step() in PUBLICATION_STEPS
    finally:
        run.stop.set()
        for w in workers:
            w.join(300)
    if combo.radix:  # the idle check reads the tree's pool; without a tree SGLang's own busy checks still run
        strict_idle_check(server)
    if "Traceback" in server.logs():
        run.errors.append("Traceback in the server log:\n" + server.tail(40))
    return run


def wait_for_traffic(run: Run, n: int, timeout: float = 300.0) -> None:
    """Until `n` more responses arrived (or a worker failed)."""
    with run.lock:
        target = len(run.responses) + n
    deadline = time.monotonic() + timeout
    while len(run.responses) < target and not run.errors:
        assert time.monotonic() < deadline, "the load made no progress"
        time.sleep(0.01)


def oracle_sets(models: Dict[str, str], wanted: Dict[str, set], stock) -> Dict:
    """{(weights, prompt): {outputs}}: what a stock server (`stock(path)`, a context) on those weights answers alone
    and in a batch of four."""
    out = {}
    with stock(models["A"]) as s:
        for weights in WEIGHTS:
            prompts = sorted(wanted.get(weights, ()))
            if not prompts:
                continue
            s.reset(models[weights], f"oracle-{weights}")
            solo = [tuple(s.generate(list(p), MAX_NEW_TOKENS)["output_ids"]) for p in prompts]
            with cf.ThreadPoolExecutor(4) as pool:
                batched = list(pool.map(lambda p: tuple(s.generate(list(p), MAX_NEW_TOKENS)["output_ids"]), prompts))
            out.update({(weights, p): {a, b} for p, a, b in zip(prompts, solo, batched)})
    return out


#: the largest log-probability gap (top choice minus the token given) at which a greedy token counts as a near-tie:
#: float32 sums in another order (another batch, another cached split) move a tiny model's logits by about 1e-3;
#: another weights' KV moves them by tenths or more
NEAR_TIE_LOGPROB = 0.01


def near_tie(models: Dict[str, str], weights: str, prompt: Tuple[int, ...], output: Tuple[int, ...], stock,
             prefix_len: int) -> bool:
    """Whether `output` is what stock on `weights` answers for `prompt` up to greedy near-ties: stock gives it when it
    computes the prompt another way (from an empty cache, or with its first `prefix_len` tokens cached first), or
    each of its tokens is, after the tokens before it, within `NEAR_TIE_LOGPROB` of stock's top choice (a batch of
    another composition flips a near-tie that neither way reproduces, and the rest of the output then continues
    from the flipped token). Another weights' KV moves the first token's logits far more, so a stale hit is never
    taken for one."""
    with stock(models[weights]) as s:
        answers = set()
        for warm in (False, True):
            s.reset(models[weights], f"recheck-{weights}")
            if warm:
                s.generate(list(prompt[:prefix_len]), 1)
            answers.add(tuple(s.generate(list(prompt), MAX_NEW_TOKENS)["output_ids"]))
        return output in answers or max(token_gaps(s, prompt, output)) <= NEAR_TIE_LOGPROB


def token_gaps(server: CpuServer, prompt: Tuple[int, ...], output: Tuple[int, ...]) -> List[float]:
    """For each token of `output`: stock's top log-probability minus the token's, given the prompt and the tokens
    of `output` before it (one prefill of prompt + output with SGLang's input log-probabilities)."""
    # SGLang gives no log-probability for the first position it reports: start one before the output
    r = server.post("/generate", {"input_ids": list(prompt) + list(output), "return_logprob": True,
                                  "logprob_start_len": len(prompt) - 1, "top_logprobs_num": 1,
                                  "sampling_params": {"temperature": 0, "max_new_tokens": 1}})
    assert r.status_code == 200, r.text[:300]
    meta = r.json()["meta_info"]
    chosen, tops = meta["input_token_logprobs"][1:], meta["input_top_logprobs"][1:]
    assert len(chosen) == len(output) == len(tops), (len(chosen), len(output), len(tops))
    return [top[0][0] - lp for (lp, _, _), top in zip(chosen, tops)]


def reused_segments(r: Response, label_weights: Dict[str, str]) -> List[Tuple[str, int]]:
    """The prefix a response reused (`[0, cached)`), as its spans describe it: (weights, end) per span, in order."""
    return [(label_weights[v], min(e, r.cached)) for v, s, e in r.spans if s < r.cached]


def rebuilt_answer(s: CpuServer, models: Dict[str, str], segments: Sequence[Tuple[str, int]], weights: str,
                   prompt: Tuple[int, ...]) -> Tuple[Tuple[int, ...], int]:
    """What stock SGLang answers for `prompt` on `weights` when its cache holds exactly the KV `segments` describe:
    from an empty cache, each segment's prompt prefix computed under its weights on top of the segments before it
    (a disk update without a flush between weights: stock keeps what the old weights computed), then `weights`
    loaded the same way. Returns (output ids, cached tokens)."""
    serving = segments[0][0]
    s.reset(models[serving], f"rebuild-{serving}")
    for seg_weights, end in segments:
        if seg_weights != serving:
            s.update_weights(models[seg_weights], f"rebuild-{seg_weights}")
            serving = seg_weights
        s.generate(list(prompt[:end]), 1)
    if serving != weights:
        s.update_weights(models[weights], f"rebuild-{weights}")
    meta = s.generate(list(prompt), MAX_NEW_TOKENS)
    return tuple(meta["output_ids"]), meta["meta_info"]["cached_tokens"]


@dataclass
class Figures:
    combinations: List[str] = field(default_factory=list)
    publications: int = 0
    requests: int = 0
    checked: int = 0
    crossing_not_checked: int = 0
    #: bounded responses that reused another weights' KV, checked against stock on the cache state their spans
    #: describe (`rebuilt_answer`); part of `checked`
    bounded_rebuilt: int = 0
    mismatches: List[tuple] = field(default_factory=list)
    #: mismatches that are greedy near-ties of the labelled weights (`near_tie`)
    near_ties: List[tuple] = field(default_factory=list)
    errors: List[str] = field(default_factory=list)
    counts: Dict[str, int] = field(default_factory=dict)

    def add(self, other: "Figures") -> None:
        for name in ("combinations", "mismatches", "near_ties", "errors"):
            getattr(self, name).extend(getattr(other, name))
        for name in ("publications", "requests", "checked", "crossing_not_checked", "bounded_rebuilt"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for k, v in other.counts.items():
            self.counts[k] = self.counts.get(k, 0) + v

    def line(self) -> str:
        return (f"{len(self.combinations)} combination(s), {self.publications} publications, {self.requests} "
                f"requests, {self.checked} checked ({self.bounded_rebuilt} bounded on a rebuilt stale cache), "
                f"{self.crossing_not_checked} crossing, {len(self.mismatches)} mismatches ({len(self.near_ties)} "
                f"greedy near-ties, not counted), {len(self.errors)} errors")


def sort_responses(combo: Combination, run: Run, figures: Figures) -> Tuple[list, list]:
    """(exact checks, rebuilt checks): every response outside the weight changes, as (weights, response) or
    (weights, response, reused segments). A bounded response whose reused KV is all its labelled weights' is checked
    like an exact one; a span it computed itself under other weights than its label's, or a label no step set, is an
    error."""
    exact, rebuilt = [], []
    for r in run.responses:
        unknown = {r.label, *(v for v, _, _ in r.spans)} - set(run.label_weights)
        if unknown:
            figures.errors.append(f"{combo.name()}: a response labelled {sorted(unknown)}, which no step set")
            continue
        if overlapped(r, run.weight_changes):
            figures.crossing_not_checked += 1
            continue
        weights = run.label_weights[r.label]
        computed = {run.label_weights[v] for v, _, e in r.spans if e > r.cached}
        if computed - {weights}:
            figures.errors.append(f"{combo.name()}: a response labelled {r.label!r} ({weights}) computed KV under "
                                  f"{sorted(computed)} without crossing a weight change: {r.spans}")
            continue
        segments = [] if r.exact else reused_segments(r, run.label_weights)
        if {w for w, _ in segments} - {weights}:
            rebuilt.append((weights, r, segments))
        else:
            exact.append((weights, r))
    return exact, rebuilt


def check(combo: Combination, run: Run, models: Dict[str, str], stock) -> Figures:
    """One server's figures: every exact response outside the weight changes against the oracle of its label's
    weights, computed by `stock(path, combo)` (a context: a stock server with the combination's chunking and page
    size); a mismatch stock reproduces by computing the prompt another way is a near-tie, not a stale hit. Every
    bounded response that reused another weights' KV against stock on the cache state its spans describe, rebuilt
    (its cached length must match too; a token difference within `NEAR_TIE_LOGPROB` there is a near-tie)."""
    figures = Figures(combinations=[combo.name()], errors=list(run.errors), requests=len(run.responses),
                      counts=dict(run.counts))
    figures.publications = sum(v for k, v in run.counts.items()
                               if k.startswith("control: ") and k[len("control: "):] in PUBLICATION_STEPS)
    to_check, to_rebuild = sort_responses(combo, run, figures)
    wanted: Dict[str, set] = {}
    for weights, r in to_check:
        wanted.setdefault(weights, set()).add(r.prompt)
    oracle = oracle_sets(models, wanted, lambda path: stock(path, combo))
    for weights, r in to_check:
        figures.checked += 1
        if r.output in oracle[(weights, r.prompt)]:
            continue
        found = (combo.name(), r.label, r.prompt, r.output, sorted(oracle[(weights, r.prompt)]))
        if near_tie(models, weights, r.prompt, r.output, lambda path: stock(path, combo), len(run.prefixes[0])):
            figures.near_ties.append(found)
        else:
            figures.mismatches.append(found)
    if to_rebuild:
        with stock(models["A"], combo) as s:
            for weights, r, segments in to_rebuild:
                check_rebuilt(s, models, combo, weights, r, segments, figures)
    return figures


def check_rebuilt(s: CpuServer, models: Dict[str, str], combo: Combination, weights: str, r: Response,
                  segments: Sequence[Tuple[str, int]], figures: Figures) -> None:
    """One bounded response against stock on the cache state its spans describe (`rebuilt_answer`)."""
    figures.checked += 1
    figures.bounded_rebuilt += 1
    output, cached = rebuilt_answer(s, models, segments, weights, r.prompt)
    if (output, cached) == (r.output, r.cached):
        return
    found = (combo.name(), r.label, r.prompt, r.output, [output], f"rebuilt {segments}: cached {cached} vs {r.cached}")
    if cached == r.cached and max(token_gaps(s, r.prompt, r.output)) <= NEAR_TIE_LOGPROB:
        figures.near_ties.append(found)
    else:
        figures.mismatches.append(found)


def fuzz(models: Dict[str, str], workdir: str, *, seed: int, combinations: Sequence[Combination],
         publications: int, stock,
         server: Optional[Callable[[Combination], CpuServer]] = None, progress=None) -> Figures:
    """Run every combination (its own server unless `server` hands one out) and check its responses right after
    (so a long run's figures so far are reported by `progress(combo, figures)`); `stock(path, combo)` is the oracle's
    server, as a context."""
    rng = random.Random(seed)
    figures = Figures()
    for combo in combinations:
        with (server(combo) if server else start_server(models, combo, workdir)) as s:
            run = exercise(s, models, combo, rng, publications)
        figures.add(check(combo, run, models, stock))
        if progress:
            progress(combo, figures)
    return figures
