"""Rollout workers: run the tasks against the server through the publication gate, and record every /generate call
with the server's meta_info (the trace every accounting step reads)."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import List, Sequence

from vradix.testing.harness.http import ServerClient

from .modes import Mode
from .schedule import Schedule
from .workload import Task


@dataclass
class Record:
    """One /generate call: what was sent and the server's meta_info."""

    task: str
    turn: int
    input_ids: List[int]
    output_ids: List[int]
    meta: dict
    sent: float = 0.0        # client wall clock
    received: float = 0.0


def run_task(server: ServerClient, schedule: Schedule, task: Task) -> List[Record]:
    history, records = list(task.prefix), []
    for t, turn in enumerate(task.turns):
        schedule.before_submit()
        sent = time.time()
        try:
            out = server.generate(history, turn.max_new_tokens, return_logprob=True)  # divergence.py
        finally:
            schedule.after_complete()
        records.append(Record(task.name, t, list(history), out["output_ids"], out["meta_info"], sent, time.time()))
        history = history + out["output_ids"] + turn.tool_result
    return records


def run_rollout(server: ServerClient, mode: Mode, tasks: List[Task], concurrency: int, every_k: int,
                every_s: float, weights: Sequence[str], label: str) -> dict:
    """Reset the server to weights[0] (idle, flushed), run the traffic with publications, return raw results."""
    server.reset(weights[0], f"{label}-v0")
    total = sum(len(t.turns) for t in tasks)
    schedule = Schedule(server, mode, weights, total, every_k, every_s, label)
    before = server.prefill_counters()
    t0 = time.perf_counter()
    schedule.start()
    workers = concurrency if tasks and len(tasks[0].turns) == 1 else min(concurrency, len(tasks))
    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(lambda t: run_task(server, schedule, t), tasks))
    finally:
        schedule.stop()
    wall = time.perf_counter() - t0
    after = server.prefill_counters()
    return {"records": [r for rs in results for r in rs], "publications": schedule.publications, "wall_s": wall,
            "first_version": schedule.version(0),
            "counters": {k: after[k] - before[k] for k in after},
            "vradix": server.vradix_info() if mode.vradix else None}
