"""Benchmark the KV page-epoch kernels (stamp, verify, spans, invalidate) per implementation.

On CUDA: times the CUDA extension, Triton and the torch reference over page tables of 1e4..1e7 pages and several
batch shapes, and prints effective bandwidth against the device's peak (the spec value when the device is known, and
a measured device-to-device copy). It also times `verify` on a full prefill batch against that batch's causal
attention (SDPA, bf16) and prints the ratio. On CPU it runs the torch reference only and says so.

    python benchmark/kernels/bench_kernels.py [--sizes 1e4,1e5,1e6,1e7] [--repeats 20] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from vradix import kernels

SPEC_TBPS = {"H200": 4.8, "H100": 3.35, "H20": 4.0, "A100": 2.0, "B200": 8.0}


def timer(device):
    if device.type == "cuda":
        def run(fn, repeats):
            fn()
            torch.cuda.synchronize()
            times = []
            for _ in range(repeats):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) / 1e3)
            return statistics.median(times)
    else:
        def run(fn, repeats):
            fn()
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t)
            return statistics.median(times)
    return run


def workloads(n: int, device):
    """(kernel, shape label, callable-factory(impl), useful bytes) for a table of n pages (page_size 16)."""
    ps = 16
    g = torch.Generator().manual_seed(0)
    pe = torch.randint(0, 3, (n,), generator=g, dtype=torch.int32).to(device)
    loc = (torch.randperm(n, generator=g)[: max(1, n // 2)] * ps).to(device)
    pinned = (torch.rand(n, generator=g) < 0.5).to(device)
    out = []
    out.append(("stamp", f"{loc.numel():.0e} slots", lambda impl: (lambda: kernels.stamp(pe, loc, 2, ps, impl=impl)),
                loc.numel() * (8 + 4)))
    for rows in (1, 64, 1024):
        width = max(1, n * ps // rows // 4)  # the batch's prefixes cover a quarter of the pool's slots
        if width * rows > 4e8 or width > 2_000_000:
            continue
        r2t = torch.randint(0, n * ps, (rows, width), generator=g, dtype=torch.int32).to(device)
        ids = torch.arange(rows, device=device)
        lens = torch.full((rows,), width, dtype=torch.int64, device=device)
        exp = torch.zeros(rows, dtype=torch.int32, device=device)
        out.append(("verify", f"{rows}x{width}",
                    lambda impl, r2t=r2t, ids=ids, lens=lens, exp=exp, width=width: (
                        lambda: kernels.verify_async(pe, r2t, ids, lens, exp, ps, max_prefix_len=width, impl=impl)),
                    rows * width * (4 + 4)))
    length = min(n * ps // 4, 1_000_000)
    r2t1 = torch.randint(0, n * ps, (1, length), generator=g, dtype=torch.int32).to(device)
    out.append(("spans", f"1x{length}", lambda impl: (lambda: kernels.spans(pe, r2t1, 0, length, ps, impl=impl)),
                length * 8))
    out.append(("invalidate", f"{n:.0e} pages", lambda impl: (lambda: kernels.invalidate(pe, 2, pinned, impl=impl)),
                n * (4 + 1)))
    return out


def peak_bandwidth(device) -> tuple[float | None, float | None]:
    """(spec TB/s or None, measured copy TB/s or None)."""
    if device.type != "cuda":
        return None, None
    name = torch.cuda.get_device_name(device)
    spec = next((v for k, v in SPEC_TBPS.items() if k in name), None)
    x = torch.empty(1 << 28, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    t = timer(device)(lambda: y.copy_(x), 10)
    return spec, 2 * x.numel() / t / 1e12


def verify_vs_attention(device, repeats) -> list[dict]:
    """verify on a full prefill batch vs that batch's causal attention (bf16 SDPA, 32 heads x 128, one layer x L)."""
    rows_out = []
    run = timer(device)
    for bs, seq, prefix in ((8, 4096, 3072), (32, 2048, 1536), (1, 32768, 24576)):
        q = torch.randn(bs, 32, seq, 128, dtype=torch.bfloat16, device=device)
        attn = run(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True), repeats)
        layers = 32
        n_pages = bs * seq
        pe = torch.zeros(n_pages, dtype=torch.int32, device=device)
        r2t = torch.arange(bs * seq, dtype=torch.int32, device=device).view(bs, seq)
        ids = torch.arange(bs, device=device)
        lens = torch.full((bs,), prefix, dtype=torch.int64, device=device)
        exp = torch.zeros(bs, dtype=torch.int32, device=device)
        for impl in [i for i in kernels.IMPLS if kernels.available(i, device)]:
            v = run(lambda: kernels.verify_async(pe, r2t, ids, lens, exp, 1, max_prefix_len=prefix, impl=impl),
                    repeats)
            rows_out.append({"batch": f"{bs}x{seq} (prefix {prefix})", "impl": impl, "verify_us": v * 1e6,
                             "attention_us": attn * layers * 1e6, "ratio_pct": 100 * v / (attn * layers)})
    return rows_out


def guard_overhead(repeats: int) -> list[dict]:
    """Cost of the strict guard's backstop on SGLang's real UnifiedRadixCache (CPU): `Scheduler.run_batch`'s BEFORE
    hook on an extend batch whose requests reuse a cached prefix, for a batch of one request and of eight (one
    gather/compare over the batch and one host read either way)."""
    import os
    try:
        from sglang.srt.plugins import load_plugins
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        from vradix.hooks.ledger import backstop_extend_batch
        from vradix.engine import attach
        from vradix.testing.harness.cache_fixture import ForwardWrite, build_cache
    except ImportError:
        return []
    os.environ.pop("VRADIX_DISABLE", None)
    load_plugins()
    rows = []
    for plen in (256, 2048, 16384):
        fx = build_cache("rust", 16, kv_tokens=4 * plen, max_reqs=9, max_context_len=plen + 64)
        state = attach(fx.cache)
        warm = fx.make_req(list(range(1, plen + 2)))
        state.admit_or_raise(warm)
        fx.admit(warm)
        fx.prefill(warm)
        fx.finish(warm)
        reqs = []
        for i in range(8):
            req = fx.make_req(list(range(1, plen + 1)) + [plen + 2 + i])
            state.admit_or_raise(req)
            assert fx.admit(req) == plen
            reqs.append(req)
        res = {}
        for n in (1, 8):
            batch = ForwardWrite(out_cache_loc=torch.empty(0, dtype=torch.int64), forward_mode=ForwardMode.EXTEND,
                                 reqs=reqs[:n], prefix_lens=[plen] * n)
            res[n] = timer(torch.device("cpu"))(lambda: backstop_extend_batch(fx.scheduler_view(), batch), repeats)
        assert state.guard.stats.violations_caught == 0
        rows.append({"prefix": plen, "backstop_1_req_us": res[1] * 1e6, "backstop_8_reqs_us": res[8] * 1e6})
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=None, help="comma-separated page-table sizes (default: 1e4..1e7 on CUDA, "
                                                  "1e4..1e6 on CPU)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sizes = [int(float(s)) for s in (args.sizes or ("1e4,1e5,1e6,1e7" if device.type == "cuda" else
                                                    "1e4,1e5,1e6")).split(",")]
    if device.type != "cuda":
        torch.set_num_threads(1)  # a loaded 2-core box: OpenMP spin-waits dominate with 2 threads
    impls = [i for i in kernels.IMPLS if kernels.available(i, device)] if device.type == "cuda" else ["torch"]
    if device.type != "cuda":
        print("# no CUDA device: timing the torch reference on CPU only (bandwidth targets need a GPU)")
    else:
        print(f"# device: {torch.cuda.get_device_name(device)}; implementations: {', '.join(impls)}")
    spec, copy = peak_bandwidth(device)
    if copy:
        print(f"# peak: spec {spec} TB/s, measured D2D copy {copy:.2f} TB/s")
    run = timer(device)
    results = []
    print(f"{'kernel':<11}{'pages':>10} {'shape':<16}{'impl':<8}{'time us':>11}{'GB/s':>10}{'% peak':>8}")
    for n in sizes:
        for name, shape, factory, nbytes in workloads(n, device):
            for impl in impls:
                t = run(factory(impl), args.repeats)
                gbps = nbytes / t / 1e9
                ref = (spec or copy or 0) * 1e3
                pct = f"{100 * gbps / ref:.0f}" if ref else "-"
                results.append({"kernel": name, "pages": n, "shape": shape, "impl": impl, "time_us": t * 1e6,
                                "gbps": gbps, "pct_peak": None if pct == "-" else float(pct)})
                print(f"{name:<11}{n:>10.0e} {shape:<16}{impl:<8}{t * 1e6:>11.1f}{gbps:>10.1f}{pct:>8}")
    ratios = verify_vs_attention(device, args.repeats) if device.type == "cuda" else []
    if ratios:
        print(f"\n{'prefill batch':<28}{'impl':<8}{'verify us':>11}{'attention us':>14}{'ratio %':>9}")
        for r in ratios:
            print(f"{r['batch']:<28}{r['impl']:<8}{r['verify_us']:>11.1f}{r['attention_us']:>14.1f}"
                  f"{r['ratio_pct']:>9.3f}")
    guard = guard_overhead(args.repeats) if device.type != "cuda" else []
    if guard:
        print("\n# strict guard's backstop on an extend batch, real UnifiedRadixCache (Rust core, page 16, CPU, "
              "1 thread)")
        print(f"{'prefix':>8}{'1 request us':>14}{'8 requests us':>15}")
        for r in guard:
            print(f"{r['prefix']:>8}{r['backstop_1_req_us']:>14.1f}{r['backstop_8_reqs_us']:>15.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": str(device), "results": results, "verify_vs_attention": ratios, "guard": guard}, f, indent=1)


if __name__ == "__main__":
    main()
