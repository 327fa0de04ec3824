"""The loop: GRPO steps on one server, publishing every step's weights into it, one-step-off asynchronous.

One-step-off: batch k + 1's rollouts start on the server when batch k's are in, and run while the trainer steps on
batch k; the step's weights are then published in place into the running server (the mode's pause, an update from
disk with a new version label, continue), so the rollouts in flight cross the publication and those admitted after
it run on the new weights. The trainer therefore always trains on samples drawn by the weights of at most one step
before (plus what the cache made them read). Batch k + 1 waits for nothing but its own requests; the trainer waits
for batch k + 1 before stepping again.

Every mode gets the same prompts (seeded) and the same request seeds; the policy is the same pretrained checkpoint.
"""
from __future__ import annotations

import os
import random
import sys
import time
from typing import Callable, Dict, List, Optional

from rl_rollout.ideal import ideal_work
from rl_rollout.modes import Mode
from rl_rollout.schedule import Publication

from . import policy
from .grpo import CROSSING, FRESH, STALE
from .provenance import stock_stale_prefixes
from .rollout import Background, draw_groups, run_batch, to_samples
from .task import Task
from .trainer import Trainer


def publish(server, mode: Mode, path: str, index: int, version: str, in_flight: int = 0) -> Publication:
    """One publication as the mode does it (the same calls as `rl_rollout.schedule.Schedule._publish`)."""
    pub = Publication(index, version, "train step", in_flight)
    t0 = time.perf_counter()
    server.pause(mode.pause_mode)
    t1 = time.perf_counter()
    server.update_weights(path, version, flush=False)
    t2 = time.perf_counter()
    if mode.flush:
        server.flush_cache()  # must succeed: a refused flush aborts the run rather than being counted
    t3 = time.perf_counter()
    pub.boundary = time.time() - (t3 - t1) / 2
    server.resume()
    pub.update_s, pub.flush_s, pub.pause_s = t2 - t1, t3 - t2, time.perf_counter() - t0
    return pub


def run(server, mode: Mode, policy_dir: str, task: Task, workdir: str, *, steps: int, prompts: int, n: int,
        turns: int, concurrency: int, seed: int, lr: float, correction: str = "none", name: str = "",
        log: Callable[[str], None] = lambda s: None, progress: bool = False) -> Dict[str, object]:
    """`steps` GRPO steps of `prompts` x `n` trajectories of `turns` turns on `server` (already started on
    `policy_dir`); one row of metrics per step. `name` labels the run (default: the mode's name); `progress`: a
    progress bar (tqdm, stderr) over the steps."""
    from tqdm import tqdm

    name = name or mode.name
    bar = tqdm(total=steps, desc=f"{name} ({turns} turn{'s' if turns > 1 else ''})", unit="step",
               disable=not progress, file=sys.stderr)
    rng = random.Random(f"{seed}:prompts")
    batches = [draw_groups(task, rng, prompts, turns) for _ in range(steps)]
    trainer = Trainer(policy.load(policy_dir), lr=lr, correction=correction)
    first = f"{name}-v0"
    server.reset(policy_dir, first)
    trainer.snapshot(first)
    order = {first: 0}
    pubs: List[Publication] = []
    records: List = []

    def rollout(k: int):
        before, t0 = server.prefill_counters(), time.perf_counter()
        trajs = run_batch(server, task, batches[k], n, concurrency, seed * 1_000_003 + k * prompts * n)
        after = server.prefill_counters()
        return trajs, {key: after[key] - before[key] for key in after}, time.perf_counter() - t0

    rows = []
    current = Background(lambda: rollout(0))
    t_step = time.perf_counter()
    for k in range(steps):
        trajs, counters, rollout_s = current.result(timeout=1800)
        batch_records = [r for tr in trajs for r in tr.records]
        records += batch_records
        nxt: Optional[Background] = Background(lambda k=k: rollout(k + 1)) if k + 1 < steps else None
        stale = None if mode.vradix else stock_stale_prefixes(records)
        samples = to_samples(trajs, order, stale, pubs)
        m = trainer.step(samples, n)
        version = f"{name}-v{k + 1}"
        path = policy.save(trainer.model, os.path.join(workdir, f"step{k + 1}"))
        pub = publish(server, mode, path, k + 1, version)
        pubs.append(pub)
        trainer.snapshot(version)
        order[version] = k + 1
        tokens_by_class = {name: sum(sum(1 for c, s in zip(x.classes, x.sampled) if s and c == cls) for x in samples)
                           for name, cls in (("fresh", FRESH), ("crossing", CROSSING), ("stale", STALE))}
        stale_prompt = (sum(stale[id(r)] for r in batch_records) if stale is not None else
                        sum((r.meta.get("vradix_staleness") or {}).get("stale_tokens", 0) for r in batch_records))
        # versions from the engine (each request's first sampled token), as for the shadow cache (provenance.py)
        ideal = ideal_work(records)["ideal_prompt_tokens"]
        prev_ideal = ideal_work(records[:len(records) - len(batch_records)])["ideal_prompt_tokens"] if k else 0
        row = {"step": k, "run": name, "reward": m["reward"], "loss": m["loss"], "grad_norm": m["grad_norm"],
               "kl_to_next": m["kl_to_next"], "clip_active": m["clip_active"], "tokens": m["tokens"],
               "tokens_trained": m["tokens_trained"], "reweighted": m["reweighted"], "tokens_by_class": tokens_by_class,
               "engine_vs_sampler": m["engine_vs_sampler"], "train_vs_rollout": m["train_vs_rollout"],
               "reference_vs_sampler": m["reference_vs_sampler"],
               "stale_prompt_tokens_reused": stale_prompt,
               "prompt_tokens_computed": int(round(counters["computed"])),
               "ideal_prompt_tokens": ideal - prev_ideal,
               "crossing_requests": sum(1 for r in batch_records if len(r.meta.get("weight_versions") or []) > 1),
               "unlabelled_crossing_requests": sum(x.meta["unlabelled_crossing"] for x in samples),
               "rollout_s": rollout_s, "train_s": m["train_s"], "pause_s": pub.pause_s,
               "step_s": time.perf_counter() - t_step}
        t_step = time.perf_counter()
        rows.append(row)
        ev = row["engine_vs_sampler"]
        log(f"{name} step {k}: reward {row['reward']:.3f}, |dlogp| fresh {ev['fresh']['abs_delta']:.2e} "
            f"({ev['fresh']['tokens']}) crossing {ev['crossing']['abs_delta']:.2e} ({ev['crossing']['tokens']}) "
            f"stale {ev['stale']['abs_delta']:.2e} ({ev['stale']['tokens']}), stale prompt tokens {stale_prompt}, "
            f"kl {row['kl_to_next']:.2e}, pause {pub.pause_s * 1000:.0f} ms")
        bar.set_postfix(reward=f"{row['reward']:.3f}", stale=tokens_by_class["stale"])
        bar.update()
        if nxt is not None:
            current = nxt
    bar.close()
    return {"run": name, "mode": mode.name, "correction": correction, "rows": rows,
            "publications": [vars(p) for p in pubs], "first_version": first, "records": records}
