"""The hot path on a GPU: the backstop's device path and the KV page ledger's per-batch work add no device sync.

Runs where SGLang is absent (CUDA torch, Triton, optionally the built `vradix._C`). For every kernel implementation
available for CUDA tensors it runs, for several scheduler iterations in a row, what vradix adds to one iteration
on the device (the ledger stamp of the forward's `out_cache_loc`, the strict backstop's gather/compare over the batch's
prefix reads, launched as a `PendingVerdicts` entry with its non-blocking copy, and the frees of finished requests)
under `torch.cuda.set_sync_debug_mode("error")`: any synchronising call raises, and the check FAILs. Only then, as
SGLang's result processing does, is each verdict read (`read_through`), and it must equal the counts a host
computation of the same ledger gives (a planted stale page must be found). It then times each step (device time
by CUDA events, host time per call) and sets the backstop's gather against the HBM bound of the bytes it reads.

    python benchmark/gpu_check/gpu_check_hot_path.py [--pages 1048576] [--iterations 50] [--json out.json]

Prints one PASS/FAIL line per check and a table; exits 1 on any FAIL.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from types import SimpleNamespace

import torch

from vradix import kernels
from vradix.ledger import guard
from vradix.ledger.device import PageLedger
from vradix.ledger.guard import PendingVerdicts
from vradix.request import HistoryEntry, ReqState

SPEC_TBPS = {"H200": 4.8, "H100": 3.35, "H20": 4.0, "A100": 2.0, "B200": 8.0}
#: (requests in the extend batch, cached prefix length each, new tokens each)
SHAPES = ((8, 4096, 256), (64, 2048, 128), (256, 512, 64))


def spec_bandwidth() -> float:
    name = torch.cuda.get_device_name()
    return next((tbps * 1e12 for key, tbps in SPEC_TBPS.items() if key in name), float("nan"))


class World:
    """A ledger over `pages` KV pages (page size `page_size`) and a request-to-token table on the GPU, filled the
    way SGLang's pools are: each request's row holds the slots of its prefix, then of its new tokens. The ledger
    runs kernel implementation `impl` (`VRADIX_KERNELS` when it is built: a ledger binds its kernels once)."""

    def __init__(self, pages: int, page_size: int, rows: int, width: int, epoch: int = 3, device: str = "cuda",
                 impl: str = "auto"):
        self.page_size, self.epoch = page_size, epoch
        per_row = -(-width // page_size)
        pages = max(pages, rows * per_row + 2)  # every row on pages of its own
        allocator = SimpleNamespace(size=(pages - 2) * page_size, page_size=page_size, device=device)
        with kernels_forced(impl):
            self.ledger = PageLedger(allocator)
        self.ledger.page_epoch.fill_(epoch)
        g = torch.Generator().manual_seed(0)
        row_pages = (torch.randperm(pages - 2, generator=g)[: rows * per_row] + 1).reshape(rows, per_row)
        pos = torch.arange(width)
        slots = row_pages[:, pos // page_size] * page_size + pos % page_size  # a row's pages are its own
        self.req_to_token = slots.to(device=device, dtype=torch.int32)
        #: the last row belongs to a request that finished: its slots are the frees of every iteration
        self.finished = self.req_to_token[rows - 1, :page_size].to(torch.int64)

    def batch(self, n: int, prefix: int, new: int):
        """An extend batch of `n` requests in rows 0..n-1, each bound to the current epoch, reading `prefix` cached
        positions and writing `new`."""
        reqs = []
        for i in range(n):
            bound = HistoryEntry(0, self.epoch, None, "")
            req = SimpleNamespace(rid=f"r{i}", kv=SimpleNamespace(req_pool_idx=i), _vradix=ReqState(None, bound))
            reqs.append(req)
        out_cache_loc = self.req_to_token[:n, prefix:prefix + new].reshape(-1).to(torch.int64)
        return SimpleNamespace(reqs=reqs, prefix_lens=[prefix] * n, decoding_reqs=None, out_cache_loc=out_cache_loc)


@contextlib.contextmanager
def kernels_forced(impl: str):
    """VRADIX_KERNELS=impl inside the block (where a ledger is built, binding its kernels), restored after it."""
    before = os.environ.get("VRADIX_KERNELS")
    os.environ["VRADIX_KERNELS"] = impl
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("VRADIX_KERNELS")
        else:
            os.environ["VRADIX_KERNELS"] = before


def one_iteration(world: World, verdicts: PendingVerdicts, stats, batch, found: list) -> None:
    """What vradix adds to one scheduler iteration on the device, in SGLang's order: the backstop's check launched
    before the forward (never read here), the stamp of what the forward writes, the frees of a finished request."""
    reads = guard.prefix_reads(batch, world.epoch)
    counts = guard.launch_prefix_check(world.ledger, stats, world.req_to_token, reads)
    verdicts.launch(batch.out_cache_loc, [r.req for r in reads], counts,
                    lambda values, reads=reads: found.append((reads, values)))
    world.ledger.stamp_written(batch.out_cache_loc, world.epoch)
    world.ledger.mark_freed_slots(world.finished)


def host_counts(world: World, reads) -> list[int]:
    page_epoch, r2t = world.ledger.page_epoch.cpu(), world.req_to_token.cpu()
    return kernels.reference.host_rows_outside_epochs(page_epoch, r2t, [r.row for r in reads],
                                                      [r.length for r in reads], [r.lo for r in reads],
                                                      [r.hi for r in reads], world.page_size)


def check_no_sync(world: World, shape, iterations: int) -> tuple[bool, str]:
    """`iterations` iterations under sync debug mode "error", then the verdicts read at their results."""
    n, prefix, new = shape
    batch = world.batch(n, prefix, new)
    stale = int(world.req_to_token[1, prefix // 2]) // world.page_size
    world.ledger.page_epoch[stale] = world.epoch - 1  # one page other weights wrote, in request 1's prefix
    verdicts, stats, found = PendingVerdicts(), guard.GuardStats(), []
    one_iteration(world, verdicts, stats, batch, [])  # warm-up (kernel compilation, pinned pool), outside the check
    verdicts.read_all()
    want = host_counts(world, guard.prefix_reads(batch, world.epoch))
    on_cuda = world.ledger.page_epoch.is_cuda
    if on_cuda:
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(iterations):
            one_iteration(world, verdicts, stats, batch, found)
    except RuntimeError as e:
        return False, f"a device sync inside the iteration: {str(e).splitlines()[0]}"
    finally:
        if on_cuda:
            torch.cuda.set_sync_debug_mode("default")
    pending_before_result = len(verdicts)
    verdicts.read_through(batch.out_cache_loc)  # the first iteration's result ...
    verdicts.read_all()  # ... and the others' (a drain)
    _, values = found[0]
    world.ledger.page_epoch[stale] = world.epoch
    ok = values == want and values[1] > 0 and sum(values) == values[1] and pending_before_result == iterations
    return ok, (f"{iterations} iterations, {pending_before_result} verdicts pending until their results; "
                f"verdict {values[:4]}... (stale page found in request 1: {values[1]} positions) == host {ok}")


def check_detector(world: World) -> tuple[bool, str]:
    """The control: reading a verdict at once (what the backstop did before) must trip the sync debug mode."""
    batch = world.batch(*SHAPES[0])
    counts = guard.launch_prefix_check(world.ledger, guard.GuardStats(), world.req_to_token,
                                       guard.prefix_reads(batch, world.epoch))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        counts.tolist()
    except RuntimeError as e:
        return True, f"an immediate read raises: {str(e).splitlines()[0][:90]}"
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return False, "an immediate read of the verdict did not raise: the check cannot see a sync"


def time_step(fn, repeats: int) -> tuple[float, float]:
    """(device ms, host µs per call), medians."""
    fn()
    torch.cuda.synchronize()
    dev, host = [], []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        t = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t) * 1e6)
        b.record()
        b.synchronize()
        dev.append(a.elapsed_time(b))
    return statistics.median(dev), statistics.median(host)


def timings(world: World, shape, repeats: int) -> dict:
    return {"impl": world.ledger.kernels.name, **_timings(world, shape, repeats)}


def _timings(world: World, shape, repeats: int) -> dict:
    n, prefix, new = shape
    batch = world.batch(n, prefix, new)
    reads = guard.prefix_reads(batch, world.epoch)
    stats, verdicts = guard.GuardStats(), PendingVerdicts()

    def backstop():
        verdicts.launch(batch.out_cache_loc, [], guard.launch_prefix_check(world.ledger, stats, world.req_to_token,
                                                                           reads), lambda v: None)

    backstop_ms, backstop_us = time_step(backstop, repeats)
    verdicts.read_all()
    stamp_ms, stamp_us = time_step(lambda: world.ledger.stamp_written(batch.out_cache_loc, world.epoch), repeats)
    # bytes the gather reads: a 4-byte slot and a 4-byte page epoch per cached position
    gathered = n * prefix * 8
    bound_ms = gathered / spec_bandwidth() * 1e3
    return {"requests": n, "prefix": prefix, "new": new, "backstop_device_ms": backstop_ms,
            "backstop_host_us": backstop_us, "hbm_bound_ms": bound_ms, "stamp_device_ms": stamp_ms,
            "stamp_host_us": stamp_us}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=1 << 20)
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("[gpu_check_hot_path] SKIP: no CUDA device")
        return 0
    print(f"[gpu_check_hot_path] {torch.cuda.get_device_name()} torch {torch.__version__} "
          f"cuda ext {kernels.cuda_ext() is not None} triton {kernels.triton_module() is not None}")
    impls = [i for i in ("cuda", "triton", "torch") if kernels.available(i, torch.device("cuda"))]
    rows = max(s[0] for s in SHAPES) + 1
    width = max(s[1] + s[2] for s in SHAPES)
    failed, results = 0, []
    for page_size in sorted({args.page_size, 16}):
        ok, what = check_detector(World(args.pages, page_size, rows, width, impl="torch"))
        failed += not ok
        print(f"[gpu_check_hot_path] {'PASS' if ok else 'FAIL'} control: {what}")
        for impl in impls:
            world = World(args.pages, page_size, rows, width, impl=impl)
            for shape in SHAPES:
                ok, what = check_no_sync(world, shape, args.iterations)
                failed += not ok
                print(f"[gpu_check_hot_path] {'PASS' if ok else 'FAIL'} no sync: {impl} page_size {page_size} "
                      f"batch {shape}: {what}")
                results.append({"page_size": page_size, **timings(world, shape, args.repeats)})
    print("\n| impl | page size | requests x prefix (+new) | backstop device ms | HBM bound ms | backstop host µs "
          "| stamp device ms | stamp host µs |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['impl']} | {r['page_size']} | {r['requests']} x {r['prefix']} (+{r['new']}) | "
              f"{r['backstop_device_ms']:.3f} | {r['hbm_bound_ms']:.4f} | {r['backstop_host_us']:.0f} | "
              f"{r['stamp_device_ms']:.3f} | {r['stamp_host_us']:.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "results": results}, f,
                      indent=1)
    print(f"[gpu_check_hot_path] {'FAIL' if failed else 'PASS'}: {failed} failing check(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
