"""What the cache inspector costs the scheduler: p50/p99 scheduler-iteration stall with and without polling.

A `GET /vradix/cache` reaches the scheduler as one internal-state request, answered synchronously on the scheduler
thread between two batches (`hooks.inspector.answer_cache_inspection`): the stall it adds to that iteration is the
snapshot (`snapshot.snapshot`) plus the msgpack encoding of its reply; HTTP and ZMQ run in the tokenizer process.
So this measures exactly that code on SGLang's real UnifiedRadixCache (both TreeCores), in a loop that stands in
for the scheduler: each iteration admits, prefills and finishes one request against a large cache (many cached
prefixes, a full hit table, live lock holders and a crossing request after a publication), and in the polled run
also answers one inspector query every `--poll-every` iterations. It prints one table row per core and mode.

    PYTHONPATH=python .venv/bin/python benchmark/cache/bench_inspector.py            # ~1-2 min on 2 CPU cores
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import time

os.environ.setdefault("TRITON_INTERPRET", "1")


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q / 100 * len(xs)))]


def build(core: str, args):
    from vradix.engine import attach
    from vradix.testing.harness.cache_fixture import build_cache

    fx = build_cache(core, args.page_size, kv_tokens=args.cached_tokens + 64 * 1024, max_reqs=args.live + 8,
                     max_context_len=4096)
    state = attach(fx.cache)
    rng = random.Random(0)
    systems = [[rng.randrange(32000) for _ in range(args.system_len)] for _ in range(args.systems)]

    def request(i):
        req = fx.make_req(systems[i % len(systems)] + [rng.randrange(32000) for _ in range(args.suffix_len)])
        state.admit_or_raise(req)
        return req

    i = 0
    while fx.cache.evictable_size() < args.cached_tokens:
        r = request(i)
        fx.admit(r)
        fx.prefill(r)
        fx.finish(r)
        i += 1
    live = []
    for _ in range(args.live):
        r = request(i)
        fx.admit(r)
        fx.prefill(r)
        live.append(r)
        i += 1
    state.bump(fx.cache, live[:1], [], reason="bench", label="v1")  # one crossing request pins stale KV
    return fx, state, live, request, i


def serve(fx, req) -> None:
    """One scheduler iteration's cache work: evict if the pool is short (as SGLang does), admit, prefill, finish."""
    from sglang.srt.mem_cache import common

    need = len(req.origin_input_ids) + fx.page_size
    if fx.allocator.available_size() < need:
        common.evict_from_tree_cache(fx.cache, need)
    fx.admit(req)
    fx.prefill(req)
    fx.finish(req)


def run(core: str, polled: bool, args) -> dict:
    import msgspec
    from sglang.srt.managers.io_struct import GetInternalStateReqOutput
    from sglang.srt.utils.msgspec_utils import msgspec_to_builtins

    from vradix.observability import snapshot

    fx, state, live, request, i = build(core, args)
    query = snapshot.Query(limit=args.limit, head=8)
    iters, snaps = [], []
    for n in range(args.iterations):
        t0 = time.perf_counter()
        if polled and n % args.poll_every == 0:
            s0 = time.perf_counter()
            view = snapshot.snapshot(state, fx.cache, live, query)
            reply = msgspec_to_builtins({"vradix_cache": view})
            msgspec.msgpack.encode(GetInternalStateReqOutput(internal_state=reply))
            snaps.append(time.perf_counter() - s0)
        serve(fx, request(i + n))
        iters.append(time.perf_counter() - t0)
    return {"core": core, "mode": f"polled every {args.poll_every}" if polled else "no polling",
            "cached": fx.cache.evictable_size() + fx.cache.protected_size(),
            "tracked": len(state.prefix_hits.entries),
            "p50": percentile(iters, 50) * 1e3, "p99": percentile(iters, 99) * 1e3,
            "snap_p50": statistics.median(snaps) * 1e3 if snaps else None,
            "snap_max": max(snaps) * 1e3 if snaps else None}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cores", default="rust,python")
    p.add_argument("--cached-tokens", type=int, default=200_000)
    p.add_argument("--systems", type=int, default=64, help="distinct shared prefixes")
    p.add_argument("--system-len", type=int, default=512)
    p.add_argument("--suffix-len", type=int, default=256)
    p.add_argument("--live", type=int, default=32, help="requests holding locks while the loop runs")
    p.add_argument("--iterations", type=int, default=1000)
    p.add_argument("--poll-every", type=int, default=10)
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--page-size", type=int, default=1)
    args = p.parse_args()
    from sglang.srt.plugins import load_plugins

    load_plugins()
    rows = [run(core, polled, args) for core in args.cores.split(",") for polled in (False, True)]
    print("\n| core | mode | cached tokens | tracked prefixes | iteration p50 (ms) | iteration p99 (ms) | "
          "snapshot p50 (ms) | snapshot max (ms) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        snap = ("-", "-") if r["snap_p50"] is None else (f"{r['snap_p50']:.2f}", f"{r['snap_max']:.2f}")
        print(f"| {r['core']} | {r['mode']} | {r['cached']} | {r['tracked']} | {r['p50']:.2f} | {r['p99']:.2f} | "
              f"{snap[0]} | {snap[1]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
