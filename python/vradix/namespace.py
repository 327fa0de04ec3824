"""The epoch namespace: how an epoch's weight identity is written into a request's radix key.

SGLang keys every radix-tree edge by `(extra_key, token)` (`RadixKey.child_key_at`), so two requests whose
`extra_key` differ live in disjoint subtrees of the same tree, in both the Rust and the Python TreeCore. The same
`extra_key` seeds the HiCache storage page-hash chain (`storage_namespace_seed`), in Python and natively in the Rust
TreeCore. vradix stamps a namespace as a *prefix* of `extra_key`:

    extra_key = "\x1evradix:[<scope>\x1c]<weight_id>[\x1d<epoch>]\x1f" + ["\x1eadapter:<adapter id>\x1f"]
                + (user extra_key + LoRA suffix, or "")

The namespace is built from the epoch's global `weight_id` (`vradix.identity`), so L3 keys of equal identities are
equal across restarts and engines, and keys of different weights never collide. The `\x1d<epoch>` suffix is added only
when an earlier epoch of the same process already used that `weight_id` (equal weights published again, or a
lock-aware flush, which keeps the weights): inside one process every epoch has its own namespace, and every key that
carries a suffix still names the same weights. A LoRA request's key also carries its adapter's *content* identity
(`vradix.core.lora.content_identity`, the adapter tag), right after the namespace: SGLang's `lora_id` is a per-load uuid4,
or `uuid5(name, path)` for `--lora-paths` (equal across restarts even when the file at that path was retrained), so
only the content tag keeps a retrained adapter's L3 pages apart from the old one's. On a P/D role the namespace also
starts with the role's scope (role and KV layout, `vradix.pd.layout`), so the roles' L3 objects never mix, in any
storage backend.

Invariants:
- The prefix is the only place the marker `\x1evradix:` may appear; a user `extra_key` or `cache_salt` containing it
  (or its control character) is rejected, so a user key can never forge or collide with a namespace, in the tree or
  in the HiCache storage seed, which hashes `extra_key` and `cache_salt` together.
- Prefix, never suffix: SGLang reads the LoRA id from the *end* of `extra_key` (`LoRANameTable.resolve`).
- The adapter tag starts with the reserved control character `\x1e`, so no user key can forge it either.
- Two epochs of one process never share a namespace string (`state.EpochState.bind_identity`).
"""
from __future__ import annotations

from typing import Optional

MARKER = "\x1evradix:"
_END = "\x1f"
#: separates a reused weight_id from its epoch; a control character, so no weight_id can contain it
_EPOCH = "\x1d"
#: ends a role-local scope before the weight_id (`vradix.pd.layout`); a control character, like the others
SCOPE_END = "\x1c"


class ReservedNamespaceError(ValueError):
    """A user-supplied cache key tried to use vradix's reserved epoch marker."""


def namespace(weight_id: str, epoch: Optional[int] = None, scope: Optional[str] = None) -> str:
    """The extra_key prefix of an epoch with identity `weight_id`; `epoch` disambiguates a reused identity; `scope`
    makes it role-local (a P/D role's KV layout, `vradix.pd.layout.scope_of`)."""
    suffix = "" if epoch is None else f"{_EPOCH}{epoch}"
    scoped = "" if scope is None else f"{scope}{SCOPE_END}"
    return f"{MARKER}{scoped}{weight_id}{suffix}{_END}"


def check_user_key(user_key: Optional[str]) -> None:
    """Raise ReservedNamespaceError if `user_key` contains the reserved marker (or its control characters)."""
    if user_key and (MARKER in user_key or "\x1e" in user_key):
        raise ReservedNamespaceError(
            "extra_key/cache_salt contains the reserved vradix epoch marker (\\x1evradix:); "
            "this namespace is owned by the engine and cannot be set by a request"
        )


ADAPTER = "\x1eadapter:"


def adapter_tag(adapter_id: Optional[str]) -> str:
    """The part of a LoRA request's key that names its adapter's content ("" for a base-model request)."""
    return "" if adapter_id is None else f"{ADAPTER}{adapter_id}{_END}"


def stamped(prefix: str, user_key: Optional[str], adapter_id: Optional[str] = None) -> str:
    """The extra_key a request is matched and inserted under: its epoch's namespace `prefix`, its adapter's content
    tag (LoRA requests only), then its user key (which ends with SGLang's `lora_id`). The common request (no user key,
    no adapter) gets the namespace string itself, not a copy."""
    if adapter_id is None and not user_key:
        return prefix
    return prefix + adapter_tag(adapter_id) + (user_key or "")


def prefix_of(extra_key: Optional[str]) -> Optional[str]:
    """The namespace prefix of a stamped extra_key, or None for an unstamped key."""
    if not extra_key or not extra_key.startswith(MARKER):
        return None
    return extra_key[: extra_key.index(_END, len(MARKER)) + 1]


def weight_id_of(extra_key: Optional[str]) -> Optional[str]:
    """The weight_id a stamped extra_key's namespace was built from (without any epoch suffix), or None."""
    prefix = prefix_of(extra_key)
    if prefix is None:
        return None
    body = prefix[len(MARKER):-len(_END)]
    # a role-local namespace (`vradix.pd.layout`) puts its scope before the weight_id
    return body.rsplit(SCOPE_END, 1)[-1].split(_EPOCH, 1)[0]
