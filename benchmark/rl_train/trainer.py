"""The trainer: one GRPO step per batch of sampled trajectories, in torch, float32, with the HF model.

Each step recomputes every sampled token's log-prob twice, teacher-forced on the whole trajectory: under the
trainer's current weights (the PPO ratio's numerator, with gradients), and under the weights that sampled the token
(a snapshot kept per published version label), the exact reference the engine's returned log-prob is measured
against. On a correct engine the second mismatch is the numerical floor (prefill vs decode kernels) for every token
whose sampling step read only KV of its own weights.
"""
from __future__ import annotations

import copy
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Dict, List, Sequence

import torch

from . import grpo
from .policy import Batch, full_logprobs, token_logprobs


@dataclass
class Sample:
    """One trajectory: its tokens (prompt, responses, environment turns, in order) and, per token, what the engine
    said about it. Per-token lists have len(ids) entries; non-sampled tokens carry 0 / "" / FRESH."""

    group: int
    ids: List[int]
    sampled: List[int]               # 1 where the policy sampled ids[t]
    rollout_logprobs: List[float]    # the engine's log-prob of each sampled token (return_logprob)
    versions: List[str]              # the weight version that sampled each token
    classes: List[int]               # grpo.FRESH / CROSSING / STALE (provenance.py)
    reward: float
    meta: dict = field(default_factory=dict)


def _per_token(samples: Sequence[Sample], attr: str, width: int, dtype) -> torch.Tensor:
    out = torch.zeros(len(samples), width, dtype=dtype)
    for b, s in enumerate(samples):
        vals = getattr(s, attr)
        out[b, :len(vals)] = torch.tensor(vals, dtype=dtype)
    return out[:, 1:]


class Trainer:
    """The policy being trained, its optimiser, and snapshots of the last `keep` published versions' weights."""

    def __init__(self, model, lr: float = 1e-3, clip_eps: float = 0.2, correction: str = "none",
                 tis_cap: float = 2.0, max_grad_norm: float = 1.0, keep: int = 4, scale_advantages: bool = True):
        if correction not in grpo.CORRECTIONS:
            raise ValueError(f"unknown correction {correction!r}")
        self.model = model
        self.opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        self.clip_eps, self.correction, self.tis_cap = clip_eps, correction, tis_cap
        self.max_grad_norm, self.keep, self.scale_advantages = max_grad_norm, keep, scale_advantages
        self.snapshots: "OrderedDict[str, dict]" = OrderedDict()
        self._scratch = copy.deepcopy(model).eval()

    def snapshot(self, version: str) -> None:
        """Remember the current weights as `version` (call when they are published under that label)."""
        self.snapshots[version] = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        while len(self.snapshots) > self.keep:
            self.snapshots.popitem(last=False)

    @torch.no_grad()
    def logprobs_under(self, version: str, ids: torch.Tensor) -> torch.Tensor:
        """Teacher-forced token log-probs [B, L - 1] under the snapshot of `version`."""
        if version not in self.snapshots:
            raise KeyError(f"no snapshot of version {version!r} (kept: {list(self.snapshots)})")
        self._scratch.load_state_dict(self.snapshots[version])
        return token_logprobs(self._scratch, ids)

    def sampler_logprobs(self, samples: Sequence[Sample], ids: torch.Tensor) -> torch.Tensor:
        """Each sampled token's log-prob under the weights that sampled it (its `versions` entry)."""
        out = torch.zeros(ids.shape[0], ids.shape[1] - 1)
        for v in sorted({v for s in samples for v in s.versions if v}):
            sel = torch.zeros_like(out, dtype=torch.bool)
            for b, s in enumerate(samples):
                sel[b, :len(s.versions) - 1] = torch.tensor([x == v for x in s.versions[1:]])
            rows = sel.any(1)
            lp = self.logprobs_under(v, ids[rows])
            out[rows] = torch.where(sel[rows], lp, out[rows])
        return out

    def step(self, samples: Sequence[Sample], group_size: int) -> Dict[str, object]:
        """One GRPO step on `samples` (groups of `group_size` consecutive samples); the step's metrics."""
        t0 = time.perf_counter()
        batch = Batch.of([s.ids for s in samples], [s.sampled for s in samples])
        width = batch.ids.shape[1]
        rollout = _per_token(samples, "rollout_logprobs", width, torch.float32)
        classes = _per_token(samples, "classes", width, torch.long)
        mask = batch.mask
        adv = grpo.group_advantages([s.reward for s in samples], group_size, self.scale_advantages)
        clean = self.sampler_logprobs(samples, batch.ids)

        self.model.train()
        full = full_logprobs(self.model, batch.ids)
        lp = full.gather(-1, batch.ids[:, 1:, None]).squeeze(-1)
        logp_old, weights = grpo.correction(self.correction, classes, rollout, clean, self.tis_cap, lp.detach())
        loss, stats = grpo.ppo_clip_loss(lp, logp_old, adv, mask, self.clip_eps, weights)
        self.opt.zero_grad()
        loss.backward()
        gnorm = grpo.grad_norm(self.model.parameters())
        if self.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        self.opt.step()
        self.model.eval()
        with torch.no_grad():
            kl = grpo.policy_kl(full.detach(), full_logprobs(self.model, batch.ids), mask)
        trained = (mask * weights).sum().item()
        flagged = (mask > 0) & (weights != 1)
        return {
            "loss": loss.item(), "grad_norm": gnorm, "kl_to_next": kl, "clip_active": stats["clip_active"],
            "reward": sum(s.reward for s in samples) / len(samples), "tokens": int(mask.sum().item()),
            "tokens_trained": trained,
            # the tokens the correction reweighted or dropped: how many, their mean weight and the share at the cap
            "reweighted": {"tokens": int(flagged.sum().item()),
                           "mean_weight": weights[flagged].mean().item() if flagged.any() else 1.0,
                           "at_cap": (weights[flagged] >= self.tis_cap).float().mean().item() if flagged.any()
                           else 0.0},
            # the engine against the exact weights that sampled each token: the cache's doing
            "engine_vs_sampler": grpo.mismatch_by_class(clean, rollout, mask, classes, self.clip_eps),
            # the behaviour log-probs the loss used (after the correction) against the sampling weights' own: the
            # mismatch left in the loss (the engine's, except where a correction replaced the reference)
            "reference_vs_sampler": grpo.mismatch_by_class(clean, logp_old, mask * (weights > 0).float(), classes,
                                                            self.clip_eps),
            # the PPO ratio's view: the trainer's weights against the engine, policy lag included
            "train_vs_rollout": grpo.mismatch_by_class(lp.detach(), rollout, mask, classes, self.clip_eps),
            "train_s": time.perf_counter() - t0,
        }
