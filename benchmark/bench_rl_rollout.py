"""RL rollout benchmark: four publication strategies on the same seeded RL traffic, on a real SGLang server.

The code is the package `benchmark/rl_rollout/` (its docstring and `--help` describe workloads, modes, metrics and
`--url` use); this file is the entry point: `python benchmark/bench_rl_rollout.py [args]` (`make bench-rl`).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from rl_rollout.__main__ import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
