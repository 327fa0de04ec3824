"""Weight version labels as RL frameworks read them (standard library only).

One rule, shared by the response fields (`vradix.core.provenance`: miles' per-forward versions and response segments)
and the consumer API (`vradix.trainer`): a label that is a decimal step number (`"7"`, `" 7 "`, `"-1"`) reads as that
integer, because RL frameworks publish step numbers and compare them as integers; any other label reads as itself.
"""
from __future__ import annotations

from typing import Optional


def step_number(label: str) -> Optional[int]:
    """`label` as an integer when it is a decimal step number (blanks around it and one leading minus allowed), else
    None. Never raises: a label that only looks like one (`"--5"`, `"²"`) is None."""
    text = label.strip()
    digits = text[1:] if text.startswith("-") else text
    return int(text) if digits.isdecimal() else None
