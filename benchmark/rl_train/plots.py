"""The two figures of the ablation (PNG, matplotlib's file-only backend): the engine-vs-sampler mismatch over the
training steps per run, and each run's prompt work against its mismatch.

The mismatch is the mean |engine log-prob − the sampling weights' own log-prob| per sampled token of a step
(`engine_vs_sampler`), over every token (what the trainer sees) and over the tokens of requests that crossed no
publication (fresh and reused-stale ones: what the cache policy adds; a crossing request's own KV mixes weights in
every in-place mode alike). Work is the prompt tokens the engine computed over the run, relative to the ideal
correct engine (`ideal_prompt_tokens`)."""
from __future__ import annotations

import os
from typing import Dict, List

#: the floor drawn under a zero mismatch on the log axis (below float32's ~1e-7 recomputation noise)
FLOOR = 1e-8


def _by_workload(results: List[dict]) -> Dict[str, List[dict]]:
    out: Dict[str, List[dict]] = {}
    for res in results:
        out.setdefault(res["workload"], []).append(res)
    return out


#: the token classes each panel row averages over
SCOPES = {"every sampled token": ("fresh", "crossing", "stale"), "tokens of non-crossing requests": ("fresh", "stale")}


def mismatch(rows: List[dict], classes=SCOPES["tokens of non-crossing requests"]) -> float:
    """Token-weighted mean |Δ log-prob| over `rows` and the token `classes` (at least `FLOOR`)."""
    parts = [r["engine_vs_sampler"][c] for r in rows for c in classes]
    tokens = sum(p["tokens"] for p in parts)
    return max(sum(p["abs_delta"] * p["tokens"] for p in parts) / max(tokens, 1), FLOOR)


def work(rows: List[dict]) -> float:
    """Prompt tokens computed over the ideal correct engine's."""
    return sum(r["prompt_tokens_computed"] for r in rows) / max(sum(r["ideal_prompt_tokens"] for r in rows), 1)


def write(results: List[dict], out_dir: str) -> List[str]:
    """Write `mismatch_over_steps.png` and `work_vs_mismatch.png` into `out_dir`; returns their paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    groups = _by_workload(results)
    paths = []

    names = list(dict.fromkeys(res["run"] for res in results))
    color = {n: f"C{i}" for i, n in enumerate(names)}
    fig, axes = plt.subplots(len(SCOPES), len(groups), figsize=(6 * len(groups), 3.6 * len(SCOPES)), squeeze=False)
    for i, (scope, classes) in enumerate(SCOPES.items()):
        for ax, (workload, runs) in zip(axes[i], groups.items()):
            for res in runs:
                ax.plot([r["step"] for r in res["rows"]], [mismatch([r], classes) for r in res["rows"]], marker="o",
                        ms=3, color=color[res["run"]], label=res["run"])
            ax.set_yscale("log")
            ax.set_title(f"{workload}: {scope}", fontsize=10)
            ax.set_xlabel("training step")
            ax.set_ylabel("mean |Δ log-prob| vs sampling weights", fontsize=8)
            ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "mismatch_over_steps.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.8))
    markers = dict(zip(groups, "os^v"))
    for workload, runs in groups.items():
        for res in runs:
            ax.scatter([work(res["rows"])], [mismatch(res["rows"])], marker=markers[workload], s=40,
                       color=color[res["run"]], label=f"{res['run']} ({workload})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("prompt tokens computed / ideal correct engine")
    ax.set_ylabel("mean |Δ log-prob|, non-crossing requests' tokens", fontsize=8)
    ax.set_title("prompt work against mismatch, per run (o grpo, s multiturn)", fontsize=10)
    ax.legend(fontsize=6, ncol=2)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "work_vs_mismatch.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths
