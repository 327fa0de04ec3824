"""Benchmark the weight fingerprint (`vradix.kernels.fingerprint`): how long proving weight identity takes.

For each device and each implementation available there, it times `fingerprint_named_tensors` over a random bfloat16
weight of --mib MiB (--cpu-mib on the CPU). The timing covers the whole call: digest, one host read, SHA-256. It also times
`fingerprint_module` on the tiny test Llama. The table shows bytes hashed, the median time, GB/s, and seconds per GB,
plus that figure extrapolated to 16 GB and 140 GB of weights (8B and 70B parameters in bf16).

On CPU only the torch reference is timed: Triton runs on CPU only under the interpreter, which is a test aid, not an
implementation. On CUDA the CUDA extension, Triton and the torch reference are timed when available.

    python benchmark/kernels/bench_fingerprint.py [--mib 256] [--cpu-mib 256] [--repeats 3] [--smoke] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch

from vradix import kernels
from vradix.kernels import fingerprint as fp

GB = 1e9


def median_seconds(fn, repeats: int, device: torch.device) -> float:
    fn()  # warm-up: Triton compiles, CUDA allocates
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        fn()  # ends with the host read, so the device work is included
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def devices() -> list[torch.device]:
    return [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])


def impls(device: torch.device) -> list[str]:
    if device.type == "cpu":
        return ["torch"]
    return [i for i in ("cuda", "triton", "torch") if kernels.available(i, device)]


def tiny_model():
    """The tiny test Llama, or None (with a note) where transformers is not installed."""
    try:
        from transformers import LlamaForCausalLM
    except ImportError:
        print("# tiny llama: skipped (transformers is not installed)")
        return None
    from vradix.testing.models.llama import generate
    with tempfile.TemporaryDirectory() as d:
        return LlamaForCausalLM.from_pretrained(generate(d, seed=1, dtype="float32", init_range=0.2))


def row(what: str, impl: str, device: torch.device, nbytes: int, seconds: float) -> dict:
    return {"what": what, "impl": impl, "device": str(device), "bytes": nbytes, "seconds": seconds,
            "gb_per_s": nbytes / GB / seconds, "s_per_gb": seconds / (nbytes / GB)}


def random_weight(mib: int) -> torch.Tensor:
    return torch.randn(mib * (1 << 20) // 2, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)


def measure(mib: int, cpu_mib: int, repeats: int) -> list[dict]:
    rows = []
    model = tiny_model()
    model_bytes = model and sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    for device in devices():
        size = cpu_mib if device.type == "cpu" else mib
        weight = random_weight(size).to(device)
        for impl in impls(device):
            t = median_seconds(lambda: fp.fingerprint_named_tensors([("w", weight)], impl=impl), repeats, device)
            rows.append(row(f"weight {size} MiB", impl, device, weight.numel() * 2, t))
            if model is None:
                continue
            model = model.to(device)
            t = median_seconds(lambda: fp.fingerprint_module(model, impl=impl), repeats, device)
            rows.append(row("tiny llama (module)", impl, device, model_bytes, t))
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"{'what':<20} {'impl':<7} {'device':<7} {'bytes':>12} {'time s':>9} {'GB/s':>8} {'s/GB':>8} "
          f"{'16 GB s':>8} {'140 GB s':>9}")
    for r in rows:
        print(f"{r['what']:<20} {r['impl']:<7} {r['device']:<7} {r['bytes']:>12} {r['seconds']:>9.4f} "
              f"{r['gb_per_s']:>8.3f} {r['s_per_gb']:>8.2f} {16 * r['s_per_gb']:>8.1f} {140 * r['s_per_gb']:>9.1f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=256, help="size of the random bf16 weight on an accelerator (default 256)")
    p.add_argument("--cpu-mib", type=int, default=256, help="the same on the CPU (default 256)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--smoke", action="store_true", help="a tiny run (1 MiB, 1 repeat) that checks the script works")
    p.add_argument("--json", help="also write the rows here")
    a = p.parse_args()
    if a.smoke:
        a.mib, a.cpu_mib, a.repeats = 1, 1, 1
    names = ", ".join([f"cuda:{torch.cuda.get_device_name()}"] if torch.cuda.is_available() else ["no accelerator"])
    print(f"# weight fingerprint: torch {torch.__version__}, {torch.get_num_threads()} CPU threads, {names}, "
          f"load average {os.getloadavg()[0]:.1f}")
    rows = measure(a.mib, a.cpu_mib, a.repeats)
    print_table(rows)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
