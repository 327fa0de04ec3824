"""Content fingerprint of a model's loaded tensors: two engines with equal fingerprints hold the same weights.

    fingerprint_module(model) -> str              32 hex chars over named_parameters() and named_buffers()
    fingerprint_named_tensors(items) -> str       the same over any (name, tensor) pairs
    tensor_lanes(t) -> int64[LANES]               one tensor's content digest, on its device

Data path: every tensor's bytes (row-major, as `t.contiguous()` lays them out) are read as 32-bit words, with a
zero-padded tail word, and digested on the tensor's device into LANES int64 lanes (`reference.fingerprint_words`
defines the digest; Triton and the CUDA extension compute the same bits). The lanes of all tensors on a device are
written into one [T, LANES] buffer and read to the host once. The host then hashes the records (name, dtype, shape,
lanes), sorted by name, with SHA-256.

Invariants:
* Every byte of every tensor is read: no sampling.
* A fingerprint depends only on the name -> (dtype, shape, bytes) mapping. It does not depend on the order of the
  items, the device, contiguity or strides, the implementation (`VRADIX_KERNELS`, as in `vradix.kernels`), or the run.
* A change to any single 32-bit word of any tensor always changes its lanes (each lane moves by a nonzero amount below
  2**32). Swapped or shifted words change them except with negligible probability. Names, dtypes and shapes go into the
  hash directly.
* Not cryptographic. The lanes are sums of a non-cryptographic mix, which guards against accidental collisions. Someone
  who can choose weights can construct a collision. The SHA-256 on the host only combines the records.
"""
from __future__ import annotations

import hashlib
import struct
from typing import Iterable, Optional

import torch

from vradix.kernels import cuda_ext, impl_for, reference, triton_module
from vradix.kernels.reference import LANES

#: Hashed first. Bump it whenever the digest (constants, word layout, record encoding) changes, so fingerprints from
#: different definitions never compare equal.
VERSION = b"vradix-weight-fingerprint-v1"
HEX_CHARS = 32


def word_segments(t: torch.Tensor) -> list[tuple[torch.Tensor, int]]:
    """The tensor's bytes as (1-D int32 tensor, position of its first word) segments on t's device.

    The aligned body is a view when the layout allows it. A non-contiguous tensor, or one whose bytes are not 4-byte
    aligned in its storage, is copied once. A trailing partial word is copied into a zero-padded word at position
    len(body).
    """
    data = t.detach().contiguous().reshape(-1).view(torch.uint8)
    if data.storage_offset() % 4:  # an int32 view needs 4-byte alignment
        data = data.clone()
    n = data.numel()
    body = n - n % 4
    segments = [(data[:body].view(torch.int32), 0)] if body else []
    if n > body:
        tail = torch.zeros(4, dtype=torch.uint8, device=data.device)
        tail[: n - body] = data[body:]
        segments.append((tail.view(torch.int32), body // 4))
    return segments


def digest_words(words: torch.Tensor, first_pos: int, out: torch.Tensor, impl: Optional[str] = None) -> None:
    """out (int64 [LANES], on the words' device) += the digest of 1-D int32 `words` at positions first_pos, ..."""
    name = impl_for(words, impl)
    if name == "cuda":
        cuda_ext().fingerprint_words(words, int(first_pos), out)
    elif name == "triton":
        triton_module().fingerprint_words(words, int(first_pos), out)
    else:
        reference.fingerprint_words(words, int(first_pos), out)


def digest_into(t: torch.Tensor, out: torch.Tensor, impl: Optional[str] = None) -> None:
    """out (int64 [LANES], zeroed, on t's device) += the digest of t's bytes."""
    if t.device.type == "meta":
        raise ValueError("cannot fingerprint a meta tensor (its weights are not loaded)")
    for words, first_pos in word_segments(t):
        digest_words(words, first_pos, out, impl)


def tensor_lanes(t: torch.Tensor, impl: Optional[str] = None) -> torch.Tensor:
    """The content digest of one tensor: int64 [LANES] on t's device (no host read)."""
    out = torch.zeros(LANES, dtype=torch.int64, device=t.device)
    digest_into(t, out, impl)
    return out


def lanes_on_host(tensors: list[torch.Tensor], impl: Optional[str] = None) -> torch.Tensor:
    """int64 [len(tensors), LANES] on the host. There is one buffer and one device-to-host read per device."""
    rows = torch.empty(len(tensors), LANES, dtype=torch.int64)
    by_device: dict[torch.device, list[int]] = {}
    for i, t in enumerate(tensors):
        by_device.setdefault(t.device, []).append(i)
    for device, idx in by_device.items():
        buf = torch.zeros(len(idx), LANES, dtype=torch.int64, device=device)
        for k, i in enumerate(idx):
            digest_into(tensors[i], buf[k], impl)
        rows[idx] = buf.cpu()
    return rows


def record(name: str, t: torch.Tensor, lanes: list[int]) -> bytes:
    """One tensor's unambiguous SHA-256 input: length-prefixed name and dtype, the shape, then the lanes."""
    return record_of(name, str(t.dtype), tuple(t.shape), lanes)


def record_of(name: str, dtype: str, shape: tuple, lanes: list[int]) -> bytes:
    """`record` from a tensor's name, dtype name, shape and lanes (a tensor that is no longer at hand)."""
    name_b, dtype_b = name.encode(), dtype.encode()
    return b"".join([struct.pack("<I", len(name_b)), name_b, struct.pack("<I", len(dtype_b)), dtype_b,
                     struct.pack(f"<I{len(shape)}q", len(shape), *shape), struct.pack(f"<{LANES}q", *lanes)])


def fingerprint_named_tensors(items: Iterable[tuple[str, torch.Tensor]], impl: Optional[str] = None) -> str:
    """Fingerprint of a name -> tensor mapping (32 hex chars). The items are taken in name order, and a repeated name
    is an error."""
    entries = sorted(((str(name), t) for name, t in items), key=lambda e: e[0])
    for (a, _), (b, _) in zip(entries, entries[1:]):
        if a == b:
            raise ValueError(f"tensor name {a!r} appears twice")
    lanes = lanes_on_host([t for _, t in entries], impl)
    h = hashlib.sha256(VERSION)
    h.update(struct.pack("<Q", len(entries)))
    for (name, t), row in zip(entries, lanes.tolist()):
        h.update(record(name, t, row))
    return h.hexdigest()[:HEX_CHARS]


def fingerprint_module(model: torch.nn.Module, impl: Optional[str] = None) -> str:
    """Fingerprint of everything a module has loaded: `named_parameters()` and `named_buffers()`.

    Tied parameters count once, under their first name, which is PyTorch's de-duplication. Buffers that are computed
    rather than loaded, such as rotary tables, are included: an engine that computes them differently gets a different
    fingerprint, which is the safe direction.
    """
    return fingerprint_named_tensors(list(model.named_parameters()) + list(model.named_buffers()), impl)


__all__ = ["VERSION", "LANES", "word_segments", "digest_words", "tensor_lanes", "lanes_on_host", "fingerprint_named_tensors",
           "fingerprint_module", "record", "record_of"]
