"""Publication cost on SGLang's real UnifiedRadixCache (CPU), vradix vs stock, and steady-state hook overhead.

    python benchmark/cache/bench_publication.py [--sizes 10000,100000,1000000] [--repeats 5] [--cores rust,python]
        [--page-size 1]  (1: SGLang's token allocator; 16: its paged allocator)

Table 1 (per tree core, per cached size): the cache is filled with GRPO-shaped traffic (groups of 8 sequences of
256 tokens sharing a 128-token prompt, so ~9 nodes per 1k tokens), 1% of the sequences are held locked by live
requests, then one publication is timed (median of repeats, refill not timed):
  - publication: the vradix bump, what runs while generation is paused (epoch advance, crossing marks, re-binds;
    the unlocked stale KV is left to the deferred reclaim);
  - reclaim total / slices / max slice: the deferred reclaim of that stale KV, run as the scheduler runs it, one
    bounded slice per iteration (`DeferredReclaim.step`) until nothing is pending: the sum of the slices, their count,
    the median one and the longest one (wall time of each `step()` call: the most one scheduler iteration stalls for
    reclaim); `max slice cpu`: the same slices' longest CPU time of this thread (`time.thread_time`: without the
    time other processes held the core); `max free`: the longest allocator `free` inside a slice (SGLang's
    allocator appends the freed slots to its free list with `torch.cat`, a copy of the whole list, on CPU a new
    allocation each time the list grows); `max slice w/o free`: the longest slice less its allocator `free`
    (vradix's own work: the tree walk and the per-node eviction);
  - bump, nothing locked: a vradix bump when no request holds KV (the tree is dropped at once, like stock's flush);
  - stock reset: `tree_cache.reset()` + allocator/req-pool clear, what `flush_cache` does (stock can only run it
    when *nothing* is locked, i.e. with retract; it would free the locked KV of live requests);
  - reclaim / reset: reclaim total over stock reset, same tokens;
  - no-op: a vradix bump on an empty cache (fixed cost of a publication).
Table 2: steady-state admit → match → prefill → checkpoint → release loop, requests/s with the vradix hooks at
their defaults (KV page ledger, strict guard) vs stock (a child process with VRADIX_DISABLE=1), same traffic, timed
after `STEADY_WARMUP` untimed requests:
`--steady-runs` alternating child runs per core, each printed, then the medians, by wall time and by the child's
CPU time (`--steady-only` prints just this table).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from array import array

import torch


def fill(fx, tokens: int, lock_frac: float = 0.01):
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey
    state = getattr(fx.cache, "_vradix", None)
    ek = state.prefix_of_epoch(state.epoch) if state is not None else None
    seqs, n = [], 0
    group = 0
    while n + 256 <= tokens:
        base = [(group * 131 + j) % 30000 + 2 for j in range(128)]
        for k in range(8):
            if n + 256 > tokens:
                break
            seqs.append(base + [(group * 977 + k * 131 + j) % 30000 + 2 for j in range(128)])
            n += 256
        group += 1
    for s in seqs:
        v = fx.allocator.alloc(len(s))
        fx.cache.insert(InsertParams(key=RadixKey(array("q", s), extra_key=ek), value=v))
    locks = []
    for s in (seqs[:: max(1, int(1 / lock_frac))] if lock_frac else []):
        m = fx.cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", s), extra_key=ek)))
        locks.append(fx.cache.lock(m.last_device_node))
    return len(seqs), locks


def bench_publication(core: str, sizes, repeats: int, page_size: int = 1):
    from vradix.engine import attach
    from vradix.testing.harness.cache_fixture import build_cache

    rows = []
    for size in sizes:
        res = {"publication": [], "reclaim total": [], "median slice": [], "max slice": [], "max slice cpu": [],
               "max free": [], "max slice w/o free": [],
               "bump, nothing locked": [],
               "stock reset": [], "no-op": []}
        slices = []
        nodes = freed = 0
        for _ in range(repeats):
            fx = build_cache(core, page_size, kv_tokens=size + 4096, max_reqs=8)
            state = attach(fx.cache)
            nseq, locks = fill(fx, size)
            cached = fx.cache.evictable_size() + fx.cache.protected_size()
            t = time.perf_counter()
            state.bump(fx.cache, [], [], reason="bench")
            res["publication"].append(time.perf_counter() - t)
            times, frees = [], []
            free = fx.allocator.free

            def timed_free(index, free=free, frees=frees, alloc=fx.allocator):
                t0 = time.perf_counter()
                free(index)
                if alloc.free_group is None:  # inside a free group `free` only appends
                    frees.append(time.perf_counter() - t0)
            fx.allocator.free = timed_free
            cpu, own = [], []
            while state.deferred.active:
                n = len(frees)
                t, c = time.perf_counter(), time.thread_time()
                state.deferred.step(state, fx.cache)
                times.append(time.perf_counter() - t)
                cpu.append(time.thread_time() - c)
                own.append(times[-1] - sum(frees[n:]))
            del fx.allocator.free
            res["max slice cpu"].append(max(cpu, default=0.0))
            res["max free"].append(max(frees, default=0.0))
            res["max slice w/o free"].append(max(own, default=0.0))
            res["reclaim total"].append(sum(times))
            res["median slice"].append(statistics.median(times) if times else 0.0)
            res["max slice"].append(max(times, default=0.0))
            slices.append(len(times))
            freed = state.deferred.tokens_freed_by_slices
            for lk in locks:
                fx.cache.unlock(lk)
            fill(fx, size, lock_frac=0)
            t = time.perf_counter()
            state.bump(fx.cache, [], [], reason="bench")
            res["bump, nothing locked"].append(time.perf_counter() - t)
            _, locks = fill(fx, size)
            for lk in locks:  # stock can only reset an idle cache
                fx.cache.unlock(lk)
            t = time.perf_counter()
            fx.cache.reset()
            fx.req_pool.clear()
            fx.allocator.clear()
            res["stock reset"].append(time.perf_counter() - t)
            t = time.perf_counter()
            state.bump(fx.cache, [], [], reason="bench")
            res["no-op"].append(time.perf_counter() - t)
            nodes = nseq
        med = {k: statistics.median(v) * 1e3 for k, v in res.items()}
        rows.append({"core": core, "inserted_tokens": size, "cached_tokens": cached, "sequences": nodes,
                     "freed": freed, "slices": int(statistics.median(slices)),
                     **{k: round(v, 3) for k, v in med.items()},
                     "reclaim / reset": round(med["reclaim total"] / med["stock reset"], 1)})
    return rows


#: requests served before the timed loop, on prompts the timed loop never shares: stock SGLang pays a one-time cost
#: of about 0.1 s in its first requests (lazy initialisation that vradix's start pays before the loop), which a timed
#: loop of N requests would spread as 0.1 s / N per request and read as vradix's overhead shrinking with N
STEADY_WARMUP = 256


def bench_steady(core: str, nreq: int) -> dict:
    """One child run of the steady-state loop (`vradix.testing.harness.steady.serve`): {"wall": requests/s over wall
    time, "cpu": requests/s over this process's CPU time}, after `STEADY_WARMUP` untimed requests. The CPU-time rate
    is the one other jobs on a shared machine disturb least."""
    from vradix.engine import attach
    from vradix.testing.harness import steady
    from vradix.testing.harness.cache_fixture import build_cache
    from sglang.srt.plugins import load_plugins

    torch.set_num_threads(1)
    load_plugins()
    fx = build_cache(core, 1, kv_tokens=1 << 19, max_reqs=64)
    if not os.environ.get("VRADIX_DISABLE"):
        attach(fx.cache)
    steady.serve(fx, steady.prompts(STEADY_WARMUP, base=40000))
    # the heap the imports and the warm-up left is frozen in both runs, as SGLang's /freeze_gc does in a server:
    # otherwise whether one full collection of it (~0.3 s: vradix's run imports vradix.hooks and the SGLang modules
    # it names, ~80k more objects) lands in the timed interval decides the run
    gc.collect()
    gc.freeze()
    reqs = steady.prompts(nreq)
    t, c = time.perf_counter(), time.process_time()
    steady.serve(fx, reqs)
    return {"wall": nreq / (time.perf_counter() - t), "cpu": nreq / (time.process_time() - c)}


def steady_child(core: str, mode: str, nreq: int) -> dict:
    env = dict(os.environ)
    env.pop("VRADIX_DISABLE", None)
    if mode == "stock":
        env["VRADIX_DISABLE"] = "1"
    out = subprocess.run([sys.executable, __file__, "--steady-child", core, "--steady-requests", str(nreq)], env=env,
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def steady_table(cores, nreq: int, runs: int) -> None:
    """Alternating child runs (stock, vradix, stock, ...; the pair order flips every run), each pair printed with its
    overhead, then the medians. Overhead = (stock - vradix) / stock, on requests/s."""
    load = os.getloadavg()
    print(f"\n# steady state (vradix.testing.harness.steady), requests/s, {runs} alternating pairs of child runs "
          f"(load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})")
    print("| core | pair | stock wall | vradix wall | stock cpu | vradix cpu | overhead (cpu) | load |")
    print("|---|---|---|---|---|---|---|---|")
    medians = []
    for core in cores:
        rates = {"stock": [], "vradix": []}
        pair_over = []
        for i in range(runs):
            for mode in (("stock", "vradix") if i % 2 == 0 else ("vradix", "stock")):
                rates[mode].append(steady_child(core, mode, nreq))
            s, v = rates["stock"][-1], rates["vradix"][-1]
            pair_over.append((s["cpu"] - v["cpu"]) / s["cpu"] * 100)
            print(f"| {core} | {i} | {s['wall']:.0f} | {v['wall']:.0f} | {s['cpu']:.0f} | {v['cpu']:.0f} | "
                  f"{pair_over[-1]:+.1f}% | {os.getloadavg()[0]:.2f} |", flush=True)
        medians.append((core, {m: {k: statistics.median(r[k] for r in rs) for k in ("wall", "cpu")}
                               for m, rs in rates.items()}, statistics.median(pair_over)))
    print("\n| core | stock (VRADIX_DISABLE=1) | vradix | overhead of the medians (wall) | overhead of the medians "
          "(cpu) | median pair overhead (cpu) |")
    print("|---|---|---|---|---|---|")
    for core, med, pair in medians:
        s, v = med["stock"], med["vradix"]
        over = {k: (s[k] - v[k]) / s[k] * 100 for k in ("wall", "cpu")}
        print(f"| {core} | {s['wall']:.0f} wall, {s['cpu']:.0f} cpu | {v['wall']:.0f} wall, {v['cpu']:.0f} cpu | "
              f"{over['wall']:+.1f}% | {over['cpu']:+.1f}% | {pair:+.1f}% |", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="10000,100000,1000000")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--cores", default="rust,python")
    p.add_argument("--page-size", type=int, default=1,
                   help="KV page size: 1 uses SGLang's token allocator, above 1 its paged allocator")
    p.add_argument("--steady-requests", type=int, default=3000)
    p.add_argument("--steady-runs", type=int, default=5, help="alternating stock/vradix child runs per core")
    p.add_argument("--steady-only", action="store_true", help="only the steady-state table")
    p.add_argument("--steady-child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.steady_child:
        print(json.dumps(bench_steady(a.steady_child, a.steady_requests)))
        return
    torch.set_num_threads(1)
    if a.steady_only:
        steady_table(a.cores.split(","), a.steady_requests, a.steady_runs)
        return
    sizes = [int(x) for x in a.sizes.split(",")]
    from vradix.core.deferred_reclaim import SLICE_NODES
    print(f"# publication cost, ms, median of {a.repeats} (CPU: {os.cpu_count()} cores, torch {torch.__version__}; "
          f"deferred reclaim slices of {SLICE_NODES} nodes; page size {a.page_size})")
    hdr = ["core", "inserted_tokens", "cached_tokens", "sequences", "freed", "publication", "reclaim total",
           "slices", "median slice", "max slice", "max slice cpu", "max free", "max slice w/o free",
           "bump, nothing locked", "stock reset", "reclaim / reset", "no-op"]
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    for core in a.cores.split(","):
        for row in bench_publication(core, sizes, a.repeats, a.page_size):
            print("| " + " | ".join(str(row[h]) for h in hdr) + " |", flush=True)
    steady_table(a.cores.split(","), a.steady_requests, a.steady_runs)

if __name__ == "__main__":
    main()
