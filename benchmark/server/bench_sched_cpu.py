"""The scheduler process's CPU time per request on real SGLang CPU servers: vradix (defaults) against stock SGLang
(`VRADIX_DISABLE=1`), same seeded greedy traffic, no publications.

    python benchmark/server/bench_sched_cpu.py [--workloads grpo,decode] [--rounds 3] [--requests 32] [--json PATH]

The scheduler runs the radix cache, the batch scheduling and the forward, one step after another: its CPU time is what
a GPU deployment pays on its critical path, and reading it from the process (`psutil` `cpu_times`, user + system, all
threads) is far steadier on a shared machine than a wall-clock rate. One stock and one vradix server run side by side
on a tiny float32 Llama (same weights), both with `--sleep-on-idle`, so an idle scheduler does not busy-poll, and with
`--threads` OpenMP threads that wait passively (`server_env`); each workload reads the scheduler's CPU time right
before its first request and right after its last response, so the time between workloads is not counted. Each round
sends the same seeded traffic to both servers, one after the other, the order alternating by round; round r uses seed
r for both, so both caches see the same history. Workloads:

- `grpo` (prefill-heavy): groups of `--group-size` samples of one `--prefix`-token prompt plus a distinct
  `--suffix`, `--grpo-new-tokens` new tokens each, all sent at once;
- `decode` (decode-heavy): `--decode-prompt`-token prompts, `--decode-new-tokens` new tokens each, all sent at once.

The table shows CPU milliseconds per request, the median over rounds, and every round's pair; the greedy output ids
of the two servers must be identical (checked, mismatches counted).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import random
import statistics
import sys
import tempfile
import time

from vradix.testing.harness.bench_cli import choice_list
from vradix.testing.harness.process import cpu_seconds, scheduler_processes
from vradix.testing.harness.server import CpuServer, start_servers
from vradix.testing.models.llama import generate

VOCAB_LO, VOCAB_HI = 17, 480
MODES = ("stock", "vradix")
WORKLOADS = ("grpo", "decode")


def grpo_prompts(rng: random.Random, requests: int, group_size: int, prefix: int, suffix: int) -> list[list[int]]:
    """`requests` prompts in groups of `group_size` sharing a `prefix`-token head, each with its own suffix."""
    prompts = []
    while len(prompts) < requests:
        shared = [rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(prefix)]
        prompts += [shared + [rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(suffix)] for _ in range(group_size)]
    return prompts[:requests]


def workload(name: str, seed: int, a) -> tuple[list[list[int]], int]:
    """(prompts, new tokens per request) of workload `name` for round `seed`."""
    rng = random.Random(f"{name}-{seed}")
    if name == "grpo":
        return grpo_prompts(rng, a.requests, a.group_size, a.prefix, a.suffix), a.grpo_new_tokens
    return [[rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(a.decode_prompt)] for _ in range(a.requests)], \
        a.decode_new_tokens


def ms_per_request(cpu_before: float, cpu_after: float, requests: int) -> float:
    """CPU milliseconds per request from two CPU-second readings around `requests` requests."""
    if requests <= 0 or cpu_after < cpu_before:
        raise ValueError(f"bad reading: {cpu_before} -> {cpu_after} s over {requests} requests")
    return (cpu_after - cpu_before) * 1000.0 / requests


def overhead_pct(stock: float, vradix: float) -> float:
    """How much more CPU per request vradix used than stock, in percent of stock's."""
    return (vradix - stock) / stock * 100.0


def scheduler_of(server: CpuServer):
    """The server's one scheduler process (a tp-size 1 server has exactly one)."""
    import psutil

    found = scheduler_processes(psutil.Process(server.proc.pid))
    if len(found) != 1:
        raise RuntimeError(f"expected one scheduler process under {server.proc.pid}, found {len(found)}")
    return found[0]


def measure(server: CpuServer, scheduler, prompts, new_tokens: int) -> tuple[float, list, float]:
    """Send all `prompts` at once; (scheduler CPU ms per request, output ids in prompt order, wall seconds from the
    first request to the last response)."""
    with cf.ThreadPoolExecutor(len(prompts)) as pool:
        before, t0 = cpu_seconds(scheduler), time.monotonic()
        outs = list(pool.map(lambda p: server.generate(p, new_tokens, timeout=900)["output_ids"], prompts))
        after, wall = cpu_seconds(scheduler), time.monotonic() - t0
    return ms_per_request(before, after, len(prompts)), outs, wall


def mismatches(a: list, b: list) -> int:
    """How many requests' outputs differ."""
    return sum(x != y for x, y in zip(a, b, strict=True))


def server_env(threads: int) -> dict:
    """Each server's OpenMP settings: `threads` forward threads that sleep when idle. An OpenMP worker that
    spin-waits burns CPU time that grows with the machine's load (it spins longer while the other worker waits for
    a core), which is no work of the server's; passive waiting keeps the reading to the work done."""
    return {"OMP_NUM_THREADS": str(threads), "OMP_WAIT_POLICY": "PASSIVE"}


def bench(model: str, a, **server_kw) -> dict:
    """Run every round of every workload on one stock and one vradix server (`server_kw`: more `CpuServer`
    arguments, e.g. the GPU serving check's device); per-workload rows (output tokens per second of wall time
    included)."""
    env = {"stock": server_env(a.threads), "vradix": {**server_env(a.threads), **dict(a.vradix_env)}}
    kw = {"startup_timeout": 600.0, **server_kw}
    servers = dict(zip(MODES, start_servers(*(lambda m=m: CpuServer(model, vradix=(m == "vradix"), env=env[m], **kw)
                                               for m in MODES))))
    try:
        schedulers = {m: scheduler_of(s) for m, s in servers.items()}
        for s in servers.values():
            s.generate([VOCAB_LO] * 8, 2, timeout=300)  # warm-up, not counted
        rows = {w: {"workload": w, "rounds": [], "mismatches": 0, "requests": 0} for w in a.workloads}
        for r in range(a.rounds):
            order = MODES if r % 2 == 0 else MODES[::-1]
            for w in a.workloads:
                prompts, new_tokens = workload(w, r, a)
                ms, outs, wall = {}, {}, {}
                for m in order:
                    ms[m], outs[m], wall[m] = measure(servers[m], schedulers[m], prompts, new_tokens)
                rows[w]["rounds"].append({"first": order[0], "stock": ms["stock"], "vradix": ms["vradix"],
                                          "load1": os.getloadavg()[0],
                                          **{f"{m}_tokens_per_s": len(prompts) * new_tokens / wall[m] for m in MODES}})
                rows[w]["mismatches"] += mismatches(outs["stock"], outs["vradix"])
                rows[w]["requests"] += len(prompts)
                print(f"  {w} round {r}: " + ", ".join(f"{m} {ms[m]:.1f} ms/req" for m in order)
                      + f" (load {os.getloadavg()[0]:.2f})", flush=True)
    finally:
        for s in servers.values():
            s.stop()
    for row in rows.values():
        row["stock"] = statistics.median(x["stock"] for x in row["rounds"])
        row["vradix"] = statistics.median(x["vradix"] for x in row["rounds"])
        row["overhead"] = overhead_pct(row["stock"], row["vradix"])
        for m in MODES:
            row[f"{m}_tokens_per_s"] = statistics.median(x[f"{m}_tokens_per_s"] for x in row["rounds"])
    return rows


def env_setting(text: str) -> tuple[str, str]:
    """An argparse type: `NAME=VALUE`."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def table(rows: dict) -> str:
    lines = ["| workload | stock CPU ms/request (median) | vradix CPU ms/request (median) | overhead | "
             "rounds (stock / vradix, first) | requests | output mismatches |", "|---|---|---|---|---|---|---|"]
    for r in rows.values():
        rounds = "; ".join(f"{x['stock']:.1f} / {x['vradix']:.1f} ({x['first']})" for x in r["rounds"])
        lines.append(f"| {r['workload']} | {r['stock']:.1f} | {r['vradix']:.1f} | {r['overhead']:+.1f}% | {rounds} | "
                     f"{r['requests']} | {r['mismatches']} |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", type=choice_list(WORKLOADS), default=list(WORKLOADS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=32, help="requests per workload and round")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--prefix", type=int, default=512)
    p.add_argument("--suffix", type=int, default=16)
    p.add_argument("--grpo-new-tokens", type=int, default=4)
    p.add_argument("--decode-prompt", type=int, default=16)
    p.add_argument("--decode-new-tokens", type=int, default=256)
    p.add_argument("--threads", type=int, default=1, help="OpenMP threads per server (passive waiting)")
    p.add_argument("--vradix-env", type=env_setting, action="append", default=[], metavar="NAME=VALUE",
                   help="a setting for the vradix server only (repeatable), e.g. VRADIX_PREFILL_DEDUP=off")
    p.add_argument("--json", help="write the rows (with every round) to this file")
    a = p.parse_args()
    load = os.getloadavg()
    print(f"# scheduler CPU time per request on CPU servers, vradix vs stock (VRADIX_DISABLE=1), no publications "
          f"({os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})")
    print(f"# {a.requests} requests per workload and round, sent at once; grpo: groups of {a.group_size} x "
          f"{a.prefix}+{a.suffix} tokens, {a.grpo_new_tokens} new; decode: {a.decode_prompt}-token prompts, "
          f"{a.decode_new_tokens} new; {a.rounds} alternating rounds; {a.threads} OpenMP thread(s) per server, "
          "passive" + "".join(f"; vradix with {k}={v}" for k, v in a.vradix_env), flush=True)
    with tempfile.TemporaryDirectory() as d:
        model = generate(os.path.join(d, "A"), seed=1, dtype="float32", init_range=0.2)
        rows = bench(model, a)
    load = os.getloadavg()
    print(f"\n# load average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n")
    print(table(rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(list(rows.values()), f, indent=1)
    if any(r["mismatches"] for r in rows.values()):
        sys.exit("outputs differ between stock and vradix")


if __name__ == "__main__":
    main()
