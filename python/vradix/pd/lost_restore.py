"""A decode restore that came up short of its promise (pure): the answer names the cause and is retryable.

Decode promises prefill a prefix that its HiCache tiers hold (`decode_prefix_len`); the L3 part of it is restored by
a storage prefetch. When pages are lost between the promise and the restore (another engine's garbage collection, a
lossy store), the restore loads less than it promised and SGLang fails that attempt through its failed-transfer path
with a generic HTTP 500 whose message ends in `MARKER`. Nothing was served and nothing of the lost span was cached
(`test/e2e/test_e2e_pd_l3.py`); the retry is matched again and promises only what decode now holds, so the failure is
transient: vradix answers it with HTTP 503, like the handshake's refusal and a revoked promise, and says why.

Invariant: only SGLang's own lost-restore failure is re-answered (its message carries `MARKER`); every other abort
keeps SGLang's status and message.
"""
from __future__ import annotations

from http import HTTPStatus

#: what SGLang 0.5.23 appends to a decode transfer failure whose HiCache restore failed (`disaggregation/decode.py`)
MARKER = "(HiCache local restore failed on this rank)"

#: transient: the retry promises only what decode's tiers now hold
STATUS = HTTPStatus.SERVICE_UNAVAILABLE


def is_lost_restore(error_message: str) -> bool:
    return MARKER in (error_message or "")


def message(error_message: str) -> str:
    return ("vradix P/D: decode's HiCache restore of the prefix it promised prefill came up short (pages were lost "
            "from its storage between the promise and the restore). Nothing was served or cached; retry: the retry "
            f"is promised only what decode still holds. SGLang: {error_message}")
