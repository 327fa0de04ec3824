"""Weight identity: the global name (`weight_id`) of the weights an epoch serves.

The epoch counter is process-local: it restarts at 0 on every boot, and two engines at the same epoch number may hold
different weights. Every key that outlives the process or leaves it (HiCache L3 page keys, the P/D handshake) is
therefore built from a `weight_id`, never from the bare epoch. One identity is chosen per epoch, by the engine's mode
(`VRADIX_WEIGHT_IDENTITY`, or the server flag `--vradix-weight-identity`):

- `auto` (default): `fingerprint` on a P/D role (prefill and decode must compute equal identities for equal weights),
  `nonce` on every other engine (`resolve_mode`). A stock P/D launch therefore needs no vradix flag.
- `nonce`: a fresh random 128-bit nonce per epoch. Safe everywhere; no reuse across restarts or engines.
- `fingerprint` (proven): a content fingerprint of what was published into the model, the named unsharded tensors
  that reach its `load_weights` (`vradix.core.published`), at startup and after every weight change. Equal weights
  give equal ids on any TP layout, so P/D roles of different TP sizes agree and L3 pages are reused across restarts
  and engines; different weights differ unless the fingerprint collides. A partial publication chains onto the
  identity before it. Where no published tensor was seen, the fingerprint of the loaded shards stands in
  (`fingerprint_model`; it matches only the same layout).
- `declared`: the publisher vouches that the publication's `weight_version` label is globally unique (for example a
  run id plus a training step), and the label becomes the identity. A publication that keeps the current label, and
  startup weights without an explicit `--weight-version`, get a nonce instead.

Invariants:
- different weights never share a `weight_id` (nonces are random; fingerprints cover every byte; a declared label is
  refused when an earlier publication in this process used it);
- the same weights share a `weight_id` only when proven (`fingerprint`) or declared;
- a `weight_id` is printable, at most `MAX_WEIGHT_ID_CHARS` characters, and never contains the namespace delimiters.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Mapping, Optional

from vradix import collectives, settings

MODES = settings.IDENTITY_MODES
ENV = "VRADIX_WEIGHT_IDENTITY"
#: longest accepted declared identity (it is part of every cache key of its epoch)
MAX_DECLARED_CHARS = 128
MAX_WEIGHT_ID_CHARS = MAX_DECLARED_CHARS + len("declared:")
#: SGLang's `--weight-version` default: not a declaration
UNDECLARED_LABEL = "default"


class InvalidIdentityError(ValueError):
    """A declared weight identity that vradix refuses (nothing changes)."""


@dataclass(frozen=True)
class WeightIdentity:
    """The identity of one epoch's weights: `weight_id` is what keys are built from; `source` says why it is
    trusted (`nonce`, `fingerprint` or `declared`)."""

    weight_id: str
    source: str
    #: what a proven identity was computed from (`published (complete)`, `published (chained)`, `loaded shards`)
    basis: str = field(default="", compare=False)

    def as_dict(self) -> dict:
        return {"weight_id": self.weight_id, "source": self.source}


def mode_from_env(environ: Optional[Mapping[str, str]] = None) -> str:
    """The engine's identity mode (VRADIX_WEIGHT_IDENTITY). Raises `settings.SettingsError` for an unknown value."""
    return settings.value(ENV, environ)


def nonce(random_hex: Optional[str] = None) -> WeightIdentity:
    """A fresh identity no other epoch, process or engine can hold: 128 random bits, drawn here or given (the ranks
    of one engine derive one from all their draws, `vradix.core.published.merge`)."""
    return WeightIdentity(f"nonce:{random_hex or secrets.token_hex(16)}", "nonce")


def proven(fingerprint: str, basis: str = "") -> WeightIdentity:
    """The identity of weights whose content fingerprint is `fingerprint` (hex), computed from `basis`."""
    return WeightIdentity(f"fp:{fingerprint}", "fingerprint", basis)


def resolve_mode(mode: str, disaggregation_mode: Optional[str]) -> str:
    """The mode an engine runs: `auto` is `fingerprint` on a P/D role (`prefill`, `decode`), else `nonce`; any other
    mode is itself."""
    if mode != "auto":
        return mode
    return "fingerprint" if disaggregation_mode in ("prefill", "decode") else "nonce"


def declared(text: str) -> WeightIdentity:
    """The identity a publisher declared. Raises InvalidIdentityError for an unusable declaration."""
    check_declared(text)
    return WeightIdentity(f"declared:{text}", "declared")


def check_declared(text) -> None:
    """A declared identity is a non-empty printable string of at most MAX_DECLARED_CHARS characters."""
    if not isinstance(text, str):
        raise InvalidIdentityError(f"invalid declared weight identity: expected a string, got {type(text).__name__}")
    if not text.strip():
        raise InvalidIdentityError("invalid declared weight identity: empty")
    if len(text) > MAX_DECLARED_CHARS:
        raise InvalidIdentityError(f"invalid declared weight identity: {len(text)} characters, at most "
                                   f"{MAX_DECLARED_CHARS} allowed")
    if not text.isprintable():
        raise InvalidIdentityError("invalid declared weight identity: contains control characters")


def is_declaration(label: Optional[str]) -> bool:
    """Whether a label names a declared identity (SGLang's default `--weight-version` does not)."""
    return label is not None and label != UNDECLARED_LABEL


def fingerprint_model(model, tp_group=None) -> str:
    """The content fingerprint of a loaded model (every parameter and buffer). With tensor parallelism each rank
    holds a shard: the ranks' fingerprints are gathered over `tp_group` (a CPU process group) and hashed together, so
    every rank of one engine gets the same identity."""
    import hashlib

    from vradix.kernels.fingerprint import fingerprint_module

    local = fingerprint_module(model)
    gathered = collectives.gather(local, tp_group)
    if len(gathered) == 1:
        return local
    return hashlib.sha256("|".join(gathered).encode()).hexdigest()[:32]
