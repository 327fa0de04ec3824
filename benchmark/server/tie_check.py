"""Greedy near-ties of the publication soak's prompt pool: does a prompt's greedy output depend on batching?

    python benchmark/server/tie_check.py [--prompts 15 | --all] [--weights A] [--trials 6] [--others 3]

Generates the soak's tiny model (`MODELS` of `benchmark/server/soak_publications.py`: same seeds and parameters)
and builds the soak's prompt pool with the soak's own `prompt_pool` and default `--suffixes` (160 prompts). Starts ONE
fresh *stock* SGLang CPU server (vradix disabled) on the chosen weights and, for every chosen prompt, generates
greedily with the soak's default `--max-new-tokens`:
  - solo: `--trials` times alone (one request in the engine);
  - batched: `--trials` times together with `--others` other prompts of the pool, all sent at once (a barrier
    releases the threads together), as the soak's concurrent load does. The other prompts are drawn per trial with
    a seeded RNG (`--seed`), so a run is repeatable.

Prints one markdown table, a row per prompt: the distinct solo outputs and the distinct batched outputs, each with
its count, and whether the prompt is tie-prone (its outputs are not all equal, typically solo != batched). A
tie-prone prompt's greedy output flips with batch composition on a stock server, so an oracle that runs one request
at a time reports such a flip as a mismatch although no KV was reused. Exits 0 once the table is printed.
Every request has a deadline (`--timeout`), and so does the server start.
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures as cf
import importlib.util
import os
import random
import sys
import tempfile
import threading
import time
from typing import List, Optional, Sequence

from vradix.testing.harness.server import CpuServer
from vradix.testing.models.llama import generate


def load_soak():
    """`benchmark/server/soak_publications.py` as a module (loaded as `test/e2e/test_soak.py` loads it)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "soak_publications.py")
    spec = importlib.util.spec_from_file_location("soak_publications", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(mod)
    return mod


def batched_output(server: CpuServer, prompts: Sequence[Sequence[int]], target: int, others: Sequence[int],
                   max_new_tokens: int, timeout: float) -> list:
    """Send `target` and `others` (pool indices) at once; return the output ids of `target`."""
    ids = [target, *others]
    barrier = threading.Barrier(len(ids), timeout=timeout)

    def one(i):
        barrier.wait()
        return server.generate(prompts[i], max_new_tokens, timeout=timeout)["output_ids"]

    with cf.ThreadPoolExecutor(len(ids)) as pool:
        futs = [pool.submit(one, i) for i in ids]
        return [f.result(timeout=2 * timeout) for f in futs][0]


def counted(outputs: List[list]) -> str:
    c = collections.Counter(tuple(o) for o in outputs)
    return "; ".join(f"`{list(o)}` ×{n}" for o, n in c.most_common())


def main(argv: Optional[List[str]] = None) -> List[dict]:
    soak = load_soak()
    soak_defaults = soak.parser().parse_args([])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--prompts", default="15", help="comma-separated indices into the soak's prompt pool (default: 15)")
    which.add_argument("--all", action="store_true", help="check every prompt of the pool")
    p.add_argument("--weights", default="A", choices=sorted(soak.MODELS), help="which soak model (default: A)")
    p.add_argument("--trials", type=int, default=6, help="N: requests alone and batches per prompt (default: 6)")
    p.add_argument("--others", type=int, default=3, help="K: other requests sent with the prompt (default: 3)")
    p.add_argument("--suffixes", type=int, default=soak_defaults.suffixes,
                   help=f"prompts per shared prefix, as the soak's --suffixes (default: {soak_defaults.suffixes})")
    p.add_argument("--max-new-tokens", type=int, default=soak_defaults.max_new_tokens,
                   help=f"as the soak's --max-new-tokens (default: {soak_defaults.max_new_tokens})")
    p.add_argument("--seed", type=int, default=0, help="seed for drawing the other prompts of each batch")
    p.add_argument("--timeout", type=float, default=120.0, help="deadline of every request, seconds (default: 120)")
    p.add_argument("--workdir", default=None, help="where to write the model (default: a temporary directory)")
    a = p.parse_args(argv)

    prompts = soak.prompt_pool(a.suffixes)
    chosen = list(range(len(prompts))) if a.all else [int(x) for x in a.prompts.split(",") if x.strip()]
    bad = [i for i in chosen if not 0 <= i < len(prompts)]
    if bad:
        p.error(f"prompt indices {bad} outside the pool of {len(prompts)}")
    if not 0 <= a.others < len(prompts):
        p.error(f"--others must be in [0, {len(prompts) - 1}]")

    tmp = None if a.workdir else tempfile.TemporaryDirectory(prefix="vradix-tie-")
    workdir = a.workdir or tmp.name
    try:
        path = generate(os.path.join(workdir, a.weights), **soak.MODELS[a.weights])
        rows = []
        t0 = time.monotonic()
        with CpuServer(path, vradix=False) as server:
            print(f"[tie_check] stock server up in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
            for n, i in enumerate(chosen, 1):
                solo = [server.generate(prompts[i], a.max_new_tokens, timeout=a.timeout)["output_ids"]
                        for _ in range(a.trials)]
                batched = []
                for t in range(a.trials):
                    rng = random.Random(f"{a.seed}/{i}/{t}")
                    others = rng.sample([j for j in range(len(prompts)) if j != i], a.others)
                    batched.append(batched_output(server, prompts, i, others, a.max_new_tokens, a.timeout))
                tie = len({tuple(o) for o in solo + batched}) > 1
                rows.append({"prompt": i, "solo": solo, "batched": batched, "tie_prone": tie})
                if a.all and n % 20 == 0:
                    print(f"[tie_check] {n}/{len(chosen)} prompts, {time.monotonic() - t0:.0f} s", file=sys.stderr,
                          flush=True)
    finally:
        if tmp is not None:
            tmp.cleanup()

    print(f"weights {a.weights} ({soak.MODELS[a.weights]}), pool of {len(prompts)} prompts, "
          f"max_new_tokens {a.max_new_tokens}, {a.trials} solo requests and {a.trials} batches of 1 + {a.others} "
          f"per prompt, fresh stock server")
    print()
    print(f"| prompt | solo outputs ({a.trials}) | batched outputs ({a.trials}, with {a.others} others) | tie-prone |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['prompt']} | {counted(r['solo'])} | {counted(r['batched'])} | {'yes' if r['tie_prone'] else 'no'} |")
    ties = [r["prompt"] for r in rows if r["tie_prone"]]
    print()
    print(f"tie-prone: {len(ties)} of {len(rows)} prompts {ties}; {time.monotonic() - t0:.0f} s with the server")
    return rows


if __name__ == "__main__":
    main()
    sys.exit(0)
