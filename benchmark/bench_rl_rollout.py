"""RL rollout benchmark: four publication strategies on the same seeded RL traffic, on a real SGLang server.

    python benchmark/bench_rl_rollout.py                       # CPU: starts its own servers on tiny models
    python benchmark/bench_rl_rollout.py --url http://HOST:PORT --mode in_place+vradix --weights CKPT_A,CKPT_B

Workloads (seeded; every mode gets the same requests in the same order and the same publication schedule):
  grpo   P prompts that share a system prompt of S tokens, n samples per prompt, response lengths drawn from a
         distribution (ignore_eos, so lengths are exact). Samples of a prompt are submitted back to back.
  agent  sessions of several turns; each turn resends the whole history (system prompt, task, earlier turns with the
         model's own output) plus a tool result.
A publication is triggered every K completed requests (--publish-every-requests) and/or every T seconds
(--publish-every-seconds). Requests already in flight cross it; requests not yet submitted are held until the
publication's `continue_generation` returned (SGLang's tokenizer holds them during a pause anyway).

Modes (what one publication is):
  radix-off        server with --disable-radix-cache (Reef's disjoint default, AReaL's default): pause in_place,
                   update_weights_from_disk(flush_cache=False), continue.
  retract+flush    stock SGLang (the miles#2782 / Reef#206 recipe): pause retract, update, POST /flush_cache (must
                   succeed), continue. Every in-flight request is re-prefilled under the new weights.
  in_place         stock SGLang, VRADIX_DISABLE=1: pause in_place, update, continue, no flush. Unsafe: stale KV stays
                   matchable.
  in_place+vradix  the same calls as in_place, on a server with vradix active.

Metrics per (workload, mode): prompt tokens actually computed (prefill work, from the server's Prometheus counter
`sglang:realtime_tokens_total{mode="prefill_compute"}`, which includes re-prefills), tokens re-prefilled because of
retraction (`prefill_compute` minus `sglang:prefill_effective_tokens_total{mode="input"}`, the counter that excludes
retracted requests' re-counts), cache hit rate (sum cached_tokens / sum prompt_tokens, from meta_info), stale tokens
reused (see `ShadowCache`), requests completed, wall time, publication pause (pause sent -> continue returned; mean,
p99) and throughput. Output: a table on stdout, a JSON file, and a PNG (needs matplotlib).

Against an existing server (--url) the script cannot switch modes: run one --mode per server, started as follows
(add your usual model/parallelism flags; --enable-metrics is required for the counters and the per-request
timestamps the stale-reuse accounting orders events by):
  radix-off        VRADIX_DISABLE=1 python -m sglang.launch_server ... --enable-metrics --disable-radix-cache
  retract+flush    VRADIX_DISABLE=1 python -m sglang.launch_server ... --enable-metrics
  in_place         VRADIX_DISABLE=1 python -m sglang.launch_server ... --enable-metrics
  in_place+vradix  python -m sglang.launch_server ... --enable-metrics        (vradix installed and active)
The script checks /get_server_info against the mode and refuses a mismatched server. Publications load the
checkpoints of --weights in turn (default: the server's own model_path, reloaded; every load is a new version).
"""
from __future__ import annotations

import argparse
import bisect
import datetime
import json
import math
import os
import platform
import random
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence

import requests

MODE_NAMES = ("radix-off", "retract+flush", "in_place", "in_place+vradix")
WORKLOADS = ("grpo", "agent")
FIRST_TOKEN_ID = 3  # ids 0-2 are bos/eos/pad in the tiny model; ids are drawn from [3, vocab)


# ---- modes --------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Mode:
    """One publication strategy: how the server must be started and what one publication calls."""

    name: str
    pause_mode: str          # pause_generation mode
    flush: bool              # POST /flush_cache after the update (must succeed)
    radix: bool              # radix cache enabled on the server
    vradix: bool             # vradix active on the server

    def server_group(self) -> str:
        """Modes in one group can share a server (the state is reset between runs)."""
        return "vradix" if self.vradix else ("stock" if self.radix else "radix-off")

    def check_server(self, info: dict) -> None:
        """Refuse a server whose configuration does not match this mode (clear error, nothing run)."""
        radix_on = not info.get("disable_radix_cache", False)
        block = ((info.get("internal_states") or [{}])[0] or {}).get("vradix") or {}
        problems = []
        if radix_on != self.radix:
            problems.append(f"radix cache is {'on' if radix_on else 'off'}, mode needs it "
                            f"{'on' if self.radix else 'off (--disable-radix-cache)'}")
        if self.radix and bool(block.get("active")) != self.vradix:
            problems.append(f"vradix is {'active' if block.get('active') else 'not active'}, mode needs it "
                            f"{'active' if self.vradix else 'disabled (VRADIX_DISABLE=1)'}")
        if not info.get("enable_metrics", False):
            problems.append("the server needs --enable-metrics (prefill counters and per-request timestamps)")
        if problems:
            raise SystemExit(f"server does not match mode {self.name!r}: " + "; ".join(problems))


MODES = {
    "radix-off": Mode("radix-off", "in_place", flush=False, radix=False, vradix=False),
    "retract+flush": Mode("retract+flush", "retract", flush=True, radix=True, vradix=False),
    "in_place": Mode("in_place", "in_place", flush=False, radix=True, vradix=False),
    "in_place+vradix": Mode("in_place+vradix", "in_place", flush=False, radix=True, vradix=True),
}


# ---- workload ---------------------------------------------------------------------------------------------------------
@dataclass
class Turn:
    max_new_tokens: int
    tool_result: List[int]   # appended after the model's output, before the next turn (empty for the last turn)


@dataclass
class Task:
    """A unit a rollout worker runs start to finish: one GRPO sample, or one agent session (turns in order)."""

    name: str
    prefix: List[int]
    turns: List[Turn]


def _tokens(rng: random.Random, n: int, vocab: int) -> List[int]:
    return [rng.randrange(FIRST_TOKEN_ID, vocab) for _ in range(n)]


def _length(rng: random.Random, lo: int, hi: int) -> int:
    """Response lengths: log-uniform in [lo, hi] (many short, a few long, like RL rollouts)."""
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def grpo_tasks(a, rng: random.Random) -> List[Task]:
    system = _tokens(rng, a.system_tokens, a.vocab)
    tasks = []
    for p in range(a.prompts):
        prompt = system + _tokens(rng, rng.randint(a.question_tokens[0], a.question_tokens[1]), a.vocab)
        for k in range(a.samples):
            tasks.append(Task(f"p{p}s{k}", prompt, [Turn(_length(rng, *a.response_tokens), [])]))
    return tasks


def agent_tasks(a, rng: random.Random) -> List[Task]:
    system = _tokens(rng, a.system_tokens, a.vocab)
    tasks = []
    for s in range(a.sessions):
        task_prompt = system + _tokens(rng, rng.randint(a.question_tokens[0], a.question_tokens[1]), a.vocab)
        turns = [Turn(_length(rng, *a.response_tokens),
                      _tokens(rng, rng.randint(a.tool_tokens[0], a.tool_tokens[1]), a.vocab) if t < a.turns - 1
                      else []) for t in range(a.turns)]
        tasks.append(Task(f"session{s}", task_prompt, turns))
    return tasks


def build_tasks(workload: str, a) -> List[Task]:
    rng = random.Random(f"{a.seed}:{workload}")
    return grpo_tasks(a, rng) if workload == "grpo" else agent_tasks(a, rng)


# ---- server calls --------------------------------------------------------------------------------------------------------
class Server:
    """The HTTP calls the benchmark makes (an existing server, or a CpuServer's URL)."""

    def __init__(self, url: str, timeout: float):
        self.url = url.rstrip("/")
        self.timeout = timeout

    def post(self, path: str, payload: Optional[dict] = None) -> requests.Response:
        return requests.post(self.url + path, json=payload or {}, timeout=self.timeout)

    def generate(self, input_ids: List[int], max_new_tokens: int) -> dict:
        r = self.post("/generate", {"input_ids": input_ids, "sampling_params": {
            "temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True}})
        if r.status_code != 200:
            raise RuntimeError(f"/generate failed ({r.status_code}): {r.text[:300]}")
        return r.json()

    def server_info(self) -> dict:
        return requests.get(self.url + "/get_server_info", timeout=60).json()

    def vradix_block(self) -> Optional[dict]:
        return ((self.server_info().get("internal_states") or [{}])[0] or {}).get("vradix")

    def prefill_counters(self) -> Dict[str, float]:
        """Cumulative prefill token counters from /metrics, summed over ranks."""
        text = requests.get(self.url + "/metrics", timeout=60).text
        wanted = {('sglang:realtime_tokens_total', 'prefill_compute'): "computed",
                  ('sglang:realtime_tokens_total', 'prefill_cache'): "cache_hit",
                  ('sglang:prefill_effective_tokens_total', 'input'): "computed_first_attempt"}
        out = {v: 0.0 for v in wanted.values()}
        for line in text.splitlines():
            if line.startswith("#") or "{" not in line:
                continue
            name, rest = line.split("{", 1)
            mode = rest.split('mode="', 1)[1].split('"', 1)[0] if 'mode="' in rest else None
            key = wanted.get((name, mode))
            if key is not None:
                out[key] += float(line.rsplit(" ", 1)[1])
        return out

    def reset(self, path: str, version: str, deadline_s: float = 300.0) -> None:
        """Load `path` as `version` and flush the whole cache; the flush only succeeds on an idle engine, so retry
        until the requests of the previous run have drained (deadline, no fixed sleep)."""
        deadline = time.monotonic() + deadline_s
        while True:
            out = self.post("/update_weights_from_disk",
                            {"model_path": path, "flush_cache": True, "weight_version": version}).json()
            if out.get("success"):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"could not reset the server to {path}: {out}")
            time.sleep(0.2)

    def load(self, path: str, version: str, flush: bool) -> dict:
        out = self.post("/update_weights_from_disk",
                        {"model_path": path, "flush_cache": flush, "weight_version": version}).json()
        if not out.get("success"):
            raise RuntimeError(f"update_weights_from_disk({path}, {version}) failed: {out}")
        return out


# ---- publication schedule -----------------------------------------------------------------------------------------------
@dataclass
class Publication:
    index: int
    version: str
    trigger: str
    in_flight: int
    pause_s: float = 0.0      # pause sent -> continue returned
    update_s: float = 0.0
    flush_s: float = 0.0
    #: client wall-clock time between "pause returned" and "continue sent": the scheduler starts no forward in
    #: between, so a forward that started before it ran under the old weights and one after it under the new
    boundary: float = 0.0


class Schedule:
    """Gate + publisher. A publication is due every K completions (never after the last one) or every T seconds.

    Invariant: a request submitted after a publication became due is submitted after its `continue_generation`
    returned, so every mode sees the same split of requests into 'in flight across publication p' and 'admitted
    after it' up to the requests already in flight.
    """

    def __init__(self, server: Server, mode: Mode, weights: Sequence[str], total: int, every_k: int,
                 every_s: float, version_prefix: str):
        self.server, self.mode, self.weights = server, mode, list(weights)
        self.total, self.every_k, self.every_s = total, every_k, every_s
        self.version_prefix = version_prefix
        self.cv = threading.Condition()
        self.completed = 0
        self.in_flight = 0
        self.due: Optional[str] = None
        #: K-boundaries reached while a publication was already due or running: each still owes one publication
        self.overdue: List[str] = []
        self.finished = False
        self.error: Optional[BaseException] = None
        self.publications: List[Publication] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def version(self, index: int) -> str:
        return f"{self.version_prefix}-v{index}"

    def start(self):
        self._last = time.monotonic()
        self._thread.start()
        return self

    # called by rollout workers
    def before_submit(self) -> None:
        with self.cv:
            while self.due is not None and self.error is None:
                self.cv.wait()
            if self.error is not None:
                raise RuntimeError("publication failed") from self.error
            self.in_flight += 1

    def after_complete(self) -> None:
        with self.cv:
            self.in_flight -= 1
            self.completed += 1
            if self.every_k and self.completed % self.every_k == 0 and self.completed < self.total:
                reason = f"{self.completed} completed"
                if self.due is None:
                    self.due = reason
                else:
                    self.overdue.append(reason)
            self.cv.notify_all()

    def stop(self) -> None:
        with self.cv:
            self.finished = True
            self.cv.notify_all()
        self._thread.join(timeout=600)
        if self.error is not None:
            raise RuntimeError("publication failed") from self.error

    # the publisher thread
    def _run(self) -> None:
        while True:
            with self.cv:
                while self.due is None and not self.finished:
                    timeout = None
                    if self.every_s:
                        timeout = max(0.0, self._last + self.every_s - time.monotonic())
                        if timeout == 0.0:
                            self.due = f"{self.every_s}s elapsed"
                            break
                    self.cv.wait(timeout)
                if self.due is None:
                    return
                pub = Publication(len(self.publications) + 1, self.version(len(self.publications) + 1),
                                  self.due, self.in_flight)
            try:
                self._publish(pub)
            except BaseException as e:  # surfaced to the workers and to stop()
                with self.cv:
                    self.error = e
                    self.cv.notify_all()
                return
            with self.cv:
                self.publications.append(pub)
                self.due = self.overdue.pop(0) if self.overdue else None
                self._last = time.monotonic()
                self.cv.notify_all()

    def _publish(self, pub: Publication) -> None:
        s, path = self.server, self.weights[pub.index % len(self.weights)]
        t0 = time.perf_counter()
        r = s.post("/pause_generation", {"mode": self.mode.pause_mode})
        if r.status_code != 200:
            raise RuntimeError(f"pause_generation failed: {r.status_code} {r.text[:200]}")
        t1 = time.perf_counter()
        s.load(path, pub.version, flush=False)
        t2 = time.perf_counter()
        if self.mode.flush:
            r = s.post("/flush_cache")
            if r.status_code != 200:
                raise RuntimeError(f"flush_cache refused after a {self.mode.pause_mode} pause: {r.text[:200]}")
        t3 = time.perf_counter()
        pub.boundary = time.time() - (t3 - t1) / 2
        r = s.post("/continue_generation")
        if r.status_code != 200:
            raise RuntimeError(f"continue_generation failed: {r.status_code} {r.text[:200]}")
        t4 = time.perf_counter()
        pub.update_s, pub.flush_s, pub.pause_s = t2 - t1, t3 - t2, t4 - t0


# ---- rollout --------------------------------------------------------------------------------------------------------------
@dataclass
class Record:
    """One /generate call: what was sent and the server's meta_info."""

    task: str
    turn: int
    input_ids: List[int]
    output_ids: List[int]
    meta: dict
    sent: float = 0.0        # client wall clock
    received: float = 0.0


def run_task(server: Server, schedule: Schedule, task: Task) -> List[Record]:
    history, records = list(task.prefix), []
    for t, turn in enumerate(task.turns):
        schedule.before_submit()
        sent = time.time()
        try:
            out = server.generate(history, turn.max_new_tokens)
        finally:
            schedule.after_complete()
        records.append(Record(task.name, t, list(history), out["output_ids"], out["meta_info"], sent, time.time()))
        history = history + out["output_ids"] + turn.tool_result
    return records


def run_rollout(server: Server, mode: Mode, tasks: List[Task], a, weights: Sequence[str], label: str) -> dict:
    """Reset the server to weights[0] (idle, flushed), run the traffic with publications, return raw results."""
    server.reset(weights[0], f"{label}-v0")
    total = sum(len(t.turns) for t in tasks)
    schedule = Schedule(server, mode, weights, total, a.publish_every_requests, a.publish_every_seconds, label)
    before = server.prefill_counters()
    t0 = time.perf_counter()
    schedule.start()
    workers = a.concurrency if tasks and len(tasks[0].turns) == 1 else min(a.concurrency, len(tasks))
    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(lambda t: run_task(server, schedule, t), tasks))
    finally:
        schedule.stop()
    wall = time.perf_counter() - t0
    after = server.prefill_counters()
    return {"records": [r for rs in results for r in rs], "publications": schedule.publications, "wall_s": wall,
            "first_version": schedule.version(0),
            "counters": {k: after[k] - before[k] for k in after},
            "vradix": server.vradix_block() if mode.vradix else None}


# ---- stale-reuse accounting --------------------------------------------------------------------------------------------
MIXED = "<mixed>"


class _Node:
    __slots__ = ("children", "copies")

    def __init__(self):
        self.children: Dict[int, "_Node"] = {}
        self.copies: List[tuple] = []   # (available_at, version tag)


class ShadowCache:
    """Counts stale tokens reused, from the responses alone (no engine internals), as a lower bound.

    Every KV position a request computed is a *copy*, tagged with the weight version it was computed under, or MIXED
    when it was computed over context that was itself stale or crossed a publication. A copy is available from the
    earliest server time it could enter the radix tree: for prompt positions the start of the request's first
    forward (forward_entry_time; chunked prefill checkpoints each chunk, so a prefix can be matched before the
    request's prefill finished), for output positions request_finished_ts (inserted at release).

    A request q whose first forward started at server time t under version v (the version in effect at t, from the
    publication log: the scheduler starts no forward between the pause and the continue, so the midpoint of that
    window separates old from new), and which was served `cached_tokens = c`, reused stale KV at position i < c
    unless some copy of q's prefix [0..i] tagged v was available by t. The count
    never blames a mode for a copy it might legitimately have had, whatever the engine's tree policy (LRU, flush,
    namespace): it is a lower bound on stale reuse, exact when the only matchable copies are stale ones (which is the
    unsafe mode's steady state: a prefix cached once is never recomputed).

    A retracted request keeps the copy of its first prefill and adds one clean copy of its whole sequence per version
    it later generated under (it was re-prefilled under each; benefit of the doubt, which keeps the bound a lower
    bound).
    """

    def __init__(self):
        self.root = _Node()

    def _path(self, ids: Sequence[int], n: int):
        node = self.root
        for tok in ids[:n]:
            node = node.children.setdefault(tok, _Node())
            yield node

    def stale_positions(self, ids: Sequence[int], cached: int, version: str, at: float) -> int:
        return sum(not any(tag == version and avail <= at for avail, tag in node.copies)
                   for node in self._path(ids, cached))

    def add(self, ids: Sequence[int], start: int, tags: Sequence[str], at: float) -> None:
        for i, node in enumerate(self._path(ids, start + len(tags))):
            if i >= start:
                node.copies.append((at, tags[i - start]))


def _output_tags(spans: List[dict], n_out: int, clean: bool) -> List[str]:
    """KV tag of output positions 0..n_out-2: output token j's KV is computed by the forward that samples token j+1;
    positions after the first version change are MIXED (new weights over old context)."""
    version_of = {}
    for sp in spans:
        for j in range(sp["start"], sp["end"]):
            version_of[j] = sp["version"]
    first = version_of.get(0)
    tags = []
    for j in range(n_out - 1):
        v = version_of.get(j + 1, first)
        clean = clean and v == first
        tags.append(v if clean else MIXED)
    return tags


def server_clock_offset(records: List[Record]) -> float:
    """Server wall clock minus client wall clock, bracketed by each call's send/receive times (0 on one host)."""
    hi = min(r.meta["request_received_ts"] - r.sent for r in records)
    lo = max(r.meta.get("response_sent_to_client_ts", r.received) - r.received for r in records)
    return (hi + lo) / 2 if lo <= hi else hi


def version_at(boundaries: List[float], versions: List[str], t: float) -> str:
    """The weight version in effect at server time `t` (boundaries on the server clock, ascending)."""
    return versions[bisect.bisect_right(boundaries, t)]


def stale_reuse(records: List[Record], publications: Sequence["Publication"] = (), first_version: str = "") -> dict:
    """Stale tokens reused per request (see ShadowCache), in server prefill order.

    A request's version is the one in effect when its first forward started (that is when it matched the cache), from
    the publication boundaries; without a publication log it falls back to the version of its first output token.
    """
    cache = ShadowCache()
    ordered = sorted(records, key=lambda r: r.meta.get("forward_entry_time", 0.0))
    offset = server_clock_offset(records) if records and publications else 0.0
    boundaries = [p.boundary + offset for p in publications]
    versions = [first_version] + [p.version for p in publications]
    total = requests_with_stale = 0
    for r in ordered:
        m = r.meta
        spans = m.get("weight_versions") or [{"version": m["weight_version"], "start": 0,
                                              "end": len(r.output_ids)}]
        at = m["forward_entry_time"]
        version = version_at(boundaries, versions, at) if publications else spans[0]["version"]
        cached = m["cached_tokens"]
        stale = cache.stale_positions(r.input_ids, cached, version, at)
        total += stale
        requests_with_stale += stale > 0
        clean = stale == 0
        cache.add(r.input_ids, cached, [version if clean else MIXED] * (len(r.input_ids) - cached), at)
        if m.get("num_retractions", 0):
            # re-prefilled after each retraction under the version then in effect: one clean copy per version
            seq = r.input_ids + r.output_ids[:-1]
            for v in dict.fromkeys(sp["version"] for sp in spans):
                cache.add(seq, 0, [v] * len(seq), at)
            continue
        tags = _output_tags(spans, len(r.output_ids), clean and spans[0]["version"] == version)
        cache.add(r.input_ids + r.output_ids, len(r.input_ids), tags, m.get("request_finished_ts", at))
    return {"stale_tokens_reused": total, "requests_with_stale_reuse": requests_with_stale}


# ---- summary -------------------------------------------------------------------------------------------------------------
def percentile(xs: List[float], q: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


def dump_raw(path: str, workload: str, mode: Mode, raw: dict) -> None:
    """Append one run's requests and publication log (JSON lines) so the accounting can be rerun: --reanalyze."""
    with open(path, "a") as f:
        f.write(json.dumps({"workload": workload, "mode": mode.name, "first_version": raw["first_version"],
                            "publications": [asdict(p) for p in raw["publications"]],
                            "records": [asdict(r) for r in raw["records"]]}) + "\n")


def reanalyze(raw_path: str, json_path: str, png_path: Optional[str]) -> None:
    """Recompute the stale-reuse columns of a finished run from its --raw file (no server needed): print them, and
    when `json_path` holds that run's report, update its rows and targets and redraw the PNG."""
    stale = {}
    with open(raw_path) as f:
        for line in f:
            run = json.loads(line)
            pubs = [Publication(**p) for p in run["publications"]]
            stale[(run["workload"], run["mode"])] = stale_reuse([Record(**r) for r in run["records"]], pubs,
                                                                run["first_version"])
    for (w, m), out in stale.items():
        print(f"{w:6} {m:16} {out}")
    if not json_path or not os.path.exists(json_path):
        return
    with open(json_path) as f:
        report = json.load(f)
    for row in report["rows"]:
        row.update(stale.get((row["workload"], row["mode"]), {}))
    report["targets"] = check_targets(report["rows"], report["config"]["samples"])
    report["reanalyzed"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    with open(json_path, "w") as f:
        json.dump(report, f, indent=1)
    print_report(report["rows"], report["targets"])
    if png_path:
        why = write_png(report["rows"], png_path)
        print(f"PNG: {png_path}" if why is None else f"PNG: skipped ({why})")


def summarize(workload: str, mode: Mode, raw: dict) -> dict:
    recs: List[Record] = raw["records"]
    prompt = sum(r.meta["prompt_tokens"] for r in recs)
    cached = sum(r.meta["cached_tokens"] for r in recs)
    out_tokens = sum(r.meta["completion_tokens"] for r in recs)
    c = raw["counters"]
    reprefilled = int(round(c["computed"] - c["computed_first_attempt"]))
    pauses = [p.pause_s for p in raw["publications"]]
    pubs = len(raw["publications"])
    row = {
        "workload": workload, "mode": mode.name,
        "requests": len(recs),
        "prompt_tokens": prompt,
        "prefill_computed": int(round(c["computed"])),
        "prefill_computed_client": prompt - cached + reprefilled,
        "cache_hit_rate": round(cached / prompt, 4) if prompt else 0.0,
        "reprefilled_tokens": reprefilled,
        "publications": pubs,
        "reprefilled_per_publication": round(reprefilled / pubs, 1) if pubs else 0.0,
        "in_flight_per_publication": round(statistics.mean(p.in_flight for p in raw["publications"]), 1)
        if pubs else 0.0,
        "retractions": sum(r.meta.get("num_retractions", 0) for r in recs),
        **stale_reuse(recs, raw["publications"], raw["first_version"]),
        "wall_s": round(raw["wall_s"], 2),
        "pause_mean_ms": round(statistics.mean(pauses) * 1e3, 1) if pauses else 0.0,
        "pause_p99_ms": round(percentile(pauses, 0.99) * 1e3, 1),
        "req_per_s": round(len(recs) / raw["wall_s"], 2),
        "output_tok_per_s": round(out_tokens / raw["wall_s"], 1),
        "publication_log": [asdict(p) for p in raw["publications"]],
    }
    if raw.get("vradix"):
        v = raw["vradix"]
        row["vradix_server"] = {k: v.get(k) for k in ("epoch", "publications", "stale_tokens_freed_total",
                                                     "stale_tokens_freed_at_release", "crossing_requests",
                                                     "stale_tokens_pinned")}
    return row


COLUMNS = [("workload", "workload"), ("mode", "mode"), ("requests", "requests"),
           ("prefill_computed", "prompt tokens computed"), ("cache_hit_rate", "cache hit rate"),
           ("reprefilled_tokens", "re-prefilled (retraction)"), ("reprefilled_per_publication", "re-prefilled/pub"),
           ("stale_tokens_reused", "stale tokens reused"), ("requests_with_stale_reuse", "reqs w/ stale"),
           ("publications", "pubs"), ("in_flight_per_publication", "in flight/pub"),
           ("pause_mean_ms", "pause mean ms"), ("pause_p99_ms", "pause p99 ms"), ("wall_s", "wall s"),
           ("req_per_s", "req/s"), ("output_tok_per_s", "out tok/s")]


def table(rows: List[dict]) -> str:
    lines = ["| " + " | ".join(h for _, h in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        lines.append("| " + " | ".join(str(r[k]) for k, _ in COLUMNS) + " |")
    return "\n".join(lines)


def check_targets(rows: List[dict], samples: int) -> List[dict]:
    """The issue's targets, per workload, with the measured numbers."""
    out = []
    for w in sorted({r["workload"] for r in rows}):
        by = {r["mode"]: r for r in rows if r["workload"] == w}
        v = by.get("in_place+vradix")
        if v is None:
            continue
        if "in_place" in by:
            ratio = v["prefill_computed"] / max(1, by["in_place"]["prefill_computed"])
            out.append({"workload": w, "target": "vradix prompt-token work <= 1.05x in_place (unsafe)",
                        "measured": f"{ratio:.3f}x", "met": ratio <= 1.05})
        if "radix-off" in by and w == "grpo":
            ratio = by["radix-off"]["prefill_computed"] / max(1, v["prefill_computed"])
            out.append({"workload": w, "target": f">= 3x less prompt-token work than radix-off (GRPO n={samples})",
                        "measured": f"{ratio:.2f}x less", "met": ratio >= 3})
        out.append({"workload": w, "target": "zero re-prefilled in-flight tokens per publication (vradix)",
                    "measured": str(v["reprefilled_per_publication"]), "met": v["reprefilled_tokens"] == 0})
        out.append({"workload": w, "target": "zero stale reuse (vradix)",
                    "measured": str(v["stale_tokens_reused"]), "met": v["stale_tokens_reused"] == 0})
    return out


def print_report(rows: List[dict], targets: List[dict]) -> None:
    print(table(rows))
    if targets:
        print()
        for t in targets:
            print(f"- [{'met' if t['met'] else 'MISSED'}] {t['workload']}: {t['target']}: {t['measured']}")


def write_png(rows: List[dict], path: str) -> Optional[str]:
    """Prefill work and stale reuse per mode, one bar group per workload. Returns why not, if it cannot."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib); PNG skipped"
    workloads = sorted({r["workload"] for r in rows}, key=WORKLOADS.index)
    modes = [m for m in MODE_NAMES if any(r["mode"] == m for r in rows)]
    colors = {"radix-off": "#999999", "retract+flush": "#e69f00", "in_place": "#d55e00",
              "in_place+vradix": "#0072b2"}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / max(1, len(modes))
    for ax, key, title in ((axes[0], "prefill_computed", "prompt tokens computed (prefill work)"),
                           (axes[1], "stale_tokens_reused", "stale tokens reused")):
        for i, m in enumerate(modes):
            xs, ys = [], []
            for j, w in enumerate(workloads):
                r = next((r for r in rows if r["workload"] == w and r["mode"] == m), None)
                if r is not None:
                    xs.append(j + (i - (len(modes) - 1) / 2) * width)
                    ys.append(r[key])
            bars = ax.bar(xs, ys, width, label=m, color=colors[m])
            ax.bar_label(bars, fontsize=7)
        ax.set_xticks(range(len(workloads)), workloads)
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    return None


# ---- orchestration --------------------------------------------------------------------------------------------------------
def local_runs(a, modes: List[Mode]) -> List[dict]:
    """Start CPU servers on tiny models, one per server group, and run every (mode, workload) on it."""
    from vradix.testing.server import CpuServer
    from vradix.testing.tiny_model import generate

    workdir = a.workdir or tempfile.mkdtemp(prefix="vradix-rl-")
    weights = [generate(os.path.join(workdir, f"ckpt{i}"), seed=100 + i, dtype="float32", init_range=0.2)
               for i in range(a.checkpoints)]
    rows = []
    groups: Dict[str, List[Mode]] = {}
    for m in modes:
        groups.setdefault(m.server_group(), []).append(m)
    for group, members in groups.items():
        flags = ["--enable-metrics", *a.server_args.split()]
        if group == "radix-off":
            flags.append("--disable-radix-cache")
        log(f"starting CPU server ({group}) ...")
        with CpuServer(weights[0], vradix=group == "vradix", extra_args=flags,
                       max_total_tokens=a.max_total_tokens) as cpu:
            server = Server(cpu.url, a.request_timeout)
            for m in members:
                m.check_server(server.server_info())
                rows += run_mode(server, m, a, weights)
            if "Traceback" in cpu.logs():
                raise RuntimeError(f"server ({group}) logged a traceback:\n{cpu.tail(80)}")
    return rows


def run_mode(server: Server, mode: Mode, a, weights: Sequence[str]) -> List[dict]:
    rows = []
    for w in a.workload:
        tasks = build_tasks(w, a)
        log(f"{w} / {mode.name}: {sum(len(t.turns) for t in tasks)} requests ...")
        raw = run_rollout(server, mode, tasks, a, weights, label=f"{w}-{mode.name}")
        if a.raw:
            dump_raw(a.raw, w, mode, raw)
        row = summarize(w, mode, raw)
        log(f"{w} / {mode.name}: done in {row['wall_s']}s, {row['publications']} publications, "
            f"prefill {row['prefill_computed']}, stale {row['stale_tokens_reused']}")
        rows.append(row)
    return rows


def log(msg: str) -> None:
    print(f"[rl-rollout {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _range(s: str):
    lo, _, hi = s.partition(",")
    lo, hi = int(lo), int(hi or lo)
    if not 0 < lo <= hi:
        raise argparse.ArgumentTypeError(f"expected LO,HI with 0 < LO <= HI, got {s!r}")
    return lo, hi


def _list(choices):
    def parse(s: str):
        items = [x.strip() for x in s.split(",") if x.strip()]
        bad = [x for x in items if x not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"unknown {bad or s!r}; choose from {', '.join(choices)}")
        return items
    return parse


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="drive an existing server (one --mode per server; see above)")
    p.add_argument("--mode", "--modes", dest="modes", type=_list(MODE_NAMES), default=list(MODE_NAMES))
    p.add_argument("--workload", type=_list(WORKLOADS), default=list(WORKLOADS))
    p.add_argument("--weights", help="comma-separated checkpoint dirs for publications (--url; default: the "
                                     "server's model_path)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab", type=int, default=512, help="token ids are drawn from [3, vocab)")
    g = p.add_argument_group("grpo")
    g.add_argument("--prompts", type=int, default=16)
    g.add_argument("--samples", type=int, default=8, help="n samples per prompt")
    g = p.add_argument_group("agent")
    g.add_argument("--sessions", type=int, default=16)
    g.add_argument("--turns", type=int, default=4)
    g.add_argument("--tool-tokens", type=_range, default=(16, 64))
    g = p.add_argument_group("shared shape")
    g.add_argument("--system-tokens", type=int, default=384)
    g.add_argument("--question-tokens", type=_range, default=(32, 64))
    g.add_argument("--response-tokens", type=_range, default=(8, 64))
    g.add_argument("--concurrency", type=int, default=32, help="requests in flight (grpo) / sessions (agent)")
    g = p.add_argument_group("publications")
    g.add_argument("--publish-every-requests", type=int, default=16)
    g.add_argument("--publish-every-seconds", type=float, default=0.0)
    g = p.add_argument_group("local CPU servers")
    g.add_argument("--checkpoints", type=int, default=2, help="seeded tiny checkpoints published in turn")
    g.add_argument("--max-total-tokens", type=int, default=65536)
    g.add_argument("--server-args", default="--schedule-policy lpm",
                   help="extra flags for every local server (lpm: see docs/benchmarks.md)")
    g.add_argument("--workdir")
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--json", default="rl_rollout.json")
    p.add_argument("--png", default="rl_rollout.png")
    p.add_argument("--raw", help="append every request's ids and meta_info to this JSON-lines file")
    p.add_argument("--reanalyze", metavar="RAW", help="recompute stale reuse from a --raw file (updates --json's "
                                                      "rows and --png if --json holds that run) and exit")
    a = p.parse_args(argv)
    if a.url and len(a.modes) != 1:
        p.error("--url drives one existing server: pass exactly one --mode (see the docstring for its flags)")
    if a.publish_every_requests <= 0 and a.publish_every_seconds <= 0:
        p.error("no publication schedule: set --publish-every-requests and/or --publish-every-seconds")
    if a.checkpoints < 1 or a.concurrency < 1 or a.prompts < 1 or a.samples < 1 or a.sessions < 1 or a.turns < 1:
        p.error("counts must be >= 1")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.reanalyze:
        reanalyze(a.reanalyze, a.json, a.png)
        return 0
    modes = [MODES[m] for m in a.modes]
    t0 = time.time()
    if a.url:
        server = Server(a.url, a.request_timeout)
        info = server.server_info()
        modes[0].check_server(info)
        weights = a.weights.split(",") if a.weights else [info["model_path"]]
        rows = run_mode(server, modes[0], a, weights)
    else:
        rows = local_runs(a, modes)
    targets = check_targets(rows, a.samples)
    print_report(rows, targets)
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join([os.path.basename(sys.argv[0])] + (argv if argv is not None else sys.argv[1:])),
              "host": {"platform": platform.platform(), "cpus": os.cpu_count(), "url": a.url},
              "config": {k: v for k, v in vars(a).items()}, "wall_s": round(time.time() - t0, 1),
              "rows": rows, "targets": targets}
    with open(a.json, "w") as f:
        json.dump(report, f, indent=1)
    print(f"\nJSON: {a.json}")
    why = write_png(rows, a.png) if a.png else "no --png"
    print(f"PNG: {a.png}" if why is None else f"PNG: skipped ({why})")
    print(f"total {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
