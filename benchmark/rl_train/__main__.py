"""The CLI: pretrain (or reuse) the policy, then run the GRPO loop once per run (mode), each on its own CPU server
started on the same policy, and print one line per step.

Run as `python benchmark/rl_train [args]` (the folder), or `python -m rl_train` with `benchmark/` on the path."""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

if __name__ == "__main__" and not __package__:  # run as a folder: rerun as the package, so its modules shadow nothing
    from vradix.testing.harness.bench_cli import run_folder_as_package
    run_folder_as_package(__file__, "rl_train")

from vradix.testing.harness.bench_cli import choice_list

import rl_train
from . import invariants, loop, plots, policy
from .report import summary, table
from .modes import RUN_NAMES, RUNS
from .task import Task

WORKLOADS = ("grpo", "multiturn")


def log(msg: str) -> None:
    print(f"[rl-train {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="benchmark/rl_train", description=rl_train.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=choice_list(RUN_NAMES), default=list(RUN_NAMES))
    p.add_argument("--workload", type=choice_list(WORKLOADS), default=list(WORKLOADS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--prompts", type=int, default=8, help="prompts (groups) per step")
    p.add_argument("--samples", type=int, default=4, help="n samples per prompt")
    p.add_argument("--turns", type=int, default=3, help="turns per multiturn episode")
    p.add_argument("--concurrency", type=int, default=8, help="trajectories in flight")
    p.add_argument("--lr", type=float, default=3e-4)
    g = p.add_argument_group("policy")
    g.add_argument("--system-tokens", type=int, default=128)
    g.add_argument("--pretrain-target", type=float, default=0.5,
                   help="held-out mean reward (temperature 1) at which pretraining stops")
    g.add_argument("--pretrain-max-steps", type=int, default=3000)
    p.add_argument("--workdir", help="policy and step checkpoints (default: a new temporary folder)")
    p.add_argument("--max-total-tokens", type=int, default=65536)
    p.add_argument("--json", default="rl_train.json")
    p.add_argument("--plots", default="rl_train_plots", help="folder for the two PNG figures (empty: none)")
    p.add_argument("--raw", help="append every request's ids and meta_info to this JSON-lines file")
    p.add_argument("--check", action="store_true",
                   help="exit 1 when a run breaks the loop's invariants (rl_train.invariants; the CI smoke)")
    p.add_argument("--vradix-disabled", action="store_true",
                   help="start every server with VRADIX_DISABLE=1, the vradix runs included (to show --check fail)")
    a = p.parse_args(argv)
    if min(a.steps, a.prompts, a.samples, a.turns, a.concurrency) < 1:
        p.error("counts must be >= 1")
    return a


def main(argv=None) -> int:
    import torch
    from vradix.testing.harness.server import CpuServer

    a = parse_args(argv)
    torch.set_num_threads(1)  # the server's scheduler busy-polls a core of its own
    t0 = time.time()
    workdir = a.workdir or tempfile.mkdtemp(prefix="vradix-rl-train-")
    task = Task.make(a.seed, system_tokens=a.system_tokens)
    policy_dir = policy.make_policy(os.path.join(workdir, "policy"), a.seed, task, log,
                                    target=a.pretrain_target, max_steps=a.pretrain_max_steps)
    results = []
    for name in a.runs:
        run = RUNS[name]
        # float32 as the trainer: SGLang's dtype "auto" serves a float32 checkpoint in half precision
        flags = ["--enable-metrics", "--schedule-policy", "lpm", "--dtype", "float32", *run.mode.server_flags()]
        log(f"starting CPU server ({name}) ...")
        with CpuServer(policy_dir, vradix=run.mode.vradix and not a.vradix_disabled, extra_args=flags,
                       max_total_tokens=a.max_total_tokens) as server:
            if not a.vradix_disabled:
                run.mode.check_server(server.server_info())
            for w in a.workload:
                turns = a.turns if w == "multiturn" else 1
                out = loop.run(server, run.mode, policy_dir, task, os.path.join(workdir, name, w), steps=a.steps,
                               prompts=a.prompts, n=a.samples, turns=turns, concurrency=a.concurrency,
                               seed=a.seed, lr=a.lr, correction=run.correction, name=name, log=log,
                               progress=True)
                out["workload"] = w
                records = out.pop("records")
                if a.raw:
                    with open(a.raw, "a") as f:
                        for r in records:
                            f.write(json.dumps({"workload": w, "run": name, **vars(r)}) + "\n")
                results.append(out)
            logs = server.logs()
            if "Traceback" in logs:
                at = logs.index("Traceback")
                raise RuntimeError(f"server ({name}) logged a traceback:\n{logs[max(0, at - 2000):at + 6000]}")
    print(table(results))
    print()
    print(summary(results))
    with open(a.json, "w") as f:
        json.dump({"config": vars(a), "wall_s": round(time.time() - t0, 1), "results": results}, f, indent=1)
    print(f"JSON: {a.json}")
    if a.plots:
        print("plots:", ", ".join(plots.write(results, a.plots)))
    print(f"total {time.time() - t0:.0f}s")
    if a.check:
        broken = invariants.violations(results)
        for line in broken:
            print("invariant broken:", line)
        print(f"invariants: {'broken' if broken else 'hold'} ({len(results)} runs)")
        return 1 if broken else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
