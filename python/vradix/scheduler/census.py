"""The census test mode (`VRADIX_CENSUS=1`): two checks in the scheduler process that fail an engine whose state
escaped vradix, so a test that drives a path vradix misses fails instead of passing on luck.

1. Requests, at every epoch bump (`check_requests`, called by `scheduler.publication.bump_scheduler` after the bump
   and the P/D promise revocation). Every SGLang `Req` reachable from the scheduler (`find_requests`: its attributes,
   and theirs, through lists, tuples, deques, sets, dicts, dataclasses and SGLang's and vradix's own objects, breadth
   first to `MAX_DEPTH`, reading `__dict__` and `__slots__` only, never calling a method or a property) that holds KV
   (`request.holds_own_kv`: a `req_to_token` row, a tree lock, or a retraction backup it resumes from) must be
   treated by the bump: marked crossing (`ReqState.crossed`) or finished. A queued request that holds nothing is
   re-bound or bound at its next match, so it is not checked. A held, untreated request fails the census; the message names the path
   the walk reached it by and whether `scheduler.publication.live_requests` (what the bump treats) had it.
2. Weights, before every forward (`check_weights`, BEFORE `Scheduler.run_batch`). The served model's parameters
   (`sample_params`: each one's name, storage pointer, shape, dtype and `SAMPLES_PER_PARAM` fixed elements, one
   device-to-host copy for all of them) must equal what was recorded at the engine's start or at the last
   publication that changed weights (`record_weights`). A difference fails the census, naming the parameter and the
   control requests the scheduler answered since the record (`note_control_request`).

A failure raises `CensusViolation`, whose message starts with `MARKER`. Raised in the scheduler's event loop, it stops
the scheduler process, which takes its server down, as any scheduler exception does: the request or publication
that drove it fails, and the test harness (`vradix.testing.harness.server.CpuServer.stop`) fails the test that
stops the server when its log holds the marker.

Invariants: the census is attached to a scheduler only when `VRADIX_CENSUS` is on (`attach`), and every check is a
no-op on a scheduler without one; a check reads the scheduler and never changes what it serves.
"""
from __future__ import annotations

import collections
import dataclasses
import enum
import logging
import re
import time
import types
import zlib
from dataclasses import dataclass, field
from typing import Iterator, List, Optional, Tuple

import torch

from vradix import request, settings

logger = logging.getLogger("vradix")

MARKER = "vradix census failed:"
#: how far from the scheduler the request walk descends (scheduler -> session controller -> sessions -> session ->
#: its requests needs 5)
MAX_DEPTH = 8
#: the most objects one walk visits; a walk cut short says so in its log line
MAX_OBJECTS = 500_000
SAMPLES_PER_PARAM = 4
#: control requests remembered for a weight-census message
CONTROL_HISTORY = 16
#: objects of these modules are walked into (besides containers and dataclasses): SGLang's and vradix's own, and the
#: standard library's thread-safe queue
WALKED_MODULES = ("sglang.", "vradix.", "queue")
#: never walked into: they hold no request, and some are large (a model's module tree, tensors)
ATOMIC = (str, bytes, bytearray, int, float, complex, bool, type(None), enum.Enum, torch.Tensor, torch.nn.Module,
          torch.dtype, torch.device, type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
          types.MethodType, types.BuiltinMethodType, memoryview, range, slice)


class CensusViolation(RuntimeError):
    """The census found state that escaped vradix: a held request a bump did not treat, or weights that changed
    without a publication."""


@dataclass(frozen=True)
class ParamRecord:
    """One parameter as the weight census sees it."""

    name: str
    ptr: int
    shape: Tuple[int, ...]
    dtype: torch.dtype
    sample: bytes


@dataclass
class Census:
    """The census of one scheduler (`scheduler._vradix_census`), touched only from the scheduler thread.

    `weights` is what the served model's parameters were at `recorded_at` (the engine's start, or the last
    publication that changed weights); `controls` the control requests answered since then, oldest first (at most
    `CONTROL_HISTORY`)."""

    weights: Optional[List[ParamRecord]] = None
    recorded_at: str = "engine start"
    controls: collections.deque = field(default_factory=lambda: collections.deque(maxlen=CONTROL_HISTORY))
    bumps_checked: int = 0
    forwards_checked: int = 0
    requests_seen: int = 0
    #: time the checks took, in total (what the test mode costs)
    bumps_ms: float = 0.0
    forwards_ms: float = 0.0
    #: parameter name -> (shape, the index tensors of its sampled elements)
    positions: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"bumps_checked": self.bumps_checked, "forwards_checked": self.forwards_checked,
                "requests_seen": self.requests_seen, "weights_recorded_at": self.recorded_at,
                "bumps_ms": round(self.bumps_ms, 3), "forwards_ms": round(self.forwards_ms, 3)}


def enabled() -> bool:
    return settings.value("VRADIX_CENSUS")


def of(scheduler) -> Optional[Census]:
    return getattr(scheduler, "_vradix_census", None)


def attach(scheduler) -> Optional[Census]:
    """At scheduler start, when `VRADIX_CENSUS` is on: attach the census and record the weights the engine serves."""
    if not enabled():
        return None
    census = scheduler._vradix_census = Census()
    record_weights(scheduler, "engine start")
    return census


# ---- 1. requests, at every bump --------------------------------------------------------------------------------------
def check_requests(scheduler, live, epoch: int) -> None:
    """After a bump to `epoch` that treated `live`: raise CensusViolation when a request the scheduler holds with KV
    was neither marked crossing nor finished (see the module docstring)."""
    census = of(scheduler)
    if census is None:
        return
    t0 = time.perf_counter()
    found, visited, complete = find_requests(scheduler)
    census.bumps_checked += 1
    census.requests_seen += len(found)
    live_ids = {id(r) for r in live}
    bad = [(path, req) for path, req in found.values() if request.holds_own_kv(req) and not treated(req)]
    census.bumps_ms += (time.perf_counter() - t0) * 1e3
    logger.info("vradix census: bump to epoch %d: %d request(s) reachable, %d in live_requests, %d untreated "
                "holder(s) (%d objects walked%s, %.1f ms); outside live_requests: %s", epoch, len(found),
                len(live_ids), len(bad), visited, "" if complete else ", walk cut short",
                (time.perf_counter() - t0) * 1e3, outside(found, live_ids) or "none")
    if bad:
        raise CensusViolation(f"{MARKER} the bump to epoch {epoch} left {len(bad)} request(s) holding KV neither "
                              "crossing nor finished: " + "; ".join(describe(path, req, id(req) in live_ids)
                                                                     for path, req in bad))


def outside(found: dict, live_ids: set) -> str:
    """Where the walk found requests `live_requests` does not hold, by attribute path (indices and keys dropped),
    with how many and how many of them hold KV."""
    counts: collections.Counter[tuple[str, bool]] = collections.Counter()
    for path, req in found.values():
        if id(req) not in live_ids:
            where = re.sub(r"\[[^\]]*\]", "[]", path)
            counts[where, request.holds_own_kv(req)] += 1
    return ", ".join(f"{where} x{n}{' holding KV' if held else ''}" for (where, held), n in sorted(counts.items()))


def treated(req) -> bool:
    """Whether a bump treated a request that holds KV: it crosses the bump (keeps its KV, never inserts it), or it
    is finished (a revoked P/D promise, an abort)."""
    st = request.of(req)
    return (st is not None and st.crossed) or bool(req.finished())


def describe(path: str, req, in_live: bool) -> str:
    st = request.of(req)
    bound = f"bound to epoch {st.epoch}" if st is not None else "never admitted by vradix"
    seen = "in live_requests" if in_live else "missed by live_requests"
    return (f"rid {getattr(req, 'rid', '?')!r} at {path} ({bound}, row {req.kv.req_pool_idx}, "
            f"lock {'held' if getattr(req, 'lock', None) is not None else 'none'}; {seen})")


def find_requests(root, max_depth: int = MAX_DEPTH, max_objects: int = MAX_OBJECTS) -> Tuple[dict, int, bool]:
    """Every SGLang `Req` reachable from `root`: ({id: (the first path reaching it, req)}, objects visited, whether
    the walk finished within `max_objects`). Breadth first, so each path is a shortest one; a `Req` is not walked
    into (what it points at is its own state). The root's attributes are always read, whatever its class."""
    from sglang.srt.managers.schedule_batch import Req

    found: dict[int, tuple[str, Req]] = {}
    seen = {id(root)}
    queue = collections.deque([(root, "scheduler", 0)])
    visited = 0
    while queue:
        obj, path, depth = queue.popleft()
        visited += 1
        if isinstance(obj, Req):
            found.setdefault(id(obj), (path, obj))
            continue
        if depth >= max_depth:
            continue
        for name, child in (attributes(obj) if obj is root else children(obj)):
            if isinstance(child, ATOMIC) or id(child) in seen:
                continue
            if len(seen) >= max_objects:
                return found, visited, False
            seen.add(id(child))
            queue.append((child, path + name, depth + 1))
    return found, visited, True


def children(obj) -> Iterator[Tuple[str, object]]:
    """What the walk descends into from `obj`, each with its path step; nothing for an object it does not walk."""
    if isinstance(obj, dict):
        for key, value in list(obj.items()):
            yield f"[{short(key)}]", value
            if not isinstance(key, ATOMIC):
                yield f"[key {short(key)}]", key
    elif isinstance(obj, (list, tuple, collections.deque)):
        for i, item in enumerate(list(obj)):
            yield f"[{i}]", item
    elif isinstance(obj, (set, frozenset)):
        for item in list(obj):
            yield "[member]", item
    elif walked(obj):
        yield from attributes(obj)


def walked(obj) -> bool:
    module = type(obj).__module__ or ""
    return dataclasses.is_dataclass(obj) or module == "queue" or module.startswith(WALKED_MODULES)


def attributes(obj) -> Iterator[Tuple[str, object]]:
    """An object's instance attributes, from its `__dict__` and the `__slots__` of its classes: no property and no
    method runs."""
    for name, value in list(getattr(obj, "__dict__", {}).items()):
        yield f".{name}", value
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__"):
                value = getattr(obj, name, None)  # a slot's member descriptor: no user code
                yield f".{name}", value


def short(key) -> str:
    text = repr(key)
    return text if len(text) <= 40 else text[:37] + "..."


# ---- 2. weights, before every forward --------------------------------------------------------------------------------
def served_model(scheduler):
    """The model the scheduler's forwards run, or None when it serves none (a stand-in in a test)."""
    return getattr(getattr(getattr(scheduler, "tp_worker", None), "model_runner", None), "model", None)


def record_weights(scheduler, why: str) -> None:
    """Record the served weights as published (`why`: the engine's start, or the publication). Nothing without a
    census or a model."""
    census, model = of(scheduler), served_model(scheduler)
    if census is None or model is None:
        return
    census.weights = sample_params(census, model)
    census.recorded_at = why
    census.controls.clear()


def note_control_request(scheduler, recv_req) -> None:
    """Remember a control request the scheduler answered (named in a weight-census failure)."""
    census = of(scheduler)
    if census is not None:
        action = getattr(recv_req, "action", None)
        census.controls.append(type(recv_req).__name__ + (f"(action={action!r})" if isinstance(action, str) else ""))


def check_weights(scheduler) -> None:
    """Before a forward: raise CensusViolation when the served weights differ from the last record."""
    census, model = of(scheduler), served_model(scheduler)
    if census is None or model is None:
        return
    census.forwards_checked += 1
    t0 = time.perf_counter()
    now = sample_params(census, model)
    census.forwards_ms += (time.perf_counter() - t0) * 1e3
    if census.weights is None:
        census.weights = now
        return
    change = first_change(census.weights, now)
    if change is not None:
        raise CensusViolation(
            f"{MARKER} the served weights changed without a publication: {change}, since {census.recorded_at}; "
            f"control requests answered since then: {list(census.controls) or 'none'}. This forward would run on "
            "weights no epoch names")


def first_change(before: List[ParamRecord], now: List[ParamRecord]) -> Optional[str]:
    """What differs first between two records, in words, or None."""
    old = {p.name: p for p in before}
    new = {p.name: p for p in now}
    for name in old.keys() - new.keys():
        return f"parameter {name} was removed"
    for name in new.keys() - old.keys():
        return f"parameter {name} was added"
    for p in now:
        q = old[p.name]
        if (q.shape, q.dtype) != (p.shape, p.dtype):
            return f"parameter {p.name} changed from {q.dtype} {q.shape} to {p.dtype} {p.shape}"
        if q.ptr != p.ptr:
            return f"parameter {p.name} moved to another storage"
        if q.sample != p.sample:
            return f"parameter {p.name} was written in place"
    return None


def sample_params(census: Census, model) -> List[ParamRecord]:
    """Every parameter's name, storage pointer, shape, dtype and sampled elements (raw bytes), with one
    device-to-host copy for all samples."""
    named = list(model.named_parameters())
    picks = [pick(census, name, p) for name, p in named]
    taken = [t for t in picks if t is not None]
    flat = torch.cat([t.to(taken[0].device) for t in taken]).cpu().numpy().tobytes() if taken else b""
    records, at = [], 0
    for (name, p), t in zip(named, picks):
        size = 0 if t is None else t.numel()
        records.append(ParamRecord(name, 0 if p.is_meta else p.data_ptr(), tuple(p.shape), p.dtype,
                                   flat[at:at + size]))
        at += size
    return records


def pick(census: Census, name: str, param) -> Optional[torch.Tensor]:
    """The sampled elements of one parameter, as bytes on its device (None for a meta or empty tensor). The
    positions are fixed per name and shape, spread over the tensor."""
    data = param.detach()
    if data.is_meta or data.numel() == 0:
        return None
    if data.dim() == 0:
        data = data.reshape(1)
    key = (name, tuple(data.shape), data.device)
    index = census.positions.get(key)
    if index is None:
        n = data.numel()
        seed = zlib.crc32(name.encode())
        flat = torch.tensor(sorted({(seed + k * (n // SAMPLES_PER_PARAM + 1)) % n for k in range(SAMPLES_PER_PARAM)}))
        index = census.positions[key] = tuple(i.to(data.device) for i in torch.unravel_index(flat, data.shape))
    return data[index].view(torch.uint8)
