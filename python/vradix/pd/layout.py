"""Role-local L3 namespaces: each role writes and reads HiCache storage (L3) only under a namespace derived from its
role, its KV layout and the weights' global `weight_id`.

SGLang 0.5.23 names an L3 object by the page-hash chain (seeded by the request's `extra_key`) plus a backend suffix
that carries at most the served model name and the TP/DCP rank layout (`file`: `_<model>_<tp_rank>_<tp_size>`, MLA
drops the TP part, DCP adds `_tp.._dcp.._page..`). Nothing in it names the role, the page size or the KV dtype, so a
prefill and a decode role (or two layouts) sharing one store read each other's objects, and an FP8 reader would load
BF16 pages. vradix derives a *scope* from the layout and builds the key prefix from it:

    scope     = "<role>.tp<tp_size>.dcp<dcp_size>.ps<page_size>.<kv_dtype>[.mla]"    (role: prefill | decode | unified)
    namespace = "\\x1evradix:" + scope + "\\x1c" + weight_id + ["\\x1d" epoch] + "\\x1f"

The namespace seeds the page-hash chain (as the epoch namespace does, `vradix.identity`), so it separates objects in
every storage backend, not only in those that honour `extra_backend_tag`. The per-rank part (which TP/DCP rank holds
which shard) stays in SGLang's own suffix; the scope holds what must be equal for two ranks' objects to be
interchangeable.

Invariants:
- two layouts that differ in any field of `KvLayout` have different scopes, so they never read each other's objects;
- a scope is made of `[a-z0-9_.]` only (no namespace delimiter), and `parse_scope(scope_of(l)) == l`;
- cross-layout conversion is unsupported: `check_compatible` refuses it with an error naming every differing field,
  and `check_layout` refuses a layout SGLang's storage cannot shard (DCP without MLA, DCP not dividing TP or the page
  size) at startup or attach, never at read time.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Optional

from vradix import identity

ROLES = ("prefill", "decode", "unified")
#: separates a scope from the weight_id inside the namespace; a control character, so neither can contain it
SCOPE_END = identity.SCOPE_END
_SCOPE_RE = re.compile(r"^(prefill|decode|unified)\.tp(\d+)\.dcp(\d+)\.ps(\d+)\.([a-z0-9_]+)(\.mla)?$")


class IncompatibleLayoutError(ValueError):
    """An attempt to read L3 objects of another KV layout, or a layout L3 cannot serve (refused at startup/attach)."""


@dataclass(frozen=True)
class KvLayout:
    """What must be equal for two engines' L3 objects to be interchangeable."""

    role: str
    tp_size: int
    dcp_size: int
    page_size: int
    kv_dtype: str
    is_mla: bool = False


def role_of(disaggregation_mode: Optional[str]) -> str:
    """The role of an engine from SGLang's `--disaggregation-mode` (`null`/None is a non-P/D engine: `unified`)."""
    return "unified" if disaggregation_mode in (None, "null") else disaggregation_mode


def dtype_name(kv_dtype) -> str:
    """A KV dtype (a torch dtype or SGLang's flag value) as a scope token: `torch.float8_e4m3fn` -> `float8_e4m3fn`,
    `bf16` -> `bfloat16`."""
    name = str(kv_dtype).removeprefix("torch.").lower()
    return {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "float": "float32"}.get(name, name)


def layout_of(server_args, kv_dtype, is_mla: bool = False) -> KvLayout:
    """The layout of an engine from its ServerArgs; `kv_dtype` is the resolved KV pool dtype (SGLang's flag may say
    `auto`, which means the model's dtype)."""
    return KvLayout(role=role_of(getattr(server_args, "disaggregation_mode", None)),
                    tp_size=int(server_args.tp_size), dcp_size=int(getattr(server_args, "dcp_size", 1) or 1),
                    page_size=int(server_args.page_size or 1), kv_dtype=dtype_name(kv_dtype), is_mla=bool(is_mla))


def scope_of(layout: KvLayout) -> str:
    """The scope string of a layout (see the module docstring). Raises IncompatibleLayoutError for an invalid one."""
    if layout.role not in ROLES:
        raise IncompatibleLayoutError(f"unknown role {layout.role!r}: expected one of {', '.join(ROLES)}")
    dtype = dtype_name(layout.kv_dtype)
    if not re.fullmatch(r"[a-z0-9_]+", dtype) or dtype == "auto":
        raise IncompatibleLayoutError(f"KV dtype {layout.kv_dtype!r} is not a resolved dtype name")
    for name in ("tp_size", "dcp_size", "page_size"):
        value = getattr(layout, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise IncompatibleLayoutError(f"{name}={value!r} is not a positive integer")
    return (f"{layout.role}.tp{layout.tp_size}.dcp{layout.dcp_size}.ps{layout.page_size}.{dtype}"
            + (".mla" if layout.is_mla else ""))


def role_of_scope(scope: Optional[str]) -> str:
    """The role an engine's scope names (`unified` for a non-P/D engine, which stamps no scope)."""
    return "unified" if scope is None else parse_scope(scope).role


def parse_scope(scope: str) -> KvLayout:
    """The layout a scope string was built from. Raises IncompatibleLayoutError for a malformed scope."""
    m = _SCOPE_RE.match(scope)
    if m is None:
        raise IncompatibleLayoutError(f"{scope!r} is not a vradix L3 scope")
    role, tp, dcp, ps, dtype, mla = m.groups()
    return KvLayout(role, int(tp), int(dcp), int(ps), dtype, mla is not None)


def l3_namespace(layout: KvLayout, weight_id: str, epoch: Optional[int] = None) -> str:
    """The L3 key prefix of `weight_id`'s KV in `layout`'s role-local namespace (`epoch` as in `identity.namespace`:
    only for an identity this process already used)."""
    return identity.namespace(weight_id, epoch, scope_of(layout))


def scope_in(prefix: str) -> Optional[str]:
    """The scope of a role-local namespace prefix, or None for a prefix without one."""
    if not prefix.startswith(identity.MARKER) or SCOPE_END not in prefix:
        return None
    return prefix[len(identity.MARKER):prefix.index(SCOPE_END)]


def check_layout(layout: KvLayout) -> None:
    """Refuse a layout whose L3 objects SGLang cannot shard: DCP storage needs an MLA model, DCP groups that divide TP
    and a page size the DCP size divides (`HiCacheStorageConfig` checks these only when the storage is built)."""
    scope_of(layout)
    if layout.dcp_size == 1:
        return
    reasons = []
    if not layout.is_mla:
        reasons.append("DCP storage needs an MLA model")
    if layout.tp_size % layout.dcp_size:
        reasons.append(f"dcp_size {layout.dcp_size} does not divide tp_size {layout.tp_size}")
    if layout.page_size % layout.dcp_size:
        reasons.append(f"dcp_size {layout.dcp_size} does not divide page_size {layout.page_size}")
    if reasons:
        raise IncompatibleLayoutError(f"vradix: L3 storage cannot serve layout {scope_of(layout)}: "
                                      + "; ".join(reasons))


def check_compatible(reader: KvLayout, writer: KvLayout) -> None:
    """Refuse reading `writer`'s L3 objects with `reader`'s layout unless the layouts are equal (same role included:
    roles are role-local even when their layouts match). Cross-layout conversion is unsupported."""
    differ = [f"{f.name} {getattr(reader, f.name)!r} != {getattr(writer, f.name)!r}"
              for f in fields(KvLayout) if getattr(reader, f.name) != getattr(writer, f.name)]
    if differ:
        raise IncompatibleLayoutError(
            f"vradix: refusing to read L3 objects of layout {scope_of(writer)} as {scope_of(reader)} ("
            + "; ".join(differ) + "): each role reads only its own role-local namespace; cross-layout conversion "
            "is unsupported.")
