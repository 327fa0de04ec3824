"""Which HiCache storage (L3) prefetch policy a role's restore needs: the configuration half of "decode keeps the
prefix it promised".

A decode-role engine matches a prefix in its own tree (device, host and, with L3, storage) and promises that length
to prefill (`decode_prefix_len`); prefill then sends only the rest. The L3 part of that prefix is restored by a
storage prefetch. SGLang's `best_effort` and `timeout` policies let a request run with whatever part of the prefetch
has landed, so the restored prefix can end short of the promise: decode would then hold neither the promised KV nor a
transfer of it. Only `wait_complete` makes the request wait for the whole prefetch. DCP decode shards each page's KV
across the DCP group; a partial prefetch leaves the shards disagreeing on the prefix length, so it needs
`wait_complete` as well.

Rule (`check`): an engine with L3 storage attached whose role is `decode`, or whose `dcp_size` > 1, must run the
prefetch policy `wait_complete`. The policy checked is the *effective* one: at startup the server flag; at runtime
attach the policy the attach request names, else the one the server was started with (`effective_policy`). Without
L3 the prefetch policy is never used, so nothing is required. Violations raise `RestorePolicyError` naming the role,
the storage backend, the policy and the fix; nothing is attached or started.
"""
from __future__ import annotations

from typing import Optional

REQUIRED = "wait_complete"


class RestorePolicyError(ValueError):
    """An L3 prefetch policy that cannot keep a role's restore promises (refused at startup or attach)."""


def requires_wait_complete(role: Optional[str], dcp_size: int, storage_backend: Optional[str]) -> bool:
    """Whether an engine of `role` (`prefill`, `decode`, or None/`null` for a non-P/D engine) with this DCP size and
    L3 storage backend must restore with `wait_complete`."""
    if storage_backend is None:
        return False
    return role == "decode" or dcp_size > 1


def effective_policy(requested: Optional[str], configured: str) -> str:
    """The prefetch policy an attach runs with: the one it requests, else the server's configured one."""
    return requested if requested is not None else configured


def check(role: Optional[str], dcp_size: int, storage_backend: Optional[str], policy: str) -> None:
    """Raise RestorePolicyError when `policy` cannot keep this role's restore promises (see the module rule)."""
    if not requires_wait_complete(role, dcp_size, storage_backend) or policy == REQUIRED:
        return
    who = " and ".join(w for w in (("a decode-role engine" if role == "decode" else None),
                                   (f"decode context parallelism (dcp_size={dcp_size})" if dcp_size > 1 else None))
                       if w)
    raise RestorePolicyError(
        f"vradix: {who} with HiCache L3 storage ({storage_backend!r}) requires --hicache-storage-prefetch-policy "
        f"{REQUIRED}, got {policy!r}: with any other policy a storage restore can end short of the prefix decode "
        f"promised to prefill. Set the policy to {REQUIRED} (at startup, or in the attach request's "
        f"hicache_storage_prefetch_policy).")
