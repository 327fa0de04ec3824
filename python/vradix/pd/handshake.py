"""The P/D weight-identity handshake (pure): prefill names the weights (and, for a LoRA request, the adapter content)
its KV was computed with, decode refuses KV that does not match what it serves the request with.

SGLang's P/D protocol carries no weight version. What prefill sends decode with a request's last chunk is one row of
`MetadataBuffers` per buffer, moved by the transfer engine with the KV. The `bootstrap_room` row is 64 bytes (8 uint64
slots, padded for the RDMA minimum) of which SGLang uses slot 0; vradix writes the prefill identity into the other 56:

    bytes 0..6   MAGIC (b"vradix1")     absent (zeros) when prefill runs without vradix
    byte  7      flags                  bit 0: the request crossed a publication on prefill (its KV mixes weights)
                                        bit 1: prefill computed the KV with a LoRA adapter
    bytes 8..23  blake2b-128 of the weight_id, and of the adapter's content identity for a LoRA request (`digest`;
                 what is compared)
    bytes 24..55 the weight_id's first 32 UTF-8 bytes (what error messages show)

Invariants:
- decode commits a request's transferred KV only when prefill's identity is present, unmixed, and its digest equals
  the digest of the `weight_id` the decode request is bound to (the namespace its prefix was matched and promised in)
  and of the content identity of the adapter decode serves it with (`vradix.core.lora`; none for the base model). Each
  role mints its own `lora_id` per load, so the `lora_id` is never compared: equal adapter files pass, an adapter
  reloaded with other content on one role does not;
- anything else is a `Mismatch`: the request fails with HTTP 503 (retryable) and a message naming both identities,
  and none of its KV is inserted into decode's tree.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from http import HTTPStatus
from typing import Optional, Sequence

from vradix import identity
from vradix.request import HistoryEntry

MAGIC = b"vradix1"
FLAG_MIXED = 0x01
FLAG_ADAPTER = 0x02
SIZE = 56  # bytes 8..64 of the bootstrap_room row
SHOWN = 32
#: a mismatch is transient (a publication is reaching the roles at different times): retry
STATUS = HTTPStatus.SERVICE_UNAVAILABLE


@dataclass(frozen=True)
class PrefillIdentity:
    """What decode reads back: the digest it compares, a readable prefix of the weight_id, and whether prefill's KV
    for the request spans a publication."""

    digest: bytes
    shown: str
    mixed: bool
    #: whether prefill computed the KV with a LoRA adapter
    adapter: bool = False


def digest(weight_id: str, adapter_id: Optional[str] = None) -> bytes:
    """What the roles compare: the weight_id's digest for a base-model request; for a LoRA request, a digest of the
    (weight_id, adapter content identity) pair, domain-separated and length-prefixed so no pair equals another pair
    or a bare weight_id."""
    if adapter_id is None:
        return hashlib.blake2b(weight_id.encode(), digest_size=16).digest()
    w = weight_id.encode()
    return hashlib.blake2b(len(w).to_bytes(4, "little") + w + adapter_id.encode(), digest_size=16,
                           person=b"vradix-lora").digest()


def encode(weight_ids: Sequence[str], adapter_id: Optional[str] = None) -> bytes:
    """The 56 bytes prefill sends for a request whose KV was computed under `weight_ids` (its provenance history, in
    order; more than one distinct id means it crossed a publication) with adapter `adapter_id` (None: base model)."""
    if not weight_ids:
        raise ValueError("a request's KV has at least one identity")
    mixed = len(set(weight_ids)) > 1
    last = weight_ids[-1]
    shown = last.encode()[:SHOWN]
    flags = (FLAG_MIXED if mixed else 0) | (FLAG_ADAPTER if adapter_id is not None else 0)
    out = MAGIC + bytes([flags]) + digest(last, adapter_id) + shown.ljust(SHOWN, b"\0")
    assert len(out) == SIZE
    return out


def decode(raw: bytes) -> Optional[PrefillIdentity]:
    """Read back what `encode` wrote; None when prefill wrote no identity (no vradix on prefill)."""
    raw = bytes(raw)
    if len(raw) != SIZE or raw[:len(MAGIC)] != MAGIC:
        return None
    return PrefillIdentity(digest=raw[8:24], shown=raw[24:].rstrip(b"\0").decode(errors="replace"),
                           mixed=bool(raw[7] & FLAG_MIXED), adapter=bool(raw[7] & FLAG_ADAPTER))


def mismatch(prefill: Optional[PrefillIdentity], decode_weight_id: str, rid: str,
             adapter_id: Optional[str] = None) -> Optional[str]:
    """None when decode may commit the request's KV; otherwise the error the client gets, naming both identities.
    `adapter_id` is the content identity of the adapter decode serves the request with (None: base model)."""
    if prefill is None:
        why = "prefill sent no weight identity (is vradix installed on the prefill role?)"
    elif prefill.mixed:
        why = f"prefill computed its KV across a publication (ending under weight_id {prefill.shown!r})"
    elif prefill.digest != digest(decode_weight_id, adapter_id):
        why = f"prefill computed its KV under weight_id {prefill.shown!r}{adapter_side(prefill.adapter, adapter_id)}"
    else:
        return None
    hint = (" Both roles must name equal weights with the same id: run them with --vradix-weight-identity "
            "fingerprint or declared (a nonce identity never matches across processes)."
            if decode_weight_id.startswith("nonce:") else "")
    if adapter_id is not None or (prefill is not None and prefill.adapter):
        hint += (" A LoRA adapter is identified by its content: load the same adapter files under the same name on "
                 "both roles.")
    decoded = "" if adapter_id is None else f" with LoRA adapter {adapter_id!r}"
    return (f"vradix P/D weight-identity mismatch for request {rid}: {why}, but decode serves it under weight_id "
            f"{decode_weight_id!r}{decoded}. Nothing was cached; retry once both roles serve the same weights.{hint}")


def adapter_side(prefill_adapter: bool, decode_adapter_id: Optional[str]) -> str:
    """How a mismatch message describes prefill's adapter ("" when neither role used one)."""
    if not prefill_adapter:
        return "" if decode_adapter_id is None else " without a LoRA adapter"
    if decode_adapter_id is None:
        return " with a LoRA adapter"
    return " with a LoRA adapter (its adapter content, or its weights, differ from decode's)"


def sent_weight_ids(kv_history: Sequence[HistoryEntry], prompt_len: int) -> list:
    """The weight_ids under which the KV prefill sends (positions `[0, prompt_len)`) was computed: the entries of the
    request's provenance history (`request.HistoryEntry`) that start inside the prompt, in order. A crossing after
    the prompt was computed adds an entry at `prompt_len`, which covers no sent position."""
    return [entry.weight_id for entry in kv_history if entry.start < prompt_len] or [kv_history[0].weight_id]


class RoleIdentityError(ValueError):
    """A P/D role whose weight identity mode can never pass the handshake (refused at startup)."""


def check_role_identity(role: Optional[str], mode: str, weight_version: Optional[str]) -> None:
    """Raise RoleIdentityError when a P/D role (`prefill` or `decode`) would serve under an identity the other role
    cannot share: `nonce` (each process draws its own), or `declared` without a declared startup label (the startup
    epoch then gets a nonce). Either way every request would fail the handshake until a publication. Non-P/D engines
    (`role` None or `null`) may use any mode."""
    if role not in ("prefill", "decode"):
        return
    if mode == "nonce":
        why = "the nonce identity is drawn per process, so the other role never shares it"
    elif mode == "declared" and not identity.is_declaration(weight_version):
        why = (f"the declared identity needs a startup label: --weight-version is {weight_version!r}, so the startup "
               f"weights get a nonce the other role never shares")
    else:
        return
    raise RoleIdentityError(
        f"vradix: a {role}-role engine needs a weight identity both P/D roles compute equally for equal weights, but "
        f"{why}; every request would fail the weight-identity handshake. Start both roles without "
        f"--vradix-weight-identity (auto: fingerprint on a P/D role), with --vradix-weight-identity fingerprint, or "
        f"with --vradix-weight-identity declared and the same --weight-version.")
