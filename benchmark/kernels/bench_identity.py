"""Benchmark the layout-invariant weight identity (`vradix.core.published`): its cost per rank, by TP size.

A synthetic checkpoint of --mib MiB (bfloat16, Llama-style tensor names, --tensors tensors of varied sizes) is
published once per TP size: every rank's `Tap` sees the whole stream, as a rank's `load_weights` does, and digests
the names it owns; then the ranks' shares are merged and hashed (`merge`, `identity_of`; the all-gather itself moves
about 100 bytes per tensor and is not timed). The ranks run one after the other in this process, so "per rank" is
each rank's own work; the table reports the slowest rank, its bytes digested, ms per GB of the whole model, and the
merge. Every TP size must prove the same identity (checked).

    python benchmark/kernels/bench_identity.py [--mib 256] [--tensors 96] [--tp 1 2 4 8] [--device cpu] [--json f]
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch

from vradix.core import published

GB = 1e9


class Sink(torch.nn.Module):
    """A model whose `load_weights` consumes the stream (the weight loader's copy is not what is timed)."""

    def load_weights(self, weights):
        for _ in weights:
            pass


def checkpoint(mib: int, tensors: int, device: torch.device) -> list:
    """(name, bf16 tensor) pairs of about `mib` MiB: per layer two large and two small tensors."""
    total = mib << 20
    weights = [4 if i % 4 < 2 else 1 for i in range(tensors)]
    unit = total // (2 * sum(weights))  # bf16: 2 bytes per element
    g = torch.Generator().manual_seed(0)
    out = []
    for i, w in enumerate(weights):
        n = max(1, unit * w)
        t = torch.randint(-2**15, 2**15, (n,), dtype=torch.int16, generator=g).view(torch.bfloat16)
        out.append((f"model.layers.{i // 4}.{('q', 'mlp', 'norm', 'bias')[i % 4]}.weight", t.to(device)))
    return out


def publish_on(tp: int, weights: list, device: torch.device) -> dict:
    shares, names, rank_s, rank_bytes = [], None, [], []
    for rank in range(tp):
        model = Sink()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        with published.tapping(model, rank, tp, device):
            model.load_weights(iter(weights))
        pending = published.of(model).take()
        share = pending.share()  # ends with the host read of this rank's lanes
        rank_s.append(time.perf_counter() - t)
        rank_bytes.append(pending.bytes_digested)
        shares.append(share)
        names = pending.names
    t = time.perf_counter()
    outcome, hex_ = published.identity_of(published.merge(shares, names), "bench|bfloat16|None", None, None)
    merge_s = time.perf_counter() - t
    slowest = max(range(tp), key=lambda r: rank_s[r])
    return {"tp": tp, "outcome": outcome, "identity": hex_, "slowest_rank_s": rank_s[slowest],
            "slowest_rank_bytes": rank_bytes[slowest], "merge_s": merge_s}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--tensors", type=int, default=96)
    p.add_argument("--tp", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", help="also write the rows to this file")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    weights = checkpoint(args.mib, args.tensors, device)
    model_bytes = sum(t.numel() * t.element_size() for _, t in weights)
    rows = [publish_on(tp, weights, device) for tp in args.tp]
    assert len({r["identity"] for r in rows}) == 1, "the TP sizes proved different identities"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"# published-weights identity: torch {torch.__version__}, device {device}, {torch.get_num_threads()} "
          f"threads, load average {load:.1f}; model {model_bytes / GB:.3f} GB in {len(weights)} tensors")
    print(f"{'tp':>3} {'slowest rank s':>15} {'bytes digested':>15} {'ms per model GB':>16} {'merge ms':>9}  identity")
    for r in rows:
        print(f"{r['tp']:>3} {r['slowest_rank_s']:>15.3f} {r['slowest_rank_bytes']:>15} "
              f"{r['slowest_rank_s'] * 1e3 / (model_bytes / GB):>16.1f} {r['merge_s'] * 1e3:>9.2f}  "
              f"{r['identity']} ({r['outcome']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": str(device), "model_bytes": model_bytes, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
