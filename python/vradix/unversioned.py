"""SGLang paths vradix cannot version in 0.5.23, refused before any scheduler starts (the closed world,
docs/coverage.md).

Each `Refusal` names the server flag that turns a path on, why the path can hand a request KV (or weight-derived
state) that vradix does not see, and the alternative that is versioned. `check(server_args)` raises
`UnversionedPathError` for the first flag set, so the engine does not start and the error names the flag; nothing
else has been built yet, so nothing is lost. The rules read `ServerArgs` fields only (no SGLang import here).

Invariant: a row of docs/coverage.md whose verdict is "refused at launch" has its `Refusal` here, and
test/test_coverage.py starts SGLang's own argument pipeline with that flag and expects this error.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


class UnversionedPathError(ValueError):
    """A server flag turns on a path that could serve KV or state of other weights, unversioned."""


@dataclass(frozen=True)
class Refusal:
    flag: str
    is_set: Callable[[object], bool]
    why: str
    alternative: str

    def message(self) -> str:
        return (f"vradix refuses to start with {self.flag}: {self.why}. Serving it would be unversioned. "
                f"Instead: {self.alternative}; or set VRADIX_DISABLE=1 for stock behaviour (docs/coverage.md).")


def _field(name: str, default=None):
    return lambda args: getattr(args, name, default)


REFUSALS = (
    Refusal("--enable-flexkv", _field("enable_flexkv"),
            "FlexKV's cache is a RadixCache without the tree core vradix namespaces, and FlexKV stores KV outside "
            "SGLang under keys that carry no weight identity",
            "HiCache with an L3 storage backend (--enable-hierarchical-cache --hicache-storage-backend ...), which "
            "vradix versions"),
    Refusal("--enable-lmcache", _field("enable_lmcache"),
            "LMCache salts its storage keys inside the external package, so vradix cannot show they carry the "
            "weight identity, and its retrieve path loads device KV outside the page ledger",
            "HiCache with an L3 storage backend (--enable-hierarchical-cache --hicache-storage-backend ...)"),
    Refusal("--radix-cache-backend", _field("radix_cache_backend"),
            "a registered third-party prefix cache is not SGLang's UnifiedRadixCache, whose namespaces and tree "
            "core vradix versions",
            "the default radix cache (leave --radix-cache-backend unset)"),
    Refusal("--enable-pd-role-switch", _field("enable_pd_role_switch"),
            "a role switch resets the tree under the launch role's scope, so the role-local L3 namespaces and the "
            "decode-only restore rules would follow the wrong role",
            "separate prefill and decode engines, each started in its role"),
    Refusal("--enable-streaming-session on a P/D decode role",
            lambda args: (bool(getattr(args, "enable_streaming_session", False))
                          and getattr(args, "disaggregation_mode", "null") == "decode"),
            "decode hands a transferred request's KV record to its session slot (DecodeTransferQueue), a path "
            "vradix's session step (docs/streaming-sessions.md) has not been checked against",
            "streaming sessions on a non-P/D engine, or plain sessions over P/D"),
    Refusal("--speculative-accept-threshold-single/--speculative-accept-threshold-acc below 1",
            lambda args: (getattr(args, "speculative_algorithm", None) is not None
                          and min(float(getattr(args, "speculative_accept_threshold_single", 1.0)),
                                  float(getattr(args, "speculative_accept_threshold_acc", 1.0))) < 1.0),
            "relaxed acceptance lets the draft model's proposals, which a publication does not version, change "
            "the outputs",
            "speculative decoding with the default thresholds (1.0), where verification is lossless"),
)


def check(server_args) -> None:
    """Raise UnversionedPathError naming the first refused flag `server_args` sets; return if none is set."""
    for refusal in REFUSALS:
        if refusal.is_set(server_args):
            raise UnversionedPathError(refusal.message())
