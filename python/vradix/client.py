"""A fail-closed publish client: pause, update, verify, continue — for one engine or a list of them.

Verification is positive, never "HTTP 200":
- **vradix engine** (server info has an active `vradix` block on every DP rank, and on each of its TP ranks where it
  lists them in `tp_ranks`): pause `in_place`, update without a flush, then every rank's epoch must have advanced,
  every rank, and `/model_info`, must report the new label, and every rank must report one weight identity: in
  `declared` mode exactly `declared:<label>` (the label is the identity the publisher vouches for), in `nonce` mode
  a new one.
- **engine without vradix** (stock SGLang; radix state unknown counts as enabled): the predicate picks `retract` +
  flush. Before pausing, a fresh random probe prompt is sent twice; after the update and the flush, the probe's
  prefix must report `cached_tokens == 0`. A second probe before pausing that reports a hit proves the check is not
  vacuous (with the radix cache really disabled there is nothing to flush, and the probe stays at 0).
- Radix disabled: nothing to invalidate; only the label is verified.

The fleet view: one publication (one label, one `update`) gives the fleet one weight identity. The engines that
must agree are the vradix engines whose identity is proven or declared (server info `vradix.weight_identity.mode`
`fingerprint` or `declared` on every rank; `auto` is reported resolved): every rank of every one of them must serve
one `weight_id` after the update, else the publication fails with the rest (engines left paused, per `on_failure`).
Two fingerprints differ only when the published weights differ (e.g. a callable transfer that loaded other weights
on one engine), and a P/D pair whose roles differ refuses every request, so disagreement is never reported as
published. `nonce` engines cannot agree by design and stock engines have no identity: they are reported per engine,
not as a failure. A fleet whose proven and declared engines mix the two modes can never agree; it is refused
before any engine is paused. `publish` returns the per-engine results as a `Publication`, a list whose `fleet`
(`FleetView`) holds the fleet's `weight_id` and each engine's identity.

All-or-nothing, in phases: every engine is planned (and its probe armed) while it still serves, then every engine is
paused, then every engine is updated. Phase 1 checks, on every engine while all are paused, all that a paused engine
can show: the label, and on vradix every rank's epoch. Phase 2 probes the stock engines: a probe needs generation, so
only the engines with a probe are resumed, one after the other; the others stay paused until the verdict. Only when
every check on every engine passed is any engine reported `verified` and the rest continued.

The probe interval: a probed stock engine serves, with the new weights and its cache flushed, from its resume in
phase 2 to the verdict. The guarantee is that if anything fails (a probe, an HTTP call, anything), the first failure
ends phase 2 (no further engine is resumed), every engine resumed for a probe is paused again with its own plan's
pause mode, and `PublishError` carries each engine's evidence and final state, with no engine reported verified. By
default engines stay paused (fail closed: a half-published fleet must not serve), which the message names with the
command to resume; `on_failure="continue"` resumes every engine instead (still none reported verified).

Behind an SGLang model gateway (`smg --enable-rl`), pass the gateway's URL in `gateways`: the client lists the
workers the gateway routes to (`GET /v1/rl/workers`), publishes to each one through the gateway's RL control plane
(`/v1/rl/workers/<id>/engine/<path>`, which the gateway forwards to that worker alone), and verifies each one as
above, from its own server info. It fails closed when a gateway lists no worker, lists a worker that is not healthy,
or lists a different set of workers after the publication than before (a worker that joined mid-publication was not
verified).

HTTP goes through `requests` (installed with SGLang).
"""
from __future__ import annotations

import json
import random
import uuid
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence, Union

import requests

from vradix import predicate

Update = Union[str, Callable[["EngineHandle", str], None]]


class PublishError(RuntimeError):
    """A publication could not be verified; `results` holds every engine's evidence and final state, `fleet` the
    fleet view of the engines' identities as last read (None when it failed before any was read)."""

    def __init__(self, message: str, results: List["EngineResult"], fleet: Optional["FleetView"] = None):
        super().__init__(message)
        self.results = results
        self.fleet = fleet


class FleetDisagreement(RuntimeError):
    """Engines that must serve one weight identity after the publication do not (or never can: mixed modes)."""


#: the identity modes in which engines on equal published weights serve equal `weight_id`s
AGREEING_MODES = ("fingerprint", "declared")


@dataclass
class EngineResult:
    url: str
    plan: Optional[predicate.Plan] = None
    vradix: bool = False
    epochs_before: List[int] = field(default_factory=list)
    epochs_after: List[Optional[int]] = field(default_factory=list)
    weight_ids_before: List[Optional[str]] = field(default_factory=list)
    weight_ids_after: List[Optional[str]] = field(default_factory=list)
    identity_mode: Optional[str] = None  # the mode every rank runs (`vradix.weight_identity.mode`, resolved)
    identity_requested: Optional[str] = None  # the mode the engine was started with, where the server reports it
    label_after: Optional[str] = None
    probe_cached_before: Optional[int] = None
    probe_cached_after: Optional[int] = None
    update_message: str = ""
    flush_message: str = ""
    checks_passed: bool = False  # this engine's own checks passed (it may still fail with the fleet)
    verified: bool = False  # only when every engine passed every check
    state: str = "running"  # running | paused(<mode>)
    error: Optional[str] = None

    def planned(self) -> predicate.Plan:
        """The plan phase 0 derived (`_plan_and_arm` plans every engine before any is paused)."""
        if self.plan is None:
            raise RuntimeError(f"{self.url}: not planned")
        return self.plan
    worker_url: Optional[str] = None  # behind a gateway: the worker's own URL (`url` is its route on the gateway)

    def evidence(self) -> str:
        status = "verified" if self.verified else (
            "NOT verified (its own checks passed)" if self.checks_passed else "NOT verified")
        parts = [f"{self.url}: {status}, left {self.state}"]
        if self.worker_url:
            parts.append(f"worker {self.worker_url}")
        if self.plan is not None:
            parts.append(f"plan={self.plan.pause_mode}/radix={'on' if self.plan.radix_enabled else 'off'}"
                         f"/flush={self.plan.flush}")
        if self.vradix:
            parts.append(f"epochs {self.epochs_before}->{self.epochs_after}, label={self.label_after!r}, "
                         f"weight_id {sorted(set(self.weight_ids_after), key=str) or None} ({self.identity_mode})")
        if self.probe_cached_after is not None:
            parts.append(f"probe cached_tokens {self.probe_cached_before}->{self.probe_cached_after}")
        if self.update_message:
            parts.append(f"update: {self.update_message!r}")
        if self.error:
            parts.append(f"error: {self.error}")
        return "; ".join(parts)


@dataclass
class FleetView:
    """The weight identity of a publication's fleet. `weight_id`: the one identity every engine in `AGREEING_MODES`
    serves (None when no engine is in one); `mode`: theirs. `engines`: one entry per engine, in order, with its
    `url`, `mode` (None without vradix), `weight_id` (its ranks' one identity, None without vradix or when its ranks
    disagree) and `in_fleet` (whether it must agree; nonce and stock engines are reported alone)."""

    weight_id: Optional[str]
    mode: Optional[str]
    engines: List[dict]

    def as_dict(self) -> dict:
        return {"weight_id": self.weight_id, "mode": self.mode, "engines": self.engines}


class Publication(list):
    """The verified per-engine results (`EngineResult`, in order) and their `fleet` view."""

    def __init__(self, results: List[EngineResult], fleet: FleetView):
        super().__init__(results)
        self.fleet = fleet


def must_agree(res: EngineResult) -> bool:
    """Whether the engine's identity is proven or declared, so it must serve the fleet's one `weight_id`."""
    return res.vradix and res.identity_mode in AGREEING_MODES


def fleet_modes(results: Sequence[EngineResult]) -> Optional[str]:
    """The one identity mode of the engines that must agree (None when there are none); raises FleetDisagreement
    when they mix `fingerprint` and `declared`, which never give equal identities (checked before anything is
    touched)."""
    modes = {r.url: r.identity_mode for r in results if must_agree(r)}
    if len(set(modes.values())) > 1:
        raise FleetDisagreement(
            f"the fleet mixes identity modes {modes}: a fingerprint and a declaration are never the same weight_id, "
            "so these engines can never agree; start every engine with the same --vradix-weight-identity, or publish "
            "the groups in separate calls")
    return next(iter(modes.values()), None)


def fleet_view(results: Sequence[EngineResult]) -> FleetView:
    """The fleet's identity after the update (`weight_ids_after`); raises FleetDisagreement, naming every engine that
    must agree with its identity, unless all their ranks serve one `weight_id`."""
    mode = fleet_modes(results)
    engines = [engine_identity(r) for r in results]
    agreeing = {e["url"]: r.weight_ids_after for e, r in zip(engines, results) if e["in_fleet"]}
    ids = {w for wids in agreeing.values() for w in wids}
    if len(ids) > 1 or None in ids or any(not wids for wids in agreeing.values()):
        raise FleetDisagreement(
            f"engines that must serve one weight identity ({mode} mode, one publication) do not: {agreeing}; their "
            "published weights differ")
    return FleetView(next(iter(ids), None), mode, engines)


def engine_identity(res: EngineResult) -> dict:
    """One engine's entry of the fleet view."""
    ids = set(res.weight_ids_after)
    entry = {"url": res.url, "mode": res.identity_mode if res.vradix else None,
             "weight_id": next(iter(ids)) if len(ids) == 1 else None, "in_fleet": must_agree(res)}
    if res.identity_requested is not None:
        entry["requested"] = res.identity_requested
    if res.worker_url:
        entry["worker_url"] = res.worker_url
    return entry


class EngineHandle:
    """HTTP access to one SGLang server. Every error names the server (`url`) and the call it refused."""

    def __init__(self, url: str, timeout: float = 600.0):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.headers: dict = {}

    def authorize(self, api_key: Optional[str]) -> "EngineHandle":
        """Send `api_key` as SGLang's servers expect it (`Authorization: Bearer`), when one is given."""
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        return self

    def get(self, path: str) -> dict:
        r = requests.get(self.url + path, headers=self.headers, timeout=self.timeout)
        if r.status_code != 200:
            raise RuntimeError(f"{self.url}: GET {path} -> HTTP {r.status_code}: {r.text.strip()[:500]}"
                               + unauthorized_hint(r.status_code))
        return r.json()

    def post(self, path: str, payload: Optional[dict] = None) -> requests.Response:
        return requests.post(self.url + path, json=payload or {}, headers=self.headers, timeout=self.timeout)

    def post_ok(self, path: str, payload: Optional[dict] = None) -> requests.Response:
        r = self.post(path, payload)
        if r.status_code != 200:
            raise RuntimeError(f"{self.url}: POST {path} -> HTTP {r.status_code}: {r.text.strip()[:500]}"
                               + unauthorized_hint(r.status_code))
        return r

    def server_info(self) -> dict:
        return self.get("/get_server_info")

    def vradix_blocks(self, info: Optional[dict] = None) -> List[Optional[dict]]:
        """Every rank's `vradix` block (None where a rank has none): each DP rank's, or, where a DP rank reports its
        TP ranks (`tp_ranks`), each of those, so every check covers every rank."""
        info = info if info is not None else self.server_info()
        blocks = [(s or {}).get("vradix") for s in (info.get("internal_states") or [{}])]
        return [rank for b in blocks for rank in ((b or {}).get("tp_ranks") or [b])]

    def label(self) -> Optional[str]:
        return self.get("/model_info").get("weight_version")

    def generate_ids(self, input_ids: Sequence[int], max_new_tokens: int = 1) -> dict:
        r = self.post_ok("/generate", {"input_ids": list(input_ids),
                                       "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens}})
        return r.json()

    def probe_cached_tokens(self, input_ids: Sequence[int]) -> int:
        """Send the probe prompt once and return how many of its tokens the server served from its prefix cache."""
        return self.generate_ids(input_ids)["meta_info"].get("cached_tokens", 0)


def unauthorized_hint(status: int) -> str:
    """What to do about a refusal for want of a key."""
    return (" (the server requires an API key: pass --api-key or set VRADIX_API_KEY)"
            if status in (401, 403) else "")


class GatewayWorker(EngineHandle):
    """One worker behind an SGLang model gateway (`smg --enable-rl`), reached through the gateway: each call goes to
    `<gateway>/v1/rl/workers/<id>/engine/<path>`, which the gateway forwards to this worker alone and answers with
    the worker's status and body wrapped (`{"status", "body", ...}`); this handle unwraps them, so every check reads
    the worker's own answer. `url` is that route's base, so `POST <url>/continue_generation` resumes this worker."""

    def __init__(self, gateway: str, worker: dict, timeout: float = 600.0):
        self.gateway = gateway.rstrip("/")
        self.worker_id = worker["id"]
        self.worker_url = worker.get("url")
        super().__init__(f"{self.gateway}/v1/rl/workers/{self.worker_id}/engine", timeout)

    def get(self, path: str) -> dict:
        r = self._forward("GET", path, None)
        if r.status_code != 200:
            raise RuntimeError(f"worker {self.worker_id} ({self.worker_url}) via {self.gateway}: GET {path} -> HTTP "
                               f"{r.status_code}: {r.text.strip()[:500]}" + unauthorized_hint(r.status_code))
        return r.json()

    def post(self, path: str, payload: Optional[dict] = None) -> requests.Response:
        return self._forward("POST", path, payload or {})

    def _forward(self, method: str, path: str, payload: Optional[dict]) -> requests.Response:
        r = requests.request(method, self.url + path, json=payload, headers=self.headers, timeout=self.timeout)
        try:
            wrapped = r.json()
        except ValueError:
            wrapped = None
        if not isinstance(wrapped, dict) or "status" not in wrapped or "latency_ms" not in wrapped:
            raise RuntimeError(f"gateway {self.gateway} did not forward {method} {path} to worker {self.worker_id} "
                               f"({self.worker_url}): HTTP {r.status_code}: {r.text.strip()[:500]}")
        return worker_response(wrapped, r.url)


def worker_response(wrapped: dict, url: str) -> requests.Response:
    """The worker's own answer, as the gateway reported it, as a `requests.Response`."""
    body = wrapped.get("body")
    out = requests.Response()
    out.status_code = int(wrapped["status"])
    out.url = url
    if isinstance(body, str):
        out._content = body.encode()
        out.headers["content-type"] = "text/plain"
    else:
        out._content = json.dumps(body).encode()
        out.headers["content-type"] = "application/json"
    return out


#: the worker states in which the gateway routes to a worker (smg 1.13 reports "ready")
SERVING_HEALTH = ("ready", "healthy")


def gateway_workers(gateway: str, timeout: float = 600.0, headers: Optional[dict] = None) -> List[dict]:
    """The workers an SGLang model gateway routes to, from its RL control plane; raises unless every one is
    healthy (an unhealthy worker would miss the publication and serve the old weights once it recovers)."""
    r = requests.get(gateway.rstrip("/") + "/v1/rl/workers", headers=headers or {}, timeout=timeout)
    if r.status_code != 200:
        raise RuntimeError(f"gateway {gateway}: GET /v1/rl/workers -> HTTP {r.status_code} (is it an SGLang model "
                           f"gateway started with --enable-rl?): {r.text.strip()[:300]}")
    workers = r.json().get("workers") or []
    if not workers:
        raise RuntimeError(f"gateway {gateway} lists no workers: nothing would be published")
    unhealthy = [f"{w.get('id')} ({w.get('url')}): {w.get('health')}" for w in workers
                 if w.get("health") not in SERVING_HEALTH]
    if unhealthy:
        raise RuntimeError(f"gateway {gateway} lists workers that are not healthy: {unhealthy}")
    return workers


def deployment_of(info: dict, blocks: List[Optional[dict]], *, colocated: bool = False,
                  prefer_sharing: bool = False) -> predicate.Deployment:
    """What the predicate needs, read from server info. A radix state the server does not report counts as enabled."""
    vradix = bool(blocks) and all(b is not None and b.get("active") for b in blocks)
    disable = info.get("disable_radix_cache")
    pd = str(info.get("disaggregation_mode") or "null").lower() not in ("null", "none", "")
    lora = bool(info.get("enable_lora")) or bool(info.get("lora_paths"))
    # a running engine's radix state is a fact, not a preference: anything but an explicit "disabled" is "enabled"
    return predicate.Deployment(colocated=colocated, pd_disaggregated=pd, lora=lora, vradix=vradix,
                                disable_radix_cache=disable is True, prefer_sharing=prefer_sharing)


def probe_ids(rng: random.Random, n: int = 256, vocab: int = 400) -> List[int]:
    """A prompt no other traffic shares (random ids well inside any vocabulary), long enough to span whole pages."""
    return [rng.randrange(10, vocab) for _ in range(n)]


def publish(urls: Union[str, Sequence[str]], update: Update, version: Optional[str] = None, *,
            colocated: bool = False, prefer_sharing: bool = False, pause_mode: Optional[str] = None,
            on_failure: str = "stay_paused", timeout: float = 600.0, probe_vocab: int = 400,
            seed: Optional[int] = None,
            engine_factory: Callable[[str, float], EngineHandle] = EngineHandle,
            gateways: Sequence[str] = (), api_key: Optional[str] = None) -> Publication:
    """Publish `update` to every engine and verify it. Returns the per-engine results with the fleet's one
    `weight_id` (`Publication.fleet`), or raises `PublishError`.

    `update` is a model path (`/update_weights_from_disk`) or a callable `(engine, version) -> None` that performs the
    transfer (e.g. NCCL `update_weights_from_distributed`) and raises on failure. Either way it is one publication:
    the same weights on every engine, so every engine in a proven or declared identity mode must serve one
    `weight_id` after it (engines that must hold different weights are published in separate calls). `on_failure`
    is `stay_paused` (default, fail closed) or `continue`. `engine_factory(url, timeout)` builds each engine's `EngineHandle`
    (a subclass can add authentication, logging or, in tests, fault injection). `gateways`: SGLang model gateways
    (`smg --enable-rl`); every worker each one routes to is published through it and verified (`GatewayWorker`).
    `api_key` goes with every call, to engines and gateways (SGLang's `Authorization: Bearer`).
    """
    if on_failure not in ("stay_paused", "continue"):
        raise ValueError("on_failure must be 'stay_paused' or 'continue'")
    engines = [engine_factory(u, timeout) for u in ([urls] if isinstance(urls, str) else list(urls or []))]
    auth = EngineHandle("").authorize(api_key).headers
    listed = {g: gateway_workers(g, timeout, auth) for g in gateways}
    engines += [GatewayWorker(g, w, timeout) for g, workers in listed.items() for w in workers]
    for e in engines:
        e.authorize(api_key)
    if not engines:
        raise ValueError("no engine to publish to: pass engine URLs or a gateway")
    version = version or f"pub-{uuid.uuid4().hex[:12]}"
    rng = random.Random(seed)
    results = [EngineResult(e.url, worker_url=getattr(e, "worker_url", None)) for e in engines]
    probes: List[Optional[List[int]]] = [None] * len(engines)
    resumed: List[int] = []  # engines resumed for their probe in phase 2: re-paused if anything fails
    current = results[0]
    fleet: Optional[FleetView] = None
    try:
        # phase 0, every engine still serving: plan it, and arm the probe of a stock engine with radix on
        for i, (e, res) in enumerate(zip(engines, results)):
            current = res
            probes[i] = _plan_and_arm(e, res, colocated, prefer_sharing, pause_mode, rng, probe_vocab)
        fleet_modes(results)  # a fleet that can never agree is refused before any engine is paused
        for e, res in zip(engines, results):
            current = res
            e.post_ok("/pause_generation", {"mode": res.planned().pause_mode})
            res.state = f"paused({res.planned().pause_mode})"
        for e, res in zip(engines, results):
            current = res
            _update(e, res, update, version)
        # phase 1, every engine paused: labels and vradix epochs on all of them
        for e, res, probe in zip(engines, results, probes):
            current = res
            _verify_paused(e, res, version)
            res.checks_passed = probe is None
        fleet = fleet_view(results)  # still all paused: engines that must agree serve one weight_id
        # phase 2: a probe needs generation, so only the engines with a probe are resumed, one after the other, and
        # they serve from here to the verdict; the first failure stops the phase (no further engine is resumed)
        for i, (e, res, probe) in enumerate(zip(engines, results, probes)):
            if probe is not None:
                current = res
                resumed.append(i)
                _probe(e, res, probe)
                res.checks_passed = True
        for g, before in listed.items():  # the fleet behind each gateway is still the one that was published
            current = next(r for r, e in zip(results, engines) if getattr(e, "gateway", None) == g)
            _same_workers(g, before, gateway_workers(g, timeout))
    except predicate.UnsafeDeployment:
        raise  # raised while planning, before any engine was paused
    except Exception as exc:  # noqa: BLE001 - every failure is reported with the evidence, then re-raised
        fleet_error = f"{type(exc).__name__}: {exc}" if isinstance(exc, FleetDisagreement) else None
        if fleet_error is None:
            current.error = f"{type(exc).__name__}: {exc}"
        if on_failure == "continue":
            _continue_all(engines, results)
        else:
            for i in resumed:  # each with its own plan's pause mode
                results[i].state = _repause(engines[i], results[i])
        raise PublishError(_failure_message(results, version, fleet_error), results, fleet) from exc
    for res in results:  # every engine passed every check: only now is any engine reported verified
        res.verified = True
    _continue_all(engines, results)
    return Publication(results, fleet)


def _plan_and_arm(e: EngineHandle, res: EngineResult, colocated, prefer_sharing, pause_mode, rng, vocab):
    info = e.server_info()
    blocks = e.vradix_blocks(info)
    d = deployment_of(info, blocks, colocated=colocated, prefer_sharing=prefer_sharing)
    if pause_mode is not None:
        d = predicate.Deployment(**{**d.__dict__, "pause_mode": pause_mode})
    res.plan = predicate.derive(d)
    res.vradix = d.vradix
    if res.vradix:
        ranks = [b for b in blocks if b is not None]  # all of them: vradix means every rank has an active block
        res.epochs_before = [b["epoch"] for b in ranks]
        res.weight_ids_before = [b.get("weight_id") for b in ranks]
        res.identity_mode, res.identity_requested = identity_mode_of(ranks)
        return None
    if not res.plan.radix_enabled:
        return None
    probe = probe_ids(rng, vocab=vocab)
    e.generate_ids(probe)
    res.probe_cached_before = e.probe_cached_tokens(probe)
    return probe


def identity_mode_of(blocks: List[dict]) -> tuple:
    """(the identity mode every rank runs, the mode it was started with or None where the server does not say);
    raises unless every rank runs the same mode."""
    modes = [(b.get("weight_identity") or {}).get("mode") for b in blocks]
    if len(set(modes)) != 1:
        raise RuntimeError(f"ranks run different weight-identity modes: {modes}")
    return modes[0], (blocks[0].get("weight_identity") or {}).get("requested")


def _update(e: EngineHandle, res: EngineResult, update: Update, version: str) -> None:
    if callable(update):
        update(e, version)
        res.update_message = "callable transfer"
    else:
        out = e.post("/update_weights_from_disk",
                     {"model_path": update, "weight_version": version, "flush_cache": res.planned().flush})
        body = out.json() if out.headers.get("content-type", "").startswith("application/json") else {}
        res.update_message = str(body.get("message", out.text))[:2000]
        if out.status_code != 200 or not body.get("success"):
            raise RuntimeError(f"update_weights_from_disk failed (HTTP {out.status_code}): {res.update_message}")
    if res.planned().flush:
        res.flush_message = e.post_ok("/flush_cache").text.strip()


def _verify_paused(e: EngineHandle, res: EngineResult, version: str) -> None:
    """Phase 1: everything that can be checked on a paused engine (the label; on vradix every rank's epoch too)."""
    res.label_after = e.label()
    if res.vradix:
        blocks = e.vradix_blocks()
        res.epochs_after = [b.get("epoch") if b else None for b in blocks]
        if res.label_after != version or any(b is None or b.get("label") != version for b in blocks):
            # a callable transfer that did not set the label: set it (a label change is itself a publication)
            e.post_ok("/update_weight_version", {"new_version": version})
            res.label_after = e.label()
            blocks = e.vradix_blocks()
            res.epochs_after = [b.get("epoch") if b else None for b in blocks]
        labels = [b.get("label") if b else None for b in blocks]
        if len(res.epochs_after) != len(res.epochs_before) or any(
                a is None or a <= b for a, b in zip(res.epochs_after, res.epochs_before)):
            raise RuntimeError(f"epoch did not advance on every rank: {res.epochs_before} -> {res.epochs_after}")
        if res.label_after != version or any(lbl != version for lbl in labels):
            raise RuntimeError(f"server reports label {res.label_after!r} (ranks {labels}), expected {version!r}")
        res.weight_ids_after = [b.get("weight_id") if b else None for b in blocks]
        check_weight_identity(res, version)
    elif res.label_after != version:
        raise RuntimeError(f"server reports weight_version {res.label_after!r}, expected {version!r}")


def check_weight_identity(res: EngineResult, version: str) -> None:
    """Every rank serves one identity after the publication: `declared:<version>` in declared mode, a new one in
    nonce mode (fingerprint mode may legitimately keep it: the same weights published again)."""
    ids = set(res.weight_ids_after)
    if len(ids) != 1 or None in ids:
        raise RuntimeError(f"ranks report different weight identities after the publication: {res.weight_ids_after}")
    (weight_id,) = ids
    if res.identity_mode == "declared" and weight_id != f"declared:{version}":
        raise RuntimeError(f"declared-identity engine reports weight_id {weight_id!r}, expected 'declared:{version}' "
                           "(was this label already used by an earlier publication?)")
    if res.identity_mode == "nonce" and weight_id in res.weight_ids_before:
        raise RuntimeError(f"weight_id {weight_id!r} did not change with the publication")


def _probe(e: EngineHandle, res: EngineResult, probe: List[int]) -> None:
    """Phase 2 on a stock engine: a paused engine serves no generation, so it is resumed for its probe."""
    res.state = "running"  # before the call: a continue that errors may still have resumed the engine
    e.post_ok("/continue_generation")
    res.probe_cached_after = e.probe_cached_tokens(probe)
    if res.probe_cached_after != 0:
        raise RuntimeError(f"probe prefix still cached after the flush: cached_tokens="
                           f"{res.probe_cached_after} (before: {res.probe_cached_before})")


def _same_workers(gateway: str, before: List[dict], after: List[dict]) -> None:
    ids = lambda ws: sorted((w["id"], w.get("url")) for w in ws)  # noqa: E731
    if ids(before) != ids(after):
        raise RuntimeError(f"gateway {gateway}'s workers changed during the publication: {ids(before)} -> "
                           f"{ids(after)}; a worker that joined was not published to, nor verified")


def _repause(e: EngineHandle, res: EngineResult) -> str:
    try:
        e.post_ok("/pause_generation", {"mode": res.planned().pause_mode})
        return f"paused({res.planned().pause_mode})"
    except Exception:  # noqa: BLE001
        return "running (re-pause failed)"


def _continue_all(engines, results) -> None:
    for e, res in zip(engines, results):
        if res.state.startswith("paused"):
            try:
                e.post_ok("/continue_generation")
                res.state = "running"
            except Exception as exc:  # noqa: BLE001
                res.error = (res.error or "") + f"; continue_generation failed: {exc}"


def _failure_message(results: List[EngineResult], version: str, fleet_error: Optional[str] = None) -> str:
    lines = [f"publication {version!r} NOT verified on all {len(results)} engine(s); nothing is reported published:"]
    lines += [f"  - {r.evidence()}" for r in results]
    if fleet_error:
        lines.append(f"fleet: {fleet_error}")
    paused = [r.url for r in results if r.state.startswith("paused")]
    if paused:
        lines.append(f"engines left paused: {paused}; resume with POST <url>/continue_generation once resolved")
    return "\n".join(lines)
