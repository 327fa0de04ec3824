"""LoRA-scoped invalidation: (re)loading adapter X invalidates only X's cached entries.

SGLang 0.5.23 already keys LoRA requests apart: every `load_lora_adapter` mints a fresh `lora_id` (a uuid), which
`Req.__init__` appends to `extra_key`, and vradix keeps it as the *suffix* after its epoch prefix. So after X is
unloaded and loaded again (same name, new weights), X's requests match only KV computed with the new adapter, while
the base model's and other adapters' entries keep being shared. What SGLang leaves behind is the old X entries: no
request can match them any more, yet they hold KV slots until LRU pressure reaches them.

vradix frees them when X is unloaded: one pass of SGLang's device eviction order frees every unlocked leaf whose key
carries X's adapter tag, and each parent that becomes one (`free_adapter_entries`). Every node a request of X inserted
carries the tag, because a request's key is the same on every edge from the root, so nothing of another adapter or
of the base model is touched, and no insert pays for remembering nodes. A base-weight publication still bumps the
epoch and invalidates every namespace, adapters included.

Adapter identity beyond one process. The `lora_id` says nothing about an adapter's content: a dynamic load mints a
uuid4 in each process (so two P/D roles never agree on it), and a `--lora-paths` adapter gets `uuid5(name, path)`, the
same after a restart even when the file at that path was retrained. So vradix identifies an adapter by its content
(`content_identity`: a digest of every tensor SGLang loaded for it, and of its config), computed in the scheduler
once per `lora_id`, and every key that leaves the process carries it: the namespace tag of each LoRA request
(`identity.adapter_tag`, which seeds its L3 page hashes) and the P/D handshake (`vradix.pd.handshake`).

Invariants:
- `Engine.lora.adapter_ids[lora_id]` is the content identity of the adapter loaded as `lora_id` in this process,
  or a process-local nonce when vradix could not read that adapter (never shared across processes: fail closed);
- an entry is replaced at every successful load of its `lora_id` and dropped at its unload;
- equal adapter files (equal tensors as loaded, equal config) give equal identities in every process.
"""
from __future__ import annotations

import hashlib
import json
import logging
import secrets
from typing import TYPE_CHECKING, Optional

from vradix import identity
from vradix.core import deferred_reclaim

if TYPE_CHECKING:
    from vradix.engine import Engine

logger = logging.getLogger("vradix")

#: hashed first; bump it whenever what `content_identity` covers changes
IDENTITY_VERSION = b"vradix-lora-adapter-identity-v1"

def free_adapter_entries(state: Engine, cache, lora_id: Optional[str]) -> int:
    """Free the unlocked cached entries of adapter `lora_id`: every tree node whose key carries its adapter tag (its
    content identity, `identity.adapter_tag`; every node a request of the adapter inserted, from the root on), found
    in one pass of SGLang's device eviction order at the unload (`deferred_reclaim.free_leaves_where`), so no insert
    pays for remembering them. KV that a second `lora_id` of the same content shares is freed with it (it would have
    been reused, not served wrong). Returns tokens freed."""
    adapter_id = state.lora.adapter_ids.get(lora_id) if lora_id is not None else None
    if adapter_id is None:
        return 0
    tag = identity.adapter_tag(adapter_id)
    core = cache.tree_core

    def carries_tag(node_id) -> bool:
        extra_key, _ = core.prefetch_anchor_info(node_id)
        return bool(extra_key) and tag in extra_key

    freed = deferred_reclaim.free_leaves_where(cache, carries_tag)
    state.freed.count(freed)
    return freed


# ---- adapter identity (beyond one process) ----------------------------------------------------------------------
def content_identity(adapter) -> str:
    """The content identity of a loaded SGLang `LoRAAdapter`: its per-layer, embedding and added-token tensors (as
    SGLang holds them, on CPU, after loading and normalising) and its config (rank, alpha, targets, added tokens).
    Equal adapter files give equal identities; a change to any tensor byte, name, dtype or shape, or to any config
    value, changes it (a cryptographic hash over all of them, not the weight fingerprint's GPU digest: the adapter is
    on the host already)."""
    import torch

    tensors = [(f"layer.{name}", t) for layer in adapter.layers for name, t in layer.weights.items()]
    tensors += [(f"embedding.{name}", t) for name, t in adapter.embedding_layers.items()]
    tensors += [(f"added.{name}", t) for name, t in adapter.added_tokens_embeddings.items()]
    config = json.dumps({"hf_config": adapter.config.hf_config, "added_tokens": adapter.config.added_tokens_config},
                        sort_keys=True, default=str)
    h = hashlib.blake2b(IDENTITY_VERSION, digest_size=16)
    _update_with_record(h, config.encode())
    for name, t in sorted(tensors, key=lambda e: e[0]):
        _update_with_record(h, f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        _update_with_record(h, t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return f"lora:{h.hexdigest()}"


def _update_with_record(h, data) -> None:
    """Length-prefixed, so no two sequences of records hash alike by shifting a boundary."""
    h.update(len(memoryview(data).cast("B")).to_bytes(8, "little"))
    h.update(data)


def loaded_adapter(scheduler, lora_id: str):
    """The `LoRAAdapter` SGLang's LoRA manager holds for `lora_id` in this scheduler, or None."""
    runner = getattr(getattr(scheduler, "tp_worker", None), "model_runner", None)
    manager = getattr(runner, "lora_manager", None)
    return getattr(manager, "loras", {}).get(lora_id)


def identify_adapter(state: Engine, scheduler, lora_id: Optional[str]) -> Optional[str]:
    """The identity of adapter `lora_id` (None for a base-model request), computed from its loaded content the first
    time this process sees it; a process-local nonce when the scheduler holds no such adapter."""
    if lora_id is None:
        return None
    known = state.lora.adapter_ids.get(lora_id)
    if known is None:
        adapter = loaded_adapter(scheduler, lora_id)
        if adapter is None:
            known = unknown_adapter_identity()
            logger.warning("vradix: no loaded adapter for lora_id %s in this scheduler: its requests get the "
                           "process-local identity %s (no L3 reuse, and a P/D peer refuses their KV)", lora_id, known)
        else:
            known = content_identity(adapter)
        state.lora.identify(lora_id, known)
    return known


def adapter_identity_of(state: Engine, lora_id: Optional[str]) -> Optional[str]:
    """The identity a request of adapter `lora_id` is stamped with: the one identified for it, else (an adapter
    vradix was never shown) a process-local nonce, kept for the `lora_id` so its requests still share KV here."""
    if lora_id is None:
        return None
    return state.lora.identity_or(lora_id, unknown_adapter_identity())


def unknown_adapter_identity() -> str:
    return f"lora-nonce:{secrets.token_hex(16)}"


def reidentify_loaded_adapter(state: Engine, scheduler, lora_id: str) -> str:
    """After a successful load of `lora_id`: (re)compute its identity from what was just loaded."""
    state.lora.forget(lora_id)
    ident = identify_adapter(state, scheduler, lora_id)
    assert ident is not None, "a named adapter always gets an identity"
    return ident


def forget_adapter(state: Engine, lora_id: Optional[str]) -> None:
    """At unload: the `lora_id` no longer names loaded content."""
    state.lora.forget(lora_id)
