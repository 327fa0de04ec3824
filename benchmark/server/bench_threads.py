"""OpenMP threads per CPU server when several serve at once (why `make test` runs one thread per process).

For each setting (torch's default, a thread per core; and `OMP_NUM_THREADS=1`) and each server count, starts that
many vradix CPU servers on one tiny float32 Llama, then sends `--requests` requests per server (300-token prompts,
32 new tokens, greedy) from two client threads per server, all servers at once, and prints the wall time of the
load (start-up excluded). Run it on a quiet machine; `--rounds` repeats every row.

    .venv/bin/python benchmark/server/bench_threads.py --servers 1,2 --rounds 2
"""
import argparse
import concurrent.futures as cf
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

SETTINGS = {"default": {}, "1": {"OMP_NUM_THREADS": "1"}}


def load(server, client: int, requests: int) -> None:
    for i in range(requests // 2):
        server.generate([(j * 7 + client * 13 + i * 31) % 400 + 5 for j in range(300)], 32)


def measure(model: str, setting: str, servers: int, requests: int) -> float:
    """Seconds the load took on `servers` servers started with the environment of `setting`."""
    from vradix.testing.harness.server import CpuServer, start_servers
    running = start_servers(*[lambda: CpuServer(model, env=dict(SETTINGS[setting])) for _ in range(servers)])
    try:
        t0 = time.monotonic()
        with cf.ThreadPoolExecutor(2 * servers) as pool:
            list(pool.map(lambda a: load(*a, requests), [(s, c) for s in running for c in range(2)]))
        return time.monotonic() - t0
    finally:
        for s in running:
            s.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--servers", default="1,2", help="server counts, comma-separated (default 1,2)")
    p.add_argument("--requests", type=int, default=12, help="requests per server (default 12)")
    p.add_argument("--rounds", type=int, default=2, help="times each row runs (default 2)")
    args = p.parse_args()
    os.environ.pop("OMP_NUM_THREADS", None)  # the servers inherit this environment: the setting alone decides
    from vradix.testing.models.llama import generate
    model = generate(str(Path(tempfile.mkdtemp()) / "A"), seed=1, dtype="float32", init_range=0.2)
    print("| OMP threads | servers at once | requests | wall s (each round) |")
    print("|---|---|---|---|")
    for n in (int(x) for x in args.servers.split(",")):
        for setting in SETTINGS:
            walls = [measure(model, setting, n, args.requests) for _ in range(args.rounds)]
            print(f"| {setting} | {n} | {n * args.requests} | {', '.join(f'{w:.2f}' for w in walls)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
