"""The loop's invariants (`--check`, the CI smoke): what must hold whatever the seed, per run present.

- every run: one row and one publication per step; rewards in [0, 1]; the policy moved (KL to the next policy > 0)
  and had a gradient;
- in_place+vradix (exact): no token ever read reused stale KV, no stale prompt token was reused, and every token of a
  request that crossed no publication has the engine's log-prob at the numerical floor (`FLOOR`) against the
  trainer's float32 recomputation under the weights that sampled it;
- in_place+vradix+tis: the same as in_place+vradix, and the trainer reweighted only crossing tokens (as many tokens
  carry a weight other than 1 as there are crossing tokens at most);
- retract+vradix: no token is stale or crossing (every retracted request re-prefilled under the new weights), no
  stale prompt token was reused, and every token's engine log-prob is at the floor;
- in_place (unsafe): after a publication, some request reused KV the previous weights computed, and its tokens are
  off the floor.
"""
from __future__ import annotations

from typing import List

#: float32 recomputation noise of the tiny policy is ~1e-6 per token; a stale prefix moves log-probs by ~1e-2
FLOOR = 1e-4


def violations(results: List[dict]) -> List[str]:
    """Every invariant a run's result breaks, as a line naming the run, the step and the figure."""
    out = []
    for res in results:
        name, rows = f"{res['workload']}/{res['run']}", res["rows"]
        if len(rows) != len(res["publications"]):
            out.append(f"{name}: {len(rows)} rows for {len(res['publications'])} publications")
        for r in rows:
            if not (0 <= r["reward"] <= 1 and r["kl_to_next"] > 0 and r["grad_norm"] > 0):
                out.append(f"{name} step {r['step']}: reward {r['reward']}, KL {r['kl_to_next']}, "
                           f"grad norm {r['grad_norm']}")
        if res["run"] in ("in_place+vradix", "in_place+vradix+tis"):
            for r in rows:
                stale, reused = r["tokens_by_class"]["stale"], r["stale_prompt_tokens_reused"]
                fresh = r["engine_vs_sampler"]["fresh"]["max_abs_delta"]
                if stale or reused or fresh >= FLOOR:
                    out.append(f"{name} step {r['step']}: {stale} tokens read stale KV, {reused} stale prompt "
                               f"tokens reused, fresh tokens' max |Δ log-prob| {fresh:.1e} (floor {FLOOR:.0e})")
        if res["run"] == "in_place+vradix+tis":
            for r in rows:
                moved, crossing = (r.get("reweighted") or {}).get("tokens", 0), r["tokens_by_class"]["crossing"]
                if moved > crossing:
                    out.append(f"{name} step {r['step']}: {moved} tokens reweighted, only {crossing} crossing")
        if res["run"] == "retract+vradix":
            for r in rows:
                by, reused = r["tokens_by_class"], r["stale_prompt_tokens_reused"]
                worst = max(r["engine_vs_sampler"][c]["max_abs_delta"] for c in ("fresh", "crossing", "stale"))
                if by["stale"] or by["crossing"] or reused or worst >= FLOOR:
                    out.append(f"{name} step {r['step']}: {by['stale']} stale and {by['crossing']} crossing tokens, "
                               f"{reused} stale prompt tokens reused, max |Δ log-prob| {worst:.1e} (floor {FLOOR:.0e})")
        if res["run"] == "in_place" and not any(
                r["tokens_by_class"]["stale"] and r["stale_prompt_tokens_reused"]
                and r["engine_vs_sampler"]["stale"]["abs_delta"] >= FLOOR for r in rows[1:]):
            out.append(f"{name}: no step after a publication reused stale KV (the unsafe mode must)")
    return out
