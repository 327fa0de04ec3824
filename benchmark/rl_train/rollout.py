"""Rollouts on the SGLang server: n samples per prompt at temperature 1 with the engine's log-probs
(`return_logprob`), single-turn or multi-turn, turned into the trainer's `Sample`s with each sampled token's
provenance.

Every /generate call is recorded as `rl_rollout.client.Record` (what was sent, the server's meta_info), the trace the
stock modes' shadow cache and the ideal-work yardstick read.
"""
from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

from rl_rollout.client import Record

from .grpo import FRESH
from .provenance import classify, unlabelled_crossing
from .task import EOS, Question, Task, episode_reward
from .trainer import Sample


@dataclass
class Trajectory:
    """One sample of one prompt: its questions (one per turn) and the /generate record of each turn."""

    group: int
    index: int
    questions: List[Question]
    records: List[Record]


def generate(server, input_ids: Sequence[int], max_new_tokens: int, seed: int) -> dict:
    """One sampled response at temperature 1 over the whole vocabulary, stopping at EOS, with the engine's log-prob of
    every output token."""
    payload = {"input_ids": list(input_ids), "return_logprob": True,
               "sampling_params": {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": max_new_tokens,
                                   "stop_token_ids": [EOS], "sampling_seed": seed}}
    r = server.post("/generate", payload)
    if r.status_code != 200:
        raise RuntimeError(f"/generate failed ({r.status_code}): {r.text[:300]}")
    return r.json()


def run_trajectory(server, task: Task, group: int, index: int, questions: List[Question], seed: int,
                   gate: Optional[Callable[[], None]] = None) -> Trajectory:
    """Turn by turn: the history grows by the model's response and the environment's next turn."""
    history, records = task.prompt(questions[0]), []
    for t, q in enumerate(questions):
        if gate is not None:
            gate()
        sent = time.time()
        out = generate(server, history, len(q.values) + 2, seed * 64 + t)
        records.append(Record(f"g{group}s{index}", t, list(history), out["output_ids"], out["meta_info"], sent,
                              time.time()))
        if t + 1 < len(questions):
            history = history + out["output_ids"] + task.env_turn(q, out["output_ids"], questions[t + 1])
    return Trajectory(group, index, questions, records)


def draw_groups(task: Task, rng: random.Random, prompts: int, turns: int) -> List[List[Question]]:
    return [task.episode(rng, turns) for _ in range(prompts)]


def run_batch(server, task: Task, groups: List[List[Question]], n: int, concurrency: int, seed: int,
              gate: Optional[Callable[[], None]] = None) -> List[Trajectory]:
    """n samples of every group, samples of a group submitted back to back, at most `concurrency` trajectories in
    flight; trajectories in group order."""
    jobs = [(g, i) for g in range(len(groups)) for i in range(n)]
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(lambda gi: run_trajectory(server, task, gi[0], gi[1], groups[gi[0]],
                                                      seed + gi[0] * n + gi[1], gate), jobs))


def to_samples(trajs: Sequence[Trajectory], order: Dict[str, int],
               stale_prefix: Optional[Dict[int, int]] = None, publications: Sequence = ()) -> List[Sample]:
    """The trainer's samples. `stale_prefix` ({id(record): stale positions}, `provenance.stock_stale_prefixes`) for a
    stock server; None on a vradix server (its responses carry per-position provenance). `publications`: the
    publication log, to catch crossings the sampler spans do not record (`provenance.unlabelled_crossing`); a
    sample's meta counts them (`unlabelled_crossing`)."""
    out = []
    for tr in trajs:
        last = tr.records[-1]
        ids = last.input_ids + last.output_ids
        sampled, lps = [0] * len(ids), [0.0] * len(ids)
        versions, classes = [""] * len(ids), [FRESH] * len(ids)
        responses, unlabelled = [], 0
        for r in tr.records:
            p, n = len(r.input_ids), len(r.output_ids)
            assert ids[:p + n] == r.input_ids + r.output_ids, "each turn's prompt is the history so far"
            missed = unlabelled_crossing(r.meta, publications)
            unlabelled += missed
            prov = classify(p, n, r.meta, order, None if stale_prefix is None else stale_prefix[id(r)], missed)
            engine = [lp for lp, *_ in r.meta["output_token_logprobs"]]
            assert len(engine) == n, (len(engine), n)
            for j in range(n):
                sampled[p + j], lps[p + j] = 1, engine[j]
                versions[p + j], classes[p + j] = prov.versions[j], prov.classes[j]
            responses.append(r.output_ids)
        out.append(Sample(tr.group, ids, sampled, lps, versions, classes, episode_reward(tr.questions, responses),
                          {"staleness": [(r.meta.get("vradix_staleness") or {}).get("staleness", 0)
                                         for r in tr.records], "unlabelled_crossing": unlabelled}))
    return out


class Background:
    """`fn()` on a thread; `result()` joins it and re-raises its error."""

    def __init__(self, fn: Callable[[], object]):
        self._out: list = []
        self._err: list = []
        self._t = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._t.start()

    def _run(self, fn):
        try:
            self._out.append(fn())
        except BaseException as e:  # handed to result()
            self._err.append(e)

    def result(self, timeout: Optional[float] = None):
        self._t.join(timeout)
        if self._t.is_alive():
            raise TimeoutError("rollout still running")
        if self._err:
            raise self._err[0]
        return self._out[0]

