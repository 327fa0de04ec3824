"""vradix inside SGLang on a GPU, through the carried runtime (docs/gpu-bundle.md): the checks of
`gpu_serve_check.sh`, one JSON.

    python benchmark/gpu_check/gpu_serve_check.py --json OUT.json [--device cuda | --cpu-dry-run] [--python PY]

`--python`: the interpreter of the servers (the bundle's venv; default this one). On `--device cuda` every server
takes the GPU aid's route (`vradix.testing.gpu_aids`: Triton attention, PyTorch sampling, fused ops on their torch
forward, CUDA graphs off) on tiny bf16 Llamas generated here; `--cpu-dry-run` runs the same steps on SGLang's CPU
engine with float32 models and small workloads, to check the plumbing on a machine without a GPU. Steps:
1. **publication**: the stale-prefix scenario (`vradix.testing.harness.scenario.stale_prefix_publication`: warm a
   prefix, a request in flight across an in_place publication to B, probe the prefix) on a vradix and a stock
   (`VRADIX_DISABLE=1`) server on A, against a fresh stock server on B. vradix's probe output must equal the fresh
   server's, stock's must not; a mismatch at a bf16 near-tie (the fresh server's top-2 logprobs closer than
   `TIE_LOGPROB`, the suite's tolerance for bf16 ties) is reported as a tie, not a failure.
2. **ledger**: the vradix server's `kv_ledger` block after it served: which kernel implementation its ledger runs,
   the batches and prefixes it checked, violations.
3. **sync**: both publication servers run with `VRADIX_GPU_SYNC_PROBE` (`vradix.testing.gpu_aids.sync_probe`:
   `torch.cuda.set_sync_debug_mode("warn")` in the scheduler, each synchronisation counted by owner) under SGLang's
   default overlap scheduling, through the scenario and a burst of concurrent requests: the synchronisations vradix
   adds (goal 0), apart from the engine's own, on both servers.
4. **steady**: `benchmark/server/bench_sched_cpu.py`'s `bench` on a fresh stock and vradix server (no probe): the
   prefill-heavy GRPO and the decode-heavy workload, scheduler CPU ms per request and output tokens/s, alternating
   rounds, greedy outputs compared.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmark" / "server"))
import bench_sched_cpu  # noqa: E402

import vradix  # noqa: E402
from vradix.testing import gpu_aids  # noqa: E402
from vradix.testing.gpu_aids import sync_probe  # noqa: E402
from vradix.testing.harness.scenario import PROBE, shared_prefix_burst, stale_prefix_publication  # noqa: E402
from vradix.testing.harness.server import CpuServer, start_servers  # noqa: E402
from vradix.testing.models.llama import generate  # noqa: E402

#: a greedy mismatch where the oracle's top-2 logprobs are closer than this is a bf16 near-tie
TIE_LOGPROB = 0.05
#: each GPU server's share of the card (three run at once); the tiny models need megabytes
GPU_SERVER_ARGS = ["--mem-fraction-static", "0.25"]
#: (requests, rounds, grpo new tokens, decode new tokens) per mode
STEADY = {"cuda": dict(requests=64, rounds=3, grpo_new_tokens=4, decode_new_tokens=256),
          "cpu": dict(requests=8, rounds=1, grpo_new_tokens=2, decode_new_tokens=16)}


def models(d: str, device: str) -> tuple[str, str]:
    """Tiny Llamas A and B (seeds 1, 2; peaky logits, init range 0.2): bf16 on a GPU, float32 on the CPU engine."""
    dtype = "bfloat16" if device == "cuda" else "float32"
    return (generate(os.path.join(d, "A"), seed=1, dtype=dtype, init_range=0.2),
            generate(os.path.join(d, "B"), seed=2, dtype=dtype, init_range=0.2))


def first_difference(a: list, b: list) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def tie_at(meta: dict, position: int) -> bool:
    """Whether the oracle's greedy choice at `position` was a near-tie (its top-2 logprobs within `TIE_LOGPROB`)."""
    tops = (meta.get("output_top_logprobs") or [])
    if position >= len(tops) or len(tops[position] or []) < 2:
        return False
    return abs(tops[position][0][0] - tops[position][1][0]) < TIE_LOGPROB


def verdict(output: list, oracle: list, meta: dict) -> str:
    if output == oracle:
        return "equal"
    return "tie" if tie_at(meta, first_difference(output, oracle)) else "differs"


def publication_and_sync(a_model: str, b_model: str, server_kw: dict, probe_dirs: dict) -> dict:
    """Steps 1-3 on three servers started together: vradix and stock on A (each with a sync probe), fresh stock on
    B."""
    # the probe is loaded by the GPU aid's plugin, which a CUDA server has on its path already; the dry run adds it
    path = os.pathsep.join(p for p in (gpu_aids.PLUGIN_PATH, os.environ.get("PYTHONPATH")) if p)
    kw = {m: {**server_kw, "env": {**server_kw.get("env", {}), sync_probe.ENV: probe_dirs[m], "PYTHONPATH": path}}
          for m in ("vradix", "stock")}
    vr, st, fresh = start_servers(lambda: CpuServer(a_model, vradix=True, **kw["vradix"]),
                                  lambda: CpuServer(a_model, vradix=False, **kw["stock"]),
                                  lambda: CpuServer(b_model, vradix=False, **server_kw))
    try:
        oracle = fresh.generate(PROBE, 4, return_logprob=True, top_logprobs_num=2)
        fresh_out, fresh_meta = oracle["output_ids"], oracle["meta_info"]
        out = {}
        for mode, server in (("vradix", vr), ("stock", st)):
            t0 = time.monotonic()
            o = stale_prefix_publication(server, b_model)
            burst = shared_prefix_burst(server, n=16)
            done = time.time()
            out[mode] = {"seconds": round(time.monotonic() - t0, 2), "cached_after": o.cached_after,
                         "label_after": o.label_after, "output_after": o.output_after,
                         "inflight_retractions": o.inflight_retractions, "inflight_tokens": o.inflight_tokens,
                         "cached_again": o.cached_again, "burst_computed": burst.computed,
                         "verdict": verdict(o.output_after, fresh_out, fresh_meta),
                         "sync": {k: v for k, v in sync_probe.read(probe_dirs[mode], done).items()
                                  if k != "processes"}}
        ledger = (vr.vradix_info() or {}).get("kv_ledger")
        logs = {"vradix": vr.logs(), "stock": st.logs()}
    finally:
        for s in (vr, st, fresh):
            s.stop()
    return {
        "publication": {"fresh_output": fresh_out, "vradix": out["vradix"], "stock": out["stock"],
                        "vradix_active": f"vradix {vradix.__version__} active" in logs["vradix"],
                        "passed": out["vradix"]["verdict"] in ("equal", "tie") and out["vradix"]["cached_after"] == 0
                        and out["stock"]["verdict"] != "equal"
                        and f"vradix {vradix.__version__} active" in logs["vradix"]},
        "ledger": ledger,
        "sync": {"vradix_added": out["vradix"]["sync"]["vradix"], "engine_vradix_server": out["vradix"]["sync"]["engine"],
                 "engine_stock_server": out["stock"]["sync"]["engine"],
                 "stock_attributed_to_vradix": out["stock"]["sync"]["vradix"],
                 "sites_vradix_server": out["vradix"]["sync"]["sites"],
                 "mode_errors": sorted(set(out["vradix"]["sync"]["mode_errors"] + out["stock"]["sync"]["mode_errors"])),
                 # measured only where torch's sync debug mode could be set (a CUDA machine)
                 "measured": not (out["vradix"]["sync"]["mode_errors"] or out["stock"]["sync"]["mode_errors"]),
                 "passed": out["vradix"]["sync"]["vradix"] == 0},
    }


def steady(a_model: str, server_kw: dict, device: str) -> list:
    """Step 4: bench_sched_cpu's alternating rounds on a fresh stock and vradix server."""
    a = SimpleNamespace(workloads=list(bench_sched_cpu.WORKLOADS), group_size=8, prefix=512, suffix=16,
                        decode_prompt=16, threads=1, vradix_env=[], **STEADY[device])
    return list(bench_sched_cpu.bench(a_model, a, **server_kw).values())


def environment(device: str, python: str) -> dict:
    import subprocess

    probe = ("import json, sglang, torch, triton, vradix; print(json.dumps({'sglang': sglang.__version__, "
             "'torch': torch.__version__, 'triton': triton.__version__, 'vradix': vradix.__version__, "
             "'vradix_from': vradix.__file__, 'cuda': torch.cuda.is_available() and "
             "torch.cuda.get_device_name(0), 'python': '%d.%d.%d' % __import__('sys').version_info[:3]}))")
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_USE_CPU_ENGINE"}
    info = json.loads(subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True,
                                     env=env, timeout=300).stdout)
    return {**info, "device": device, "host": platform.node(), "cores": os.cpu_count(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--device", choices=("cuda",), default="cuda")
    g.add_argument("--cpu-dry-run", action="store_true", help="the same steps on SGLang's CPU engine (no GPU)")
    p.add_argument("--python", default=sys.executable, help="the servers' interpreter (the bundle's venv)")
    p.add_argument("--json", required=True)
    p.add_argument("--skip", action="append", default=[], choices=("steady",), help="leave a step out")
    a = p.parse_args(argv)
    device = "cpu" if a.cpu_dry_run else a.device
    server_kw = {"python": a.python, "device": device, "startup_timeout": 400.0,
                 "extra_args": GPU_SERVER_ARGS if device == "cuda" else []}
    result: dict = {"environment": environment(device, a.python)}
    print(f"[gpu_serve_check] {json.dumps(result['environment'])}", flush=True)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vradix-gpu-serve-") as d:
        a_model, b_model = models(d, device)
        probes = {m: os.path.join(d, f"sync-{m}") for m in ("vradix", "stock")}
        for folder in probes.values():
            os.makedirs(folder)
        result.update(publication_and_sync(a_model, b_model, server_kw, probes))
        result["seconds_publication_and_sync"] = round(time.monotonic() - t0, 1)
        print(f"[gpu_serve_check] publication: {json.dumps(result['publication'])}", flush=True)
        print(f"[gpu_serve_check] ledger: {json.dumps(result['ledger'])}", flush=True)
        print(f"[gpu_serve_check] sync: {json.dumps(result['sync'])}", flush=True)
        if "steady" not in a.skip:
            result["steady"] = steady(a_model, server_kw, device)
            print(bench_sched_cpu.table({r["workload"]: r for r in result["steady"]}), flush=True)
    result["seconds"] = round(time.monotonic() - t0, 1)
    # the dry run cannot measure synchronisations (no CUDA): there it checks the plumbing, on a GPU the count
    sync_ok = result["sync"]["passed"] and (result["sync"]["measured"] or device == "cpu")
    result["passed"] = result["publication"]["passed"] and sync_ok and \
        not any(r["mismatches"] for r in result.get("steady", []))
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(result, indent=1) + "\n")
    print(f"[gpu_serve_check] {'PASS' if result['passed'] else 'FAIL'} in {result['seconds']} s -> {a.json}")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
