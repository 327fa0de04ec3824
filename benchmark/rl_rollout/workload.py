"""Seeded RL traffic: GRPO groups, synthetic multi-turn agent sessions and real ones (ShareGPT, sharegpt.py), as tasks a rollout worker runs start to finish."""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import List

WORKLOADS = ("grpo", "agent", "sharegpt")
#: what runs without --workload (sharegpt needs a dataset download: sharegpt.py)
DEFAULT_WORKLOADS = ("grpo", "agent")
FIRST_TOKEN_ID = 3  # ids 0-2 are bos/eos/pad in the tiny model; ids are drawn from [3, vocab)


@dataclass
class Turn:
    max_new_tokens: int
    tool_result: List[int]   # appended after the model's output, before the next turn (empty for the last turn)


@dataclass
class Task:
    """A unit a rollout worker runs start to finish: one GRPO sample, or one agent session (turns in order)."""

    name: str
    prefix: List[int]
    turns: List[Turn]


def _tokens(rng: random.Random, n: int, vocab: int) -> List[int]:
    return [rng.randrange(FIRST_TOKEN_ID, vocab) for _ in range(n)]


def _length(rng: random.Random, lo: int, hi: int) -> int:
    """Response lengths: log-uniform in [lo, hi] (many short, a few long, like RL rollouts)."""
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def grpo_tasks(a, rng: random.Random) -> List[Task]:
    system = _tokens(rng, a.system_tokens, a.vocab)
    tasks = []
    for p in range(a.prompts):
        prompt = system + _tokens(rng, rng.randint(a.question_tokens[0], a.question_tokens[1]), a.vocab)
        for k in range(a.samples):
            tasks.append(Task(f"p{p}s{k}", prompt, [Turn(_length(rng, *a.response_tokens), [])]))
    return tasks


def agent_tasks(a, rng: random.Random) -> List[Task]:
    system = _tokens(rng, a.system_tokens, a.vocab)
    tasks = []
    for s in range(a.sessions):
        task_prompt = system + _tokens(rng, rng.randint(a.question_tokens[0], a.question_tokens[1]), a.vocab)
        turns = [Turn(_length(rng, *a.response_tokens),
                      _tokens(rng, rng.randint(a.tool_tokens[0], a.tool_tokens[1]), a.vocab) if t < a.turns - 1
                      else []) for t in range(a.turns)]
        tasks.append(Task(f"session{s}", task_prompt, turns))
    return tasks


def build_tasks(workload: str, a) -> List[Task]:
    rng = random.Random(f"{a.seed}:{workload}")
    if workload == "sharegpt":
        from .sharegpt import sharegpt_tasks
        return sharegpt_tasks(a, rng)
    return grpo_tasks(a, rng) if workload == "grpo" else agent_tasks(a, rng)
