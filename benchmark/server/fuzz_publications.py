"""The publication fuzzer's long profile: random supported flag combinations, random traffic and random control
requests on real CPU servers, every response that crossed no weight change checked against stock SGLang on the
weights its label names, or (a bounded response that reused older KV) on the cache state its spans describe
(`vradix.testing.harness.fuzzer`).

    python benchmark/server/fuzz_publications.py [--combinations 20] [--publications 25] [--seed 2026] [--windowed]
        [--match REGEX] [--http-workers] [--list]

`--match` keeps only the drawn combinations whose name matches (e.g. `dp2|hicache`), drawing from the same seed until
there are enough; `--http-workers` switches on the HTTP-workers dimension (off by default); `--list` prints the
combinations a seed draws and starts nothing. Prints one line per combination (the figures so far), then the table
of docs/reliability.md, the control steps and traffic summed, and the combinations in order; exits 1 on any mismatch
or error.
"""
from __future__ import annotations

import argparse
import itertools
import os
import random
import re
import sys
import tempfile
import time

from vradix.testing.harness import fuzzer
from vradix.testing.harness.pool import ServerPool
from vradix.testing.models.llama import generate

MODELS = {"A": 1, "B": 2, "C": 3}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--combinations", type=int, default=fuzzer.LONG_PROFILE_COMBINATIONS)
    p.add_argument("--publications", type=int, default=fuzzer.LONG_PROFILE_PUBLICATIONS,
                   help="publications per combination")
    p.add_argument("--seed", type=int, default=fuzzer.LONG_PROFILE_SEED)
    p.add_argument("--workdir", default=None)
    p.add_argument("--windowed", action="store_true",
                   help="only combinations with a staleness window (drawn from the same seed until there are enough)")
    p.add_argument("--match", default=None, help="only combinations whose name matches this regular expression")
    p.add_argument("--http-workers", action="store_true",
                   default=os.environ.get(fuzzer.HTTP_WORKERS_ENV) == "1",
                   help="draw the HTTP-workers dimension (--tokenizer-worker-num 2; off by default)")
    p.add_argument("--no-http-workers", dest="http_workers", action="store_false",
                   help="leave the HTTP-workers dimension out (the default)")
    p.add_argument("--list", action="store_true", help="print the combinations drawn and exit")
    a = p.parse_args(argv)
    combos = list(itertools.islice((c for c in fuzzer.combinations(a.seed, http_workers=a.http_workers)
                                    if (c.window or not a.windowed) and re.search(a.match or "", c.name())),
                                   a.combinations))
    if a.list:
        print("\n".join(c.name() for c in combos))
        return 0
    workdir = a.workdir or tempfile.mkdtemp(prefix="vradix-fuzz-")
    models = {name: generate(os.path.join(workdir, name), seed=seed, dtype="float32", init_range=0.2)
              for name, seed in MODELS.items()}
    pool, t0 = ServerPool(), time.monotonic()
    try:
        figures = fuzzer.fuzz(models, workdir, seed=random.Random(a.seed).randrange(1 << 30), combinations=combos,
                              publications=a.publications,
                              stock=lambda path, combo: pool.lease(path, vradix=False,
                                                                   chunked_prefill_size=combo.chunked_prefill_size,
                                                                   extra_args=["--page-size", str(combo.page_size)]),
                              progress=lambda combo, so_far: print(
                                  f"[fuzz] {time.monotonic() - t0:.0f} s {combo.name()}; so far {so_far.line()}",
                                  flush=True))
    finally:
        pool.close()
    print("| combinations | publications | requests | checked vs stock | of them bounded, on a rebuilt stale cache | "
          "crossing (not checked) | greedy near-ties (not mismatches) | mismatches | errors | minutes |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print(f"| {len(figures.combinations)} | {figures.publications} | {figures.requests} | {figures.checked} | "
          f"{figures.bounded_rebuilt} | {figures.crossing_not_checked} | {len(figures.near_ties)} | "
          f"{len(figures.mismatches)} | {len(figures.errors)} | {(time.monotonic() - t0) / 60:.0f} |")
    print("control steps and traffic:", dict(sorted(figures.counts.items())))
    print("combinations, in order:", ", ".join(f"`{name}`" for name in figures.combinations))
    for m in figures.mismatches[:5] + figures.near_ties[:5] + figures.errors[:5]:
        print("problem:", m, file=sys.stderr)
    return 1 if figures.mismatches or figures.errors else 0


if __name__ == "__main__":
    sys.exit(main())
