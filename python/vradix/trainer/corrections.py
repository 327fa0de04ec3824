"""The two corrections RL trainers apply with per-token weight versions, aligned with `output_token_logprobs`:

- `mask`: which tokens to keep (1) or drop (0), given the trainer's version and an allowed staleness: a token is kept
  when the KV it read is at most `max_staleness` publications older than the trainer's version (without a trainer
  version: than the weights that sampled it, so `max_staleness=0` keeps only fresh tokens);
- `importance_weights`: truncated importance weights (TIS) w = min(exp(logp_trainer - logp_rollout), cap) per token,
  optionally only on tokens of some kinds (e.g. the crossing ones; 1 elsewhere).

Every result comes as the caller asks: a list, a numpy array or a torch tensor (`array=`), or, for the weights, the
type of `trainer_logprobs`. `pad_rows` lays per-response rows out as a [batch, width] array, the shape trainers batch.
Client side: numpy and torch are imported only when asked for.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, List, Optional, Sequence

from vradix.trainer.versions import KINDS, TokenVersions

ARRAYS = ("list", "numpy", "torch")


def to_array(values: Sequence[Any], array: str = "list", dtype: str = "float32") -> Any:
    """`values` as a list, a numpy array or a torch tensor of `dtype` ("float32", "int64", "bool")."""
    if array == "list":
        return list(values)
    if array == "numpy":
        import numpy as np

        return np.asarray(list(values), dtype=dtype)
    if array == "torch":
        import torch

        return torch.tensor(list(values), dtype=getattr(torch, dtype))
    raise ValueError(f"unknown array kind {array!r}; choose from {', '.join(ARRAYS)}")


def mask(tv: TokenVersions, trainer_version: Any = None, max_staleness: int = 0, array: str = "list",
         dtype: str = "int64") -> Any:
    """1 for each token to keep, 0 for each to drop: kept when the KV it read lags `trainer_version` by at most
    `max_staleness` publications (`TokenVersions.lag`), or, without a trainer version, lags its own sampler by at
    most that (`TokenVersions.staleness`)."""
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    lags = list(tv.staleness) if trainer_version is None else tv.lag(trainer_version)
    return to_array([1 if lag <= max_staleness else 0 for lag in lags], array, dtype)


def _selected(tv: TokenVersions, kinds: Optional[Iterable[str]]) -> Optional[List[bool]]:
    if kinds is None:
        return None
    chosen = set(kinds)
    unknown = chosen - set(KINDS)
    if unknown:
        raise ValueError(f"unknown token kinds {sorted(unknown)}; choose from {', '.join(KINDS)}")
    return [k in chosen for k in tv.kind]


def truncated_weights(trainer_logprobs: Any, rollout_logprobs: Any, cap: float = 2.0, apply: Any = None) -> Any:
    """min(exp(trainer - rollout), cap) elementwise, 1 where `apply` (same shape, bool) is False. Inputs are lists,
    numpy arrays or torch tensors of one shape; the result has `trainer_logprobs`' type (a tensor: its dtype and
    device, no gradient)."""
    if cap <= 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    try:
        import torch
    except ImportError:  # torch is optional
        torch = None  # type: ignore[assignment]
    if torch is not None and isinstance(trainer_logprobs, torch.Tensor):
        t = trainer_logprobs.detach()
        r = torch.as_tensor(rollout_logprobs, dtype=t.dtype, device=t.device)
        w = torch.clamp(torch.exp(t - r), max=cap)
        if apply is not None:
            w = torch.where(torch.as_tensor(apply, dtype=torch.bool, device=t.device), w, torch.ones_like(w))
        return w
    if type(trainer_logprobs).__module__ == "numpy":
        import numpy as np

        tn = np.asarray(trainer_logprobs)
        rn = np.asarray(rollout_logprobs).astype(tn.dtype)
        wn = np.minimum(np.exp(tn - rn), cap).astype(tn.dtype)
        if apply is not None:
            wn = np.where(np.asarray(apply).astype(bool), wn, np.ones_like(wn))
        return wn
    t_list, r_list = list(trainer_logprobs), list(rollout_logprobs)
    if len(t_list) != len(r_list):
        raise ValueError(f"{len(t_list)} trainer log-probs for {len(r_list)} rollout log-probs")
    flags = [True] * len(t_list) if apply is None else list(apply)
    return [min(math.exp(a - b), cap) if f else 1.0 for a, b, f in zip(t_list, r_list, flags)]


def importance_weights(tv: TokenVersions, trainer_logprobs: Any, cap: float = 2.0,
                       kinds: Optional[Iterable[str]] = None, rollout_logprobs: Any = None) -> Any:
    """Truncated importance weights (TIS) of one response's output tokens: min(pi_trainer / pi_rollout, cap) on the
    tokens whose kind is in `kinds` (every token when None), 1 on the others. `trainer_logprobs`: the trainer's
    log-prob of each output token (list, numpy or torch, as the response's tokens); `rollout_logprobs`: the
    engine's, default the response's own (`return_logprob`)."""
    rollout = rollout_logprobs if rollout_logprobs is not None else tv.logprobs
    if rollout is None:
        raise ValueError("the response carries no log-probs: send return_logprob (native) or logprobs (OpenAI), or "
                         "pass rollout_logprobs")
    if len(trainer_logprobs) != len(tv):
        raise ValueError(f"{len(trainer_logprobs)} trainer log-probs for {len(tv)} output tokens")
    return truncated_weights(trainer_logprobs, list(rollout), cap, _selected(tv, kinds))


def pad_rows(rows: Sequence[Sequence[Any]], width: Optional[int] = None, value: Any = 0, array: str = "list",
             dtype: str = "float32", left: bool = False) -> Any:
    """Per-response rows as one [len(rows), width] array, padded with `value` on the right (or the left): the
    [batch, response_length] layout trainers batch responses in. `width` defaults to the longest row."""
    width = max((len(r) for r in rows), default=0) if width is None else width
    out = []
    for r in rows:
        row = list(r)
        if len(row) > width:
            raise ValueError(f"a row of {len(row)} tokens does not fit width {width}")
        pad = [value] * (width - len(row))
        out.append(pad + row if left else row + pad)
    if array == "list":
        return out
    if array == "numpy":
        import numpy as np

        return np.asarray(out, dtype=dtype).reshape(len(out), width)
    if array == "torch":
        import torch

        return torch.tensor(out, dtype=getattr(torch, dtype)).reshape(len(out), width)
    raise ValueError(f"unknown array kind {array!r}; choose from {', '.join(ARRAYS)}")
