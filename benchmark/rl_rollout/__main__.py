"""The CLI: parse arguments, start local CPU servers (or use --url), run every (schedule, mode, workload), report.

Run as `python benchmark/rl_rollout [args]` (the folder), or `python -m rl_rollout` with `benchmark/` on the path."""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from typing import Dict, List, Sequence

if __name__ == "__main__" and not __package__:  # run as a folder: rerun as the package, so its modules shadow nothing
    from vradix.testing.harness.bench_cli import run_folder_as_package
    run_folder_as_package(__file__, "rl_rollout")

from vradix.testing.harness.bench_cli import choice_list

from vradix.testing.harness.http import ServerClient

import rl_rollout
from . import divergence
from .client import run_rollout
from .modes import MODE_NAMES, MODES, Mode
from .report import check_targets, dump_raw, print_report, reanalyze, summarize, write_png
from .workload import DEFAULT_WORKLOADS, WORKLOADS, build_tasks


def log(msg: str) -> None:
    print(f"[rl-rollout {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def local_runs(a, modes: List[Mode]) -> List[dict]:
    """Start CPU servers on tiny models, one per server group, and run every (schedule, mode, workload) on it."""
    from vradix.testing.harness.server import CpuServer
    from vradix.testing.models.llama import generate

    from tqdm import tqdm

    workdir = a.workdir or tempfile.mkdtemp(prefix="vradix-rl-")
    weights = [generate(os.path.join(workdir, f"ckpt{i}"), seed=100 + i, dtype="float32", init_range=0.2)
               for i in range(a.checkpoints)]
    rows = []
    groups: Dict[str, List[Mode]] = {}
    for m in modes:
        groups.setdefault(m.server_group(), []).append(m)
    # on a terminal only (disable=None): a log file keeps the per-run lines below
    progress = tqdm(total=len(modes) * len(a.publish_every_requests) * len(a.workload), unit="run",
                    desc="rl-rollout", file=sys.stderr, disable=None)
    for group, members in groups.items():
        flags = ["--enable-metrics", *a.server_args.split(), *members[0].server_flags()]
        log(f"starting CPU server ({group}) ...")
        with CpuServer(weights[0], vradix=members[0].vradix, extra_args=flags, max_total_tokens=a.max_total_tokens,
                       timeout=a.request_timeout) as server:
            for m in members:
                m.check_server(server.server_info())
                rows += run_mode(server, m, a, weights, progress)
            if "Traceback" in server.logs():
                raise RuntimeError(f"server ({group}) logged a traceback:\n{server.tail(80)}")
    progress.close()
    return rows


def run_mode(server: ServerClient, mode: Mode, a, weights: Sequence[str], progress=None) -> List[dict]:
    rows = []
    for k in a.publish_every_requests:
        for w in a.workload:
            tasks = build_tasks(w, sized_to_schedule(a, k))
            log(f"{w} / {mode.name} / every {k}: {sum(len(t.turns) for t in tasks)} requests ...")
            label = f"{w}-{mode.name}" + (f"-k{k}" if len(a.publish_every_requests) > 1 else "")
            raw = run_rollout(server, mode, tasks, a.concurrency, k, a.publish_every_seconds, weights, label)
            if mode.radix and not a.no_divergence:
                log(f"{w} / {mode.name} / every {k}: scoring log-probs on exact servers ...")
                raw["divergence"] = divergence.measure(server, raw, weights, label)
            if a.raw:
                dump_raw(a.raw, w, mode, k, raw)
            row = summarize(w, mode, raw, k)
            log(f"{w} / {mode.name} / every {k}: done in {row['wall_s']}s, {row['publications']} publications, "
                f"prefill {row['prefill_computed']} (ideal {row['ideal_prompt_tokens']}), "
                f"stale {row['stale_tokens_reused']}")
            rows.append(row)
            if progress is not None:
                progress.update()
    return rows


def sized_to_schedule(a, k: int):
    """The arguments for schedule K: with --scale-to-schedule N, N x K requests per run (grpo prompts of n samples,
    agent sessions of t turns, rounded up), so every schedule publishes N - 1 times; otherwise `a` unchanged."""
    if not a.scale_to_schedule or not k:
        return a
    sized = argparse.Namespace(**vars(a))
    sized.prompts = -(-a.scale_to_schedule * k // a.samples)
    sized.sessions = -(-a.scale_to_schedule * k // a.turns)
    return sized


def _range(s: str):
    lo, _, hi = s.partition(",")
    lo, hi = int(lo), int(hi or lo)
    if not 0 < lo <= hi:
        raise argparse.ArgumentTypeError(f"expected LO,HI with 0 < LO <= HI, got {s!r}")
    return lo, hi


def _counts(s: str) -> List[int]:
    try:
        ks = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected K or K1,K2,... (integers), got {s!r}") from None
    if not ks or any(k < 0 for k in ks):
        raise argparse.ArgumentTypeError(f"expected K or K1,K2,... (integers >= 0), got {s!r}")
    return list(dict.fromkeys(ks))


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="benchmark/rl_rollout", description=rl_rollout.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="drive an existing server (one --mode per server; see above)")
    p.add_argument("--mode", "--modes", dest="modes", type=choice_list(MODE_NAMES), default=list(MODE_NAMES))
    p.add_argument("--workload", type=choice_list(WORKLOADS), default=list(DEFAULT_WORKLOADS))
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
    g = p.add_argument_group("sharegpt (agent sessions from real conversations; --sessions of them)")
    g.add_argument("--sharegpt-message-tokens", type=int, default=256, help="cap per human message")
    g.add_argument("--sharegpt-context", type=int, default=3072, help="a session stops before its history passes this")
    g = p.add_argument_group("shared shape")
    g.add_argument("--system-tokens", type=int, default=384)
    g.add_argument("--question-tokens", type=_range, default=(32, 64))
    g.add_argument("--response-tokens", type=_range, default=(8, 64))
    g.add_argument("--concurrency", type=int, default=32, help="requests in flight (grpo) / sessions (agent)")
    g = p.add_argument_group("publications")
    g.add_argument("--publish-every-requests", type=_counts, default=[16],
                   help="K, or K1,K2,... to run everything once per schedule (a sweep); 0: by time only")
    g.add_argument("--publish-every-seconds", type=float, default=0.0)
    g.add_argument("--scale-to-schedule", type=int, default=0, metavar="N",
                   help="size each run to N x K requests for schedule K (overrides --prompts/--sessions), so a sweep "
                        "publishes N - 1 times at every K")
    g = p.add_argument_group("local CPU servers")
    g.add_argument("--checkpoints", type=int, default=2, help="seeded tiny checkpoints published in turn")
    g.add_argument("--max-total-tokens", type=int, default=65536)
    g.add_argument("--server-args", default="--schedule-policy lpm",
                   help="extra flags for every local server (lpm: see docs/benchmarks.md)")
    g.add_argument("--workdir")
    p.add_argument("--no-divergence", action="store_true",
                   help="skip the log-prob divergence scoring after each run (see divergence.py)")
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--json", default="rl_rollout.json")
    p.add_argument("--png", default="rl_rollout.png")
    p.add_argument("--raw", help="append every request's ids and meta_info to this JSON-lines file")
    p.add_argument("--reanalyze", metavar="RAW", help="recompute the trace columns (stale reuse, ideal, missed) "
                                                      "from a --raw file (updates --json's rows and --png if --json "
                                                      "holds that run) and exit")
    a = p.parse_args(argv)
    if a.url and len(a.modes) != 1:
        p.error("--url drives one existing server: pass exactly one --mode (see the docstring for its flags)")
    if 0 in a.publish_every_requests and a.publish_every_seconds <= 0:
        p.error("no publication schedule: set --publish-every-requests and/or --publish-every-seconds")
    if a.scale_to_schedule < 0 or a.checkpoints < 1 or a.concurrency < 1 or a.prompts < 1 or a.samples < 1 or a.sessions < 1 or a.turns < 1:
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
        server = ServerClient(a.url, a.request_timeout)
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
              "host": {"platform": platform.platform(), "cpus": os.cpu_count(), "url": a.url,
                       "load_avg_at_end": list(os.getloadavg())},
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
