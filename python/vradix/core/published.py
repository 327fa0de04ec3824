"""What was published into a model, and the weight identity it proves on any parallel layout.

Data path: every (name, tensor) pair that reaches a model's `load_weights` (the checkpoint at startup, and
`update_weights_from_disk`, `_from_tensor`, `_from_distributed`, `_from_ipc` afterwards) passes a `Tap`. These are
the named, unsharded tensors the publisher sent, before any TP/PP/EP weight loader slices them, so every rank of every
layout sees the same stream. Each name has one owner rank in the TP group (`owner_of`); only the owner digests the
tensor (`vradix.kernels.fingerprint` lanes, every byte, on the tensor's device), so the hashing cost per rank falls
with TP. Every rank keeps the names it saw. At the identity point (engine start, or a publication's bump) the ranks
exchange what they hold once (`vradix.scheduler.publication`, one all-gather) and `identity_of` hashes the union, in
name order.

Assumption: every rank that receives a name receives the same tensor under it, as `load_weights` expects (it
takes unsharded tensors and slices them itself); a name only one rank digests vouches for all ranks.

Invariants:
- `fingerprint_of` depends only on the engine salt (architecture, dtype, quantization: what turns the same tensors
  into the same computation) and the name -> (dtype, shape, bytes) mapping: not on the TP size, the rank that owned
  a name, the order of the tensors, or how a bucketed update split them into buckets (a name loaded twice counts with
  its last value, as the model holds it);
- a publication that loads every name the engine started with is complete: its identity is that of a fresh engine
  started on the same weights. One that loads fewer chains onto the identity before it, so the identity names a
  history of publications from a proven start (equal histories, equal identities; never equal for different weights
  unless the digest collides);
- a load that raised on any rank taints the publication (`Outcome.TAINTED`): the weights are partly written, and the
  caller gives the epoch a nonce. A publication no tap saw (a `direct` tensor load, P2P/RDMA writes, a startup that
  bypassed `load_weights`) or ranks that saw different names are `UNTAPPED`/`INCONSISTENT`: the caller falls back
  to the layout-dependent fingerprint of the loaded shards, which is safe but matches only the same layout.
"""
from __future__ import annotations

import contextlib
import hashlib
import struct
import zlib
from dataclasses import dataclass, field
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

import torch

from vradix.kernels import fingerprint

#: Hashed first. Bump it whenever what is hashed changes, so identities from different definitions never compare equal
#: (and never equal `vradix.identity.fingerprint_model`'s, which hashes loaded shards).
VERSION = b"vradix-published-weights-v1"
CHAIN = b"vradix-published-chain-v1"
#: the model attribute that holds its `PublishedWeights` (the record belongs to the model it describes)
ATTR = "_vradix_published"


class Outcome:
    COMPLETE = "complete"  # every name of the start: the identity of the weights alone
    CHAINED = "chained"  # some names: chained onto the previous identity
    TAINTED = "tainted"  # a load raised: the weights are partly written
    UNTAPPED = "untapped"  # weights changed where no tap saw them
    INCONSISTENT = "inconsistent"  # ranks saw different names


def owner_of(name: str, world: int) -> int:
    """The rank (in a TP group of `world` ranks) that digests tensor `name`; the same on every layout's ranks."""
    return zlib.crc32(name.encode()) % world if world > 1 else 0


@dataclass
class Pending:
    """What the taps of one rank saw since the last identity point: the records of the names it owns, the names it
    saw, and whether a load raised."""

    lanes: Dict[str, Tuple[str, tuple, torch.Tensor]] = field(default_factory=dict)
    names: set = field(default_factory=set)
    tainted: bool = False
    tensors: int = 0
    bytes_digested: int = 0

    def records(self) -> Dict[str, bytes]:
        """name -> `fingerprint.record_of` bytes for the names this rank owns (one device-to-host read per device)."""
        out: Dict[str, bytes] = {}
        by_device: Dict[torch.device, List[str]] = {}
        for name, (_, _, lanes) in self.lanes.items():
            by_device.setdefault(lanes.device, []).append(name)
        for names in by_device.values():
            rows = torch.stack([self.lanes[n][2] for n in names]).cpu().tolist()
            for name, row in zip(names, rows):
                dtype, shape, _ = self.lanes[name]
                out[name] = fingerprint.record_of(name, dtype, shape, row)
        return out

    def share(self) -> dict:
        """This rank's part of the exchange (picklable)."""
        return {"records": self.records(), "names": names_digest(self.names), "count": len(self.names),
                "tainted": self.tainted}


@dataclass
class PublishedWeights:
    """A model's record of what was published into it: what the taps saw since the last identity point (`pending`)
    and the names the engine started with (`start_names`, None when the start was not tapped)."""

    pending: Pending = field(default_factory=Pending)
    start_names: Optional[frozenset] = None
    tapping: int = 0

    def take(self) -> Pending:
        """The pending publication, leaving an empty one (each identity point consumes what it saw)."""
        taken, self.pending = self.pending, Pending()
        return taken


def of(model) -> PublishedWeights:
    """The model's `PublishedWeights`, created empty on first use."""
    rec = model.__dict__.get(ATTR)
    if rec is None:
        rec = PublishedWeights()
        model.__dict__[ATTR] = rec
    return rec


class Tap:
    """Records every (name, tensor) that reaches one model's `load_weights` into its `PublishedWeights.pending`:
    names always; lanes only for the names rank `rank` of `world` owns, digested on `digest_device` (a CPU tensor
    bound for a GPU model is copied there first, where the digest runs at memory bandwidth)."""

    def __init__(self, model, rank: int, world: int, digest_device: Optional[torch.device] = None):
        self.record, self.rank, self.world = of(model), rank, world
        self.digest_device = digest_device

    def add(self, name: str, tensor: torch.Tensor) -> None:
        pending = self.record.pending
        pending.names.add(name)
        pending.tensors += 1
        if owner_of(name, self.world) != self.rank:
            return
        t = tensor
        if self.digest_device is not None and t.device.type == "cpu" and self.digest_device.type != "cpu":
            t = t.to(self.digest_device, non_blocking=True)
        pending.lanes[name] = (str(t.dtype), tuple(t.shape), fingerprint.tensor_lanes(t))
        pending.bytes_digested += t.numel() * t.element_size()

    def stream(self, weights: Iterable) -> Iterator:
        for name, tensor in weights:
            self.add(name, tensor)
            yield name, tensor


@contextlib.contextmanager
def tapping(model, rank: int, world: int, digest_device: Optional[torch.device] = None):
    """While inside, every call of `model.load_weights` passes its weights through a `Tap`; a call that raises taints
    the pending publication. Reentrant: an inner `tapping` of the same model adds nothing (one tap per tensor).

    Why the instance attribute: every model class has its own `load_weights`, so the one place all weight sources meet
    is the model instance's; SGLang's own loaders shadow it the same way (`model.load_weights = proxy`)."""
    record = of(model)
    if record.tapping:
        record.tapping += 1
        try:
            yield record
        finally:
            record.tapping -= 1
        return
    tap = Tap(model, rank, world, digest_device)
    had_own = "load_weights" in model.__dict__
    own = model.__dict__.get("load_weights")
    original = model.load_weights

    def load_weights(weights, *args, **kwargs):
        try:
            return original(tap.stream(weights), *args, **kwargs)
        except BaseException:
            record.pending.tainted = True
            raise

    model.load_weights = load_weights
    record.tapping = 1
    try:
        yield record
    finally:
        record.tapping = 0
        if had_own:
            model.load_weights = own
        else:
            del model.load_weights


def names_digest(names: Iterable[str]) -> str:
    h = hashlib.sha256()
    for name in sorted(names):
        b = name.encode()
        h.update(struct.pack("<I", len(b)) + b)
    return h.hexdigest()


@dataclass(frozen=True)
class Merged:
    """The ranks' shares of one publication, combined: every owned record, the names (when all ranks agree),
    and whether any rank's load raised (a tainted publication gets the engine's nonce of its epoch)."""

    records: Dict[str, bytes]
    names: Optional[frozenset]
    tainted: bool


def merge(shares: List[dict], names: Iterable[str]) -> Merged:
    """Combine the ranks' `Pending.share()`s; `names` are this rank's (all ranks saw the same ones, or `names` is
    None). A name owned by no rank that saw it makes the names inconsistent too."""
    tainted = any(s["tainted"] for s in shares)
    records: Dict[str, bytes] = {}
    for s in shares:
        records.update(s["records"])
    agreed = len({(s["names"], s["count"]) for s in shares}) == 1
    names = frozenset(names)
    if not agreed or set(records) != names:
        return Merged(records, None, tainted)
    return Merged(records, names, tainted)


def fingerprint_of(records: Dict[str, bytes], salt: str) -> str:
    """The identity hex of a name -> record mapping under an engine salt (32 hex chars, name order)."""
    h = hashlib.sha256(VERSION)
    salt_b = salt.encode()
    h.update(struct.pack("<I", len(salt_b)) + salt_b)
    h.update(struct.pack("<Q", len(records)))
    for name in sorted(records):
        h.update(records[name])
    return h.hexdigest()[:fingerprint.HEX_CHARS]


def chained(previous_weight_id: str, published_hex: str) -> str:
    """The identity hex of `previous_weight_id`'s weights with a partial publication `published_hex` on top."""
    h = hashlib.sha256(CHAIN)
    prev = previous_weight_id.encode()
    h.update(struct.pack("<I", len(prev)) + prev + published_hex.encode())
    return h.hexdigest()[:fingerprint.HEX_CHARS]


def identity_of(merged: Merged, salt: str, start_names: Optional[frozenset],
                previous_weight_id: Optional[str]) -> Tuple[str, Optional[str]]:
    """(`Outcome`, identity hex or None) of one merged publication. `previous_weight_id` None means the engine's
    start; `start_names` None means the start was not tapped, so no later publication can prove it is complete."""
    if merged.tainted:
        return Outcome.TAINTED, None
    if not merged.records and not merged.names:
        return Outcome.UNTAPPED, None
    if merged.names is None:
        return Outcome.INCONSISTENT, None
    hex_ = fingerprint_of(merged.records, salt)
    if previous_weight_id is None or (start_names is not None and merged.names >= start_names):
        return Outcome.COMPLETE, hex_
    return Outcome.CHAINED, chained(previous_weight_id, hex_)


__all__ = ["VERSION", "Outcome", "owner_of", "Pending", "PublishedWeights", "of", "Tap", "tapping", "Merged", "merge",
           "fingerprint_of", "chained", "identity_of", "names_digest"]
