"""GRPO's arithmetic: group-normalised advantages, the PPO-clip loss against the rollout log-probs the engine
returned, the train-vs-rollout mismatch metrics (split by each token's provenance), the per-token weights of a
trainer that uses the provenance, grad norm and the KL between consecutive policies.

Tensors are [B, T] over the trained (response) tokens of a `policy.Batch`: `mask` is 1 where a token counts.
Log-ratios are trainer minus rollout: log(pi_train / pi_rollout), the importance weight's log.
"""
from __future__ import annotations

import math
from typing import Dict, Optional, Sequence, Tuple

import torch

from vradix.trainer import truncated_weights

#: a token's provenance: which weights computed the KV its sampling step read (see provenance.py)
FRESH, CROSSING, STALE = 0, 1, 2
CLASSES = {"fresh": FRESH, "crossing": CROSSING, "stale": STALE}
#: how a trainer treats the tokens the provenance flags: `mask` and `tis` the stale ones (in_place+vradix(K) with
#: provenance), `tis_crossing` the crossing ones (in_place+vradix+tis)
CORRECTIONS = ("none", "mask", "tis", "tis_crossing")


def group_advantages(rewards: Sequence[float], group_size: int, scale: bool = True,
                     eps: float = 1e-6) -> torch.Tensor:
    """A_i = r_i - mean(group), divided by the group's (population) std + eps when `scale` (GRPO; without it,
    Dr. GRPO's unscaled form). Groups are consecutive runs of `group_size`. Every group's advantages sum to zero; a
    group of equal rewards has all-zero advantages (it carries no signal)."""
    r = torch.as_tensor(list(rewards), dtype=torch.float64)
    if r.numel() % group_size:
        raise ValueError(f"{r.numel()} rewards do not split into groups of {group_size}")
    g = r.view(-1, group_size)
    a = g - g.mean(1, keepdim=True)
    if scale:
        a = a / (g.std(1, unbiased=False, keepdim=True) + eps)
    return a.reshape(-1).float()


def ppo_clip_loss(logp: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                  clip_eps: float = 0.2, weights: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, dict]:
    """The PPO-clip surrogate, token mean over the masked tokens of the batch:
    -mean[w * min(rho * A, clip(rho, 1 - eps, 1 + eps) * A)], rho = exp(logp - logp_old).

    `adv` is per sequence [B] (broadcast over its tokens) or per token [B, T]; `weights` (detached, [B, T]) scale
    each token's term (the provenance correction: 0 masks a token). Stats: `clip_active`, the fraction of masked
    tokens whose gradient the clip removed (the min chose the clipped branch and rho is outside the range)."""
    adv = adv[:, None] if adv.dim() == 1 else adv
    ratio = torch.exp(logp - logp_old)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv
    term = torch.min(unclipped, clipped)
    w = mask if weights is None else mask * weights
    n = mask.sum().clamp(min=1)
    loss = -(term * w).sum() / n
    with torch.no_grad():
        active = ((adv > 0) & (ratio > 1 + clip_eps)) | ((adv < 0) & (ratio < 1 - clip_eps))
        stats = {"clip_active": ((active.float() * mask).sum() / n).item(), "tokens": int(mask.sum().item())}
    return loss, stats


def mismatch(logp_train: torch.Tensor, logp_rollout: torch.Tensor, mask: torch.Tensor,
             clip_eps: float = 0.2) -> dict:
    """Train-vs-rollout mismatch over the masked tokens, d = logp_train - logp_rollout, w = exp(d):
    mean |d|, mean d^2 (the squared log-ratio), max |d|, the importance weights' effective sample size
    (sum w)^2 / sum w^2 (n when every weight is equal, 1 when one dominates) and its fraction of n, and the clip
    fraction (|w - 1| > clip_eps). All zero over no tokens."""
    m = mask.bool()
    d = (logp_train - logp_rollout).detach().double()[m]
    n = d.numel()
    if n == 0:
        return {"tokens": 0, "abs_delta": 0.0, "sq_log_ratio": 0.0, "max_abs_delta": 0.0, "ess": 0.0,
                "ess_frac": 0.0, "clip_frac": 0.0}
    # weights relative to the largest: the ESS is scale-free, and exp of a large log-ratio overflows
    w = torch.exp(d - d.max())
    ess = (w.sum() ** 2 / (w * w).sum()).item()
    return {"tokens": n, "abs_delta": d.abs().mean().item(), "sq_log_ratio": (d * d).mean().item(),
            "max_abs_delta": d.abs().max().item(), "ess": ess, "ess_frac": ess / n,
            "clip_frac": ((torch.exp(d) - 1).abs() > clip_eps).double().mean().item()}


def mismatch_by_class(logp_train: torch.Tensor, logp_rollout: torch.Tensor, mask: torch.Tensor,
                      classes: torch.Tensor, clip_eps: float = 0.2) -> Dict[str, dict]:
    """`mismatch` over all masked tokens ("all") and over each provenance class's tokens."""
    out = {"all": mismatch(logp_train, logp_rollout, mask, clip_eps)}
    for name, c in CLASSES.items():
        out[name] = mismatch(logp_train, logp_rollout, mask * (classes == c).float(), clip_eps)
    return out


def correction(kind: str, classes: torch.Tensor, logp_rollout: torch.Tensor,
               logp_clean: Optional[torch.Tensor] = None, cap: float = 2.0,
               logp_trainer: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(behaviour log-probs for the PPO ratio, per-token weights) for a trainer that treats the tokens whose
    sampling read reused stale KV (class STALE) by `kind`:
      none  train on every token against the rollout log-probs (what a trainer without provenance does);
      mask  drop the STALE tokens (weight 0);
      tis   for STALE tokens only, take the ratio against `logp_clean` (the trainer's log-probs under the weights
            that sampled the token, recomputed for the flagged samples alone) and weight the token by the truncated
            importance weight min(pi_clean / pi_rollout, cap), the decoupled-PPO form of `--use-tis`;
      tis_crossing  for CROSSING tokens only, what a trainer does with `vradix.trainer.importance_weights(...,
            kinds=("crossing",))`: the ratio against `logp_trainer` (the trainer's own log-probs before the step,
            detached: the trainer's version) and the weight min(pi_trainer / pi_rollout, cap) (TIS).
    Every other token keeps the rollout log-probs and weight 1."""
    stale = classes == STALE
    ones = torch.ones_like(logp_rollout)
    if kind == "none":
        return logp_rollout, ones
    if kind == "mask":
        return logp_rollout, (~stale).float()
    if kind == "tis":
        if logp_clean is None:
            raise ValueError("tis needs the clean log-probs of the STALE tokens")
        w = torch.clamp(torch.exp(logp_clean - logp_rollout), max=cap).detach()
        return torch.where(stale, logp_clean, logp_rollout), torch.where(stale, w, ones)
    if kind == "tis_crossing":
        if logp_trainer is None:
            raise ValueError("tis_crossing needs the trainer's log-probs")
        crossing = classes == CROSSING
        reference = logp_trainer.detach()
        w = truncated_weights(reference, logp_rollout, cap, apply=crossing)
        return torch.where(crossing, reference, logp_rollout), w
    raise ValueError(f"unknown correction {kind!r}; choose from {', '.join(CORRECTIONS)}")


def policy_kl(full_old: torch.Tensor, full_new: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean over the masked positions of KL(pi_old || pi_new), exact over the vocabulary, from the two policies'
    log-softmax [B, T, V] on the same sequences."""
    kl = (full_old.exp() * (full_old - full_new)).sum(-1)
    n = mask.sum().clamp(min=1)
    return ((kl * mask).sum() / n).item()


def grad_norm(parameters) -> float:
    """The global L2 norm of the gradients (what clip_grad_norm_ reports), 0 without gradients."""
    sq = sum(float((p.grad.detach().double() ** 2).sum()) for p in parameters if p.grad is not None)
    return math.sqrt(sq)
