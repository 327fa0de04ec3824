"""Weight identity: the global name (`weight_id`) of the weights an epoch serves, and the epoch namespace built from
it (the prefix of every request's radix key, "The epoch namespace" below).

The epoch counter is process-local: it restarts at 0 on every boot, and two engines at the same epoch number may hold
different weights. Every key that outlives the process or leaves it (HiCache L3 page keys, the P/D handshake) is
therefore built from a `weight_id`, never from the bare epoch. One identity is chosen per epoch, by the engine's mode
(`VRADIX_WEIGHT_IDENTITY`, or the server flag `--vradix-weight-identity`):

- `auto` (default): `fingerprint` on a P/D role (prefill and decode must compute equal identities for equal weights),
  `nonce` on every other engine (`resolve_mode`). A stock P/D launch therefore needs no vradix flag.
- `nonce`: a 128-bit nonce per epoch, derived from the engine's launch seed and the epoch number
  (`EngineNonces`): every rank of one engine (TP, DP, DP attention) reports the same `weight_id`, and no other launch
  shares it. Safe everywhere; no reuse across restarts or engines.
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

The epoch namespace
-------------------
The namespace is how an epoch's weight identity is written into a request's radix key. SGLang keys every radix-tree
edge by `(extra_key, token)` (`RadixKey.child_key_at`), so two requests whose `extra_key` differ live in disjoint
subtrees of the same tree, in both the Rust and the Python TreeCore. The same `extra_key` seeds the HiCache storage
page-hash chain (`storage_namespace_seed`), in Python and natively in the Rust TreeCore. vradix stamps a namespace as
a *prefix* of `extra_key`:

    extra_key = "\x1evradix:[<scope>\x1c]<weight_id>[\x1d<epoch>]\x1f" + ["\x1eadapter:<adapter id>\x1f"]
                + (user extra_key + LoRA suffix, or "")

The namespace is built from the epoch's global `weight_id` (above), so L3 keys of equal identities are equal across
restarts and engines, and keys of different weights never collide. The `\x1d<epoch>` suffix is added only when an
earlier epoch of the same process already used that `weight_id` (equal weights published again, or a lock-aware
flush, which keeps the weights): inside one process every epoch has its own namespace, and every key that carries a
suffix still names the same weights. A LoRA request's key also carries its adapter's *content* identity
(`vradix.core.lora.content_identity`, the adapter tag), right after the namespace: SGLang's `lora_id` is a per-load
uuid4, or `uuid5(name, path)` for `--lora-paths` (equal across restarts even when the file at that path was
retrained), so only the content tag keeps a retrained adapter's L3 pages apart from the old one's. On a P/D role the
namespace also starts with the role's scope (role and KV layout, `vradix.pd.layout`), so the roles' L3 objects never
mix, in any storage backend.

Invariants of the namespace:
- The prefix is the only place the marker `\x1evradix:` may appear; a user `extra_key` or `cache_salt` containing it
  (or its control character) is rejected, so a user key can never forge or collide with a namespace, in the tree or
  in the HiCache storage seed, which hashes `extra_key` and `cache_salt` together.
- Prefix, never suffix: SGLang reads the LoRA id from the *end* of `extra_key` (`LoRANameTable.resolve`).
- The adapter tag starts with the reserved control character `\x1e`, so no user key can forge it either.
- Two epochs of one process never share a namespace string (`vradix.engine.Engine.bind_identity`).
"""
from __future__ import annotations

import hashlib
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
    """An identity no other epoch, process or engine can hold: 128 random bits, drawn here or given (an engine's
    ranks derive theirs from its launch seed, `EngineNonces`)."""
    return WeightIdentity(f"nonce:{random_hex or secrets.token_hex(16)}", "nonce")


@dataclass(frozen=True)
class EngineNonces:
    """The nonce identities of one engine. `seed` is unique to one launch and equal on every rank of it (TP, PP, DP
    and DP-attention ranks: `launch_seed`); the nonce of epoch `e` is a hash of (seed, e).

    Invariants: every rank of one engine that reaches epoch `e` gets the same nonce for it, with no collective at
    the publication; two epochs of one engine never share a nonce; two launches share none (their seeds differ)."""

    seed: str

    def for_epoch(self, epoch: int) -> WeightIdentity:
        """The nonce identity of `epoch` (the epoch a publication or the engine's start binds)."""
        digest = hashlib.sha256(f"vradix-nonce\x1f{self.seed}\x1f{epoch}".encode()).hexdigest()[:32]
        return nonce(digest)

    @classmethod
    def fresh(cls) -> "EngineNonces":
        """The nonces of an engine of one process (a test engine, a scheduler built without launch arguments)."""
        return cls(secrets.token_hex(16))


def launch_seed(port_args, group=None) -> str:
    """The seed every rank of one engine shares: SGLang's per-launch `PortArgs.instance_id` (drawn once by the
    launcher and handed to every DP rank's scheduler) with the launch's detokenizer address, taken from the group's
    first rank (`group`: the TP CPU group, so TP ranks started by another node's launcher agree too). Without launch
    arguments, rank 0's random draw."""
    instance = getattr(port_args, "instance_id", "") or ""
    local = (f"{instance}\x1f{getattr(port_args, 'detokenizer_ipc_name', '')}" if instance
             else secrets.token_hex(16))
    return collectives.gather(local, group)[0]


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
    from vradix.kernels.fingerprint import fingerprint_module

    local = fingerprint_module(model)
    gathered = collectives.gather(local, tp_group)
    if len(gathered) == 1:
        return local
    return hashlib.sha256("|".join(gathered).encode()).hexdigest()[:32]


# The epoch namespace (module docstring, "The epoch namespace")

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
