"""`make demo`: the stale-prefix publication scenario on a real CPU SGLang server, stock vs vradix.

Generates two tiny float32 Llama models (weights A and B), then for stock SGLang (VRADIX_DISABLE=1) and for vradix:
start a CPU server on A, warm a 200-token prefix, start a long request, `pause_generation(in_place)`,
`update_weights_from_disk(B, flush_cache=False, weight_version="v2")`, `continue_generation`, and probe the prefix.
The reference is a fresh server started on B. Prints one side-by-side table.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from vradix import inspector as cache_inspector
from vradix.testing.harness.scenario import PROBE, stale_prefix_publication
from vradix.testing.harness.server import CpuServer
from vradix.testing.models.llama import generate


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "vradix-demo"))
    args = p.parse_args()
    t0 = time.time()
    a = generate(os.path.join(args.workdir, "model-A"), seed=1, dtype="float32", init_range=0.2)
    b = generate(os.path.join(args.workdir, "model-B"), seed=2, dtype="float32", init_range=0.2)
    print(f"[demo] tiny models: {a} (weights A), {b} (weights B)", flush=True)
    print("[demo] reference: fresh CPU server on B ...", flush=True)
    with CpuServer(b, vradix=False) as s:
        reference = s.generate(PROBE, 4)["output_ids"]
    rows, views = {}, {}
    for name, vradix in (("stock (VRADIX_DISABLE=1)", False), ("vradix", True)):
        print(f"[demo] {name}: server on A, in_place publication of B ...", flush=True)
        with CpuServer(a, vradix=vradix) as s:
            rows[name] = stale_prefix_publication(s, b)
            views[name] = inspector_view(s.url)
    print()
    print_table(rows, reference)
    for name, view in views.items():
        print(f"\n[demo] cache inspector after the publication, {name} (vradix inspect --url URL):")
        print(view)
    print(f"\n[demo] done in {time.time() - t0:.0f}s")
    ok = rows["vradix"].cached_after == 0 and rows["vradix"].output_after == reference
    return 0 if ok else 1


def inspector_view(url: str) -> str:
    """What `vradix inspect --url URL` prints (its error line when vradix is not active)."""
    try:
        return cache_inspector.render(cache_inspector.fetch(url, limit=3, head=6))
    except cache_inspector.InspectError as e:
        return f"error: {e} (exit status {e.status})"


def print_table(rows, reference) -> None:
    metrics = [
        ("cached tokens before publication (warm, then repeat)", lambda o: f"{o.warm_cached} / {o.warm_repeat_cached}"),
        ("cached tokens right after publication", lambda o: str(o.cached_after)),
        ("stale tokens reused", lambda o: str(o.cached_after)),
        ("label of that response", lambda o: o.label_after),
        ("output == fresh server on new weights", lambda o: "yes" if o.output_after == reference else "NO"),
        ("in-flight request retractions", lambda o: str(o.inflight_retractions)),
        ("in-flight request completed tokens", lambda o: str(o.inflight_tokens)),
        ("cached tokens when prefix repeated again", lambda o: str(o.cached_again)),
        ("vradix epoch / stale tokens freed", lambda o: (f"{o.vradix['epoch']} / {o.vradix['stale_tokens_freed_total']}"
                                                         if o.vradix else "-")),
        ("KV ledger: prefixes verified / violations / leaks", lambda o: (
            "{prefixes_verified} / {violations_caught} / {leaked_pages_total}".format(**o.vradix["kv_ledger"])
            if o.vradix else "-")),
    ]
    names = list(rows)
    w0 = max(len(m) for m, _ in metrics)
    w = [max(len(n), 12) for n in names]
    print(" | ".join(["metric".ljust(w0)] + [n.ljust(x) for n, x in zip(names, w)]))
    print("-+-".join(["-" * w0] + ["-" * x for x in w]))
    for label, fn in metrics:
        print(" | ".join([label.ljust(w0)] + [fn(rows[n]).ljust(x) for n, x in zip(names, w)]))


if __name__ == "__main__":
    sys.exit(main())
