"""Per output token: the weights that sampled it, the weights of the KV it read, its staleness and its kind, read from
one finished response (native `/generate` or OpenAI completion/chat).

Output token k of a request with a P-token prompt is sampled by the forward over position P + k - 1. That forward
reads the KV of positions [0, P + k): the ones before it, and its own position, computed under the sampling weights.
So, per token:
- `sampler`: the version that sampled it (SGLang's `weight_versions`, spans over output tokens; `weight_version` for
  all when absent);
- `kv_oldest`, `kv_newest`: the oldest and newest versions among the KV of positions [0, P + k) (vradix's
  `kv_weight_versions`, spans over prompt + output positions; vradix leaves them out when every position was
  computed under the version the request was admitted (or re-bound) under; on a response without vradix's fields
  a prompt position is taken as the admission version's and output position P + j - 1 as the sampler of token j's);
- `staleness`: the publications between `kv_oldest` and `sampler` (0 when they are one version);
- `kind`: `fresh` (every KV it read and its sampler are one version), `crossing` (its request crossed a publication:
  it read KV its own request computed under older weights than the ones that sampled it), `stale` (it read reused KV
  computed under weights older than its request's admission: a bounded request's reuse, `--vradix-max-staleness`).

**Versions.** A version is the label the publisher gave (`weight_version`). It is returned as an `int` when the label
is an integer (RL frameworks publish step numbers; miles' fields use the same rule), else as the string: `7` and
`"7"` are one version. Versions are ordered by the epochs the response gives (vradix: `kv_weight_versions`,
`prefix_cache`, `vradix_staleness`; epochs count every bump, a lock-aware flush included); on a response without
them (no vradix) by `order` when given ({label: publication index}), else by the labels when all are integers, else by
their order in `weight_versions`. A label the response gives no place to sits one publication after the one sampled
before it (a lower bound).

**Limits.** A response without vradix's fields (a stock engine) says nothing about reused KV, so no token is `stale`
there (`described` is False): unsafe reuse goes unseen, which is what vradix fixes. A retracted request
(`num_retractions` > 0) reports the KV it recomputed after its last retraction; a token sampled before it is taken to
have read its own sampler's KV (true for a `retract` pause, which retracts before the weights change).

Client side: no SGLang import; numpy and torch are imported only by `as_numpy` / `as_torch`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from vradix import labels

#: a weight version: the label, an int when the label is one
Version = Union[int, str]

FRESH, CROSSING, STALE = "fresh", "crossing", "stale"
KINDS = (FRESH, CROSSING, STALE)
#: each kind's integer code in arrays (`TokenVersions.codes`)
KIND_CODES = {FRESH: 0, CROSSING: 1, STALE: 2}
#: the response fields vradix adds, under OpenAI's `metadata` (SGLang 0.5.23) or `sglext` (later upstream)
OPENAI_KEYS = ("weight_version", "weight_versions", "prefix_cache", "kv_weight_versions", "vradix_staleness",
               "prefill_weight_versions", "num_retractions")


class ResponseError(ValueError):
    """The response lacks what per-token versions need; the message names what to ask the server for."""


def version(label: Any) -> Version:
    """The one rule for labels (`vradix.labels.step_number`, as in the response's miles fields): a step-number label
    (or an int) is an int, anything else its string."""
    if isinstance(label, bool):
        raise ResponseError(f"a weight version is a label or an int, not {label!r}")
    if isinstance(label, int):
        return label
    text = str(label)
    step = labels.step_number(text)
    return text if step is None else step


def _spans_over(spans: Sequence[Mapping[str, Any]], n: int, default: Any) -> List[Any]:
    out = [default] * n
    for sp in spans:
        for i in range(max(0, int(sp["start"])), min(int(sp["end"]), n)):
            out[i] = sp
    return out


@dataclass(frozen=True)
class TokenVersions:
    """Per-token weight versions of one response's output tokens; every per-token tuple has one entry per output
    token, in order, aligned with the response's `output_token_logprobs` (`logprobs`)."""

    prompt_tokens: int
    sampler: Tuple[Version, ...]
    kv_oldest: Tuple[Version, ...]
    kv_newest: Tuple[Version, ...]
    staleness: Tuple[int, ...]
    kind: Tuple[str, ...]
    #: the engine's log-prob of each output token (`return_logprob` / OpenAI `logprobs`), None when not asked for
    logprobs: Optional[Tuple[float, ...]]
    #: whether the response carried vradix's provenance (without it no token can be found `stale`)
    described: bool
    #: each version's place in publication order (epochs on a vradix response), for distances to other versions
    clock: Mapping[Version, int]
    #: the clock's unit: "epoch", "order", "label" or "appearance" (see the module docstring)
    clock_unit: str

    # ---- construction ---------------------------------------------------------------------------------------------
    @classmethod
    def from_response(cls, response: Mapping[str, Any], *, choice: int = 0,
                      order: Optional[Mapping[Any, int]] = None) -> "TokenVersions":
        """From a native `/generate` response (`{"meta_info": ...}`) or an OpenAI completion / chat completion
        (`{"choices": ..., "metadata" or "sglext": ..., "usage": ...}`); `choice` picks the OpenAI choice (vradix's
        `metadata` describes the first). `order` places labels on a response without epochs."""
        if isinstance(response, (list, tuple)):
            raise ResponseError("one response at a time: build a TokenVersions per element of a batched /generate")
        if "meta_info" in response:
            return cls.from_meta_info(response["meta_info"], order=order)
        if "choices" in response:
            return cls._from_openai(response, choice, order)
        if "completion_tokens" in response and "prompt_tokens" in response:
            return cls.from_meta_info(response, order=order)
        raise ResponseError("not a /generate response (meta_info) nor an OpenAI completion (choices)")

    @classmethod
    def _from_openai(cls, response: Mapping[str, Any], choice: int,
                     order: Optional[Mapping[Any, int]]) -> "TokenVersions":
        choices = response["choices"]
        if not 0 <= choice < len(choices):
            raise ResponseError(f"choice {choice} of a response with {len(choices)} choice(s)")
        ch = choices[choice]
        meta: Dict[str, Any] = {}
        for source in (response.get("sglext"), ch.get("sglext"), response.get("metadata")):
            if isinstance(source, Mapping):
                meta.update({k: source[k] for k in OPENAI_KEYS if k in source and k not in meta})
        if "weight_version" not in meta:
            raise ResponseError("the OpenAI response has no weight_version in `metadata` or `sglext` (SGLang adds it "
                                "to every completion; is this an SGLang server?)")
        if choice and meta.get("prefix_cache") is not None:
            raise ResponseError("vradix's OpenAI metadata describes the first choice only: send n=1, or use /generate")
        lp = ch.get("logprobs")
        logprobs: Optional[List[float]] = None
        if isinstance(lp, Mapping):
            if lp.get("token_logprobs") is not None:            # completions
                logprobs = [float(x) for x in lp["token_logprobs"]]
            elif lp.get("content") is not None:                 # chat completions
                logprobs = [float(x["logprob"]) for x in lp["content"]]
        usage = response.get("usage") or {}
        if "prompt_tokens" not in usage:
            raise ResponseError("the OpenAI response has no usage.prompt_tokens")
        completion = len(logprobs) if logprobs is not None else usage.get("completion_tokens")
        if completion is None:
            raise ResponseError("the OpenAI response has neither logprobs nor usage.completion_tokens")
        if logprobs is None and len(choices) > 1:
            raise ResponseError("with n > 1, ask for logprobs: usage counts every choice's tokens")
        return cls.build(meta, int(usage["prompt_tokens"]), int(completion), logprobs, order)

    @classmethod
    def from_meta_info(cls, meta_info: Mapping[str, Any], *,
                       order: Optional[Mapping[Any, int]] = None) -> "TokenVersions":
        """From a native response's `meta_info` (`prompt_tokens`, `completion_tokens`, the version fields and, with
        `return_logprob`, `output_token_logprobs`)."""
        for key in ("prompt_tokens", "completion_tokens", "weight_version"):
            if key not in meta_info:
                raise ResponseError(f"meta_info has no {key!r}: pass a finished /generate response's meta_info")
        lps = meta_info.get("output_token_logprobs")
        logprobs = None if lps is None else [float(x[0]) for x in lps]
        return cls.build(meta_info, int(meta_info["prompt_tokens"]), int(meta_info["completion_tokens"]), logprobs,
                         order)

    @classmethod
    def build(cls, meta: Mapping[str, Any], prompt_tokens: int, n: int, logprobs: Optional[Sequence[float]] = None,
              order: Optional[Mapping[Any, int]] = None) -> "TokenVersions":
        """From the version fields of a response (`meta` in `meta_info`'s names), its prompt length and its number of
        output tokens; the single implementation behind every constructor."""
        if logprobs is not None and len(logprobs) != n:
            raise ResponseError(f"{len(logprobs)} log-probs for {n} output tokens")
        P = prompt_tokens
        sampler_spans = meta.get("weight_versions") or [{"version": meta["weight_version"], "start": 0, "end": n}]
        samplers: List[Version] = [version(sampler_spans[0]["version"])] * n
        for sp in sampler_spans:
            for j in range(max(0, sp["start"]), min(sp["end"], n)):
                samplers[j] = version(sp["version"])
        sequence = list(dict.fromkeys(version(sp["version"]) for sp in sampler_spans))
        kv_spans = list(meta.get("kv_weight_versions") or [])
        prefix = meta.get("prefix_cache") or None
        bounded = meta.get("vradix_staleness") or None
        described = prefix is not None
        clock, unit = _clock(sequence, kv_spans, prefix, bounded, order)
        admitted_label = version(prefix["weight_version"]) if prefix else (samplers[0] if n else
                                                                              version(meta["weight_version"]))
        if bounded is not None and "admitted_epoch" in bounded:
            admitted = int(bounded["admitted_epoch"])
            admitted_label = next((v for v, c in clock.items() if c == admitted), admitted_label)
        elif prefix is not None and "epoch" in prefix:
            admitted = int(prefix["epoch"])
        else:
            admitted = clock[admitted_label]
        retracted = int(meta.get("num_retractions") or 0) > 0

        # every position [0, P + n - 1) a token can read: (clock, label)
        total = P + max(n - 1, 0)
        covering = _spans_over(kv_spans, total, None)
        at: List[Tuple[int, Version]] = []
        for i in range(total):
            sp = covering[i]
            if sp is not None:
                label = version(sp["version"])
                at.append((int(sp["epoch"]) if unit == "epoch" and "epoch" in sp else clock[label], label))
            elif described or i < P:
                # vradix names every position computed under another epoch than its admission (or its re-bind
                # after a retraction, which recomputes what came before)
                at.append((admitted, admitted_label))
            else:                                   # output position P + j - 1: computed by the sampler of token j
                s = samplers[i - P + 1]
                at.append((clock[s], s))

        oldest_l: List[Version] = []
        newest_l: List[Version] = []
        stal: List[int] = []
        kinds: List[str] = []
        lo: Optional[Tuple[int, Version]] = None
        hi: Optional[Tuple[int, Version]] = None
        seen = 0
        for k, s in enumerate(samplers):
            end = P + k
            for i in range(seen, end):
                c = at[i]
                lo = c if lo is None or c[0] < lo[0] else lo
                hi = c if hi is None or c[0] > hi[0] else hi
            seen = max(seen, end)
            sc = clock[s]
            if lo is None or hi is None or (retracted and sc < admitted):
                # read nothing (an empty prompt), or sampled before its last retraction: its own sampler's KV
                oldest_l.append(s)
                newest_l.append(s)
                stal.append(0)
                kinds.append(FRESH)
                continue
            oldest_l.append(lo[1])
            newest_l.append(hi[1])
            stal.append(max(0, sc - lo[0]))
            if lo[0] < admitted:
                kinds.append(STALE)
            elif lo[0] != sc or hi[0] != sc:
                kinds.append(CROSSING)
            else:
                kinds.append(FRESH)
        return cls(P, tuple(samplers), tuple(oldest_l), tuple(newest_l), tuple(stal), tuple(kinds),
                   None if logprobs is None else tuple(float(x) for x in logprobs), described, clock, unit)

    # ---- reading --------------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.sampler)

    @property
    def codes(self) -> Tuple[int, ...]:
        """`kind` as integer codes (`KIND_CODES`: fresh 0, crossing 1, stale 2)."""
        return tuple(KIND_CODES[k] for k in self.kind)

    def counts(self) -> Dict[str, int]:
        """Tokens per kind."""
        return {k: self.kind.count(k) for k in KINDS}

    def distance(self, older: Any, newer: Any) -> int:
        """Publications from version `older` to version `newer` (negative when `newer` is the older one): by this
        response's clock when it places both, else by the labels when both are integers (step numbers). Raises
        `ResponseError` naming the alternatives otherwise."""
        a, b = version(older), version(newer)
        if a in self.clock and b in self.clock:
            return self.clock[b] - self.clock[a]
        if isinstance(a, int) and isinstance(b, int):
            return b - a
        raise ResponseError(f"cannot place version {older!r} and {newer!r}: this response orders "
                            f"{sorted(map(str, self.clock))}; publish integer step labels, or name a version it holds")

    def lag(self, trainer_version: Any) -> List[int]:
        """Per token: the publications between the oldest KV it read and `trainer_version` (the weights the trainer
        computes its log-probs under)."""
        return [self.distance(old, trainer_version) for old in self.kv_oldest]

    def columns(self) -> Dict[str, List[Any]]:
        """The per-token columns as plain lists: sampler, kv_oldest, kv_newest, staleness, kind, code, logprob."""
        out: Dict[str, List[Any]] = {"sampler": list(self.sampler), "kv_oldest": list(self.kv_oldest),
                                     "kv_newest": list(self.kv_newest), "staleness": list(self.staleness),
                                     "kind": list(self.kind), "code": list(self.codes)}
        if self.logprobs is not None:
            out["logprob"] = list(self.logprobs)
        return out

    def as_numpy(self) -> Dict[str, Any]:
        """The columns as numpy arrays (staleness and code int64, logprob float32; versions int64 when every version
        is an int, else object arrays of labels); `kind` stays a list of strings."""
        import numpy as np

        out: Dict[str, Any] = {}
        for name, values in self.columns().items():
            if name == "kind":
                out[name] = values
            elif name == "logprob":
                out[name] = np.asarray(values, dtype=np.float32)
            elif name in ("staleness", "code") or all(isinstance(v, int) for v in values):
                out[name] = np.asarray(values, dtype=np.int64)
            else:
                out[name] = np.asarray(values, dtype=object)
        return out

    def as_torch(self) -> Dict[str, Any]:
        """The columns as torch tensors (staleness, code and integer versions int64, logprob float32). Versions that
        are not integers have no tensor: they are left out (read them from `columns()`)."""
        import torch

        out: Dict[str, Any] = {}
        for name, values in self.columns().items():
            if name == "logprob":
                out[name] = torch.tensor(values, dtype=torch.float32)
            elif name != "kind" and all(isinstance(v, int) for v in values):
                out[name] = torch.tensor(values, dtype=torch.int64)
        return out


def _clock(sequence: List[Version], kv_spans: Sequence[Mapping[str, Any]], prefix: Optional[Mapping[str, Any]],
           bounded: Optional[Mapping[str, Any]], order: Optional[Mapping[Any, int]]) -> Tuple[Dict[Version, int], str]:
    """Each version's place: epochs where the response gives them, else `order`, else integer labels, else the order
    of `sequence` (the sampler spans' versions); a version left without one sits one after the version sampled
    before it (the first: one before the next known one)."""
    clock: Dict[Version, int] = {}
    for sp in kv_spans:
        if "epoch" in sp:
            clock.setdefault(version(sp["version"]), int(sp["epoch"]))
    if prefix is not None and "epoch" in prefix:
        clock.setdefault(version(prefix["weight_version"]), int(prefix["epoch"]))
    if clock:
        unit = "epoch"
    elif order:
        unit = "order"
        clock = {version(k): int(v) for k, v in order.items()}
    else:
        named = set(sequence) | {version(sp["version"]) for sp in kv_spans}
        if prefix is not None:
            named.add(version(prefix["weight_version"]))
        if named and all(isinstance(v, int) for v in named):
            unit = "label"
            clock = {v: int(v) for v in named}
        else:
            unit = "appearance"
    known = [i for i, v in enumerate(sequence) if v in clock]
    if not known:
        base = int(bounded["admitted_epoch"]) if unit == "epoch" and bounded and "admitted_epoch" in bounded else 0
        for i, v in enumerate(sequence):
            clock[v] = base + i
    else:
        first = known[0]
        for i in range(first - 1, -1, -1):
            clock.setdefault(sequence[i], clock[sequence[i + 1]] - 1)
        for i in range(first + 1, len(sequence)):
            clock.setdefault(sequence[i], clock[sequence[i - 1]] + 1)
    for sp in kv_spans:                     # a span label the epochs left out (a span without an epoch)
        clock.setdefault(version(sp["version"]), max(clock.values(), default=0))
    if prefix is not None:
        clock.setdefault(version(prefix["weight_version"]), min(clock.values(), default=0))
    return clock, unit
