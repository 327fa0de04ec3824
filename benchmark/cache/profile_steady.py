"""Where vradix's time goes in the cache-level steady loop: cProfile of the timed part of `bench_publication`'s
steady loop (after its untimed warm-up), reporting the shares of vradix's own code and of SGLang's HookRegistry
wrapper frames, then vradix's heaviest functions.

    PYTHONPATH=$PWD/python .venv/bin/python benchmark/cache/profile_steady.py [--core rust] [--requests 1500]

Profiling inflates every frame: read the shares, not the absolute times (those are in bench_publication's tables).
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_publication  # noqa: E402


def profile_timed_loop(core: str, requests: int) -> pstats.Stats:
    """Run the steady loop, profiling from the first request after the warm-up on."""
    from vradix.testing.harness import cache_fixture

    profiler, made = cProfile.Profile(), {"n": 0}
    make_req = cache_fixture.CacheFixture.make_req

    def counting_make_req(self, *args, **kwargs):
        made["n"] += 1
        if made["n"] == bench_publication.STEADY_WARMUP + 1:
            profiler.enable()
        return make_req(self, *args, **kwargs)

    cache_fixture.CacheFixture.make_req = counting_make_req
    try:
        bench_publication.bench_steady(core, requests)
    finally:
        profiler.disable()
        cache_fixture.CacheFixture.make_req = make_req
    return pstats.Stats(profiler)


def is_vradix(path: str) -> bool:
    return "/vradix/" in path and "/testing/" not in path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--core", default="rust", choices=("rust", "python"))
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args()
    stats = profile_timed_loop(a.core, a.requests).stats
    total = sum(v[2] for v in stats.values())
    own = sum(v[2] for k, v in stats.items() if is_vradix(k[0]))
    wrappers = sum(v[2] for k, v in stats.items() if "hook_registry" in k[0])
    print(f"# {a.core} core, {a.requests} requests after the warm-up: vradix's own code {own / total:.1%} of the "
          f"loop, HookRegistry's wrapper frames {wrappers / total:.1%}")
    print("| share of the loop | calls | function |\n|---|---|---|")
    rows = sorted(((v[2], v[0], k) for k, v in stats.items() if is_vradix(k[0])), reverse=True)[:a.top]
    for t, calls, (path, line, name) in rows:
        print(f"| {t / total:.1%} | {calls} | `{path.split('/vradix/')[-1]}:{line}` {name} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
