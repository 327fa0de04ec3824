"""The epoch namespace: how a weight epoch is written into a request's radix key.

SGLang keys every radix-tree edge by `(extra_key, token)` (`RadixKey.child_key_at`), so two requests whose
`extra_key` differ live in disjoint subtrees of the same tree, in both the Rust and the Python TreeCore, and in the
HiCache page-hash chain. vradix stamps the epoch as a *prefix* of `extra_key`:

    extra_key = "\x1evradix:e<epoch>\x1f" + (user extra_key + LoRA suffix, or "")

Invariants:
- The prefix is the only place the marker `\x1evradix:` may appear; a user `extra_key` or `cache_salt` containing it
  (or its control character) is rejected, so a user key can never forge or collide with an epoch namespace, in the
  tree or in the HiCache storage seed, which hashes `extra_key` and `cache_salt` together.
- Prefix, never suffix: SGLang reads the LoRA id from the *end* of `extra_key` (`LoRANameTable.resolve`).
- Two epochs never share a namespace string, so no key built under epoch e can match a node inserted under e' != e.
"""
from __future__ import annotations

from typing import Optional

MARKER = "\x1evradix:"
_END = "\x1f"


class ReservedNamespaceError(ValueError):
    """A user-supplied cache key tried to use vradix's reserved epoch marker."""


def namespace(epoch: int) -> str:
    """The extra_key prefix of epoch `epoch`."""
    return f"{MARKER}e{epoch}{_END}"


def check_user_key(user_key: Optional[str]) -> None:
    """Raise ReservedNamespaceError if `user_key` contains the reserved marker (or its control characters)."""
    if user_key and (MARKER in user_key or "\x1e" in user_key):
        raise ReservedNamespaceError(
            "extra_key/cache_salt contains the reserved vradix epoch marker (\\x1evradix:); "
            "this namespace is owned by the engine and cannot be set by a request"
        )


def stamped(epoch: int, user_key: Optional[str]) -> str:
    """The extra_key a request of epoch `epoch` with user key `user_key` is matched and inserted under."""
    return namespace(epoch) + (user_key or "")


def epoch_of(extra_key: Optional[str]) -> Optional[int]:
    """The epoch encoded in a stamped extra_key, or None for an unstamped key."""
    if not extra_key or not extra_key.startswith(MARKER):
        return None
    end = extra_key.index(_END, len(MARKER))
    return int(extra_key[len(MARKER) + 1 : end])
