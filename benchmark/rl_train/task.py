"""The synthetic, verifiable task: list operations over digit tokens, behind a shared system prompt, with an exact
reward; single-turn (one question) and multi-turn (the environment appends feedback and asks the next question
about the same list, so each turn's prompt is the whole history so far).

Token ids (the tiny Llama's vocabulary of 512, `vradix.testing.models.llama`): 0-2 are bos/eos/pad, DIGITS the ten
digits, OPS the operations, SEP ends a question (the answer follows), OK/BAD the environment's per-position marks,
NEXT opens the environment's next question. The system prompt is drawn from [SYSTEM_FIRST, VOCAB) and never shares
an id with the task's own tokens.

    single turn:  system | op d1 .. dL SEP            -> answer a1 .. aL EOS
    turn t > 0:   history | marks(t-1) NEXT op d1 .. dL SEP -> answer EOS
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import List, Sequence, Tuple

VOCAB = 512
BOS, EOS, PAD = 0, 1, 2
DIGITS = tuple(range(10, 20))
OPS = {"copy": 30, "reverse": 31, "sort": 32}
SEP, OK, BAD, NEXT = 40, 41, 42, 43
SYSTEM_FIRST = 100
#: the per-position reward a policy that guesses a uniform digit at each position scores, in expectation
CHANCE = 1 / len(DIGITS)


@dataclass(frozen=True)
class Question:
    """One operation on one list of digit values (0-9)."""

    op: str
    values: Tuple[int, ...]

    def tokens(self) -> List[int]:
        return [OPS[self.op]] + [DIGITS[v] for v in self.values] + [SEP]

    def answer(self) -> List[int]:
        """The correct response: the result's digit tokens, then EOS."""
        vals = {"copy": list(self.values), "reverse": list(reversed(self.values)),
                "sort": sorted(self.values)}[self.op]
        return [DIGITS[v] for v in vals] + [EOS]


def digits_of(response: Sequence[int]) -> List[int]:
    """The response up to (excluding) its first EOS: what is scored."""
    out = []
    for tok in response:
        if tok == EOS:
            break
        out.append(tok)
    return out


def score(q: Question, response: Sequence[int]) -> float:
    """Positions right over max(answer length, response length), in [0, 1]: 1 exactly when the response is the
    answer (a missing EOS costs nothing; extra or missing positions count as wrong)."""
    want, got = q.answer()[:-1], digits_of(response)
    right = sum(a == b for a, b in zip(want, got))
    return right / max(len(want), len(got))


def marks(q: Question, response: Sequence[int]) -> List[int]:
    """The environment's feedback on a response: OK or BAD for each position of the answer (without EOS)."""
    got = digits_of(response)
    return [OK if i < len(got) and got[i] == a else BAD for i, a in enumerate(q.answer()[:-1])]


@dataclass
class Task:
    """The task distribution: a shared system prompt and the shape of the questions; every draw is seeded."""

    system: List[int]
    min_len: int = 3
    max_len: int = 6
    ops: Tuple[str, ...] = tuple(OPS)

    @classmethod
    def make(cls, seed: int, system_tokens: int = 128, **kw) -> "Task":
        rng = random.Random(f"{seed}:system")
        return cls([rng.randrange(SYSTEM_FIRST, VOCAB) for _ in range(system_tokens)], **kw)

    def question(self, rng: random.Random) -> Question:
        n = rng.randint(self.min_len, self.max_len)
        return Question(rng.choice(self.ops), tuple(rng.randrange(len(DIGITS)) for _ in range(n)))

    def episode(self, rng: random.Random, turns: int) -> List[Question]:
        """`turns` questions about one list: a fresh op each turn."""
        first = self.question(rng)
        return [first] + [Question(rng.choice(self.ops), first.values) for _ in range(turns - 1)]

    def prompt(self, q: Question) -> List[int]:
        """The first turn's prompt."""
        return self.system + q.tokens()

    @staticmethod
    def env_turn(prev: Question, response: Sequence[int], nxt: Question) -> List[int]:
        """What the environment appends after `response` to `prev` before the model answers `nxt`."""
        return marks(prev, response) + [NEXT] + nxt.tokens()


def episode_reward(questions: Sequence[Question], responses: Sequence[Sequence[int]]) -> float:
    """The mean of the turns' scores."""
    return sum(score(q, r) for q, r in zip(questions, responses)) / len(questions)
