"""Steady-state serving throughput on real SGLang CPU servers: vradix (defaults: KV page ledger, strict guard) against
stock SGLang (`VRADIX_DISABLE=1`), same seeded traffic, no publications.

    python benchmark/server/bench_steady_state.py [--policies lpm,fcfs] [--rounds 5] [--requests 96] [--smoke]

For each scheduling policy, one vradix and one stock server run side by side on a tiny float32 Llama (same weights).
Each round sends the same seeded GRPO-shaped traffic to both, one after the other, the order alternating by round:
`--groups` prompts of `--prefix` shared tokens, each sampled `--group-size` times with a distinct suffix, sent by
`--concurrency` clients at once to a server that runs at most `--max-running` requests, so a waiting queue forms and
SGLang re-matches it on every prefill pass (the strict guard checks each extend batch once, before its forward).
Round r uses seed r for both servers, so both caches see the same history. Throughput = requests / wall time of
the round; the table shows the median over rounds and every round's pair. The greedy outputs of the two servers must
be identical (checked), and the vradix server's guard counters show how many prefix checks ran.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import random
import statistics
import sys
import tempfile
import time

from vradix.testing.harness.server import CpuServer
from vradix.testing.models.llama import generate

VOCAB_LO, VOCAB_HI = 17, 480


def traffic(seed: int, groups: int, group_size: int, prefix: int, suffix: int) -> list[list[int]]:
    """Seeded GRPO-shaped prompts: `groups` shared prefixes, `group_size` distinct suffixes each, shuffled."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(groups):
        shared = [rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(prefix)]
        prompts += [shared + [rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(suffix)] for _ in range(group_size)]
    rng.shuffle(prompts)
    return prompts


def run_round(server, prompts, new_tokens: int, concurrency: int) -> tuple[float, list]:
    """Send `prompts` with `concurrency` clients; returns (requests/s, outputs in prompt order)."""
    t = time.perf_counter()
    with cf.ThreadPoolExecutor(concurrency) as pool:
        outs = list(pool.map(lambda p: server.generate(p, new_tokens, timeout=600)["output_ids"], prompts))
    return len(prompts) / (time.perf_counter() - t), outs


def guard_counters(server) -> dict:
    led = (server.vradix_info() or {}).get("kv_ledger") or {}
    return {k: led.get(k) for k in ("verify_mode", "prefixes_verified", "verify_host_reads",
                                    "violations_caught")}


def bench_policy(model: str, policy: str, a) -> dict:
    extra = ["--schedule-policy", policy, "--max-running-requests", str(a.max_running)]
    with cf.ThreadPoolExecutor(2) as pool:  # start-up dominates on CPU: start both at once
        starting = {m: pool.submit(CpuServer, model, vradix=(m == "vradix"), extra_args=extra,
                                   startup_timeout=600) for m in ("stock", "vradix")}
        servers = {m: f.result() for m, f in starting.items()}
    try:
        rates = {"stock": [], "vradix": []}
        identical = True
        for r in range(a.rounds):
            prompts = traffic(r, a.groups, a.group_size, a.prefix, a.suffix)
            order = ("stock", "vradix") if r % 2 == 0 else ("vradix", "stock")
            outs = {}
            for m in order:
                rate, outs[m] = run_round(servers[m], prompts, a.new_tokens, a.concurrency)
                rates[m].append(rate)
            identical &= outs["stock"] == outs["vradix"]
            print(f"  {policy} round {r}: " + ", ".join(f"{m} {rates[m][-1]:.2f} req/s" for m in order), flush=True)
        counters = guard_counters(servers["vradix"])
    finally:
        for s in servers.values():
            s.stop()
    stock, vradix = statistics.median(rates["stock"]), statistics.median(rates["vradix"])
    return {"policy": policy, "stock": stock, "vradix": vradix, "overhead": (stock - vradix) / stock * 100,
            "rounds": list(zip(rates["stock"], rates["vradix"])), "identical": identical, **counters}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policies", default="lpm,fcfs")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--groups", type=int, default=12)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--prefix", type=int, default=256)
    p.add_argument("--suffix", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=48)
    p.add_argument("--max-running", type=int, default=16)
    p.add_argument("--smoke", action="store_true", help="tiny sizes (CI): lpm only, 2 rounds of 8 requests")
    a = p.parse_args()
    if a.smoke:
        a.policies, a.rounds, a.groups, a.group_size, a.prefix, a.suffix = "lpm", 2, 2, 4, 64, 8
        a.new_tokens, a.concurrency, a.max_running = 2, 8, 4
    load = os.getloadavg()
    print(f"# steady state on CPU servers, vradix vs stock (VRADIX_DISABLE=1), no publications "
          f"({os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})")
    print(f"# traffic: {a.groups} groups x {a.group_size} samples of {a.prefix}+{a.suffix} tokens, {a.new_tokens} new "
          f"tokens each, {a.concurrency} clients, --max-running-requests {a.max_running}, {a.rounds} alternating "
          "rounds", flush=True)
    with tempfile.TemporaryDirectory() as d:
        model = generate(os.path.join(d, "A"), seed=1, dtype="float32", init_range=0.2)
        rows = [bench_policy(model, pol, a) for pol in a.policies.split(",")]
    print("\n| policy | stock req/s (median) | vradix req/s (median) | overhead | rounds (stock / vradix) | "
          "outputs identical | prefixes verified | verify host reads |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        rounds = "; ".join(f"{s:.2f} / {v:.2f}" for s, v in r["rounds"])
        print(f"| {r['policy']} | {r['stock']:.2f} | {r['vradix']:.2f} | {r['overhead']:+.1f}% | {rounds} | "
              f"{r['identical']} | {r['prefixes_verified']} | {r['verify_host_reads']} |")
    if not all(r["identical"] for r in rows):
        sys.exit("outputs differ between stock and vradix")


if __name__ == "__main__":
    main()
