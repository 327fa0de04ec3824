"""From the loop's rows to the tables: one line per (workload, run, step)."""
from __future__ import annotations

from typing import List

from .plots import mismatch, work

COLUMNS = ("workload", "run", "step", "reward", "fresh", "crossing", "stale", "trained", "|dlogp| fresh", "|dlogp| crossing",
           "|dlogp| stale", "sq log-ratio", "ESS/n", "clip frac", "grad norm", "KL(next)", "stale prompt",
           "computed", "ideal", "pause ms", "step s")


def _row(workload: str, r: dict) -> List[str]:
    ev, by = r["engine_vs_sampler"], r["tokens_by_class"]
    return [workload, r["run"], str(r["step"]), f"{r['reward']:.3f}", str(by["fresh"]), str(by["crossing"]),
            str(by["stale"]), f"{r['tokens_trained']:.0f}", f"{ev['fresh']['abs_delta']:.1e}", f"{ev['crossing']['abs_delta']:.1e}",
            f"{ev['stale']['abs_delta']:.1e}", f"{ev['all']['sq_log_ratio']:.1e}", f"{ev['all']['ess_frac']:.4f}",
            f"{ev['all']['clip_frac']:.3f}", f"{r['grad_norm']:.3f}", f"{r['kl_to_next']:.1e}",
            str(r["stale_prompt_tokens_reused"]), str(r["prompt_tokens_computed"]), str(r["ideal_prompt_tokens"]),
            f"{r['pause_s'] * 1000:.0f}", f"{r['step_s']:.1f}"]


def table(results: List[dict]) -> str:
    """A markdown table: engine-vs-sampler mismatch per provenance class (the cache's doing), training signals and
    the engine's work per step."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for res in results:
        lines += ["| " + " | ".join(_row(res["workload"], r)) + " |" for r in res["rows"]]
    return "\n".join(lines)


SUMMARY = ("workload", "run", "mean reward", "tokens fresh / crossing / stale", "trained", "reweighted (mean w)",
           "|dlogp| non-crossing", "|dlogp| crossing", "|dlogp| all", "|dlogp| loss", "max |dlogp| fresh",
           "stale prompt",
           "work / ideal", "mean KL(next)", "mean pause ms")


def loss_mismatch(rows: List[dict]) -> float:
    """Token-weighted mean |behaviour log-prob the loss used - the sampling weights' own| over every trained token
    (`reference_vs_sampler`): the engine's mismatch, except where the correction replaced the reference."""
    parts = [r["reference_vs_sampler"]["all"] for r in rows if "reference_vs_sampler" in r]
    n = sum(p["tokens"] for p in parts)
    return sum(p["abs_delta"] * p["tokens"] for p in parts) / n if n else 0.0


def reweighted(rows: List[dict]) -> str:
    """Tokens the trainer's correction gave a weight other than 1 (0 masks one) and their token-weighted mean
    weight, over the run's steps."""
    parts = [r.get("reweighted") or {"tokens": 0, "mean_weight": 1.0} for r in rows]
    n = sum(p["tokens"] for p in parts)
    return f"{n} ({sum(p['tokens'] * p['mean_weight'] for p in parts) / n:.3f})" if n else "0"


def summary(results: List[dict]) -> str:
    """One line per (workload, run) over its steps: the mismatch the cache policy adds (over non-crossing requests'
    tokens; `plots.mismatch`), over every token, the work against the ideal correct engine, the per-step KL."""
    lines = ["| " + " | ".join(SUMMARY) + " |", "|" + "---|" * len(SUMMARY)]
    for res in results:
        rows = res["rows"]
        by = {c: sum(r["tokens_by_class"][c] for r in rows) for c in ("fresh", "crossing", "stale")}
        lines.append("| " + " | ".join([
            res["workload"], res["run"], f"{sum(r['reward'] for r in rows) / len(rows):.3f}",
            f"{by['fresh']} / {by['crossing']} / {by['stale']}", f"{sum(r['tokens_trained'] for r in rows):.0f}",
            reweighted(rows), f"{mismatch(rows):.1e}",
            f"{mismatch(rows, ('crossing',)):.1e}" if by["crossing"] else "-",
            f"{mismatch(rows, ('fresh', 'crossing', 'stale')):.1e}", f"{loss_mismatch(rows):.1e}",
            f"{max(r['engine_vs_sampler']['fresh']['max_abs_delta'] for r in rows):.1e}",
            str(sum(r["stale_prompt_tokens_reused"] for r in rows)), f"{work(rows):.2f}",
            f"{sum(r['kl_to_next'] for r in rows) / len(rows):.1e}",
            f"{1000 * sum(r['pause_s'] for r in rows) / len(rows):.0f}"]) + " |")
    return "\n".join(lines)
