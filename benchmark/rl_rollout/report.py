"""From raw runs to the report: one row per (workload, mode, schedule), the tables, the targets, the PNGs, and the
raw dump that lets every accounting step be rerun without a server (--reanalyze)."""
from __future__ import annotations

import datetime
import json
import math
import os
import statistics
from dataclasses import asdict
from typing import List, Optional

from .client import Record
from .divergence import stale_by_staleness
from .ideal import ideal_work
from .modes import MODE_NAMES, Mode
from .schedule import Publication
from .shadow_cache import stale_reuse
from .workload import WORKLOADS

#: work / ideal prompt tokens allowed for in_place+vradix
IDEAL_TARGET = 1.10
COLORS = {"radix-off": "#999999", "retract+flush": "#e69f00", "in_place": "#d55e00", "in_place+vradix": "#0072b2",
          "in_place+vradix(1)": "#56b4e9", "in_place+vradix(2)": "#009e73"}


def percentile(xs: List[float], q: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


def trace_columns(records: List[Record], publications: List[Publication], first_version: str,
                  computed: int) -> dict:
    """Every column computed from the trace alone: stale reuse, the ideal work and the missed-reuse breakdown."""
    ideal = ideal_work(records, publications, first_version)
    return {**stale_reuse(records, publications, first_version), **ideal,
            "work_over_ideal": round(computed / ideal["ideal_prompt_tokens"], 3)
            if ideal["ideal_prompt_tokens"] else 0.0}


def summarize(workload: str, mode: Mode, raw: dict, publish_every: int) -> dict:
    recs: List[Record] = raw["records"]
    prompt = sum(r.meta["prompt_tokens"] for r in recs)
    cached = sum(r.meta["cached_tokens"] for r in recs)
    out_tokens = sum(r.meta["completion_tokens"] for r in recs)
    c = raw["counters"]
    computed = int(round(c["computed"]))
    reprefilled = int(round(c["computed"] - c["computed_first_attempt"]))
    pauses = [p.pause_s for p in raw["publications"]]
    pubs = len(raw["publications"])
    row = {
        "workload": workload, "mode": mode.name, "publish_every": publish_every,
        "requests": len(recs),
        "prompt_tokens": prompt,
        "prefill_computed": computed,
        "prefill_computed_client": prompt - cached + reprefilled,
        "cache_hit_rate": round(cached / prompt, 4) if prompt else 0.0,
        "reprefilled_tokens": reprefilled,
        "publications": pubs,
        "reprefilled_per_publication": round(reprefilled / pubs, 1) if pubs else 0.0,
        "in_flight_per_publication": round(statistics.mean(p.in_flight for p in raw["publications"]), 1)
        if pubs else 0.0,
        "retractions": sum(r.meta.get("num_retractions", 0) for r in recs),
        **trace_columns(recs, raw["publications"], raw["first_version"], computed),
        "wall_s": round(raw["wall_s"], 2),
        "pause_mean_ms": round(statistics.mean(pauses) * 1e3, 1) if pauses else 0.0,
        "pause_p99_ms": round(percentile(pauses, 0.99) * 1e3, 1),
        "req_per_s": round(len(recs) / raw["wall_s"], 2),
        "output_tok_per_s": round(out_tokens / raw["wall_s"], 1),
        "publication_log": [asdict(p) for p in raw["publications"]],
    }
    row["stale_tokens_by_staleness"] = stale_by_staleness(recs)
    row.update(raw.get("divergence") or {})
    if raw.get("vradix"):
        v = raw["vradix"]
        row["vradix_server"] = {k: v.get(k) for k in ("epoch", "publications", "stale_tokens_freed_total",
                                                     "stale_tokens_freed_at_release", "crossing_requests",
                                                     "stale_tokens_pinned")}
    return row


# ---- raw dump and reanalysis --------------------------------------------------------------------------------------------
def dump_raw(path: str, workload: str, mode: Mode, publish_every: int, raw: dict) -> None:
    """Append one run's requests and publication log (JSON lines) so the accounting can be rerun: --reanalyze."""
    with open(path, "a") as f:
        f.write(json.dumps({"workload": workload, "mode": mode.name, "publish_every": publish_every,
                            "first_version": raw["first_version"],
                            "publications": [asdict(p) for p in raw["publications"]],
                            "records": [asdict(r) for r in raw["records"]]}) + "\n")


def row_key(row: dict) -> tuple:
    return row["workload"], row["mode"], row.get("publish_every")


def reanalyze(raw_path: str, json_path: str, png_path: Optional[str]) -> None:
    """Recompute the trace columns (stale reuse, ideal work, missed reuse) of a finished run from its --raw file (no
    server needed): print them, and when `json_path` holds that run's report, update its rows and targets and redraw
    the PNG."""
    report = None
    if json_path and os.path.exists(json_path):
        with open(json_path) as f:
            report = json.load(f)
    computed = {row_key(r): r["prefill_computed"] for r in (report or {}).get("rows", [])}
    columns = {}
    with open(raw_path) as f:
        for line in f:
            run = json.loads(line)
            key = (run["workload"], run["mode"], run.get("publish_every"))
            records = [Record(**r) for r in run["records"]]
            work = computed.get(key) or sum(r.meta["prompt_tokens"] - r.meta["cached_tokens"] for r in records)
            columns[key] = trace_columns(records, [Publication(**p) for p in run["publications"]],
                                         run["first_version"], work)
    for key, out in columns.items():
        print(" ".join(str(k) for k in key), out)
    if report is None:
        return
    for row in report["rows"]:
        row.update(columns.get(row_key(row), {}))
    report["targets"] = check_targets(report["rows"], report["config"]["samples"])
    report["reanalyzed"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    with open(json_path, "w") as f:
        json.dump(report, f, indent=1)
    print_report(report["rows"], report["targets"])
    if png_path:
        why = write_png(report["rows"], png_path)
        print(f"PNG: {png_path}" if why is None else f"PNG: skipped ({why})")


# ---- tables and targets ---------------------------------------------------------------------------------------------------
COLUMNS = [("workload", "workload"), ("mode", "mode"), ("publish_every", "pub every"), ("requests", "requests"),
           ("prefill_computed", "prompt tokens computed"), ("ideal_prompt_tokens", "ideal prompt tokens"),
           ("work_over_ideal", "work / ideal"), ("cache_hit_rate", "cache hit rate"),
           ("reprefilled_tokens", "re-prefilled (retraction)"), ("reprefilled_per_publication", "re-prefilled/pub"),
           ("stale_tokens_reused", "stale tokens reused"), ("requests_with_stale_reuse", "reqs w/ stale"),
           ("publications", "pubs"), ("in_flight_per_publication", "in flight/pub"),
           ("pause_mean_ms", "pause mean ms"), ("pause_p99_ms", "pause p99 ms"), ("wall_s", "wall s"),
           ("req_per_s", "req/s"), ("output_tok_per_s", "out tok/s")]

#: the extra work of the radix modes over the ideal, by the state of the KV they missed (see ideal.py)
MISSED_COLUMNS = [("workload", "workload"), ("mode", "mode"), ("publish_every", "pub every"),
                  ("prefill_computed", "work"), ("ideal_prompt_tokens", "ideal"),
                  ("missed_tokens", "missed tokens"), ("missed_requests", "missed reqs"),
                  ("missed_earlier_tokens", "missed, computed earlier: tokens"),
                  ("missed_earlier_requests", "reqs"),
                  ("missed_in_flight_tokens", "missed, in flight: tokens"), ("missed_in_flight_requests", "reqs"),
                  ("missed_same_batch_tokens", "of which same batch"),
                  ("missed_cold_tokens", "missed while the version was cold"),
                  ("reprefilled_tokens", "re-prefilled"), ("cached_beyond_ideal_tokens", "cached beyond ideal")]


#: the bounded-staleness trade: prompt work against the stale reuse and the log-prob divergence it causes
TRADE_COLUMNS = [("workload", "workload"), ("mode", "mode"), ("publish_every", "pub every"),
                 ("work_over_ideal", "work / ideal"), ("stale_tokens_reused", "stale tokens reused"),
                 ("stale_tokens_by_staleness", "bounded reuse by staleness"),
                 ("scored_tokens", "tokens scored"), ("unscored_requests", "reqs not scorable"), ("logprob_delta_mean", "|d logprob| mean"),
                 ("logprob_delta_p99", "p99"), ("older_kv_scored_tokens", "tokens over older KV"),
                 ("older_kv_logprob_delta_mean", "|d logprob| mean"), ("older_kv_logprob_delta_p99", "p99")]


def table(rows: List[dict], columns=COLUMNS) -> str:
    lines = ["| " + " | ".join(h for _, h in columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(k, "")) for k, _ in columns) + " |")
    return "\n".join(lines)


def check_targets(rows: List[dict], samples: int) -> List[dict]:
    """The benchmark's targets (docs/benchmarks.md), per workload and schedule, with the measured numbers."""
    out = []
    for w in [w for w in WORKLOADS if any(r["workload"] == w for r in rows)]:
        for k in sorted({r.get("publish_every") or 0 for r in rows if r["workload"] == w}):
            by = {r["mode"]: r for r in rows if r["workload"] == w and (r.get("publish_every") or 0) == k}
            v = by.get("in_place+vradix")
            if v is None:
                continue
            where = {"workload": w, "publish_every": k}
            ratio = v["work_over_ideal"]
            out.append({**where, "target": f"vradix prompt-token work <= {IDEAL_TARGET:.2f}x the ideal correct engine",
                        "measured": f"{ratio:.3f}x ({v['prefill_computed']} vs {v['ideal_prompt_tokens']})",
                        "met": 0 < ratio <= IDEAL_TARGET})
            if "in_place" in by:
                ratio = v["prefill_computed"] / max(1, by["in_place"]["prefill_computed"])
                out.append({**where, "target": "vradix prompt-token work <= 1.05x in_place (unsafe)",
                            "measured": f"{ratio:.3f}x", "met": ratio <= 1.05})
            if "radix-off" in by and w == "grpo":
                ratio = by["radix-off"]["prefill_computed"] / max(1, v["prefill_computed"])
                out.append({**where, "target": f">= 3x less prompt-token work than radix-off (GRPO n={samples})",
                            "measured": f"{ratio:.2f}x less", "met": ratio >= 3})
            out.append({**where, "target": "zero re-prefilled in-flight tokens per publication (vradix)",
                        "measured": str(v["reprefilled_per_publication"]), "met": v["reprefilled_tokens"] == 0})
            out.append({**where, "target": "zero stale reuse (vradix)",
                        "measured": str(v["stale_tokens_reused"]), "met": v["stale_tokens_reused"] == 0})
    return out


def print_report(rows: List[dict], targets: List[dict]) -> None:
    print(table(rows))
    radix = [r for r in rows if r["mode"] != "radix-off"]
    if radix:
        print("\nExtra prompt work over the ideal, by what was missed (computed earlier = in the tree when the "
              "request was scheduled; in flight = still being prefilled):\n")
        print(table(radix, MISSED_COLUMNS))
    scored = [r for r in rows if "scored_tokens" in r]
    if scored:
        print("\nThe trade: prompt work against stale reuse and the log-prob divergence it causes (rollout log-probs vs "
              "an exact server on the request's weights, same tokens; requests that crossed a publication are not "
              "scored):\n")
        print(table(scored, TRADE_COLUMNS))
    if targets:
        print()
        for t in targets:
            print(f"- [{'met' if t['met'] else 'MISSED'}] {t['workload']} (publish every {t['publish_every']}): "
                  f"{t['target']}: {t['measured']}")


# ---- plots ---------------------------------------------------------------------------------------------------------------
def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        return None


def write_png(rows: List[dict], path: str) -> Optional[str]:
    """One schedule: prefill work (ideal marked) and stale reuse per mode, a bar group per workload. Several
    schedules: work / ideal against the schedule, a line per mode, a panel per workload. Returns why not, if it
    cannot."""
    plt = _pyplot()
    if plt is None:
        return "matplotlib is not installed (pip install matplotlib); PNG skipped"
    fig = (sweep_figure if len({r.get("publish_every") for r in rows}) > 1 else bars_figure)(plt, rows)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    if any("scored_tokens" in r for r in rows):
        fig = trade_figure(plt, rows)
        fig.savefig(trade_png(path), dpi=110)
        plt.close(fig)
    return None


def trade_png(path: str) -> str:
    """Where the trade plot goes: beside the main PNG (`x.png` -> `x-trade.png`)."""
    root, ext = os.path.splitext(path)
    return f"{root}-trade{ext or '.png'}"


def trade_figure(plt, rows: List[dict]):
    """Prompt work over the ideal against the mean |delta log-prob| per token, a point per (mode, schedule), a
    panel per workload."""
    fig, panels = workload_panels(plt, rows)
    for ax, w in panels:
        for m in _modes(rows):
            pts = [(r["work_over_ideal"], r["logprob_delta_mean"]) for r in rows
                   if r["workload"] == w and r["mode"] == m and "logprob_delta_mean" in r]
            if pts:
                ax.scatter([x for x, _ in pts], [y for _, y in pts], label=m, color=COLORS[m])
        ax.axvline(1.0, color="black", lw=0.8)
        ax.set_xlabel("prompt work / ideal correct engine")
        ax.set_ylabel("mean |delta log-prob| per sampled token")
        ax.set_title(f"{w}: the bounded-staleness trade")
    panels[0][0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def workload_panels(plt, rows: List[dict]):
    """A figure with one panel per workload in `rows`: (figure, [(axes, workload), ...])."""
    workloads = _workloads(rows)
    fig, axes = plt.subplots(1, len(workloads), figsize=(5.5 * len(workloads), 4), squeeze=False)
    return fig, list(zip(axes[0], workloads))


def _modes(rows):
    return [m for m in MODE_NAMES if any(r["mode"] == m for r in rows)]


def _workloads(rows):
    return [w for w in WORKLOADS if any(r["workload"] == w for r in rows)]


def bars_figure(plt, rows: List[dict]):
    workloads, modes = _workloads(rows), _modes(rows)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / max(1, len(modes))
    for ax, key, title in ((axes[0], "prefill_computed", "prompt tokens computed (black tick: ideal)"),
                           (axes[1], "stale_tokens_reused", "stale tokens reused")):
        for i, m in enumerate(modes):
            xs, ys, ideal = [], [], []
            for j, w in enumerate(workloads):
                r = next((r for r in rows if r["workload"] == w and r["mode"] == m), None)
                if r is not None:
                    xs.append(j + (i - (len(modes) - 1) / 2) * width)
                    ys.append(r[key])
                    ideal.append(r.get("ideal_prompt_tokens", 0))
            bars = ax.bar(xs, ys, width, label=m, color=COLORS[m])
            ax.bar_label(bars, fontsize=7)
            if key == "prefill_computed":
                ax.hlines(ideal, [x - width / 2 for x in xs], [x + width / 2 for x in xs], colors="black")
        ax.set_xticks(range(len(workloads)), workloads)
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def sweep_figure(plt, rows: List[dict]):
    modes = _modes(rows)
    fig, panels = workload_panels(plt, rows)
    for ax, w in panels:
        for m in modes:
            pts = sorted((r["publish_every"], r["work_over_ideal"]) for r in rows
                         if r["workload"] == w and r["mode"] == m)
            ax.plot([k for k, _ in pts], [y for _, y in pts], marker="o", label=m, color=COLORS[m])
            for k, y in pts:   # labels above the vradix line, below the others (the table has every number)
                ax.annotate(f"{y:.2f}", (k, y), textcoords="offset points", fontsize=7, ha="center",
                            xytext=(0, 5) if m == "in_place+vradix" else (0, -11), color=COLORS[m])
        ax.axhline(1.0, color="black", lw=0.8)
        ax.axhline(IDEAL_TARGET, color="black", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")   # radix-off sits 10-50x above the others
        ax.yaxis.set_major_formatter(plt.matplotlib.ticker.ScalarFormatter())
        ax.yaxis.set_minor_formatter(plt.matplotlib.ticker.FormatStrFormatter("%.1f"))
        ks = sorted({r["publish_every"] for r in rows})
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.set_xlabel("publication every K completed requests")
        ax.set_ylabel("prompt work / ideal correct engine")
        ax.set_title(f"{w}: prefill work vs ideal (dashed: {IDEAL_TARGET:.2f}x)")
    panels[0][0].legend(fontsize=8)
    fig.tight_layout()
    return fig
