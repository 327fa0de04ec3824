"""Publication soak: many publications on a real CPU server under a concurrent request load with shared prefixes.

    python benchmark/server/soak_publications.py --publications 1000 [--concurrency 4] [--requests-between 4]

Two tiny float32 models A and B (peaky logits) are generated; the vradix server starts on A and every publication
alternates the weights (`pause_generation(in_place)` -> `update_weights_from_disk` without flush -> `continue`; every
`--unpaused-every`-th publication is an update without a pause, which SGLang serializes against in-flight requests).
Load workers send greedy requests drawn from a pool of prompts that share a few prefixes; the next publication starts
once `--requests-between` requests sent after the previous one have completed. Each response carries the
label (`weight_version`) it was served under. A response whose request did not overlap any pause interval must
equal the greedy output of a fresh server on the weights its label names (the oracle, computed up front for the whole
prompt pool on fresh stock servers); a mismatch is a stale hit. Every `--leak-check-every` publications the load is
paused, and SGLang's strict idle memory check is read from the scheduler (`vradix.testing.harness.reliability`).
The server runs with SGLang's busy-time memory and KV page checks on, so a leak or use-after-free stops it.
With `--hicache` the server also has HiCache L2 (host pool, twice the device pool) and L3 (SGLang's `file` backend in
the workdir), and a device pool of `--device-tokens` (default 256), smaller than the shared prefixes, so that between
publications prefixes are demoted to host and loaded back, and read from storage once the host pool overflows (more
`--requests-between` publications make that likelier). The summary then adds the share of responses with a host hit
and with a storage hit.

Prints: publications, requests, responses checked against the oracle, stale hits (must be 0), leak checks, and the
p50/p99 of the publication latency (client-side update call, and vradix's server-side bump).
"""
from __future__ import annotations

import argparse
import bisect
import concurrent.futures as cf
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from vradix.testing.harness.hicache_store import hicache_server, tiers
from vradix.testing.harness.reliability import STRICT_CHECK_ENV, oracle_output_sets, strict_idle_check
from vradix.testing.harness.server import CpuServer
from vradix.testing.models.llama import generate


#: the soak's two weight sets, as `generate(path, **MODELS[name])` (peaky float32 logits); shared with tie_check.py
MODELS = {"A": dict(seed=1, dtype="float32", init_range=0.2), "B": dict(seed=2, dtype="float32", init_range=0.2)}


def prompt_pool(n_suffixes: int) -> List[List[int]]:
    """Prompts that share prefixes: 4 prefixes of 96 tokens (two of them share their first 48), then 2 tokens."""
    base = [[(i * 7 + k * 101) % 450 + 20 for i in range(96)] for k in range(4)]
    base[1] = base[0][:48] + base[1][48:]
    return [p + [(j * 7) % 400 + 50, (j * 13) % 400 + 60] for p in base for j in range(n_suffixes)]


@dataclass
class Response:
    prompt: int
    t0: float
    t1: float
    label: str
    output: list
    cached: int
    #: cached tokens from (device, host, storage); all from device without HiCache
    tiers: Tuple[int, int, int] = (0, 0, 0)


@dataclass
class Soak:
    server: CpuServer
    prompts: List[List[int]]
    max_new_tokens: int
    responses: List[Response] = field(default_factory=list)
    #: (start, end) of each publication's pause interval: from just before its pause (an unpaused publication: its
    #: update call) to just after its continue
    pauses: List[Tuple[float, float]] = field(default_factory=list)
    errors: List[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    hold: threading.Event = field(default_factory=threading.Event)  # set: workers idle (leak check)
    inflight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def worker(self, seed: int) -> None:
        rng = random.Random(seed)
        while not self.stop.is_set():
            if self.hold.is_set():
                time.sleep(0.01)
                continue
            with self.lock:
                self.inflight += 1
            try:
                i = rng.randrange(len(self.prompts))
                t0 = time.monotonic()
                r = self.server.generate(self.prompts[i], self.max_new_tokens, timeout=300)
                t1 = time.monotonic()
                meta = r["meta_info"]
                t = tiers(r)
                with self.lock:
                    self.responses.append(Response(i, t0, t1, meta["weight_version"], r["output_ids"],
                                                   meta["cached_tokens"], (t["device"], t["host"], t["storage"])))
            except Exception as e:  # recorded and reported; the soak fails on any error
                self.errors.append(repr(e))
            finally:
                with self.lock:
                    self.inflight -= 1

    def completed_since(self, t: float, first: int) -> int:
        """Responses to requests sent after time t; they complete after t, so they sit at index >= `first`, the
        number of responses at time t."""
        with self.lock:
            return sum(r.t0 > t for r in self.responses[first:])

    def quiesce(self, timeout: float = 300.0) -> None:
        self.hold.set()
        deadline = time.monotonic() + timeout
        while self.inflight:
            if time.monotonic() > deadline:
                raise TimeoutError("the load's requests did not finish")
            time.sleep(0.01)


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))] if xs else float("nan")


def crossed(resp: Response, starts: List[float], ends: List[float]) -> bool:
    """Whether [t0, t1] overlaps a publication's pause interval (the intervals are sorted and disjoint)."""
    i = bisect.bisect_right(starts, resp.t1) - 1
    return i >= 0 and ends[i] >= resp.t0


def parser() -> argparse.ArgumentParser:
    """The soak's command line (its defaults are shared with tie_check.py)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--publications", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--suffixes", type=int, default=40, help="prompts per shared prefix")
    p.add_argument("--max-new-tokens", type=int, default=6)
    p.add_argument("--leak-check-every", type=int, default=50)
    p.add_argument("--unpaused-every", type=int, default=10)
    p.add_argument("--requests-between", type=int, default=4,
                   help="publish again once this many requests sent after the last publication have completed")
    p.add_argument("--workdir", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hicache", action="store_true", help="HiCache L2 + L3 (file store in the workdir)")
    p.add_argument("--device-tokens", type=int, default=256, help="device KV pool with --hicache")
    return p


def soak_server(models: dict, workdir: str, a: argparse.Namespace) -> CpuServer:
    """The vradix server under test, on A, with SGLang's strict checks on."""
    if not a.hicache:
        return CpuServer(models["A"], env=STRICT_CHECK_ENV)
    store = os.path.join(workdir, "l3")
    os.makedirs(store, exist_ok=True)
    # SGLang looks a request up in L3 only when at least `prefetch_threshold` tokens (default 256) are not on device or
    # host; the soak's prompts differ by 2 tokens
    l3_lookups = ["--hicache-storage-backend-extra-config", json.dumps({"prefetch_threshold": 1})]
    return hicache_server(models["A"], store, env=STRICT_CHECK_ENV, max_total_tokens=a.device_tokens,
                          extra_args=l3_lookups)


def main(argv: Optional[List[str]] = None) -> dict:
    a = parser().parse_args(argv)

    workdir = a.workdir or tempfile.mkdtemp(prefix="vradix-soak-")
    models = {w: generate(os.path.join(workdir, w), **kw) for w, kw in MODELS.items()}
    prompts = prompt_pool(a.suffixes)
    t_oracle = time.monotonic()
    with cf.ThreadPoolExecutor(2) as pool:
        futs = {w: pool.submit(oracle_output_sets, path, prompts, a.max_new_tokens) for w, path in models.items()}
        oracle = {w: f.result() for w, f in futs.items()}
    tie_prone = sum(len(o) > 1 for outs in oracle.values() for o in outs)
    t_oracle = time.monotonic() - t_oracle

    update_ms, bump_ms, leak_checks = [], [], 0
    t_start = time.monotonic()
    with soak_server(models, workdir, a) as server:
        soak = Soak(server, prompts, a.max_new_tokens)
        workers = [threading.Thread(target=soak.worker, args=(a.seed * 1000 + k,), daemon=True)
                   for k in range(a.concurrency)]
        for w in workers:
            w.start()
        weights = "A"
        try:
            last_end, first = time.monotonic(), 0
            for n in range(1, a.publications + 1):
                deadline = time.monotonic() + 300
                while soak.completed_since(last_end, first) < a.requests_between and not soak.errors:
                    if time.monotonic() > deadline:
                        raise TimeoutError("the load made no progress for 300 s")
                    time.sleep(0.01)
                weights = "B" if weights == "A" else "A"
                paused = n % a.unpaused_every != 0
                p0 = time.monotonic()
                if paused:
                    server.pause("in_place")
                u0 = time.monotonic()
                server.update_weights(models[weights], f"{weights}{n}", timeout=300)
                update_ms.append((time.monotonic() - u0) * 1e3)
                if paused:
                    server.resume()
                with soak.lock:
                    last_end, first = time.monotonic(), len(soak.responses)
                soak.pauses.append((p0, last_end))
                bump_ms.append(server.vradix_info()["last_publication_latency_ms"])
                if n % a.leak_check_every == 0 or n == a.publications:
                    soak.quiesce()
                    strict_idle_check(server)
                    leak_checks += 1
                    soak.hold.clear()
                    print(f"[soak] {n} publications, {len(soak.responses)} responses, {leak_checks} leak checks passed, "
                          f"{time.monotonic() - t_start:.0f} s", file=sys.stderr, flush=True)
                if soak.errors:
                    break
        finally:
            soak.stop.set()
            for w in workers:
                w.join(timeout=300)
        info = server.vradix_info()
        if "Traceback" in server.logs():
            soak.errors.append("Traceback in server log:\n" + server.tail(60))
    elapsed = time.monotonic() - t_start

    checked = stale = crossing = 0
    stale_examples = []
    starts, ends = [p[0] for p in soak.pauses], [p[1] for p in soak.pauses]
    for resp in soak.responses:
        if crossed(resp, starts, ends):
            crossing += 1
            continue
        weights_of_label = "A" if resp.label in ("default",) or resp.label.startswith("A") else "B"
        checked += 1
        if tuple(resp.output) not in oracle[weights_of_label][resp.prompt]:
            stale += 1
            stale_examples.append((resp.prompt, resp.label, resp.cached, resp.output))
    cached_share = statistics.mean(r.cached > 0 for r in soak.responses) if soak.responses else 0.0
    summary = {
        "publications": len(soak.pauses), "requests": len(soak.responses), "checked_vs_oracle": checked,
        "crossing_not_checked": crossing, "stale_hits": stale, "tie_prone_prompts": tie_prone, "leak_checks_passed": leak_checks,
        "errors": len(soak.errors), "prefix_hit_share": round(cached_share, 3),
        "update_call_ms_p50": round(percentile(update_ms, 50), 1), "update_call_ms_p99": round(percentile(update_ms, 99), 1),
        "vradix_bump_ms_p50": round(percentile(bump_ms, 50), 3), "vradix_bump_ms_p99": round(percentile(bump_ms, 99), 3),
        "server_epoch": info["epoch"], "server_publications": info["publications"],
        "stale_tokens_freed_total": info["stale_tokens_freed_total"],
        "soak_s": round(elapsed, 1), "oracle_s": round(t_oracle, 1),
    }
    if a.hicache:
        for k, tier in ((1, "host"), (2, "storage")):
            summary[f"{tier}_hit_share"] = round(statistics.mean(r.tiers[k] > 0 for r in soak.responses), 3) \
                if soak.responses else 0.0
    print("| " + " | ".join(summary) + " |")
    print("|" + "---|" * len(summary))
    print("| " + " | ".join(str(v) for v in summary.values()) + " |")
    for e in soak.errors[:5]:
        print("error:", e, file=sys.stderr)
    for ex in stale_examples[:5]:
        print("stale hit (prompt, label, cached, output):", ex, file=sys.stderr)
    summary["error_list"] = soak.errors
    return summary


if __name__ == "__main__":
    s = main()
    sys.exit(0 if s["stale_hits"] == 0 and not s["errors"] and s["leak_checks_passed"] > 0 else 1)
