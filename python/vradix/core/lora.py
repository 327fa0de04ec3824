"""LoRA-scoped invalidation: (re)loading adapter X invalidates only X's cached entries.

SGLang 0.5.23 already keys LoRA requests apart: every `load_lora_adapter` mints a fresh `lora_id` (a uuid), which
`Req.__init__` appends to `extra_key`, and vradix keeps it as the *suffix* after its epoch prefix. So after X is
unloaded and loaded again (same name, new weights), X's requests match only KV computed with the new adapter, while
the base model's and other adapters' entries keep being shared. What SGLang leaves behind is the old X entries: no
request can match them any more, yet they hold KV slots until LRU pressure reaches them.

vradix frees them when X is unloaded: one pass of SGLang's device eviction order frees every unlocked leaf whose key
carries X's adapter tag, and each parent that becomes one (`LoraRecord.free_entries`). Every node a request of X
inserted carries the tag, because a request's key is the same on every edge from the root, so nothing of another
adapter or of the base model is touched, and no insert pays for remembering nodes. A base-weight publication still
bumps the epoch and invalidates every namespace, adapters included.

Adapter identity beyond one process. The `lora_id` says nothing about an adapter's content: a dynamic load mints a
uuid4 in each process (so two P/D roles never agree on it), and a `--lora-paths` adapter gets `uuid5(name, path)`, the
same after a restart even when the file at that path was retrained. So vradix identifies an adapter by its content
(`content_identity`: a digest of every tensor SGLang loaded for it, and of its config), computed in the scheduler once
per `lora_id` (`LoraRecord.identify`), and every key that leaves the process carries it: the namespace tag of each
LoRA request (`identity.adapter_tag`, which seeds its L3 page hashes) and the P/D handshake (`vradix.pd.handshake`).

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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Optional

from vradix import identity
from vradix.core import deferred_reclaim

if TYPE_CHECKING:
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

logger = logging.getLogger("vradix")

#: hashed first; bump it whenever what `content_identity` covers changes
IDENTITY_VERSION = b"vradix-lora-adapter-identity-v1"

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


def unknown_adapter_identity() -> str:
    return f"lora-nonce:{secrets.token_hex(16)}"


@dataclass
class LoraRecord:
    """The engine's LoRA part: the content identity of every adapter loaded in this process, and what adapter events
    did. Changes only through its methods: `identify`, `identity_of`, `on_load` and `on_unload`."""

    #: adapter loads/unloads seen
    events: int = 0
    tokens_freed: int = 0
    #: lora_id -> the content identity of the adapter loaded under it (`identify`), which every LoRA request's
    #: namespace and P/D handshake carry
    adapter_ids: Dict[str, str] = field(default_factory=dict)

    def identify(self, scheduler: Any, lora_id: Optional[str]) -> Optional[str]:
        """The identity of adapter `lora_id` (None for a base-model request), computed from its loaded content the
        first time this process sees it; a process-local nonce when the scheduler holds no such adapter."""
        if lora_id is None:
            return None
        known = self.adapter_ids.get(lora_id)
        if known is None:
            adapter = loaded_adapter(scheduler, lora_id)
            if adapter is None:
                known = unknown_adapter_identity()
                logger.warning("vradix: no loaded adapter for lora_id %s in this scheduler: its requests get the "
                               "process-local identity %s (no L3 reuse, and a P/D peer refuses their KV)", lora_id,
                               known)
            else:
                known = content_identity(adapter)
            self.adapter_ids[lora_id] = known
        return known

    def identity_of(self, lora_id: Optional[str]) -> Optional[str]:
        """The identity a request of adapter `lora_id` is stamped with: the one identified for it, else (an adapter
        vradix was never shown) a process-local nonce, kept for the `lora_id` so its requests still share KV here."""
        if lora_id is None:
            return None
        known = self.adapter_ids.get(lora_id)
        if known is None:
            known = self.adapter_ids[lora_id] = unknown_adapter_identity()
        return known

    def on_load(self, scheduler: Any, lora_id: str) -> str:
        """After a successful load of `lora_id`: (re)compute its identity from what was just loaded. Returns it."""
        self.events += 1
        self.adapter_ids.pop(lora_id, None)
        ident = self.identify(scheduler, lora_id)
        assert ident is not None, "a named adapter always gets an identity"
        return ident

    def free_entries(self, cache: "UnifiedRadixCache", lora_id: Optional[str]) -> int:
        """Free the unlocked cached entries of adapter `lora_id`: every tree node whose key carries its adapter tag
        (its content identity, `identity.adapter_tag`; every node a request of the adapter inserted, from the root
        on), found in one pass of SGLang's device eviction order (`deferred_reclaim.free_leaves_where`), so no insert
        pays for remembering them. KV that a second `lora_id` of the same content shares is freed with it (it would
        have been reused, not served wrong). Returns tokens freed."""
        adapter_id = self.adapter_ids.get(lora_id) if lora_id is not None else None
        if adapter_id is None:
            return 0
        tag = identity.adapter_tag(adapter_id)
        core = cache.tree_core

        def carries_tag(node_id: int) -> bool:
            extra_key, _ = core.prefetch_anchor_info(node_id)
            return bool(extra_key) and tag in extra_key

        return deferred_reclaim.free_leaves_where(cache, carries_tag)

    def on_unload(self, cache: "UnifiedRadixCache", lora_id: Optional[str]) -> int:
        """At an unload: free the adapter's entries (`free_entries`) and forget its identity (the `lora_id` no longer
        names loaded content). Returns tokens freed."""
        self.events += 1
        freed = self.free_entries(cache, lora_id)
        if lora_id is not None:
            self.adapter_ids.pop(lora_id, None)
        self.tokens_freed += freed
        return freed
